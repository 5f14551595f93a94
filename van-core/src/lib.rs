//! # van-core: the contracts every part of vans is built on
//!
//! The crate holds:
//!
//! - [`message`]: [`Message`], [`Meta`], [`Control`], [`Node`], roles, commands, data types,
//!   the kinds of van a node's endpoints are for ([`VanKind`]) and ps-lite's node-id numbering
//!   ([`node_ids`]);
//! - [`wire`]: the versioned frame format, byte by byte, with zero-copy encode and decode;
//! - [`van`]: the [`Van`] trait, the [`Inbox`] vans deliver into and [`VanError`];
//! - [`rendezvous`]: the [`Rendezvous`] trait and TensorFlow's key format;
//! - [`buf`]: [`SharedBuf`], buffers a van can send without copying ([`Van::alloc`]);
//! - [`budget`]: [`ByteBudget`](budget::ByteBudget), bytes of large frames a peer's send
//!   queue may hold;
//! - [`pool`]: [`FramePool`], reused buffers for large received frames;
//! - [`link`]: [`Links`](link::Links), the table of connections every van keeps the same way
//!   (routes by peer, one dial per peer, spares, lost peers, stop), and the per-peer
//!   [`FrameQueue`](link::FrameQueue);
//! - [`select`]: the selection policy, which van carries each peer's traffic;
//! - [`config`]: [`Config`], parsed once from `DMLC_*`/`PS_*` environment or built in code;
//! - [`inproc`]: an in-process van (channels, no sockets) for tests, simulation and
//!   single-process embedding;
//! - [`testkit`] (feature `testkit`): the conformance suite every van runs;
//! - [`error`]: [`Error`], the umbrella every crate's error converts into.
//!
//! ## The I/O it does
//!
//! Messages, the wire format, the traits, the link table, the selection policy and the
//! in-process van work on values, channels, tasks and timers, and never touch a socket or a
//! file. What does I/O is this, and nothing else:
//!
//! - [`link::stream`] sets up TCP connections for the vans that use them: it dials a peer
//!   ([`dial`](link::stream::dial)) and runs an accept loop
//!   ([`serve`](link::stream::serve)), both over tokio's `TcpStream`/`TcpListener` and both
//!   running the cluster-secret handshake; it sets `TCP_NODELAY` and keepalive, reads a
//!   socket's unacknowledged bytes (`TIOCOUTQ`) to wait for a flush, and checks a loopback
//!   port is free by binding it. It never reads or writes a frame: each van moves its frames
//!   itself (van-tcp with tokio, van-uring with io_uring, van-rdma with verbs). It lives here
//!   because three van crates share it (van-tcp and van-uring for their connections, van-rdma
//!   for its TCP side channel) and it is built on van-core's own [`auth`] gate and
//!   [`VanError`]; a crate of its own would only move those dependencies around.
//! - [`auth`] runs its handshake (under a hundred bytes each way) on a stream it is handed,
//!   any `AsyncRead + AsyncWrite`, and
//!   [`ClusterSecret::from_file`](auth::ClusterSecret::from_file) reads the secret's file.
//! - [`config`] reads the process environment ([`Config::from_env`]) and the files its
//!   variables name: the cluster secret, and the TensorFlow endpoint map
//!   ([`EndpointMap::load`]).
//! - [`testkit`] (feature `testkit`, for tests) opens sockets and starts processes to check
//!   a van.

pub mod auth;
pub mod budget;
pub mod buf;
pub mod config;
pub mod endpoint_map;
pub mod error;
pub mod inproc;
pub mod link;
pub mod message;
pub mod pool;
pub mod rendezvous;
pub mod select;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tf_config;
pub mod van;
pub mod wire;

pub use buf::SharedBuf;
pub use config::{Config, ConfigError};
pub use endpoint_map::{EndpointMap, EndpointMapError, HostPort};
pub use error::Error;
pub use message::{
    node_ids, Command, Control, DataType, DataTypes, Endpoint, Message, Meta, Node, NodeId, Parts,
    Role, Seq, TfTask, VanKind,
};
pub use pool::FramePool;
pub use rendezvous::{ParsedKey, Rendezvous, RendezvousError};
pub use smallvec;
pub use tf_config::{TfConfig, TfConfigError};
pub use van::{inbox, Event, Inbox, InboxSender, PeerLost, Van, VanError};
pub use wire::{Limits, WireError};
