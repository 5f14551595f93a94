//! # rendezvous: TensorFlow-style step-scoped tensor exchange over vans
//!
//! The equivalent of TensorFlow's `Rendezvous` / `RendezvousMgrInterface` /
//! `BaseRemoteRendezvous`, with both TensorFlow's send/recv semantics (*pull*, as its gRPC and
//! Seastar runtimes) and StarServer's *push* semantics, over the parameter server's
//! postoffice — so over whichever van connects each pair of tasks (TCP, shared memory for
//! co-located tasks with the `ipc` feature, …).
//!
//! - [`local`]: [`LocalRendezvous`], the table where sends meet receives inside a task;
//! - [`remote`]: [`RemoteRendezvous`], one step's rendezvous on one task, reaching the others;
//! - [`mgr`]: [`RendezvousMgr`], the step-keyed table (`find`, `recv_local_async`,
//!   `cleanup`, `cleanup_all`) with bounds on steps never cleaned up;
//! - [`protocol`]: [`Protocol`], pull (`grpc+seastar`) or push (`star_server`);
//! - [`device`]: which task owns a device name;
//! - [`wire`]: the RecvTensor / PushTensor / CancelRecv / Goodbye messages between tasks;
//! - [`handle`]: [`RendezvousHandle`](handle::RendezvousHandle), send and receive for callers
//!   without an async runtime (on a `node::handle::NodeHandle`);
//! - [`error`]: [`Error`] (setting up) and [`MessageError`] (bad peer messages); calls fail
//!   with the contract's [`RendezvousError`].
//!
//! Keys are TensorFlow's, `src_device;hex(src_incarnation);dst_device;name;frame:iter`
//! ([`create_key`], [`parse_key`]); the device names say which task produces and which
//! consumes a value.
//!
//! ```
//! use bytes::Bytes;
//! use node::local::LocalCluster;
//! use node::Role;
//! use rendezvous::device::cpu_device;
//! use rendezvous::{create_key, parse_key, Protocol, Rendezvous, RendezvousMgr};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! // A server (node 8) and a worker (node 9) in one process; StarServer-style push.
//! LocalCluster::new(1, 1)
//!     .run(|po| async move {
//!         let mgr = RendezvousMgr::new(&po, Protocol::Push)
//!             .await
//!             .map_err(|e| node::NodeError::InvalidArgument(e.to_string()))?;
//!         let (worker, server) = (cpu_device(9).unwrap(), cpu_device(8).unwrap());
//!         let weights = parse_key(&create_key(&server, 1, &worker, "w", (0, 0))).unwrap();
//!         let grad = parse_key(&create_key(&worker, 1, &server, "grad", (0, 0))).unwrap();
//!         for step_id in 0..3 {
//!             let step = mgr.find(step_id);
//!             step.initialize().unwrap();
//!             match po.role() {
//!                 Role::Server => {
//!                     step.send(&weights, Bytes::from(vec![step_id as u8; 4]), false).unwrap();
//!                     let g = step.recv(&grad).await.unwrap();
//!                     assert_eq!(g.value, Bytes::from(vec![step_id as u8 + 1; 4]));
//!                 }
//!                 Role::Worker => {
//!                     let w = step.recv(&weights).await.unwrap();
//!                     let g: Vec<u8> = w.value.iter().map(|x| x + 1).collect();
//!                     step.send(&grad, Bytes::from(g), false).unwrap();
//!                 }
//!                 Role::Scheduler => {}
//!             }
//!         }
//!         po.finalize().await?;
//!         mgr.cleanup_all();
//!         Ok(())
//!     })
//!     .await
//!     .unwrap();
//! # });
//! ```

pub mod device;
pub mod error;
pub mod handle;
pub mod local;
pub mod mgr;
// Messages waiting for the manager's sender task, with a byte bound (private).
mod outbox;
pub mod protocol;
pub mod remote;
// The manager's shared state: options, the step table, the tables of requests in flight
// both ways, the outbox (private).
mod state;
// Locking that tolerates poisoning (private).
mod sync;
// The postoffice customer, the sender task, and pulls and served requests as they come and
// go (private).
mod transport;
pub mod wire;

pub use device::{cpu_device, table_resolver, task_of_device, DeviceResolver};
pub use error::{Error, MessageError};
pub use local::{LocalRendezvous, Queued};
pub use mgr::{MgrStats, RendezvousMgr, RendezvousMgrBuilder};
pub use protocol::Protocol;
pub use remote::RemoteRendezvous;
/// The deadline type of [`RemoteRendezvous::recv_with_deadline`] and
/// [`LocalRendezvous::recv_with_deadline`] (tokio's, so tests can pause time).
pub use tokio::time::Instant;
pub use van_core::rendezvous::{
    create_key, parse_key, DoneCallback, KeyError, Received, RecvFuture,
};
pub use van_core::{ParsedKey, Rendezvous, RendezvousError};
