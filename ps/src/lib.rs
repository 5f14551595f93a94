//! # ps: a ps-lite style parameter server over vans (planned)
//!
//! The scheduler (registration, node ids, barriers, heartbeats, termination) as a state
//! machine, a postoffice per node, `KvWorker` (push, pull, push-pull, wait by request id) and
//! `KvServer` (request handler, sum aggregation, shared-nothing shards), key-range
//! partitioning, and the per-peer van router. The message, node numbering and configuration
//! it will use already live in `van-core`.
//!
//! Nothing is implemented yet; this crate exists so the workspace layout is fixed.

pub use van_core::{node_ids, Config, Message, Meta, Node, Role};
