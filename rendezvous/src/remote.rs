//! [`RemoteRendezvous`]: one step's rendezvous on one task, reaching the other tasks of the
//! cluster through the manager (TensorFlow's `BaseRemoteRendezvous`).
//!
//! Where a call goes depends on the key's devices (resolved to tasks by the manager's
//! [`DeviceResolver`](crate::device::DeviceResolver)) and the manager's
//! [`Protocol`]:
//!
//! | call | source device on this task | source device on another task |
//! | --- | --- | --- |
//! | `send` (pull) | into this task's table | rejected: a task sends only what it produces |
//! | `send` (push) | into this task's table, or straight to the destination's task | rejected |
//! | `recv` (pull) | from this task's table | RecvTensor request to the source's task |
//! | `recv` (push) | from this task's table | from this task's table, where the producer pushes it |
//!
//! Two-phase construction as in TensorFlow: the manager creates a step's rendezvous on first
//! use — possibly for a peer's request that arrives before this task has heard of the step —
//! and every call made before [`initialize`](RemoteRendezvous::initialize) is queued, then
//! run in order when it is called.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant as StdInstant;

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, warn};
use van_core::rendezvous::Received;
use van_core::rendezvous::{DoneCallback, RecvFuture};
use van_core::{NodeId, ParsedKey, Rendezvous, RendezvousError};

use crate::error::remote_error;
use crate::local::{Done, LocalRendezvous, WaiterId, PRUNE_FROM};
use crate::protocol::Protocol;
use crate::sync::lock;

/// What a step needs of its manager: the manager's options, where a key's tasks are, and the
/// wire (pushes, pulls and their withdrawal). Steps hold it weakly, so that dropping the
/// manager aborts them. The manager's shared state implements it (in `transport`), so this
/// module depends on neither.
pub(crate) trait StepHost: Send + Sync {
    /// This task.
    fn me(&self) -> NodeId;
    /// Pull or push.
    fn protocol(&self) -> Protocol;
    /// How many calls a step may queue before it is initialized.
    fn max_deferred_calls(&self) -> usize;
    /// The tasks of `key`'s devices.
    fn route(&self, key: &ParsedKey) -> Result<Route, RendezvousError>;
    /// Why `peer` is known to be dead, if it is.
    fn peer_dead(&self, peer: NodeId) -> Option<String>;
    /// Push mode: sends the value of `key` of `step` to its consumer `dst`.
    fn push(
        &self,
        step: &RemoteRendezvous,
        key: &ParsedKey,
        value: Received,
        dst: NodeId,
    ) -> Result<(), RendezvousError>;
    /// Pull mode: asks `src` for the value of `key` of `step`; `done` gets the answer, and
    /// `ticket` tracks the request so that it can be withdrawn.
    fn pull(
        &self,
        step: &RemoteRendezvous,
        key: &ParsedKey,
        src: NodeId,
        done: Done,
        ticket: Option<&TicketCell>,
    );
    /// Withdraws pull `request` (telling its owner), completing it with `error`; false if it
    /// was no longer pending.
    fn cancel_pull(&self, request: node::RequestId, error: RendezvousError) -> bool;
    /// Withdraws every pull of the step `step_id` in its `incarnation`, failing them with
    /// `status`.
    fn abort_pulls(&self, step_id: i64, incarnation: u64, status: &RendezvousError);
}

/// Where a cancellable receive is waiting, so that a deadline, a cancel from the requester or
/// a dead peer can withdraw it. Moves only forward: `Pending` → (`Deferred` → `Pending`, when
/// queued until initialize) → `Local`/`Remote` → `Finished`, or to `Cancelled` when a cancel
/// arrives while the receive is being placed (whoever places it then withdraws it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ticket {
    /// Being placed.
    Pending,
    /// Queued until the step is initialized, with this sequence number.
    Deferred(u64),
    /// Waiting in the step's local table.
    Local { key: String, waiter: WaiterId },
    /// Waiting for a RecvTensor response.
    Remote(node::RequestId),
    /// Answered, or withdrawn.
    Finished,
    /// Withdrawn while being placed, with this error.
    Cancelled(RendezvousError),
}

/// A shared [`Ticket`].
pub(crate) type TicketCell = Arc<Mutex<Ticket>>;

pub(crate) fn new_ticket() -> TicketCell {
    Arc::new(Mutex::new(Ticket::Pending))
}

/// A call made before the step was initialized.
enum Deferred {
    Send {
        key: ParsedKey,
        value: Received,
        route: Route,
    },
    Recv {
        key: ParsedKey,
        done: Done,
        ticket: Option<TicketCell>,
        route: Route,
    },
    RecvLocal {
        key: ParsedKey,
        done: Done,
        ticket: Option<TicketCell>,
    },
    Pushed {
        key: ParsedKey,
        value: Received,
    },
}

impl Deferred {
    fn ticket(&self) -> Option<&TicketCell> {
        match self {
            Deferred::Recv { ticket, .. } | Deferred::RecvLocal { ticket, .. } => ticket.as_ref(),
            _ => None,
        }
    }

    fn fail(self, error: RendezvousError) {
        match self {
            Deferred::Recv { done, ticket, .. } | Deferred::RecvLocal { done, ticket, .. } => {
                if let Some(ticket) = ticket {
                    *lock(&ticket) = Ticket::Finished;
                }
                done.complete(Err(error));
            }
            Deferred::Send { .. } | Deferred::Pushed { .. } => {}
        }
    }
}

/// Where the tasks of a key are, relative to this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    /// The task producing the value.
    pub(crate) src: NodeId,
    /// The task consuming it.
    pub(crate) dst: NodeId,
}

/// A receive in push mode waiting for a value from another task: failed if that task dies.
struct Watched {
    peer: NodeId,
    key: String,
    ticket: TicketCell,
}

#[derive(Default)]
struct StepState {
    /// `initialize` has started: later calls to it return at once.
    initializing: bool,
    /// `initialize` has finished: calls run directly.
    ready: bool,
    aborted: Option<RendezvousError>,
    deferred: VecDeque<(u64, Deferred)>,
    next_deferred: u64,
    watched: Vec<Watched>,
}

/// The rendezvous of one step on this task, from [`RendezvousMgr::find`](crate::RendezvousMgr::find).
///
/// Implements [`Rendezvous`]: `send` never blocks, `recv_async` calls its callback exactly
/// once, `start_abort` fails every pending and later call of the step — including receives
/// waiting on other tasks, whose requests are withdrawn. A peer that dies fails the receives
/// waiting on it with [`RendezvousError::Remote`] naming the step, the key and the peer.
pub struct RemoteRendezvous {
    step_id: i64,
    /// Distinguishes this rendezvous from an earlier one of the same step id (cleaned up,
    /// then found again).
    incarnation: u64,
    created: StdInstant,
    mgr: Weak<dyn StepHost>,
    local: LocalRendezvous,
    state: Mutex<StepState>,
}

impl std::fmt::Debug for RemoteRendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("RemoteRendezvous")
            .field("step_id", &self.step_id)
            .field("initialized", &state.ready)
            .field("deferred", &state.deferred.len())
            .field("aborted", &state.aborted)
            .finish_non_exhaustive()
    }
}

impl RemoteRendezvous {
    pub(crate) fn new(step_id: i64, incarnation: u64, mgr: Weak<dyn StepHost>) -> RemoteRendezvous {
        RemoteRendezvous {
            step_id,
            incarnation,
            created: StdInstant::now(),
            mgr,
            local: LocalRendezvous::new(),
            state: Mutex::new(StepState::default()),
        }
    }

    /// The step this rendezvous belongs to.
    pub fn step_id(&self) -> i64 {
        self.step_id
    }

    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    pub(crate) fn created(&self) -> StdInstant {
        self.created
    }

    /// This task's table for the step (values sent here, or pushed here, not yet received).
    pub fn local(&self) -> &LocalRendezvous {
        &self.local
    }

    /// Whether [`initialize`](Self::initialize) has finished.
    pub fn is_initialized(&self) -> bool {
        lock(&self.state).ready
    }

    /// Number of calls queued until [`initialize`](Self::initialize).
    pub fn deferred_calls(&self) -> usize {
        lock(&self.state).deferred.len()
    }

    /// The abort status, once the step was aborted (by [`start_abort`](Rendezvous::start_abort),
    /// a cleanup, an eviction or the postoffice stopping).
    pub fn status(&self) -> Option<RendezvousError> {
        lock(&self.state).aborted.clone()
    }

    /// Completes the two-phase construction: runs, in the order they were made, every call
    /// queued since the step was created (sends, receives, and requests or values from other
    /// tasks), then lets calls run directly. Calling it again is harmless. Fails with the
    /// abort status if the step was aborted first.
    pub fn initialize(&self) -> Result<(), RendezvousError> {
        {
            let mut state = lock(&self.state);
            if let Some(status) = &state.aborted {
                return Err(status.clone());
            }
            if state.initializing {
                return Ok(());
            }
            state.initializing = true;
        }
        loop {
            let batch: Vec<Deferred> = {
                let mut state = lock(&self.state);
                if state.deferred.is_empty() {
                    state.ready = true;
                    break;
                }
                let batch: Vec<Deferred> = state.deferred.drain(..).map(|(_, d)| d).collect();
                for call in &batch {
                    if let Some(ticket) = call.ticket() {
                        let mut ticket = lock(ticket);
                        if matches!(*ticket, Ticket::Deferred(_)) {
                            *ticket = Ticket::Pending;
                        }
                    }
                }
                batch
            };
            for call in batch {
                self.replay(call);
            }
        }
        Ok(())
    }

    fn replay(&self, call: Deferred) {
        match call {
            Deferred::Send { key, value, route } => {
                if let Err(e) = self.run_send(&key, value, route) {
                    // The caller was told Ok when it queued the send; the step cannot finish
                    // correctly without the value, so it fails as a whole.
                    warn!(
                        step = self.step_id,
                        "a send queued before initialize failed: {e}"
                    );
                    self.start_abort(e);
                }
            }
            Deferred::Recv {
                key,
                done,
                ticket,
                route,
            } => self.run_recv(&key, done, ticket.as_ref(), route),
            Deferred::RecvLocal { key, done, ticket } => {
                self.place_local(&key, done, ticket.as_ref())
            }
            Deferred::Pushed { key, value } => self.run_pushed(&key, value),
        }
    }

    /// Runs `call` now if the step is ready (returns it), queues it if not (returns `None`),
    /// or fails it (receives get the error through their `done`) and returns the error: the
    /// step was aborted, the manager is gone, or too many calls are queued already.
    fn gate(&self, call: Deferred) -> Result<Option<Deferred>, RendezvousError> {
        // Read before taking the lock: the manager must never be dropped (which aborts this
        // step, taking the lock) while the lock is held.
        let limit = self.mgr.upgrade().map(|m| m.max_deferred_calls());
        let mut state = lock(&self.state);
        let error = if let Some(status) = state.aborted.clone() {
            status
        } else if state.ready {
            return Ok(Some(call));
        } else if let Some(limit) = limit.filter(|limit| state.deferred.len() >= *limit) {
            RendezvousError::Aborted(format!(
                "step {}: {limit} calls are already queued waiting for initialize \
                 (RendezvousMgrBuilder::max_deferred_calls); call RemoteRendezvous::initialize",
                self.step_id
            ))
        } else if limit.is_none() {
            RendezvousError::Aborted(format!(
                "step {}: the rendezvous manager was dropped",
                self.step_id
            ))
        } else {
            let seq = state.next_deferred;
            state.next_deferred += 1;
            if let Some(ticket) = call.ticket() {
                *lock(ticket) = Ticket::Deferred(seq);
            }
            state.deferred.push_back((seq, call));
            return Ok(None);
        };
        drop(state);
        call.fail(error.clone());
        Err(error)
    }

    fn manager(&self) -> Result<Arc<dyn StepHost>, RendezvousError> {
        self.mgr.upgrade().ok_or_else(|| {
            RendezvousError::Aborted(format!(
                "step {}: the rendezvous manager was dropped",
                self.step_id
            ))
        })
    }

    /// Where `key`'s tasks are, checking that this task may make `call` with it.
    fn route(&self, key: &ParsedKey) -> Result<(Arc<dyn StepHost>, Route), RendezvousError> {
        let mgr = self.manager()?;
        let route = mgr.route(key)?;
        Ok((mgr, route))
    }

    fn run_send(
        &self,
        key: &ParsedKey,
        value: Received,
        route: Route,
    ) -> Result<(), RendezvousError> {
        let mgr = self.manager()?;
        if mgr.protocol() == Protocol::Push && route.dst != mgr.me() {
            return mgr.push(self, key, value, route.dst);
        }
        self.local.send_str(key.full_key(), value)
    }

    fn run_recv(&self, key: &ParsedKey, done: Done, ticket: Option<&TicketCell>, route: Route) {
        let mgr = match self.manager() {
            Ok(mgr) => mgr,
            Err(e) => return finish(done, ticket, Err(e)),
        };
        if route.src == mgr.me() {
            return self.place_local(key, done, ticket);
        }
        match mgr.protocol() {
            Protocol::Pull => mgr.pull(self, key, route.src, done, ticket),
            Protocol::Push => {
                // The producer pushes into this table; watch for it dying meanwhile.
                let ticket = ticket.cloned().unwrap_or_else(new_ticket);
                self.place_local(key, done, Some(&ticket));
                if !matches!(*lock(&ticket), Ticket::Local { .. }) {
                    return; // answered at once, or failed
                }
                {
                    let mut state = lock(&self.state);
                    // Answered receives leave their entry behind: drop those at each doubling
                    // from PRUNE_FROM, so that a long step keeps about as many entries as it
                    // has receives waiting.
                    let watched = &mut state.watched;
                    if watched.len() >= PRUNE_FROM && watched.len().is_power_of_two() {
                        watched.retain(|w| self.still_waiting(&w.ticket));
                    }
                    watched.push(Watched {
                        peer: route.src,
                        key: key.full_key().to_owned(),
                        ticket: Arc::clone(&ticket),
                    });
                }
                if let Some(reason) = mgr.peer_dead(route.src) {
                    let error = remote_error(self.step_id, key.full_key(), route.src, reason);
                    self.cancel(&ticket, error);
                }
            }
        }
    }

    /// Whether the receive `ticket` tracks may still be waiting (lock order: the step's
    /// state, then a ticket, then the local table).
    fn still_waiting(&self, ticket: &TicketCell) -> bool {
        match &*lock(ticket) {
            Ticket::Local { key, waiter } => self.local.is_waiting(key, *waiter),
            Ticket::Finished | Ticket::Cancelled(_) => false,
            Ticket::Pending | Ticket::Deferred(_) | Ticket::Remote(_) => true,
        }
    }

    /// Queues a receive in the local table and records where it waits.
    fn place_local(&self, key: &ParsedKey, done: Done, ticket: Option<&TicketCell>) {
        let waiter = self.local.recv_waiter(key.full_key(), done);
        let Some(ticket) = ticket else {
            return;
        };
        let mut cell = lock(ticket);
        if let Ticket::Cancelled(error) = &*cell {
            let error = error.clone();
            *cell = Ticket::Finished;
            drop(cell);
            if let Some(waiter) = waiter {
                self.local.cancel_waiter(key.full_key(), waiter, error);
            }
            return;
        }
        *cell = match waiter {
            Some(waiter) => Ticket::Local {
                key: key.full_key().to_owned(),
                waiter,
            },
            None => Ticket::Finished,
        };
    }

    fn run_pushed(&self, key: &ParsedKey, value: Received) {
        if let Err(e) = self.local.send_str(key.full_key(), value) {
            debug!(step = self.step_id, "pushed value for `{key}` dropped: {e}");
        }
    }

    /// A value another task pushed into this step (push mode).
    pub(crate) fn deliver_pushed(&self, key: ParsedKey, value: Received) {
        match self.gate(Deferred::Pushed { key, value }) {
            Ok(Some(Deferred::Pushed { key, value })) => self.run_pushed(&key, value),
            Ok(_) => {}
            Err(error) => {
                // The value cannot be refused to its sender any more, and the receive waiting
                // for it would wait forever: the step fails instead (a no-op if it had).
                if self.status().is_none() {
                    warn!(
                        step = self.step_id,
                        "a value pushed by a peer dropped: {error}"
                    );
                    self.start_abort(error);
                }
            }
        }
    }

    /// Receives `key` from this task's own table, for a request from another task (TF's
    /// `RecvLocalAsync`): queued until [`initialize`](Self::initialize), rejected when the
    /// key's source device is not on this task.
    pub fn recv_local_async(&self, key: &ParsedKey, done: DoneCallback) {
        self.recv_local_internal(key, Done::Callback(done), None);
    }

    pub(crate) fn recv_local_internal(
        &self,
        key: &ParsedKey,
        done: Done,
        ticket: Option<&TicketCell>,
    ) {
        let route = self.route(key).and_then(|(mgr, route)| {
            if route.src == mgr.me() {
                Ok(route)
            } else {
                Err(RendezvousError::InvalidArgument(format!(
                    "step {}: a local receive of `{key}` on node {}, but its source device \
                     is on node {}",
                    self.step_id,
                    mgr.me(),
                    route.src
                )))
            }
        });
        if let Err(e) = route {
            return finish(done, ticket, Err(e));
        }
        let call = Deferred::RecvLocal {
            key: key.clone(),
            done,
            ticket: ticket.cloned(),
        };
        if let Ok(Some(Deferred::RecvLocal { key, done, ticket })) = self.gate(call) {
            self.place_local(&key, done, ticket.as_ref());
        }
    }

    pub(crate) fn recv_internal(&self, key: &ParsedKey, done: Done, ticket: Option<&TicketCell>) {
        let route = match self.route(key) {
            Ok((mgr, route)) if route.dst != mgr.me() => {
                Err(RendezvousError::InvalidArgument(format!(
                    "step {}: node {} receives `{key}`, but its destination device is on node {}",
                    self.step_id,
                    mgr.me(),
                    route.dst
                )))
            }
            Ok((_, route)) => Ok(route),
            Err(e) => Err(e),
        };
        let route = match route {
            Ok(route) => route,
            Err(e) => return finish(done, ticket, Err(e)),
        };
        let call = Deferred::Recv {
            key: key.clone(),
            done,
            ticket: ticket.cloned(),
            route,
        };
        if let Ok(Some(Deferred::Recv {
            key,
            done,
            ticket,
            route,
        })) = self.gate(call)
        {
            self.run_recv(&key, done, ticket.as_ref(), route);
        }
    }

    /// Receives `key`, failing with [`RendezvousError::DeadlineExceeded`] if no value arrives
    /// before `deadline` (`None`: no deadline). A receive that expires is withdrawn: from
    /// this task's table, or from the owner's (pull: a cancel is sent), so that it does not
    /// consume a later value.
    pub async fn recv_with_deadline(
        &self,
        key: &ParsedKey,
        deadline: Option<Instant>,
    ) -> Result<Received, RendezvousError> {
        let (tx, mut rx) = oneshot::channel();
        let Some(deadline) = deadline else {
            self.recv_internal(key, Done::Channel(tx), None);
            return rx.await.unwrap_or_else(|_| Err(dropped(key)));
        };
        let ticket = new_ticket();
        self.recv_internal(key, Done::Channel(tx), Some(&ticket));
        match tokio::time::timeout_at(deadline, &mut rx).await {
            Ok(result) => result.unwrap_or_else(|_| Err(dropped(key))),
            Err(_) => {
                let expired = RendezvousError::DeadlineExceeded {
                    key: key.full_key().to_owned(),
                };
                // Withdrawn here, or answered by whoever took it first (a response that just
                // arrived, an abort, a dead peer), which completes it at once: wait for that
                // rather than peek, or a value taken just before the withdrawal is lost.
                self.cancel(&ticket, expired.clone());
                rx.await.unwrap_or(Err(expired))
            }
        }
    }

    /// Withdraws the receive `ticket` tracks, completing it with `error`. Returns false if it
    /// had already been answered.
    pub(crate) fn cancel(&self, ticket: &TicketCell, error: RendezvousError) -> bool {
        // Each retry follows a forward move of the ticket, of which there are at most four.
        for _ in 0..8 {
            let current = {
                let mut cell = lock(ticket);
                match &*cell {
                    Ticket::Finished | Ticket::Cancelled(_) => return false,
                    Ticket::Pending => {
                        *cell = Ticket::Cancelled(error);
                        return true;
                    }
                    other => other.clone(),
                }
            };
            let withdrawn = match &current {
                Ticket::Deferred(seq) => self.cancel_deferred(*seq, error.clone()),
                Ticket::Local { key, waiter } => {
                    self.local.cancel_waiter(key, *waiter, error.clone())
                }
                Ticket::Remote(request) => self
                    .mgr
                    .upgrade()
                    .is_some_and(|m| m.cancel_pull(*request, error.clone())),
                _ => false,
            };
            let mut cell = lock(ticket);
            if withdrawn {
                *cell = Ticket::Finished;
                return true;
            }
            if *cell == current {
                return false; // it was answered meanwhile
            }
        }
        false
    }

    fn cancel_deferred(&self, seq: u64, error: RendezvousError) -> bool {
        let call = {
            let mut state = lock(&self.state);
            let Some(at) = state.deferred.iter().position(|(s, _)| *s == seq) else {
                return false;
            };
            state.deferred.remove(at)
        };
        match call {
            Some((_, call)) => {
                if let Some(ticket) = call.ticket() {
                    *lock(ticket) = Ticket::Pending; // `fail` marks it finished
                }
                call.fail(error);
                true
            }
            None => false,
        }
    }

    /// `peer` died: fails the receives waiting for values it would have pushed.
    pub(crate) fn peer_failed(&self, peer: NodeId, reason: &str) {
        let watched: Vec<Watched> = {
            let mut state = lock(&self.state);
            let (dead, alive): (Vec<Watched>, Vec<Watched>) =
                state.watched.drain(..).partition(|w| w.peer == peer);
            state.watched = alive;
            dead
        };
        for w in watched {
            let error = remote_error(self.step_id, &w.key, peer, reason.to_owned());
            self.cancel(&w.ticket, error);
        }
    }
}

/// Completes `done` and marks its ticket finished.
pub(crate) fn finish(
    done: Done,
    ticket: Option<&TicketCell>,
    result: Result<Received, RendezvousError>,
) {
    if let Some(ticket) = ticket {
        *lock(ticket) = Ticket::Finished;
    }
    done.complete(result);
}

fn dropped(key: &ParsedKey) -> RendezvousError {
    RendezvousError::Aborted(format!(
        "the rendezvous dropped the receive of `{}` without answering",
        key.full_key()
    ))
}

impl Rendezvous for RemoteRendezvous {
    /// Makes `value` available under `key`, whose source device must be on this task.
    /// Pull: into this task's table, where the consumer's request finds it. Push: straight
    /// to the destination's task (or this table, when the destination is here). Never
    /// blocks; before [`initialize`](RemoteRendezvous::initialize) the send is queued.
    fn send(&self, key: &ParsedKey, value: Bytes, is_dead: bool) -> Result<(), RendezvousError> {
        let value = Received {
            value,
            is_dead,
            header: Bytes::new(),
        };
        self.send_received(key, value)
    }

    fn recv_async(&self, key: &ParsedKey, done: DoneCallback) {
        self.recv_internal(key, Done::Callback(done), None);
    }

    /// Aborts the step on this task: queued calls, waiting receives (local, and remote ones,
    /// whose requests are withdrawn) and later calls fail with the first abort's status.
    fn start_abort(&self, error: RendezvousError) {
        let (status, deferred) = {
            let mut state = lock(&self.state);
            let status = state.aborted.get_or_insert(error).clone();
            state.watched.clear();
            let deferred: Vec<Deferred> = state.deferred.drain(..).map(|(_, d)| d).collect();
            (status, deferred)
        };
        for call in deferred {
            call.fail(status.clone());
        }
        self.local.start_abort(status.clone());
        if let Some(mgr) = self.mgr.upgrade() {
            mgr.abort_pulls(self.step_id, self.incarnation, &status);
        }
    }

    /// As the trait's; a dropped future gives up its place in this task's table (a pull's
    /// request stays with the owner: use [`recv_with_deadline`](RemoteRendezvous::recv_with_deadline)
    /// to bound a wait and withdraw it).
    fn recv(&self, key: &ParsedKey) -> RecvFuture {
        let (tx, rx) = oneshot::channel();
        self.recv_internal(key, Done::Channel(tx), None);
        RecvFuture::new(key.full_key(), rx)
    }
}

impl RemoteRendezvous {
    /// [`send`](Rendezvous::send) of a value with its header ([`Received::header`]), which
    /// travels beside the value to the receiver, neither copied into the other.
    pub fn send_received(&self, key: &ParsedKey, value: Received) -> Result<(), RendezvousError> {
        if let Some(status) = self.status() {
            return Err(status);
        }
        let (mgr, route) = self.route(key)?;
        if route.src != mgr.me() {
            return Err(RendezvousError::InvalidArgument(format!(
                "step {}: node {} sends `{key}`, but its source device is on node {}",
                self.step_id,
                mgr.me(),
                route.src
            )));
        }
        drop(mgr);
        let call = Deferred::Send {
            key: key.clone(),
            value,
            route,
        };
        match self.gate(call) {
            Ok(Some(Deferred::Send { key, value, route })) => self.run_send(&key, value, route),
            Ok(_) => self.status().map_or(Ok(()), Err),
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cpu_device, RendezvousMgr};
    use node::local::LocalCluster;
    use van_core::rendezvous::{create_key, parse_key};
    use van_core::{node_ids, Role};

    const TASKS: i32 = node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;

    #[tokio::test]
    async fn answered_push_receives_do_not_pile_up_in_a_long_step() {
        const ROUNDS: usize = 20;
        const PER_ROUND: usize = 100;
        let cluster = LocalCluster::new(1, 1);
        let run = cluster.run(|po| async move {
            if po.role() == Role::Scheduler {
                return po.finalize().await.map(|()| None);
            }
            let failed = |e: RendezvousError| node::NodeError::InvalidArgument(e.to_string());
            let mgr = RendezvousMgr::new(&po, Protocol::Push)
                .await
                .map_err(|e| node::NodeError::InvalidArgument(e.to_string()))?;
            let (server, worker) = (cpu_device(8).unwrap(), cpu_device(9).unwrap());
            // One step with many iterations, as a while loop inside a TensorFlow step.
            let step = mgr.find(1);
            step.initialize().map_err(failed)?;
            for round in 0..ROUNDS {
                let keys: Vec<ParsedKey> = (0..PER_ROUND)
                    .map(|i| {
                        let iter = (round * PER_ROUND + i) as u64;
                        parse_key(&create_key(&server, 1, &worker, "x", (0, iter))).unwrap()
                    })
                    .collect();
                if po.role() == Role::Worker {
                    // Waiting before the values are pushed: each receive is watched.
                    let receives: Vec<_> = keys.iter().map(|k| step.recv(k)).collect();
                    po.barrier(TASKS).await?;
                    for receive in receives {
                        receive.await.map_err(failed)?;
                    }
                } else {
                    po.barrier(TASKS).await?;
                    for k in &keys {
                        step.send(k, Bytes::from_static(b"v"), false)
                            .map_err(failed)?;
                    }
                }
                po.barrier(TASKS).await?;
            }
            let watched = lock(&step.state).watched.len();
            mgr.cleanup(1);
            po.finalize().await?;
            Ok(Some(watched))
        });
        let watched: Vec<usize> = tokio::time::timeout(std::time::Duration::from_secs(60), run)
            .await
            .unwrap()
            .unwrap()
            .into_iter()
            .flatten()
            .collect();
        // At most a round's live receives and what accumulated since the last pruning.
        assert!(
            watched.iter().all(|n| *n <= 4 * PER_ROUND),
            "{watched:?} entries left for {} answered receives",
            ROUNDS * PER_ROUND
        );
    }
}
