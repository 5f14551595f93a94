//! [`RendezvousMgr`]: the step-keyed table of [`RemoteRendezvous`] on one task, as
//! TensorFlow's `RendezvousMgrInterface` (`Find`, `RecvLocalAsync`, `RecvLocal`, `Cleanup`,
//! `CleanupAll`), with a bound on steps that are never cleaned up.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant as StdInstant};

use ps::Postoffice;
use tokio::sync::oneshot;
use tracing::warn;
use van_core::rendezvous::DoneCallback;
use van_core::rendezvous::Received;
use van_core::{node_ids, NodeId, ParsedKey, Rendezvous, RendezvousError, Role};

use crate::device::{default_resolver, DeviceResolver};
use crate::error::Error;
use crate::local::Done;
use crate::protocol::Protocol;
use crate::remote::{lock, RemoteRendezvous, Route};
use crate::transport::{Mailbox, Outbox, PendingPull, Served};

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
/// Step ids remembered after their cleanup, so that late requests and values for them are
/// answered with an error instead of re-creating the step.
pub(crate) const RECENTLY_CLEANED: usize = 4096;

/// The manager's options, set through [`RendezvousMgrBuilder`].
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) protocol: Protocol,
    pub(crate) app_id: i32,
    pub(crate) customer_id: i32,
    pub(crate) max_steps: usize,
    pub(crate) max_step_age: Option<Duration>,
    pub(crate) max_outbox_bytes: usize,
    pub(crate) max_deferred_calls: usize,
    pub(crate) resolver: DeviceResolver,
}

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

    /// How device names map to tasks ([`task_of_device`](crate::device::task_of_device) by
    /// default).
    pub fn resolver(mut self, resolver: DeviceResolver) -> Self {
        self.options.resolver = resolver;
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
        let me = po.my_id();
        let outbox = Arc::new(Outbox::new(self.options.max_outbox_bytes));
        let tasks = po
            .nodes()
            .iter()
            .filter(|n| n.role != Role::Scheduler)
            .filter_map(|n| n.id)
            .chain(std::iter::once(me))
            .collect();
        let inner = Arc::new(MgrInner {
            po: po.clone(),
            me,
            tasks,
            options: self.options,
            steps: Mutex::new(Steps::default()),
            pulls: Mutex::new(HashMap::new()),
            served: Mutex::new(HashMap::new()),
            next_request: AtomicI32::new(1),
            next_incarnation: AtomicU64::new(1),
            outbox: Arc::clone(&outbox),
            stopped: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(crate::transport::run_sender(
            po.clone(),
            outbox,
            weak.clone(),
        ));
        if let Some(age) = inner.options.max_step_age {
            tokio::spawn(sweep(weak.clone(), age));
        }
        let mailbox = Arc::new(Mailbox::new(weak));
        po.register_customer(inner.options.app_id, inner.options.customer_id, mailbox)
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

/// The live steps and the recently cleaned ones.
#[derive(Default)]
pub(crate) struct Steps {
    live: HashMap<i64, Arc<RemoteRendezvous>>,
    /// Live steps by incarnation, i.e. in creation order.
    by_age: BTreeMap<u64, i64>,
    /// Recently cleaned step ids, with how many times each is in `cleaned_order`.
    cleaned: HashMap<i64, u32>,
    cleaned_order: VecDeque<i64>,
}

impl Steps {
    fn remove(&mut self, step_id: i64) -> Option<Arc<RemoteRendezvous>> {
        let step = self.live.remove(&step_id)?;
        self.by_age.remove(&step.incarnation());
        *self.cleaned.entry(step_id).or_default() += 1;
        self.cleaned_order.push_back(step_id);
        while self.cleaned_order.len() > RECENTLY_CLEANED {
            let Some(old) = self.cleaned_order.pop_front() else {
                break;
            };
            if let Some(count) = self.cleaned.get_mut(&old) {
                *count -= 1;
                if *count == 0 {
                    self.cleaned.remove(&old);
                }
            }
        }
        Some(step)
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

/// The manager's state, shared with its steps (which hold it weakly), its sender task and
/// its postoffice mailbox.
pub(crate) struct MgrInner {
    pub(crate) po: Postoffice,
    pub(crate) me: NodeId,
    /// The tasks of the cluster (the node table, fixed once the postoffice has started).
    tasks: HashSet<NodeId>,
    pub(crate) options: Options,
    pub(crate) steps: Mutex<Steps>,
    /// This task's receives waiting for a RecvTensor response, by request id.
    pub(crate) pulls: Mutex<HashMap<ps::RequestId, PendingPull>>,
    /// Requests from other tasks waiting for a value here, by (requester, request id).
    pub(crate) served: Mutex<HashMap<(NodeId, ps::RequestId), Served>>,
    pub(crate) next_request: AtomicI32,
    next_incarnation: AtomicU64,
    pub(crate) outbox: Arc<Outbox>,
    /// Set when the local postoffice stopped: every step is aborted with it.
    pub(crate) stopped: Mutex<Option<RendezvousError>>,
}

impl MgrInner {
    /// The tasks of `key`'s devices.
    pub(crate) fn route(&self, key: &ParsedKey) -> Result<Route, RendezvousError> {
        let task = |device: &str, which: &str| {
            let node = (self.options.resolver)(device).ok_or_else(|| {
                RendezvousError::InvalidArgument(format!(
                    "no task owns the {which} device `{device}` of `{key}` (the resolver knows \
                     /job:ps|server|worker/replica:R/task:T names by default)"
                ))
            })?;
            if !self.tasks.contains(&node) {
                return Err(RendezvousError::InvalidArgument(format!(
                    "the {which} device `{device}` of `{key}` belongs to {}, which is not a \
                     task of this cluster",
                    peer_name(node)
                )));
            }
            Ok(node)
        };
        Ok(Route {
            src: task(&key.src_device, "source")?,
            dst: task(&key.dst_device, "destination")?,
        })
    }

    pub(crate) fn find(self: &Arc<Self>, step_id: i64) -> Arc<RemoteRendezvous> {
        let steps = lock(&self.steps);
        if let Some(step) = steps.live.get(&step_id) {
            return Arc::clone(step);
        }
        self.create(steps, step_id)
    }

    /// The step for a message from a peer: `None` if it was cleaned up recently (the message
    /// is late), else found or created (checked and created under one lock, so that a step
    /// cleaned up meanwhile is not brought back).
    pub(crate) fn find_for_peer(self: &Arc<Self>, step_id: i64) -> Option<Arc<RemoteRendezvous>> {
        let steps = lock(&self.steps);
        if let Some(step) = steps.live.get(&step_id) {
            return Some(Arc::clone(step));
        }
        if steps.cleaned.contains_key(&step_id) {
            return None;
        }
        Some(self.create(steps, step_id))
    }

    /// Creates step `step_id`, which is not live. Its id may stay among the recently cleaned
    /// ones: their counts must match `cleaned_order`, and a live step is found before they
    /// are looked at.
    fn create(
        self: &Arc<Self>,
        mut steps: MutexGuard<'_, Steps>,
        step_id: i64,
    ) -> Arc<RemoteRendezvous> {
        let incarnation = self.next_incarnation.fetch_add(1, Ordering::Relaxed);
        let step = Arc::new(RemoteRendezvous::new(
            step_id,
            incarnation,
            Arc::downgrade(self),
        ));
        steps.live.insert(step_id, Arc::clone(&step));
        steps.by_age.insert(incarnation, step_id);
        let evicted = self.evict_locked(&mut steps, StdInstant::now());
        drop(steps);
        for (old, error) in evicted {
            old.start_abort(error);
        }
        if let Some(status) = lock(&self.stopped).clone() {
            step.start_abort(status);
        }
        step
    }

    pub(crate) fn all_live_steps(&self) -> Vec<Arc<RemoteRendezvous>> {
        lock(&self.steps).live.values().cloned().collect()
    }

    pub(crate) fn live_step(&self, step_id: i64) -> Option<Arc<RemoteRendezvous>> {
        lock(&self.steps).live.get(&step_id).cloned()
    }

    /// Removes the steps over the count limit or the age limit; returns them with the error
    /// to abort them with (outside the lock).
    fn evict_locked(
        &self,
        steps: &mut Steps,
        now: StdInstant,
    ) -> Vec<(Arc<RemoteRendezvous>, RendezvousError)> {
        let mut evicted = Vec::new();
        let max = self.options.max_steps;
        while steps.live.len() > max {
            let Some((_, step_id)) = steps.by_age.first_key_value().map(|(k, v)| (*k, *v)) else {
                break;
            };
            let Some(step) = steps.remove(step_id) else {
                break;
            };
            let error = RendezvousError::Aborted(format!(
                "step {step_id} aborted on node {}: it was never cleaned up and more than \
                 {max} steps were live (RendezvousMgrBuilder::max_steps); call \
                 RendezvousMgr::cleanup(step_id) when a step ends",
                self.me
            ));
            evicted.push((step, error));
        }
        if let Some(max_age) = self.options.max_step_age {
            while let Some(step_id) = steps.by_age.first_key_value().map(|(_, v)| *v) {
                let Some(step) = steps.live.get(&step_id) else {
                    break;
                };
                let age = now.saturating_duration_since(step.created());
                if age <= max_age {
                    break;
                }
                let Some(step) = steps.remove(step_id) else {
                    break;
                };
                let error = RendezvousError::Aborted(format!(
                    "step {step_id} aborted on node {}: it was created {:.1} s ago and never \
                     cleaned up (RendezvousMgrBuilder::max_step_age is {:.1} s); call \
                     RendezvousMgr::cleanup(step_id) when a step ends",
                    self.me,
                    age.as_secs_f64(),
                    max_age.as_secs_f64()
                ));
                evicted.push((step, error));
            }
        }
        evicted
    }

    pub(crate) fn evict(&self, now: StdInstant) {
        let evicted = self.evict_locked(&mut lock(&self.steps), now);
        for (step, error) in evicted {
            warn!("{error}");
            step.start_abort(error);
        }
    }

    /// Aborts every step with `status` (the postoffice stopped, or the manager is going).
    pub(crate) fn shut_down(&self, status: RendezvousError) {
        lock(&self.stopped).get_or_insert(status.clone());
        let steps: Vec<Arc<RemoteRendezvous>> = {
            let mut steps = lock(&self.steps);
            let ids: Vec<i64> = steps.live.keys().copied().collect();
            ids.into_iter().filter_map(|id| steps.remove(id)).collect()
        };
        for step in steps {
            step.start_abort(status.clone());
        }
        let pulls: Vec<PendingPull> = lock(&self.pulls).drain().map(|(_, p)| p).collect();
        for pull in pulls {
            pull.done.complete(Err(status.clone()));
        }
        lock(&self.served).clear();
    }

    /// The error for a call on `key` of `step_id` that `peer` can no longer answer.
    pub(crate) fn remote_error(
        &self,
        step_id: i64,
        key: &str,
        peer: NodeId,
        reason: String,
    ) -> RendezvousError {
        RendezvousError::Remote {
            step_id,
            key: key.to_owned(),
            peer: peer_name(peer),
            reason,
        }
    }

    /// Why `peer` is known to be dead, if it is.
    pub(crate) fn peer_dead(&self, peer: NodeId) -> Option<String> {
        self.po.dead_error(peer).map(|e| e.to_string())
    }
}

impl Drop for MgrInner {
    fn drop(&mut self) {
        self.outbox.close();
        self.shut_down(RendezvousError::Aborted(format!(
            "the rendezvous manager of node {} was dropped",
            self.me
        )));
    }
}

/// `node 9 (worker)`: how errors name a peer.
pub(crate) fn peer_name(node: NodeId) -> String {
    let role = node_ids::role_of(node).map_or("group", |r| r.as_str());
    format!("node {node} ({role})")
}

/// The rendezvous manager of one task: the step-keyed table of [`RemoteRendezvous`], as
/// TensorFlow's `RendezvousMgrInterface`, reaching the other tasks through the node's
/// [`Postoffice`] (so over whichever van connects each pair: TCP, shared memory, …). Cheap
/// to clone (all clones are the same manager); dropping the last clone aborts every step.
///
/// ```
/// use bytes::Bytes;
/// use ps::local::LocalCluster;
/// use ps::Role;
/// use rendezvous::device::cpu_device;
/// use rendezvous::{create_key, parse_key, Protocol, Rendezvous, RendezvousMgr};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // One server (node 8) and one worker (node 9): the worker sends, the server receives.
/// LocalCluster::new(1, 1)
///     .run(|po| async move {
///         let mgr = RendezvousMgr::new(&po, Protocol::Pull).await.map_err(|e| ps::PsError::InvalidArgument(e.to_string()))?;
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
                resolver: default_resolver(),
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
        let step = lock(&self.inner.steps).remove(step_id);
        if let Some(step) = step {
            step.start_abort(RendezvousError::Aborted(format!(
                "step {step_id} was cleaned up on node {}",
                self.inner.me
            )));
        }
    }

    /// [`cleanup`](Self::cleanup) of every live step.
    pub fn cleanup_all(&self) {
        let steps: Vec<Arc<RemoteRendezvous>> = {
            let mut steps = lock(&self.inner.steps);
            let ids: Vec<i64> = steps.live.keys().copied().collect();
            ids.into_iter().filter_map(|id| steps.remove(id)).collect()
        };
        for step in steps {
            step.start_abort(RendezvousError::Aborted(format!(
                "step {} was cleaned up on node {} (cleanup_all)",
                step.step_id(),
                self.inner.me
            )));
        }
    }

    /// The steps created and not yet cleaned up, sorted.
    pub fn live_steps(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = lock(&self.inner.steps).live.keys().copied().collect();
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

    /// Counters for diagnostics and tests.
    pub fn stats(&self) -> MgrStats {
        MgrStats {
            live_steps: lock(&self.inner.steps).live.len(),
            pending_pulls: lock(&self.inner.pulls).len(),
            served_requests: lock(&self.inner.served).len(),
            outbox_bytes: self.inner.outbox.bytes(),
        }
    }
}
