//! # ps: a ps-lite style parameter server over vans
//!
//! - [`control`]: the scheduler as a state machine (registration, node ids, barriers,
//!   heartbeats, failure notices, termination), with no I/O;
//! - [`postoffice`]: one per node; joins the cluster, runs barriers and heartbeats, dispatches
//!   messages to applications;
//! - [`kv`]: [`KvWorker`] (push, pull, push-pull, wait by request id) and [`KvServer`]
//!   (request handler, sum aggregation, synchronous rounds with [`ROUND_CMD`],
//!   shared-nothing shards);
//! - [`optim`]: server-side optimizers and embedding tables ([`optim::TableHandler`]);
//! - [`range`]: key ranges and slicing of requests across servers;
//! - [`values`]: typed views of values carried as bytes;
//! - [`local`]: a whole cluster inside one process, over the in-process van;
//! - [`simple_app`]: ps-lite's `SimpleApp`, request/response of (head, body) for commands;
//! - [`netif`]: the address of a network interface (`DMLC_INTERFACE`);
//! - [`router`]: which van carries each peer's traffic (with feature `rdma`, remote peers use
//!   the RDMA van when `DMLC_ENABLE_RDMA` asks for it);
//! - [`hash`]: a fast hasher for integer keys;
//! - [`embed`]: [`NodeHandle`](embed::NodeHandle), a node that owns its I/O runtime, for
//!   plain threads, foreign runtimes and other executors (the bindings' base);
//! - [`error`]: the crate's error type, [`PsError`].

pub mod control;
// How data messages reach a node's applications: the `Customer` trait (re-exported by
// `postoffice`), the table of customers, and the dispatch loop's data queue (private).
mod delivery;
pub mod embed;
pub mod error;
pub mod hash;
pub mod kv;
pub mod local;
pub mod netif;
pub mod optim;
mod pending;
pub mod postoffice;
pub mod range;
// Exactly-once delivery across broken connections (`PS_RESEND`).
mod resend;
// The RDMA van of a node, when `DMLC_ENABLE_RDMA` asks for it (feature `rdma`).
mod rdma;
pub mod router;
pub mod simple_app;
pub mod values;

pub use error::{PsError, Result};
pub use kv::{
    Handled, HeldRequest, KvMeta, KvPairs, KvServer, KvWorker, PullBuffer, Released,
    RequestHandler, RequestId, ShardContext, Snapshot, SumHandler, ROUND_CMD,
};
pub use postoffice::{Postoffice, ALL_GROUPS};
pub use resend::ResendStats;
pub use simple_app::SimpleApp;
pub use van_core::{node_ids, Config, Message, Meta, Node, Role};
