//! [`RendezvousHandle`]: the rendezvous of a [`NodeHandle`], for callers without an async
//! runtime (the C and Python bindings, plain threads, other executors).
//!
//! Keys are TensorFlow's rendezvous keys as text (`src_device;hex(incarnation);dst_device;
//! name;frame:iter`, see [`create_key`](crate::create_key)). Each call finds the step's
//! rendezvous and initializes it (both are idempotent), so a caller only names the step.
//! [`send`](RendezvousHandle::send) never blocks; [`recv`](RendezvousHandle::recv) answers
//! through a [`Call`] (await it anywhere, wait for it, or have a callback run).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use node::handle::{Call, NodeHandle};
use node::NodeError;
use van_core::rendezvous::{parse_key, Received};
use van_core::{NodeId, Rendezvous};

use crate::{Protocol, RendezvousMgr};

/// A node's rendezvous manager, owned with the node's runtime; cheap to clone, thread-safe.
#[derive(Clone)]
pub struct RendezvousHandle {
    node: NodeHandle,
    mgr: Arc<RendezvousMgr>,
}

impl std::fmt::Debug for RendezvousHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendezvousHandle")
            .field("node", &self.node.id())
            .field("protocol", &self.mgr.protocol())
            .finish_non_exhaustive()
    }
}

impl RendezvousHandle {
    /// Starts the rendezvous manager of `node` with `protocol` (pull: TensorFlow's
    /// `grpc+seastar`; push: StarServer's `star_server`). Every task of the job must start
    /// one with the same protocol.
    pub fn start(node: &NodeHandle, protocol: Protocol) -> Call<RendezvousHandle> {
        let po = node.postoffice().clone();
        let owner = node.clone();
        node.spawn(async move {
            let mgr = RendezvousMgr::new(&po, protocol)
                .await
                .map_err(|e| match e {
                    // Keep the postoffice's own kind (stopped, van, ...).
                    crate::Error::Ps(e) => e,
                    other => NodeError::InvalidArgument(other.to_string()),
                })?;
            Ok(RendezvousHandle {
                node: owner,
                mgr: Arc::new(mgr),
            })
        })
    }

    /// The node this rendezvous runs on.
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// Makes `value` available under `key` in step `step_id`; never blocks. Fails on a
    /// malformed key, a key whose source device is not this task, or an aborted step.
    pub fn send(&self, step_id: i64, key: &str, value: Bytes, is_dead: bool) -> node::Result<()> {
        let value = Received {
            value,
            is_dead,
            header: Bytes::new(),
        };
        self.send_received(step_id, key, value)
    }

    /// [`send`](Self::send) of a value with its header ([`Received::header`]), which reaches
    /// the receiver beside the value: neither is copied into the other.
    pub fn send_received(&self, step_id: i64, key: &str, value: Received) -> node::Result<()> {
        let parsed = parse_key(key).map_err(|e| NodeError::InvalidArgument(e.to_string()))?;
        // The manager spawns its sends onto the node's runtime: enter it (without blocking).
        let runtime = self.node.runtime();
        let _context = runtime.enter();
        let step = self.mgr.find(step_id);
        step.initialize().map_err(NodeError::from)?;
        step.send_received(&parsed, value).map_err(NodeError::from)
    }

    /// Receives the value under `key` in step `step_id`, from whichever task produces it.
    pub fn recv(&self, step_id: i64, key: &str) -> Call<Received> {
        let parsed = parse_key(key).map_err(|e| NodeError::InvalidArgument(e.to_string()));
        let mgr = Arc::clone(&self.mgr);
        self.node.spawn(async move {
            let parsed = parsed?;
            let step = mgr.find(step_id);
            step.initialize().map_err(NodeError::from)?;
            step.recv(&parsed).await.map_err(NodeError::from)
        })
    }

    /// Receives the value under `key` in step `step_id` as [`recv`](Self::recv) does, and
    /// calls `done` once with the result: on the thread that completes the receive (a vans
    /// I/O thread, with no task spawned for it), or on a task of the node's runtime when the
    /// receive ends at once (the value was there, or the call failed) — never on the calling
    /// thread before this returns. For callers that hand the result on (the C ABI, the
    /// TensorFlow plugin), the cheapest receive.
    pub fn recv_then(
        &self,
        step_id: i64,
        key: &str,
        done: impl FnOnce(node::Result<Received>) + Send + 'static,
    ) {
        self.recv_with(step_id, key, false, done);
    }

    /// [`recv_then`](Self::recv_then), except that a receive that ends at once (the value
    /// was there, as it mostly is in push mode, or the call failed) calls `done` right here,
    /// on the calling thread before this returns, instead of handing it to another thread.
    /// For callers that hold no lock `done` takes (TensorFlow's `RecvAsync` allows its
    /// callback to run inline, as its local rendezvous does).
    pub fn recv_now_or_then(
        &self,
        step_id: i64,
        key: &str,
        done: impl FnOnce(node::Result<Received>) + Send + 'static,
    ) {
        self.recv_with(step_id, key, true, done);
    }

    fn recv_with(
        &self,
        step_id: i64,
        key: &str,
        inline: bool,
        done: impl FnOnce(node::Result<Received>) + Send + 'static,
    ) {
        let runtime = self.node.runtime();
        // Set once `recv_async` has returned: an answer before that came on this thread.
        let returned = Arc::new(AtomicBool::new(inline));
        let done = {
            let returned = Arc::clone(&returned);
            let runtime = runtime.clone();
            move |result: node::Result<Received>| {
                if returned.load(Ordering::Acquire) {
                    done(result);
                } else {
                    drop(runtime.spawn(async move { done(result) }));
                }
            }
        };
        let parsed = match parse_key(key) {
            Ok(parsed) => parsed,
            Err(e) => return done(Err(NodeError::InvalidArgument(e.to_string()))),
        };
        let _context = runtime.enter();
        let step = self.mgr.find(step_id);
        if let Err(e) = step.initialize() {
            return done(Err(NodeError::from(e)));
        }
        step.recv_async(
            &parsed,
            Box::new(move |result| done(result.map_err(NodeError::from))),
        );
        returned.store(true, Ordering::Release);
    }

    /// Ends step `step_id` (TensorFlow's `Cleanup`): its pending receives fail, its table goes.
    pub fn cleanup(&self, step_id: i64) {
        let runtime = self.node.runtime();
        let _context = runtime.enter();
        self.mgr.cleanup(step_id);
    }

    /// Exempts step `step_id` from the manager's count and age limits
    /// ([`RendezvousMgr::pin`](crate::RendezvousMgr::pin)).
    pub fn pin(&self, step_id: i64) {
        self.mgr.pin(step_id);
    }

    /// The protocol this rendezvous speaks.
    pub fn protocol(&self) -> Protocol {
        self.mgr.protocol()
    }

    /// The CPU device name of `node` ([`RendezvousMgr::device`]).
    pub fn device(&self, node: NodeId) -> Option<String> {
        self.mgr.device(node)
    }
}

impl Drop for RendezvousHandle {
    fn drop(&mut self) {
        // The last clone ends every step, so no peer waits on a table that is gone.
        if Arc::strong_count(&self.mgr) == 1 {
            let runtime = self.node.runtime();
            let _context = runtime.enter();
            self.mgr.cleanup_all();
        }
    }
}
