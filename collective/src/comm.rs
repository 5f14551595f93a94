//! The communicator's shared state: generations and how they form, the mailbox of data
//! messages, and the transport of one collective (see [`Op`]).
//!
//! **Generations.** The workers of a generation are its ranks, in node-id order. The
//! lowest-numbered live worker coordinates: a worker that wants a new generation (it
//! starts, or its collective failed) sends it `JOIN`; the coordinator asks every live
//! worker that has not joined to do so (`INTERRUPT`: their current generation ends), and
//! once all have joined (or the settle window has passed) it announces the next generation
//! (`GENERATION`: number and members) to those that joined. A member that dies breaks the
//! generation on every survivor (the postoffice reports the failure: a broken connection at
//! once, the scheduler's notice within the heartbeat timeout). Control messages leave in
//! order through one queue, so an `INTERRUPT` never overtakes the `GENERATION` before it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use node::postoffice::Customer;
use node::Postoffice;
use tokio::sync::{mpsc, Notify};
use tracing::{debug, warn};
use van_core::{node_ids, Message, Meta, NodeId};

use crate::error::{CollectiveError, Result};

// How a generation ends and the next forms (`join`, `coordinate`, `handle_control`).
mod generation;

/// The application id of collectives' messages (the customer id is the communicator's).
pub const APP_ID: i32 = 0x636f;

const KIND_JOIN: i32 = 1;
const KIND_INTERRUPT: i32 = 2;
const KIND_GENERATION: i32 = 3;
/// Data messages: this plus the [`OpKind`].
const KIND_DATA: i32 = 16;

/// How often the background task re-sends a pending `JOIN` and looks at the settle window.
const TICK: Duration = Duration::from_millis(100);
/// Longest a control message may take to be queued for its peer.
const CONTROL_SEND: Duration = Duration::from_secs(5);
/// Control messages waiting for the background task (a round posts a few per worker).
const CONTROL_QUEUE: usize = 4096;
/// A `JOIN` without an answer is sent again after this (the coordinator may have changed).
const JOIN_RESEND: Duration = Duration::from_secs(1);

/// Which collective a data message belongs to (checked on receipt: every rank must call
/// the same collectives in the same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum OpKind {
    AllReduce = 0,
    Broadcast = 1,
    AllGather = 2,
    ReduceScatter = 3,
    Barrier = 4,
    AllToAll = 5,
    /// A point-to-point message ([`Shared::begin_p2p`]).
    PointToPoint = 6,
}

impl OpKind {
    fn from_head(head: i32) -> Option<OpKind> {
        Some(match head - KIND_DATA {
            0 => OpKind::AllReduce,
            1 => OpKind::Broadcast,
            2 => OpKind::AllGather,
            3 => OpKind::ReduceScatter,
            4 => OpKind::Barrier,
            5 => OpKind::AllToAll,
            6 => OpKind::PointToPoint,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "allreduce",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::Barrier => "barrier",
            OpKind::AllToAll => "all_to_all",
            OpKind::PointToPoint => "send/recv",
        }
    }
}

/// One generation of the communicator: its number (0 before the first) and its members,
/// in rank order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Generation {
    /// Increases with every new membership.
    pub number: u64,
    /// The members' node ids; a member's rank is its index.
    pub members: Vec<NodeId>,
}

impl Generation {
    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The rank of `node`, if it is a member.
    pub fn rank_of(&self, node: NodeId) -> Option<usize> {
        self.members.iter().position(|&m| m == node)
    }
}

/// Settings of a communicator (see [`CommOptions::from_env`]).
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// The customer id of the communicator's messages (two communicators on one node need
    /// different ids).
    pub customer_id: i32,
    /// Largest message a collective sends: buffers travel in slices of this size, so a
    /// rank forwards the first slice while the next is still on its way.
    pub slice_bytes: usize,
    /// All-reduces of buffers up to this many bytes send every buffer to every rank (one
    /// step) instead of around the ring (`2 (n - 1)` steps): faster for small buffers.
    pub direct_bytes: usize,
    /// How long the coordinator waits for every live worker to join before it forms the
    /// next generation with those that did.
    pub settle_window: Duration,
    /// Longest wait for one message of a collective before it fails.
    pub timeout: Duration,
}

impl Default for CommOptions {
    fn default() -> CommOptions {
        CommOptions {
            customer_id: 0,
            slice_bytes: 256 << 10,
            direct_bytes: 64 << 10,
            settle_window: Duration::from_secs(5),
            timeout: Duration::from_secs(300),
        }
    }
}

impl CommOptions {
    /// The defaults, changed by `VANS_COLLECTIVE_SLICE_BYTES`, `VANS_COLLECTIVE_DIRECT_BYTES`,
    /// `VANS_COLLECTIVE_SETTLE_WINDOW` (seconds) and `VANS_COLLECTIVE_TIMEOUT` (seconds).
    pub fn from_env() -> Result<CommOptions> {
        let mut options = CommOptions::default();
        if let Some(bytes) = env_number("VANS_COLLECTIVE_SLICE_BYTES")? {
            if !(4096.0..=(1u64 << 30) as f64).contains(&bytes) || bytes.fract() != 0.0 {
                return Err(CollectiveError::InvalidArgument(format!(
                    "VANS_COLLECTIVE_SLICE_BYTES={bytes} is not a whole number of bytes between \
                     4096 and 1 GiB"
                )));
            }
            options.slice_bytes = bytes as usize;
        }
        if let Some(bytes) = env_number("VANS_COLLECTIVE_DIRECT_BYTES")? {
            if !(0.0..=(1u64 << 30) as f64).contains(&bytes) || bytes.fract() != 0.0 {
                return Err(CollectiveError::InvalidArgument(format!(
                    "VANS_COLLECTIVE_DIRECT_BYTES={bytes} is not a whole number of bytes up to \
                     1 GiB"
                )));
            }
            options.direct_bytes = bytes as usize;
        }
        if let Some(secs) = env_number("VANS_COLLECTIVE_SETTLE_WINDOW")? {
            options.settle_window = seconds("VANS_COLLECTIVE_SETTLE_WINDOW", secs)?;
        }
        if let Some(secs) = env_number("VANS_COLLECTIVE_TIMEOUT")? {
            options.timeout = seconds("VANS_COLLECTIVE_TIMEOUT", secs)?;
        }
        Ok(options)
    }
}

fn env_number(name: &str) -> Result<Option<f64>> {
    match std::env::var(name) {
        Ok(text) => text.trim().parse::<f64>().map(Some).map_err(|_| {
            CollectiveError::InvalidArgument(format!("{name}={text:?} is not a number"))
        }),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(CollectiveError::InvalidArgument(format!(
            "{name} is not valid UTF-8"
        ))),
    }
}

fn seconds(name: &str, secs: f64) -> Result<Duration> {
    if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(CollectiveError::InvalidArgument(format!(
            "{name}={secs} is not a number of seconds in (0, 86400]"
        )))
    }
}

/// Where a generation stands on this node.
enum Status {
    /// Collectives run.
    Active,
    /// Collectives fail with this until the next generation.
    Broken(CollectiveError),
    /// This node asked to join the next generation.
    Settling,
}

/// Identifies one data message: generation, collective, sender, hop and slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    generation: u64,
    op: u64,
    from: NodeId,
    hop: i32,
    slice: i32,
}

struct State {
    generation: Generation,
    status: Status,
    next_op: u64,
    /// Data messages not yet taken, by key.
    mailbox: HashMap<Key, Message>,
    /// While settling: the coordinator asked and when.
    join_sent: Option<(NodeId, Instant)>,
    /// Coordinator: who asked to join, with the generation each knew.
    joins: BTreeMap<NodeId, u64>,
    /// Coordinator: why the first joiner of this round left its generation (what broke it,
    /// as the joiner saw), passed on to those asked to join.
    join_reason: Option<String>,
    /// Coordinator: when the first `JOIN` of this round arrived.
    round_started: Option<Instant>,
    /// Coordinator: who was asked to join in this round.
    asked: BTreeSet<NodeId>,
    /// The postoffice stopped.
    stopped: bool,
    /// A generation was announced while this node's was active (it did not ask): the next
    /// collective fails once, so the application resynchronizes through `settle`.
    unannounced: bool,
    /// The highest generation number seen anywhere (announced, or known by a joiner), so a
    /// new coordinator never reuses one.
    highest: u64,
    /// Point-to-point messages of this generation begun, by (peer, tag, sending): the next
    /// one's sequence number. Both ends count alike, so the n-th send of a tag to a peer
    /// meets that peer's n-th receive of it, whatever else runs meanwhile.
    p2p: HashMap<(NodeId, i32, bool), u64>,
}

/// The `op` numbers of point-to-point messages: above every collective's.
const P2P_OP: u64 = 1 << 63;

/// What a communicator's handle, its background task and the postoffice (as a
/// [`Customer`]) share.
pub(crate) struct Shared {
    pub(crate) po: Postoffice,
    pub(crate) me: NodeId,
    pub(crate) options: CommOptions,
    /// Send buffers for slices to peers over a stream van.
    pub(crate) pool: Arc<crate::pool::SendPool>,
    state: Mutex<State>,
    /// Woken whenever a message arrives or the status changes.
    notify: Notify,
    /// Control messages, sent in order by the background task.
    control: mpsc::Sender<Message>,
}

/// A collective in progress on this node: its generation, members and number.
#[derive(Clone)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) generation: u64,
    pub(crate) members: Vec<NodeId>,
    pub(crate) rank: usize,
    pub(crate) number: u64,
    /// The element type's [`Element::TAG`](crate::Element::TAG).
    pub(crate) tag: u64,
    /// Elements in the whole buffer (the same on every rank; checked).
    pub(crate) total: usize,
}

impl Op {
    pub(crate) fn size(&self) -> usize {
        self.members.len()
    }

    /// The collective carries `total` elements of `T`.
    pub(crate) fn carrying<T: crate::Element>(mut self, total: usize) -> Op {
        self.tag = T::TAG;
        self.total = total;
        self
    }
}

impl Shared {
    /// The shared state and the receiver of its control queue (for the background task).
    pub(crate) fn new(
        po: Postoffice,
        options: CommOptions,
    ) -> (Arc<Shared>, mpsc::Receiver<Message>) {
        let (control, queue) = mpsc::channel(CONTROL_QUEUE);
        let shared = Arc::new(Shared {
            me: po.my_id(),
            po,
            options,
            pool: Arc::default(),
            state: Mutex::new(State {
                generation: Generation::default(),
                status: Status::Settling,
                next_op: 0,
                mailbox: HashMap::new(),
                join_sent: None,
                joins: BTreeMap::new(),
                join_reason: None,
                round_started: None,
                asked: BTreeSet::new(),
                stopped: false,
                unannounced: false,
                highest: 0,
                p2p: HashMap::new(),
            }),
            notify: Notify::new(),
            control,
        });
        (shared, queue)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few map operations with no await and no call out, so
        // a poisoned lock still holds consistent data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current generation.
    pub(crate) fn generation(&self) -> Generation {
        self.lock().generation.clone()
    }

    /// Live workers (by this node's view), in id order.
    fn alive_workers(&self) -> Vec<NodeId> {
        (0..self.po.num_workers())
            .map(node_ids::worker_rank_to_id)
            .filter(|&id| self.po.dead_error(id).is_none())
            .collect()
    }

    fn coordinator(&self) -> Option<NodeId> {
        self.alive_workers().first().copied()
    }

    fn control_message(&self, to: NodeId, kind: i32, number: u64, body: Bytes) -> Message {
        Message {
            meta: Meta {
                app_id: APP_ID,
                customer_id: self.options.customer_id,
                sender: Some(self.me),
                recipient: Some(to),
                head: kind,
                key: number,
                body,
                ..Meta::default()
            },
            data: Default::default(),
        }
    }

    /// Queues a control message, or handles it here when it is for this node.
    fn post(&self, st: &mut State, msg: Message) {
        if msg.meta.recipient == Some(self.me) {
            self.handle_control(st, msg);
        } else if let Err(e) = self.control.try_send(msg) {
            // A round posts a few messages per worker; a full queue means the background task
            // is stuck, and a lost JOIN is sent again.
            warn!("collective control message not queued: {e}");
        }
    }

    /// One turn of the background task: re-send a stale `JOIN`, close a settle window.
    pub(crate) fn tick(&self) {
        let mut st = self.lock();
        if self.po.is_stopped() && !st.stopped {
            st.stopped = true;
            st.status = Status::Broken(CollectiveError::Ps("the postoffice stopped".into()));
        }
        let now = Instant::now();
        if matches!(st.status, Status::Settling) {
            self.join(&mut st, now);
        }
        self.coordinate(&mut st, now);
        drop(st);
        self.notify.notify_waiters();
    }

    /// Starts a collective of `kind`: fails unless the generation is active and `valid`
    /// accepts its size and this node's rank (a refused call takes no collective number, so the ranks stay in
    /// step).
    pub(crate) fn begin(
        &self,
        kind: OpKind,
        valid: impl FnOnce(usize, usize) -> Result<()>,
    ) -> Result<Op> {
        let mut st = self.lock();
        let rank = Self::active_rank(&st, self.me)?;
        valid(st.generation.size(), rank)?;
        let number = st.next_op;
        st.next_op += 1;
        Ok(Op {
            kind,
            generation: st.generation.number,
            members: st.generation.members.clone(),
            rank,
            number,
            tag: 0,
            total: 0,
        })
    }

    /// Starts a point-to-point message with the rank `peer` under `tag` (sending or
    /// receiving): numbered by the pair's own count, not the collectives', since the other
    /// ranks take no part.
    pub(crate) fn begin_p2p(&self, peer: usize, tag: i32, sending: bool) -> Result<Op> {
        let mut st = self.lock();
        let me = Self::active_rank(&st, self.me)?;
        let size = st.generation.size();
        let Some(&node) = st.generation.members.get(peer) else {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {peer} is not in a generation of {size} ranks"
            )));
        };
        if peer == me {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {me} cannot send to or receive from itself"
            )));
        }
        let count = st.p2p.entry((node, tag, sending)).or_insert(0);
        let number = P2P_OP | *count;
        *count += 1;
        Ok(Op {
            kind: OpKind::PointToPoint,
            generation: st.generation.number,
            members: st.generation.members.clone(),
            rank: me,
            number,
            tag: 0,
            total: 0,
        })
    }

    /// This node's rank, when its generation is active.
    fn active_rank(st: &State, me: NodeId) -> Result<usize> {
        if st.unannounced {
            return Err(CollectiveError::MembershipChanged {
                generation: st.generation.number,
                reason: format!(
                    "generation {} formed without this rank asking; settle() and resynchronize",
                    st.generation.number
                ),
            });
        }
        match &st.status {
            Status::Active => {}
            Status::Broken(e) => return Err(e.clone()),
            Status::Settling => {
                return Err(CollectiveError::MembershipChanged {
                    generation: st.generation.number,
                    reason: "the membership is settling".into(),
                })
            }
        }
        st.generation
            .rank_of(me)
            .ok_or_else(|| CollectiveError::MembershipChanged {
                generation: st.generation.number,
                reason: "this worker is not a member".into(),
            })
    }

    /// Waits for the next generation this node is a member of (or returns the current one
    /// when it is active).
    pub(crate) async fn settle(&self, timeout: Duration) -> Result<Generation> {
        let deadline = tokio::time::Instant::now() + timeout;
        {
            let mut st = self.lock();
            st.unannounced = false;
            if let Status::Broken(_) = st.status {
                self.join(&mut st, Instant::now());
            }
        }
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.lock();
                if st.stopped {
                    return Err(CollectiveError::Ps("the postoffice stopped".into()));
                }
                if matches!(st.status, Status::Active) {
                    return Ok(st.generation.clone());
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let st = self.lock();
                return Err(CollectiveError::SettleTimeout {
                    waited: timeout,
                    detail: format!(
                        "generation {} ({:?}); live workers {:?}; coordinator {:?}",
                        st.generation.number,
                        st.generation.members,
                        self.alive_workers(),
                        self.coordinator()
                    ),
                });
            }
        }
    }

    /// Sends one slice of collective `op` to the member of rank `to`.
    pub(crate) async fn send(
        &self,
        op: &Op,
        to: usize,
        hop: usize,
        slice: usize,
        data: Bytes,
    ) -> Result<()> {
        let node = op.members[to];
        let msg = Message {
            meta: Meta {
                app_id: APP_ID,
                customer_id: self.options.customer_id,
                sender: Some(self.me),
                recipient: Some(node),
                head: KIND_DATA + op.kind as i32,
                key: op.generation,
                addr: op.number,
                request_id: hop as i32,
                option: slice as i32,
                priority: op.tag as i32,
                val_len: op.total as u64,
                data_types: smallvec_of_u8(),
                ..Meta::default()
            },
            data: [data].into_iter().collect(),
        };
        self.po.send(msg).await.map_err(|e| match e {
            node::PsError::NodeFailed { reason, .. } => CollectiveError::RankFailed {
                node,
                rank: to,
                generation: op.generation,
                reason,
            },
            other => other.into(),
        })
    }

    /// Receives one slice of collective `op` from the member of rank `from`: its bytes,
    /// checked to be `len` bytes of the collective's element type and total.
    pub(crate) async fn recv(
        &self,
        op: &Op,
        from: usize,
        hop: usize,
        slice: usize,
        len: usize,
    ) -> Result<Bytes> {
        let node = op.members[from];
        let key = Key {
            generation: op.generation,
            op: op.number,
            from: node,
            hop: hop as i32,
            slice: slice as i32,
        };
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if let Some(msg) = st.mailbox.remove(&key) {
                    drop(st);
                    return check(op, from, node, len, msg);
                }
                if st.generation.number != op.generation {
                    return Err(CollectiveError::MembershipChanged {
                        generation: op.generation,
                        reason: format!("generation {} formed", st.generation.number),
                    });
                }
                match &st.status {
                    Status::Active => {}
                    Status::Broken(e) => return Err(e.clone()),
                    Status::Settling => {
                        return Err(CollectiveError::MembershipChanged {
                            generation: op.generation,
                            reason: "the membership is settling".into(),
                        })
                    }
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(CollectiveError::RankFailed {
                    node,
                    rank: from,
                    generation: op.generation,
                    reason: format!(
                        "no message of {} #{} within {:?} (VANS_COLLECTIVE_TIMEOUT)",
                        op.kind.name(),
                        op.number,
                        self.options.timeout
                    ),
                });
            }
        }
    }

    /// Takes a message from the postoffice.
    fn accept(&self, msg: Message) {
        let Some(from) = msg.meta.sender else {
            debug!("collective message without a sender; dropped");
            return;
        };
        let mut st = self.lock();
        if msg.meta.head < KIND_DATA {
            self.handle_control(&mut st, msg);
        } else if msg.meta.key >= st.generation.number {
            let key = Key {
                generation: msg.meta.key,
                op: msg.meta.addr,
                from,
                hop: msg.meta.request_id,
                slice: msg.meta.option,
            };
            st.mailbox.insert(key, msg);
        }
        drop(st);
        self.notify.notify_waiters();
    }

    /// This rank's part in a collective of `generation` ended with `error` (or the call was
    /// dropped): the generation is over for it, and it asks for the next at once, so the
    /// coordinator stops the others instead of their waiting out their timeout.
    pub(crate) fn abandon(&self, generation: u64, error: &CollectiveError) {
        let mut st = self.lock();
        if st.generation.number == generation && matches!(st.status, Status::Active) {
            debug!(
                generation,
                "leaving the generation after a failed collective: {error}"
            );
            st.status = Status::Broken(error.clone());
            self.join(&mut st, Instant::now());
        }
        drop(st);
        self.notify.notify_waiters();
    }

    fn failed(&self, node: NodeId, error: &str) {
        let mut st = self.lock();
        if node == self.me {
            st.stopped = true;
            st.status = Status::Broken(CollectiveError::Ps(format!(
                "this node's postoffice stopped: {error}"
            )));
        } else if matches!(st.status, Status::Active) {
            if let Some(rank) = st.generation.rank_of(node) {
                warn!(
                    node,
                    rank,
                    generation = st.generation.number,
                    "collective member failed: {error}"
                );
                st.status = Status::Broken(CollectiveError::RankFailed {
                    node,
                    rank,
                    generation: st.generation.number,
                    reason: error.to_owned(),
                });
            }
        }
        st.joins.remove(&node);
        st.asked.remove(&node);
        if matches!(st.status, Status::Settling) && st.join_sent.is_some_and(|(to, _)| to == node) {
            // The coordinator died: ask its successor now.
            st.join_sent = None;
            self.join(&mut st, Instant::now());
        }
        self.coordinate(&mut st, Instant::now());
        drop(st);
        self.notify.notify_waiters();
    }
}

fn smallvec_of_u8() -> van_core::message::DataTypes {
    [van_core::DataType::U8].into_iter().collect()
}

/// Checks a received slice against what this rank expects.
fn check(op: &Op, rank: usize, node: NodeId, len: usize, msg: Message) -> Result<Bytes> {
    let mismatch = |reason: String| CollectiveError::Mismatch { rank, node, reason };
    if OpKind::from_head(msg.meta.head) != Some(op.kind) {
        return Err(mismatch(format!(
            "it runs another collective as #{} where this rank runs {}",
            op.number,
            op.kind.name()
        )));
    }
    if msg.meta.priority as u64 != op.tag {
        return Err(mismatch(format!(
            "its element type differs (tag {} here {})",
            msg.meta.priority, op.tag
        )));
    }
    if msg.meta.val_len != op.total as u64 {
        return Err(mismatch(format!(
            "its buffer has {} elements, this rank's {}",
            msg.meta.val_len, op.total
        )));
    }
    let data = msg.data.into_iter().next().unwrap_or_default();
    if data.len() != len {
        return Err(mismatch(format!(
            "a slice of {} bytes where {len} were expected",
            data.len()
        )));
    }
    Ok(data)
}

/// The postoffice delivers the communicator's messages here.
pub(crate) struct Inbox(pub(crate) Arc<Shared>);

#[async_trait::async_trait]
impl Customer for Inbox {
    fn try_deliver(&self, msg: Message) -> Option<Message> {
        self.0.accept(msg);
        None
    }

    async fn deliver(&self, msg: Message) {
        self.0.accept(msg);
    }

    fn node_failed(&self, node: NodeId, error: &str) {
        self.0.failed(node, error);
    }

    fn node_recovered(&self, node: NodeId) {
        // A new process in a member's place holds nothing of the collective in progress.
        self.0
            .failed(node, "replaced by a new process (its old one is gone)");
    }
}

/// The background task: sends control messages in order and ticks.
pub(crate) async fn run(shared: Arc<Shared>, mut queue: mpsc::Receiver<Message>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = queue.recv() => {
                let Some(msg) = msg else { return };
                let to = msg.meta.recipient;
                // A peer that takes no more must not hold up the others' messages and the
                // ticks: what is lost here is asked for again (JOIN resends, the window).
                match tokio::time::timeout(CONTROL_SEND, shared.po.send(msg)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(?to, "collective control message not sent: {e}"),
                    Err(_) => warn!(?to, "collective control message not sent within {CONTROL_SEND:?}"),
                }
            }
            _ = tick.tick() => {
                shared.tick();
                if shared.po.is_stopped() {
                    return;
                }
            }
        }
    }
}
