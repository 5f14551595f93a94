//! The link layer every van shares: which connection carries the traffic to each peer.
//!
//! A van moves bytes over its connections; [`Links`] keeps the book on them, the same way
//! for every van:
//!
//! - **One table of connections.** Every open connection is registered with the sending
//!   side of its queue (the van's link type `L`) and, once known, the peer on the other end.
//!   A peer's *route* is the connection its messages go out on: at most one per peer, so the
//!   order of messages to a peer never depends on two connections.
//! - **One dial per peer.** [`Links::connect`] lets one caller dial a peer at a time; the
//!   others wait and find the route made.
//! - **The spare rule.** When two nodes dial each other at once, each ends up with two
//!   connections to the other. The first registered becomes the route; the other stays open
//!   (the peer may be sending over it) and is a *spare*. An accepted connection becomes a
//!   peer's route when the peer identifies itself on it ([`Links::learn`]) and no route
//!   exists yet, so a node can answer a peer it never dialed.
//! - **Lost peers.** When a connection ends, [`Links::closed`] removes it and says whether
//!   its end is a loss to report: the route of a peer (the peer is gone) or a connection
//!   nobody identified (the peer is unknown). A spare's end is no loss while the route lives,
//!   and nothing is a loss once the van stops. Later sends to a lost peer fail with the
//!   reason.
//! - **Stop and drop.** [`Links::stop`] refuses new connections, closes every queue (so each
//!   writer flushes and ends), waits for the writers up to the flush timeout, then ends every
//!   connection and task. [`Links::abort`] (for `Drop`) ends them at once.
//!
//! [`FrameQueue`] is the bounded per-peer send queue with its byte budget.
//!
//! The table does no I/O: it holds each connection's queue and tasks, and ends them through
//! [`Connection`]. The I/O the vans share is in [`stream`]: dialing a peer and accepting
//! connections over TCP (with the cluster-secret handshake), socket options, waiting for a
//! socket's send queue to empty, and the reasons a stream connection ends. van-tcp and
//! van-uring use it for their connections and van-rdma for its TCP side channel; the frames
//! themselves are read and written by each van.

pub mod stream;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::budget::ByteBudget;
use crate::message::{Message, NodeId, VanKind};
use crate::van::{recipient_of, InboxSender, PeerLost, VanError};
use crate::wire::{self, Limits};

/// Identifies one connection of a van (unique for the van's life).
pub type ConnectionId = u64;

pub use crate::wire::Frame;

/// What the table may ask of one connection's I/O (its tasks, threads or queue pair).
pub trait Connection: Send + Sync + 'static {
    /// The connection's queue has been closed by a stop: write what it holds, then end.
    /// Writers that end when their queue closes need nothing more (the default).
    fn finish(&self) {}

    /// End now, without flushing (after a stop's flush timeout, or when the van is dropped).
    fn abort(&self);

    /// The peer was declared dead ([`Links::drop_peer`]): end now, dropping what is queued.
    /// The default is [`abort`](Self::abort); a van whose `abort` leaves the ending to its
    /// stop (the io_uring van's threads) does it here.
    fn drop_dead(&self) {
        self.abort();
    }

    /// Whether the connection has ended (its route is no longer used for sending).
    fn is_closed(&self) -> bool {
        false
    }
}

/// One open connection.
struct Entry<L> {
    /// The node on the other end, once known (dialed, or learned from its first message).
    peer: Option<NodeId>,
    /// The sending side; dropping the last copy closes the connection's queue.
    link: L,
    io: Arc<dyn Connection>,
    /// Fires when the connection's writer has flushed and ended.
    flushed: Option<oneshot::Receiver<()>>,
    /// A connection to a process that another has replaced ([`Links::forget`]): never a
    /// route again, and its end is no loss.
    retired: bool,
}

struct State<L> {
    stopped: bool,
    inbox: Option<InboxSender>,
    /// Every open connection.
    connections: HashMap<ConnectionId, Entry<L>>,
    /// The connection each peer's messages go out on.
    routes: HashMap<NodeId, ConnectionId>,
    /// Why the route to a peer went away, so later sends can say so.
    lost: HashMap<NodeId, String>,
    /// Peers declared dead ([`Links::drop_peer`]) and not replaced since
    /// ([`Links::forget`]): a stop does not wait to flush what is queued to them, even on a
    /// connection opened after the verdict (a last notice dialed to a dying process).
    dead: HashSet<NodeId>,
    /// One gate per peer and process ([`Links::forget`]s so far), so concurrent connects to
    /// it dial once, while a dial to the process a new one replaced (a hung dial to a cut
    /// host) never holds up the dial to its successor. Bounded by the peers.
    dialing: HashMap<(NodeId, u64), Arc<tokio::sync::Mutex<()>>>,
    /// How many times each peer was [`Links::forget`]ed (replaced by a new process).
    forgotten: HashMap<NodeId, u64>,
    /// Accept loops, handshakes and watchers: aborted on stop.
    tasks: Vec<JoinHandle<()>>,
    /// The address of each accepted connection still open, and how many each address has
    /// open: bounded by the gate's connection limits ([`Links::admit`]).
    accepted: HashMap<ConnectionId, std::net::IpAddr>,
    open_by_address: HashMap<std::net::IpAddr, usize>,
}

/// The table of a van's connections; see the [module docs](self).
pub struct Links<L> {
    kind: VanKind,
    state: Mutex<State<L>>,
    next_id: AtomicU64,
}

impl<L> std::fmt::Debug for Links<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Links")
            .field("kind", &self.kind)
            .field("stopped", &state.stopped)
            .field("connections", &state.connections.len())
            .field("routes", &state.routes)
            .finish_non_exhaustive()
    }
}

impl<L: Clone + Send + 'static> Links<L> {
    /// An empty table for a van of `kind` (named in its errors).
    pub fn new(kind: VanKind) -> Links<L> {
        Links {
            kind,
            state: Mutex::new(State {
                stopped: false,
                inbox: None,
                connections: HashMap::new(),
                routes: HashMap::new(),
                lost: HashMap::new(),
                dead: HashSet::new(),
                dialing: HashMap::new(),
                forgotten: HashMap::new(),
                tasks: Vec::new(),
                accepted: HashMap::new(),
                open_by_address: HashMap::new(),
            }),
            next_id: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<L>> {
        // Every critical section is a few map operations; a panic inside one cannot leave
        // the table half-updated in a way later calls would trip on, so poison is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The van this table belongs to.
    pub fn kind(&self) -> VanKind {
        self.kind
    }

    /// A fresh connection id.
    pub fn next_id(&self) -> ConnectionId {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the van has stopped (or was dropped).
    pub fn is_stopped(&self) -> bool {
        self.lock().stopped
    }

    /// Fails when the van cannot bind now: it stopped, or it is bound already.
    pub fn check_bindable(&self) -> Result<(), VanError> {
        let state = self.lock();
        if state.stopped {
            return Err(VanError::Stopped(self.kind));
        }
        if state.inbox.is_some() {
            return Err(VanError::AlreadyBound(self.kind));
        }
        Ok(())
    }

    /// Records a successful bind: the inbox connections deliver into, and the task that
    /// accepts them (if the van has one). Fails (aborting the task) when the van stopped or
    /// another bind won meanwhile.
    pub fn bound(
        &self,
        inbox: InboxSender,
        accept: Option<JoinHandle<()>>,
    ) -> Result<(), VanError> {
        let mut state = self.lock();
        let refused = if state.stopped {
            Some(VanError::Stopped(self.kind))
        } else if state.inbox.is_some() {
            Some(VanError::AlreadyBound(self.kind))
        } else {
            None
        };
        if let Some(error) = refused {
            if let Some(task) = accept {
                task.abort();
            }
            return Err(error);
        }
        state.inbox = Some(inbox);
        state.tasks.extend(accept);
        Ok(())
    }

    /// The inbox of a bound, running van.
    pub fn inbox(&self) -> Result<InboxSender, VanError> {
        let state = self.lock();
        if state.stopped {
            return Err(VanError::Stopped(self.kind));
        }
        state.inbox.clone().ok_or(VanError::NotBound(self.kind))
    }

    /// Keeps `task` (a handshake, a watcher) to abort on stop; aborts it at once when the
    /// van has stopped already.
    pub fn track(&self, task: JoinHandle<()>) {
        let mut state = self.lock();
        if state.stopped {
            task.abort();
            return;
        }
        state.tasks.retain(|t| !t.is_finished());
        state.tasks.push(task);
    }

    /// Opens the route to `peer` unless it exists: one caller at a time dials a given peer
    /// (the others wait, then find its route). `dial` gets the inbox, opens the connection
    /// and registers it with [`add`](Self::add). A dial that was under way when a new
    /// process took the peer's id ([`forget`](Self::forget)) does not hold up the dial to
    /// the new one; if it connects after all, what it made is retired, as the old process's.
    pub async fn connect<F, Fut>(&self, peer: NodeId, dial: F) -> Result<(), VanError>
    where
        F: FnOnce(InboxSender) -> Fut,
        Fut: Future<Output = Result<(), VanError>>,
    {
        let (generation, gate) = {
            let mut state = self.lock();
            let generation = state.forgotten.get(&peer).copied().unwrap_or(0);
            let gate = state.dialing.entry((peer, generation)).or_default();
            (generation, Arc::clone(gate))
        };
        // Held across the dial on purpose: it only orders connects to this one process.
        let _dialing = gate.lock().await;
        let inbox = {
            let state = self.lock();
            if state.stopped {
                return Err(VanError::Stopped(self.kind));
            }
            if live_route(&state, peer).is_some() {
                return Ok(());
            }
            state.inbox.clone().ok_or(VanError::NotBound(self.kind))?
        };
        dial(inbox).await?;
        let replaced = self.lock().forgotten.get(&peer).copied().unwrap_or(0) != generation;
        if replaced {
            // Reached the process that was replaced while this dial was under way: its
            // connection is no route to the new one. (A connection the new process's own
            // dial made meanwhile is retired too; the next send dials it again.)
            self.forget(peer);
            return Err(VanError::PeerGone {
                peer,
                reason: "a new process took its place while it was being dialed".to_owned(),
            });
        }
        Ok(())
    }

    /// Registers a new connection: `peer` is the node dialed (it becomes the peer's route
    /// unless a live one exists, in which case this connection is a spare), or `None` for an
    /// accepted connection (a route once [`learn`](Self::learn)ed). `flushed` fires when its
    /// writer has written everything and ended. Fails (aborting the connection) when the van
    /// has stopped.
    pub fn add(
        &self,
        id: ConnectionId,
        peer: Option<NodeId>,
        link: L,
        io: Arc<dyn Connection>,
        flushed: Option<oneshot::Receiver<()>>,
    ) -> Result<(), VanError> {
        let mut state = self.lock();
        if state.stopped {
            drop(state);
            io.abort();
            return Err(VanError::Stopped(self.kind));
        }
        state.connections.insert(
            id,
            Entry {
                peer,
                link,
                io,
                flushed,
                retired: false,
            },
        );
        if let Some(peer) = peer {
            route(&mut state, peer, id);
        }
        Ok(())
    }

    /// The peer on connection `id` identified itself: it becomes the peer's route unless a
    /// live one exists (then we answer over the connection we already have).
    pub fn learn(&self, id: ConnectionId, peer: NodeId) {
        let mut state = self.lock();
        if state.stopped {
            return;
        }
        let Some(entry) = state.connections.get_mut(&id).filter(|e| !e.retired) else {
            return;
        };
        entry.peer.get_or_insert(peer);
        if route(&mut state, peer, id) {
            debug!(peer, kind = %self.kind, "learned a route from an accepted connection");
        }
    }

    /// Admits accepted connection `id` from `address` under the connection limits of
    /// `gate` (in all, and per address), or refuses it: the caller then closes it, and the
    /// gate logs the refusal once per address. An admitted connection counts until
    /// [`closed`](Self::closed). So a flood of idle connections cannot take every descriptor
    /// of the process, and one address cannot take every place.
    pub fn admit(
        &self,
        id: ConnectionId,
        address: std::net::IpAddr,
        gate: &crate::auth::Gate,
    ) -> Result<(), crate::auth::AuthError> {
        use crate::auth::AuthError::TooManyConnections;
        let limits = gate.options();
        let mut state = self.lock();
        let total = state.accepted.len();
        let from_address = state.open_by_address.get(&address).copied().unwrap_or(0);
        let refusal = if from_address >= limits.max_connections_per_address.max(1) {
            Some(TooManyConnections {
                count: from_address,
                per_address: true,
                scope: "from this address",
            })
        } else if total >= limits.max_connections.max(1) {
            Some(TooManyConnections {
                count: total,
                per_address: false,
                scope: "in all",
            })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            drop(state);
            gate.refuse(&address, &refusal);
            return Err(refusal);
        }
        state.accepted.insert(id, address);
        *state.open_by_address.entry(address).or_default() += 1;
        Ok(())
    }

    /// Connection `id` ended for `reason`: forgets it and the route over it. Returns the loss
    /// to report, if it is one (see the [module docs](self)).
    pub fn closed(&self, id: ConnectionId, reason: &str) -> Option<PeerLost> {
        let mut state = self.lock();
        forget_address(&mut state, id);
        let entry = state.connections.remove(&id)?;
        if entry.retired {
            return None;
        }
        let was_route = match entry.peer {
            Some(peer) if state.routes.get(&peer) == Some(&id) => {
                state.routes.remove(&peer);
                state.lost.insert(peer, reason.to_owned());
                true
            }
            _ => false,
        };
        if state.stopped || (entry.peer.is_some() && !was_route) {
            return None;
        }
        Some(PeerLost {
            peer: entry.peer,
            kind: self.kind,
            reason: reason.to_owned(),
        })
    }

    /// A new process took `peer`'s id (recovery): the connections to the one before are
    /// retired — no longer its route, never one again, and their end (which a van may notice
    /// late, after the new process is reached) is no loss to report. The next
    /// [`connect`](Self::connect) dials the peer's new address. The connections stay open, so
    /// whatever is still in flight on them arrives.
    pub fn forget(&self, peer: NodeId) {
        let mut state = self.lock();
        *state.forgotten.entry(peer).or_default() += 1;
        state.dialing.retain(|(p, _), _| *p != peer);
        state.routes.remove(&peer);
        state.lost.remove(&peer);
        state.dead.remove(&peer);
        let mut retired = 0;
        for entry in state.connections.values_mut() {
            if entry.peer == Some(peer) && !entry.retired {
                entry.retired = true;
                retired += 1;
            }
        }
        if retired > 0 {
            debug!(peer, retired, kind = %self.kind, "connections to a replaced process retired");
        }
    }

    /// `peer` was declared dead: its connections end now, and what is queued to them is
    /// dropped, so that neither a send nor a [`stop`](Self::stop)'s flush waits for a process
    /// that will never read. Sends to it fail with [`VanError::PeerGone`] giving `reason`
    /// until a [`connect`](Self::connect) (to a process that took its id) opens a new route.
    /// Their end is no loss to report: the caller already knows.
    pub fn drop_peer(&self, peer: NodeId, reason: &str) {
        let ios: Vec<Arc<dyn Connection>> = {
            let mut state = self.lock();
            if state.stopped {
                return;
            }
            state.routes.remove(&peer);
            state.lost.insert(peer, reason.to_owned());
            state.dead.insert(peer);
            let ids: Vec<ConnectionId> = state
                .connections
                .iter()
                .filter(|(_, entry)| entry.peer == Some(peer))
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| {
                    forget_address(&mut state, id);
                    state.connections.remove(&id).map(|entry| entry.io)
                })
                .collect()
        };
        if !ios.is_empty() {
            debug!(peer, connections = ios.len(), kind = %self.kind, "a dead peer's connections ended, their queues dropped");
        }
        for io in ios {
            io.drop_dead();
        }
    }

    /// The link to send to `peer` over, or why there is none.
    pub fn link(&self, peer: NodeId) -> Result<L, VanError> {
        let state = self.lock();
        if state.stopped {
            return Err(VanError::Stopped(self.kind));
        }
        if let Some(entry) = live_route(&state, peer) {
            return Ok(entry.link.clone());
        }
        Err(match state.lost.get(&peer) {
            Some(reason) => VanError::PeerGone {
                peer,
                reason: reason.clone(),
            },
            None if state.routes.contains_key(&peer) => VanError::PeerGone {
                peer,
                reason: "the connection closed".into(),
            },
            None => VanError::UnknownPeer { peer },
        })
    }

    /// Peers with a live route, in order.
    pub fn peers(&self) -> Vec<NodeId> {
        let state = self.lock();
        let mut peers: Vec<NodeId> = state
            .routes
            .keys()
            .copied()
            .filter(|peer| live_route(&state, *peer).is_some())
            .collect();
        peers.sort_unstable();
        peers
    }

    /// Open connections: routes and spares, dialed and accepted.
    pub fn connections(&self) -> usize {
        self.lock().connections.len()
    }

    /// Stops: refuses new connections and binds, closes every queue so each writer flushes
    /// and ends, waits up to `flush` for them, then ends every connection and task. Returns
    /// whether everything was flushed in time. Idempotent.
    pub async fn stop(&self, flush: Duration) -> bool {
        let (connections, tasks, dead) = {
            let mut state = self.lock();
            state.stopped = true;
            state.inbox = None;
            state.routes.clear();
            (
                std::mem::take(&mut state.connections),
                std::mem::take(&mut state.tasks),
                std::mem::take(&mut state.dead),
            )
        };
        let mut ios = Vec::with_capacity(connections.len());
        let mut flushed = Vec::with_capacity(connections.len());
        for (_, entry) in connections {
            // Dropping the link closes the queue (the writer's copy is the last reader).
            drop(entry.link);
            if entry.peer.is_some_and(|peer| dead.contains(&peer)) {
                // Nobody will read it: not worth a wait.
                entry.io.drop_dead();
                continue;
            }
            entry.io.finish();
            flushed.extend(entry.flushed);
            ios.push(entry.io);
        }
        let all = async {
            for done in flushed {
                let _ = done.await;
            }
        };
        let in_time = tokio::time::timeout(flush, all).await.is_ok();
        for io in &ios {
            io.abort();
        }
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        in_time
    }

    /// Ends every connection and task at once, without flushing (for a van's `Drop`).
    pub fn abort(&self) {
        let (connections, tasks) = {
            let mut state = self.lock();
            state.stopped = true;
            state.inbox = None;
            state.routes.clear();
            (
                std::mem::take(&mut state.connections),
                std::mem::take(&mut state.tasks),
            )
        };
        for (_, entry) in connections {
            entry.io.abort();
        }
        for task in tasks {
            task.abort();
        }
    }
}

/// Connection `id` no longer counts against its address's limit, if it was accepted.
fn forget_address<L>(state: &mut State<L>, id: ConnectionId) {
    if let Some(address) = state.accepted.remove(&id) {
        if let Some(open) = state.open_by_address.get_mut(&address) {
            *open -= 1;
            if *open == 0 {
                state.open_by_address.remove(&address);
            }
        }
    }
}

/// The entry of `peer`'s route, if it is live.
fn live_route<L>(state: &State<L>, peer: NodeId) -> Option<&Entry<L>> {
    let id = state.routes.get(&peer)?;
    state
        .connections
        .get(id)
        .filter(|entry| !entry.io.is_closed())
}

/// Makes connection `id` the route to `peer` unless a live route exists; whether it did.
fn route<L>(state: &mut State<L>, peer: NodeId, id: ConnectionId) -> bool {
    if live_route(state, peer).is_some() {
        return false;
    }
    state.routes.insert(peer, id);
    state.lost.remove(&peer);
    true
}

/// A peer's bounded send queue of encoded frames, with the [`ByteBudget`] that keeps a deep
/// queue of large frames from holding more than its share of bytes. Clones share the queue.
#[derive(Debug, Clone)]
pub struct FrameQueue {
    queue: mpsc::Sender<Frame>,
    budget: ByteBudget,
}

impl FrameQueue {
    /// A queue of at most `depth` frames and `budget_bytes` of large frames (0: no byte
    /// limit), and the receiving end its writer drains.
    pub fn new(depth: usize, budget_bytes: usize) -> (FrameQueue, mpsc::Receiver<Frame>) {
        let (queue, frames) = mpsc::channel(depth.max(1));
        let queue = FrameQueue {
            queue,
            budget: ByteBudget::new(budget_bytes),
        };
        (queue, frames)
    }

    /// Queues `frame` for `peer`, waiting while the queue or the byte budget is full.
    pub async fn push(&self, peer: NodeId, frame: Frame) -> Result<(), VanError> {
        let frame = self.budget.attach(frame).await;
        self.queue
            .send(frame)
            .await
            .map_err(|_| VanError::PeerGone {
                peer,
                reason: "the connection closed".into(),
            })
    }

    /// Whether a message of `payload` bytes is small enough that the byte budget does not
    /// apply to its frame (so [`try_push`](Self::try_push) may take it): checked before
    /// encoding, so a large message is not encoded twice. The frame's own check is exact.
    pub fn may_take_at_once(&self, payload: usize) -> bool {
        self.budget.is_exempt(payload)
    }

    /// Queues `frame` for `peer` if that needs no waiting (room in the queue, and a frame
    /// small enough that the byte budget does not apply); otherwise gives it back.
    pub fn try_push(&self, peer: NodeId, frame: Frame) -> Result<Option<Frame>, VanError> {
        if !self
            .budget
            .is_exempt(frame.iter().map(bytes::Bytes::len).sum())
        {
            return Ok(Some(frame));
        }
        match self.queue.try_send(frame) {
            Ok(()) => Ok(None),
            Err(mpsc::error::TrySendError::Full(frame)) => Ok(Some(frame)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(VanError::PeerGone {
                peer,
                reason: "the connection closed".into(),
            }),
        }
    }

    /// Whether the writer has gone (the queue's receiving end is closed).
    pub fn is_closed(&self) -> bool {
        self.queue.is_closed()
    }
}

impl Links<FrameQueue> {
    /// Encodes `msg` and queues it on its recipient's route: the whole of a stream van's
    /// `send`.
    pub async fn send(&self, msg: &Message, limits: &Limits) -> Result<(), VanError> {
        let peer = recipient_of(msg)?;
        let queue = self.link(peer)?;
        let frame = wire::encode(msg, limits)?;
        queue.push(peer, frame).await
    }

    /// [`Van::try_send`](crate::Van::try_send) of a stream van: queues `msg` if that needs no
    /// waiting, else gives it back for [`send`](Self::send).
    pub fn try_send(&self, msg: Message, limits: &Limits) -> Result<Option<Message>, VanError> {
        let peer = recipient_of(&msg)?;
        let queue = self.link(peer)?;
        if !queue.may_take_at_once(msg.data_len()) {
            return Ok(Some(msg));
        }
        let frame = wire::encode(&msg, limits)?;
        Ok(queue.try_push(peer, frame)?.map(|_| msg))
    }

    /// Encodes and queues `msgs` in order, looking each recipient's route up once per run of
    /// messages to it; stops at the first error (earlier messages stay queued).
    pub async fn send_batch(&self, msgs: &[Message], limits: &Limits) -> Result<(), VanError> {
        let mut current: Option<(NodeId, FrameQueue)> = None;
        for msg in msgs {
            let peer = recipient_of(msg)?;
            let queue = match &current {
                Some((p, queue)) if *p == peer => queue,
                _ => &current.insert((peer, self.link(peer)?)).1,
            };
            let frame = wire::encode(msg, limits)?;
            queue.push(peer, frame).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
