//! # node: the cluster runtime of a vans node
//!
//! What every node of a ps-lite style cluster (scheduler, servers, workers) runs, whatever its
//! applications are: the key-value parameter server (`ps`), rendezvous and collectives are
//! built on it.
//!
//! - [`control`]: the scheduler as a state machine (registration, node ids, barriers,
//!   heartbeats, failure notices, termination), with no I/O;
//! - [`member`]: the node's side of membership as a state machine (the node table, who is
//!   dead, barriers, failure and recovery notices, scheduler liveness, finalize), with no I/O;
//! - [`postoffice`]: one per node, the driver of its [`Member`](member::Member); joins the
//!   cluster, runs barriers and heartbeats, dispatches messages to applications (its
//!   [`Customer`](postoffice::Customer)s);
//! - [`router`]: which van carries each peer's traffic (with feature `rdma`, remote peers use
//!   the RDMA van when `DMLC_ENABLE_RDMA` asks for it);
//! - [`local`]: a whole cluster inside one process, over the in-process van;
//! - [`handle`]: [`NodeHandle`](handle::NodeHandle), a node that owns its I/O runtime, for
//!   plain threads, foreign runtimes and other executors (the bindings' base), and
//!   [`Call`](handle::Call), the answer to one of its operations;
//! - [`netif`]: the address of a network interface (`DMLC_INTERFACE`);
//! - [`hash`]: a fast hasher for integer keys;
//! - [`logging`]: the stderr log every vans program installs (`PS_VERBOSE`);
//! - [`error`]: the crate's error type, [`NodeError`].

pub mod control;
// How data messages reach a node's applications: the `Customer` trait (re-exported by
// `postoffice`), the table of customers, and the dispatch loop's data queue (private).
mod delivery;
pub mod error;
pub mod fencing;
pub mod handle;
pub mod hash;
pub mod local;
pub mod logging;
pub mod member;
pub mod netif;
pub mod postoffice;
// Exactly-once delivery across broken connections (`PS_RESEND`).
mod resend;
// The RDMA van of a node, when `DMLC_ENABLE_RDMA` asks for it (feature `rdma`).
mod rdma;
pub mod router;
pub mod table;

pub use error::{NodeError, Result};
pub use postoffice::{Postoffice, ALL_GROUPS, UNSERVED_GRACE};
pub use resend::ResendStats;
pub use table::NodeTable;
pub use van_core::{node_ids, Config, Message, Meta, Node, Role};

/// Identifies a request until it is waited for (ps-lite's timestamp): the `request_id` of a
/// message's meta, matching an answer to its request.
pub type RequestId = i32;
