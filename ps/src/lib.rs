//! # ps: a ps-lite style parameter server over vans
//!
//! The key-value applications of a cluster whose runtime is the [`node`] crate (scheduler,
//! postoffice, barriers, failures):
//!
//! - [`kv`]: [`KvWorker`] (push, pull, push-pull, wait by request id) and [`KvServer`]
//!   (request handler, sum aggregation, synchronous rounds with [`ROUND_CMD`],
//!   shared-nothing shards);
//! - [`optim`]: server-side optimizers and embedding tables ([`optim::TableHandler`]);
//! - [`range`]: key ranges and slicing of requests across servers;
//! - [`values`]: typed views of values carried as bytes;
//! - [`simple_app`]: ps-lite's `SimpleApp`, request/response of (head, body) for commands;
//! - [`handle`]: key-value [`Worker`](handle::Worker)s and [`Server`](handle::Server)s on a
//!   [`NodeHandle`](node::handle::NodeHandle), a node that owns its I/O runtime.
//!
//! The node's items a key-value program names most are re-exported here ([`Postoffice`],
//! [`NodeError`], [`Config`], …), so `ps` alone is enough for it.

pub mod handle;
// Requests in flight and their waiters, shared by `KvWorker` and `SimpleApp`.
mod in_flight;
pub mod kv;
pub mod optim;
pub mod range;
pub mod simple_app;
pub mod values;

pub use kv::{
    Handled, HeldRequest, KvMeta, KvPairs, KvServer, KvWorker, Op, PullBuffer, Released,
    RequestHandler, ShardContext, Snapshot, SumHandler, UnpushedKeys, ROUND_CMD,
};
pub use node::{
    node_ids, Config, Message, Meta, Node, NodeError, Postoffice, RequestId, Result, Role,
    ALL_GROUPS, UNSERVED_GRACE,
};
pub use simple_app::SimpleApp;
