//! [`RendezvousMgr`]: the step-keyed table of [`RemoteRendezvous`] on one task, as
//! TensorFlow's `RendezvousMgrInterface` (`Find`, `RecvLocalAsync`, `RecvLocal`, `Cleanup`,
//! `CleanupAll`), with a bound on steps that are never cleaned up.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant as StdInstant};

use node::Postoffice;
use tokio::sync::oneshot;
use van_core::rendezvous::DoneCallback;
use van_core::rendezvous::Received;
use van_core::{NodeId, ParsedKey, Rendezvous, RendezvousError};

use crate::device::DeviceResolver;
use crate::error::Error;
use crate::local::Done;
use crate::outbox::Outbox;
use crate::protocol::Protocol;
use crate::remote::RemoteRendezvous;
use crate::state::{MgrInner, Options};
use crate::sync::lock;
use crate::transport::{run_sender, MgrCustomer};

/// Default application id of rendezvous messages (`"RV"`); every task of a job must use the
/// same ids.
pub const DEFAULT_APP_ID: i32 = 0x5256;
/// Default bound on live steps: creating one more aborts the oldest.
pub const DEFAULT_MAX_STEPS: usize = 10_000;
/// Default bound on a step's age: older steps are aborted.
pub const DEFAULT_MAX_STEP_AGE: Duration = Duration::from_secs(3600);
/// Default bound on bytes queued for sending and not yet handed to a van.
pub const DEFAULT_MAX_OUTBOX_BYTES: usize = 1 << 30;
/// Default bound on calls queued by one step before it is initialized.
pub const DEFAULT_MAX_DEFERRED_CALLS: usize = 1 << 20;

/// Builds a [`RendezvousMgr`]; from [`RendezvousMgr::builder`].
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct RendezvousMgrBuilder {
    po: Postoffice,
    options: Options,
}

impl std::fmt::Debug for RendezvousMgrBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendezvousMgrBuilder")
            .field("protocol", &self.options.protocol)
            .field("app_id", &self.options.app_id)
            .field("customer_id", &self.options.customer_id)
            .field("max_steps", &self.options.max_steps)
            .field("max_step_age", &self.options.max_step_age)
            .finish_non_exhaustive()
    }
}

impl RendezvousMgrBuilder {
    /// Pull (`grpc+seastar`, the default) or push (`star_server`); see [`Protocol`]. Every
    /// task of a job must use the same protocol for a given app and customer id.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.options.protocol = protocol;
        self
    }

    /// The application id of rendezvous messages ([`DEFAULT_APP_ID`] by default).
    pub fn app_id(mut self, app_id: i32) -> Self {
        self.options.app_id = app_id;
        self
    }

    /// The customer id of rendezvous messages (0 by default): managers with different
    /// customer ids on the same nodes are independent (e.g. one pull and one push manager).
    pub fn customer_id(mut self, customer_id: i32) -> Self {
        self.options.customer_id = customer_id;
        self
    }

    /// How many steps may be live at once ([`DEFAULT_MAX_STEPS`]); creating one more aborts
    /// the oldest with an error that says it was never cleaned up. At least 1.
    pub fn max_steps(mut self, max_steps: usize) -> Self {
        self.options.max_steps = max_steps;
        self
    }

    /// How long a step may live without cleanup ([`DEFAULT_MAX_STEP_AGE`]; `None`: no
    /// limit); older steps are aborted with an error that says so.
    pub fn max_step_age(mut self, max_age: Option<Duration>) -> Self {
        self.options.max_step_age = max_age;
        self
    }

    /// Bytes of messages queued for sending and not yet taken by a van
    /// ([`DEFAULT_MAX_OUTBOX_BYTES`]); a push or a RecvTensor request beyond it fails
    /// instead of growing memory. Answers to other tasks' requests and cancels are queued
    /// regardless: refusing an answer would lose a value that already left the table.
    pub fn max_outbox_bytes(mut self, bytes: usize) -> Self {
        self.options.max_outbox_bytes = bytes;
        self
    }

    /// Calls one step may queue before [`RemoteRendezvous::initialize`]
    /// ([`DEFAULT_MAX_DEFERRED_CALLS`]); calls beyond it fail.
    pub fn max_deferred_calls(mut self, calls: usize) -> Self {
        self.options.max_deferred_calls = calls;
        self
    }

    /// How device names map to tasks ([`table_resolver`](crate::device::table_resolver) of
    /// the node table by default: TensorFlow task names where the nodes announce tasks,
    /// [`task_of_device`](crate::device::task_of_device) otherwise).
    pub fn resolver(mut self, resolver: DeviceResolver) -> Self {
        self.options.resolver = Some(resolver);
        self
    }

    /// Registers the manager with the postoffice (as the application `app_id`/`customer_id`)
    /// and starts its sender and, with a step age limit, its sweeper. Messages that peers sent
    /// before this are kept by the postoffice and delivered now. Must run inside a tokio
    /// runtime.
    pub async fn build(self) -> Result<RendezvousMgr, Error> {
        let o = &self.options;
        if o.max_steps == 0 {
            return Err(Error::InvalidOption("max_steps must be at least 1".into()));
        }
        if o.max_step_age.is_some_and(|age| age.is_zero()) {
            return Err(Error::InvalidOption(
                "max_step_age must be positive (None for no limit)".into(),
            ));
        }
        if o.max_outbox_bytes == 0 {
            return Err(Error::InvalidOption(
                "max_outbox_bytes must be at least 1".into(),
            ));
        }
        let po = self.po;
        let outbox = Arc::new(Outbox::new(self.options.max_outbox_bytes));
        let inner = Arc::new(MgrInner::new(po.clone(), self.options, Arc::clone(&outbox)));
        let weak = Arc::downgrade(&inner);
        tokio::spawn(run_sender(po.clone(), outbox, weak.clone()));
        if let Some(age) = inner.options.max_step_age {
            tokio::spawn(sweep(weak.clone(), age));
        }
        let customer = Arc::new(MgrCustomer::new(&inner));
        po.register_customer(inner.options.app_id, inner.options.customer_id, customer)
            .await?;
        Ok(RendezvousMgr { inner })
    }
}

/// Aborts steps older than the age limit, until the manager is dropped.
async fn sweep(mgr: Weak<MgrInner>, max_age: Duration) {
    let period = (max_age / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(mgr) = mgr.upgrade() else {
            return;
        };
        mgr.evict(StdInstant::now());
    }
}

/// What [`RendezvousMgr::stats`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MgrStats {
    /// Steps created and not yet cleaned up.
    pub live_steps: usize,
    /// Receives of this task waiting for a RecvTensor response (pull).
    pub pending_pulls: usize,
    /// RecvTensor requests from other tasks waiting for a value here (pull).
    pub served_requests: usize,
    /// Bytes queued for sending and not yet taken by a van.
    pub outbox_bytes: usize,
}

/// The rendezvous manager of one task: the step-keyed table of [`RemoteRendezvous`], as
/// TensorFlow's `RendezvousMgrInterface`, reaching the other tasks through the node's
/// [`Postoffice`] (so over whichever van connects each pair: TCP, shared memory, …). Cheap
/// to clone (all clones are the same manager); dropping the last clone aborts every step and
/// tells the other tasks at once: the requests it holds (and any that arrive later) are
/// answered with an error, and every task gets a goodbye that fails its receives waiting on
/// values from this one.
///
/// ```
/// use bytes::Bytes;
/// use node::local::LocalCluster;
/// use node::Role;
/// use rendezvous::device::cpu_device;
/// use rendezvous::{create_key, parse_key, Protocol, Rendezvous, RendezvousMgr};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // One server (node 8) and one worker (node 9): the worker sends, the server receives.
/// LocalCluster::new(1, 1)
///     .run(|po| async move {
///         let mgr = RendezvousMgr::new(&po, Protocol::Pull).await.map_err(|e| node::NodeError::InvalidArgument(e.to_string()))?;
///         let key = parse_key(&create_key(
///             &cpu_device(9).unwrap(), 1, &cpu_device(8).unwrap(), "grad", (0, 0),
///         )).unwrap();
///         let step = mgr.find(42);
///         step.initialize().unwrap();
///         match po.role() {
///             Role::Worker => step.send(&key, Bytes::from_static(b"0123"), false).unwrap(),
///             Role::Server => {
///                 let got = step.recv(&key).await.unwrap();
///                 assert_eq!(got.value, Bytes::from_static(b"0123"));
///             }
///             Role::Scheduler => {}
///         }
///         po.finalize().await?;
///         mgr.cleanup(42);
///         Ok(())
///     })
///     .await
///     .unwrap();
/// # });
/// ```
#[derive(Clone)]
pub struct RendezvousMgr {
    inner: Arc<MgrInner>,
}

impl std::fmt::Debug for RendezvousMgr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendezvousMgr")
            .field("node", &self.inner.me)
            .field("protocol", &self.inner.options.protocol)
            .field("stats", &self.stats())
            .finish()
    }
}

impl RendezvousMgr {
    /// A builder for a manager on `po`'s node, with the defaults: pull protocol,
    /// [`DEFAULT_APP_ID`], customer 0, [`DEFAULT_MAX_STEPS`], [`DEFAULT_MAX_STEP_AGE`].
    pub fn builder(po: &Postoffice) -> RendezvousMgrBuilder {
        RendezvousMgrBuilder {
            po: po.clone(),
            options: Options {
                protocol: Protocol::Pull,
                app_id: DEFAULT_APP_ID,
                customer_id: 0,
                max_steps: DEFAULT_MAX_STEPS,
                max_step_age: Some(DEFAULT_MAX_STEP_AGE),
                max_outbox_bytes: DEFAULT_MAX_OUTBOX_BYTES,
                max_deferred_calls: DEFAULT_MAX_DEFERRED_CALLS,
                resolver: None,
            },
        }
    }

    /// A manager with the defaults and `protocol`.
    pub async fn new(po: &Postoffice, protocol: Protocol) -> Result<RendezvousMgr, Error> {
        RendezvousMgr::builder(po).protocol(protocol).build().await
    }

    /// The rendezvous of `step_id`, created on first use (by this task, or by a peer's
    /// request or value for the step). A created step queues its calls until
    /// [`RemoteRendezvous::initialize`], which the caller must eventually call.
    pub fn find(&self, step_id: i64) -> Arc<RemoteRendezvous> {
        self.inner.find(step_id)
    }

    /// Receives `key` of `step_id` from this task's own table (TF's `RecvLocalAsync`, what a
    /// transport's RecvTensor handler calls); `done` runs when the value is produced or the
    /// step fails.
    pub fn recv_local_async(&self, step_id: i64, key: &ParsedKey, done: DoneCallback) {
        self.find(step_id).recv_local_async(key, done);
    }

    /// [`recv_local_async`](Self::recv_local_async) as a future (TF's `RecvLocal`).
    pub async fn recv_local(
        &self,
        step_id: i64,
        key: &ParsedKey,
    ) -> Result<Received, RendezvousError> {
        let (tx, rx) = oneshot::channel();
        self.find(step_id)
            .recv_local_internal(key, Done::Channel(tx), None);
        rx.await.unwrap_or_else(|_| {
            Err(RendezvousError::Aborted(format!(
                "step {step_id}: the receive of `{key}` was dropped without an answer"
            )))
        })
    }

    /// Aborts `step_id` (every pending call fails, remote requests are withdrawn) and
    /// removes it. Late requests and values for it from other tasks are refused.
    pub fn cleanup(&self, step_id: i64) {
        if let Some(step) = self.inner.remove_step(step_id) {
            step.start_abort(RendezvousError::Aborted(format!(
                "step {step_id} was cleaned up on node {}",
                self.inner.me
            )));
        }
    }

    /// Exempts step `step_id` from the count and age limits
    /// ([`max_steps`](RendezvousMgrBuilder::max_steps),
    /// [`max_step_age`](RendezvousMgrBuilder::max_step_age)), now or, if it is not live yet,
    /// once it is created: for a step that may live as long as the task (the one step of
    /// TensorFlow's eager collectives). Only [`cleanup`](Self::cleanup), which also ends the
    /// pin, or the manager's end, ends it. Pinned steps do not count against `max_steps`.
    pub fn pin(&self, step_id: i64) {
        self.inner.pin(step_id);
    }

    /// [`cleanup`](Self::cleanup) of every live step.
    pub fn cleanup_all(&self) {
        for step in self.inner.remove_all_steps() {
            step.start_abort(RendezvousError::Aborted(format!(
                "step {} was cleaned up on node {} (cleanup_all)",
                step.step_id(),
                self.inner.me
            )));
        }
    }

    /// The steps created and not yet cleaned up, sorted.
    pub fn live_steps(&self) -> Vec<i64> {
        let mut ids = self.inner.live_step_ids();
        ids.sort_unstable();
        ids
    }

    /// The protocol this manager speaks.
    pub fn protocol(&self) -> Protocol {
        self.inner.options.protocol
    }

    /// This task's node id.
    pub fn node_id(&self) -> NodeId {
        self.inner.me
    }

    /// The postoffice the manager sends through.
    pub fn postoffice(&self) -> &Postoffice {
        &self.inner.po
    }

    /// The CPU device name of `node` that the manager's default resolver reads back as that
    /// node: its TensorFlow task's name when it announced one
    /// (`/job:chief/replica:0/task:0/device:CPU:0`), else [`cpu_device`](crate::cpu_device)'s
    /// rank-based name; `None` for a group id.
    pub fn device(&self, node: NodeId) -> Option<String> {
        crate::device::device_in(self.inner.po.nodes(), node)
    }

    /// Counters for diagnostics and tests.
    pub fn stats(&self) -> MgrStats {
        MgrStats {
            live_steps: self.inner.live_step_count(),
            pending_pulls: lock(&self.inner.pulls).len(),
            served_requests: lock(&self.inner.served).len(),
            outbox_bytes: self.inner.outbox.bytes(),
        }
    }
}
