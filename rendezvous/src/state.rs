//! The manager's shared state, [`MgrInner`]: its options, the step table with its bounds
//! (count and age), the tables of requests in flight both ways, and the outbox.
//!
//! This is the layer both sides of the manager build on: the public manager (`mgr`) creates
//! it and looks steps up, the wire side (`transport`) fills and answers its request tables.
//! It knows neither of them. Steps hold it weakly, and only through
//! [`StepHost`](crate::remote::StepHost), so that dropping the manager aborts them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant as StdInstant};

use node::Postoffice;
use tracing::warn;
use van_core::{NodeId, ParsedKey, Rendezvous, RendezvousError, Role};

use crate::device::{table_resolver, DeviceResolver};
use crate::error::peer_name;
use crate::local::Done;
use crate::outbox::Outbox;
use crate::protocol::Protocol;
use crate::remote::{RemoteRendezvous, Route, TicketCell};
use crate::sync::lock;

/// Step ids remembered after their cleanup, so that late requests and values for them are
/// answered with an error instead of re-creating the step.
pub(crate) const RECENTLY_CLEANED: usize = 4096;

/// The manager's options, set through [`RendezvousMgrBuilder`](crate::RendezvousMgrBuilder).
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) protocol: Protocol,
    pub(crate) app_id: i32,
    pub(crate) customer_id: i32,
    pub(crate) max_steps: usize,
    pub(crate) max_step_age: Option<Duration>,
    pub(crate) max_outbox_bytes: usize,
    pub(crate) max_deferred_calls: usize,
    /// `None`: [`table_resolver`] of the node table.
    pub(crate) resolver: Option<DeviceResolver>,
}

/// The live steps and the recently cleaned ones.
#[derive(Default)]
struct Steps {
    live: HashMap<i64, Arc<RemoteRendezvous>>,
    /// Live steps by incarnation, i.e. in creation order.
    by_age: BTreeMap<u64, i64>,
    /// Recently cleaned step ids, with how many times each is in `cleaned_order`.
    cleaned: HashMap<i64, u32>,
    cleaned_order: VecDeque<i64>,
    /// Steps the limits never end ([`MgrInner::pin`]), live or not yet: kept out of
    /// `by_age`.
    pinned: HashSet<i64>,
}

impl Steps {
    fn remove(&mut self, step_id: i64) -> Option<Arc<RemoteRendezvous>> {
        // Ending a step ends its pin (the limits never end a pinned one).
        self.pinned.remove(&step_id);
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

    /// Removes every live step.
    fn remove_all(&mut self) -> Vec<Arc<RemoteRendezvous>> {
        let ids: Vec<i64> = self.live.keys().copied().collect();
        ids.into_iter().filter_map(|id| self.remove(id)).collect()
    }
}

/// A receive of this task waiting for a RecvTensor response.
pub(crate) struct PendingPull {
    pub(crate) step_id: i64,
    pub(crate) incarnation: u64,
    pub(crate) key: String,
    pub(crate) peer: NodeId,
    pub(crate) done: Done,
}

/// A request from another task waiting for a value here.
pub(crate) struct Served {
    pub(crate) step_id: i64,
    pub(crate) step: Weak<RemoteRendezvous>,
    pub(crate) ticket: TicketCell,
}

/// The manager's state, shared with its steps (which hold it weakly), its sender task and
/// its postoffice customer.
pub(crate) struct MgrInner {
    pub(crate) po: Postoffice,
    pub(crate) me: NodeId,
    /// The tasks of the cluster (the node table, fixed once the postoffice has started).
    pub(crate) tasks: HashSet<NodeId>,
    /// How device names map to tasks.
    resolver: DeviceResolver,
    pub(crate) options: Options,
    steps: Mutex<Steps>,
    /// This task's receives waiting for a RecvTensor response, by request id.
    pub(crate) pulls: Mutex<HashMap<node::RequestId, PendingPull>>,
    /// Requests from other tasks waiting for a value here, by (requester, request id).
    pub(crate) served: Mutex<HashMap<(NodeId, node::RequestId), Served>>,
    pub(crate) next_request: AtomicI32,
    next_incarnation: AtomicU64,
    pub(crate) outbox: Arc<Outbox>,
    /// Set when the local postoffice stopped: every step is aborted with it.
    stopped: Mutex<Option<RendezvousError>>,
    /// Tasks whose manager said goodbye (it was dropped), with why: calls towards them fail
    /// at once. At most one entry per task.
    pub(crate) gone: Mutex<HashMap<NodeId, String>>,
}

impl MgrInner {
    /// The state of a manager on `po`'s node, with no step yet, sending through `outbox`.
    pub(crate) fn new(po: Postoffice, options: Options, outbox: Arc<Outbox>) -> MgrInner {
        let me = po.my_id();
        let tasks = po
            .nodes()
            .iter()
            .filter(|n| n.role != Role::Scheduler)
            .filter_map(|n| n.id)
            .chain(std::iter::once(me))
            .collect();
        let resolver = options
            .resolver
            .clone()
            .unwrap_or_else(|| table_resolver(po.nodes()));
        MgrInner {
            po,
            me,
            tasks,
            resolver,
            options,
            steps: Mutex::new(Steps::default()),
            pulls: Mutex::new(HashMap::new()),
            served: Mutex::new(HashMap::new()),
            next_request: AtomicI32::new(1),
            next_incarnation: AtomicU64::new(1),
            outbox,
            stopped: Mutex::new(None),
            gone: Mutex::new(HashMap::new()),
        }
    }

    /// The tasks of `key`'s devices.
    pub(crate) fn route(&self, key: &ParsedKey) -> Result<Route, RendezvousError> {
        let task = |device: &str, which: &str| {
            let node = (self.resolver)(device).ok_or_else(|| {
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
        // The step reaches the manager through `StepHost`, weakly.
        let host: Weak<MgrInner> = Arc::downgrade(self);
        let step = Arc::new(RemoteRendezvous::new(step_id, incarnation, host));
        steps.live.insert(step_id, Arc::clone(&step));
        if !steps.pinned.contains(&step_id) {
            steps.by_age.insert(incarnation, step_id);
        }
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

    /// Exempts step `step_id` from the count and age limits, now or, if it is not live yet,
    /// once it is created, until a cleanup (or the manager's end) ends it and its pin.
    pub(crate) fn pin(&self, step_id: i64) {
        let mut steps = lock(&self.steps);
        steps.pinned.insert(step_id);
        if let Some(incarnation) = steps.live.get(&step_id).map(|step| step.incarnation()) {
            steps.by_age.remove(&incarnation);
        }
    }

    pub(crate) fn all_live_steps(&self) -> Vec<Arc<RemoteRendezvous>> {
        lock(&self.steps).live.values().cloned().collect()
    }

    pub(crate) fn live_step(&self, step_id: i64) -> Option<Arc<RemoteRendezvous>> {
        lock(&self.steps).live.get(&step_id).cloned()
    }

    /// The ids of the live steps, in no order.
    pub(crate) fn live_step_ids(&self) -> Vec<i64> {
        lock(&self.steps).live.keys().copied().collect()
    }

    /// How many steps are live.
    pub(crate) fn live_step_count(&self) -> usize {
        lock(&self.steps).live.len()
    }

    /// Removes step `step_id` (remembered as recently cleaned), if it is live.
    pub(crate) fn remove_step(&self, step_id: i64) -> Option<Arc<RemoteRendezvous>> {
        lock(&self.steps).remove(step_id)
    }

    /// Removes every live step (each remembered as recently cleaned).
    pub(crate) fn remove_all_steps(&self) -> Vec<Arc<RemoteRendezvous>> {
        lock(&self.steps).remove_all()
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
        // Pinned steps are not counted (`by_age` holds every live step but those).
        while steps.by_age.len() > max {
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
        let steps = self.remove_all_steps();
        for step in steps {
            step.start_abort(status.clone());
        }
        let pulls: Vec<PendingPull> = lock(&self.pulls).drain().map(|(_, p)| p).collect();
        for pull in pulls {
            pull.done.complete(Err(status.clone()));
        }
        lock(&self.served).clear();
    }

    /// Why `peer` cannot answer, if it is known to be dead or its manager said goodbye.
    pub(crate) fn peer_dead(&self, peer: NodeId) -> Option<String> {
        match self.po.dead_error(peer) {
            Some(e) => Some(e.to_string()),
            None => lock(&self.gone).get(&peer).cloned(),
        }
    }
}
