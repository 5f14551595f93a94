//! The elastic generation protocol: which workers make up a generation, how they agree on the
//! next one, and how a failure ends the current one.
//!
//! The workers of a generation are its ranks, in node-id order. The lowest-numbered live
//! worker coordinates: a worker that wants a new generation (it starts, or its collective
//! failed) sends it `JOIN`, saying why it left its own; the coordinator asks every live worker
//! that has not joined to do so (`INTERRUPT`: their current generation ends), and once all have
//! joined (or the settle window has passed) it announces the next generation (`GENERATION`:
//! number and members) to those that joined. A member that dies breaks the generation on every
//! survivor (the postoffice reports the failure: a broken connection at once, the scheduler's
//! notice within the heartbeat timeout). Control messages leave in order through one queue, so
//! an `INTERRUPT` never overtakes the `GENERATION` before it.
//!
//! [`Membership`] is what one node knows of this; [`Protocol`] moves it on (a message arrived,
//! a node failed, time passed). Neither knows of the data messages of collectives: those are
//! numbered by generation, and `p2p` drops a generation's leftovers once the next forms.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use node::Postoffice;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use van_core::{node_ids, Message, Meta, NodeId};

use crate::error::{CollectiveError, Result};

/// The application id of collectives' messages, control and data alike (the customer id is
/// the communicator's).
pub const APP_ID: i32 = 0x636f;

const KIND_JOIN: i32 = 1;
const KIND_INTERRUPT: i32 = 2;
const KIND_GENERATION: i32 = 3;
/// The first message kind (`head`) that is not the protocol's: data messages are this and up.
pub(super) const FIRST_DATA_KIND: i32 = 16;

/// How often the background task re-sends a pending `JOIN` and looks at the settle window.
pub(super) const TICK: Duration = Duration::from_millis(100);
/// Longest a control message may take to be queued for its peer.
const CONTROL_SEND: Duration = Duration::from_secs(5);
/// Control messages waiting for the background task (a round posts a few per worker).
const CONTROL_QUEUE: usize = 4096;
/// A `JOIN` without an answer is sent again after this (the coordinator may have changed).
const JOIN_RESEND: Duration = Duration::from_secs(1);

/// Whether a message of the communicator (by its `head`) belongs to the protocol.
pub(super) fn is_control(head: i32) -> bool {
    head < FIRST_DATA_KIND
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

/// Where a generation stands on this node.
enum Status {
    /// Collectives run.
    Active,
    /// Collectives fail with this until the next generation.
    Broken(CollectiveError),
    /// This node asked to join the next generation.
    Settling,
}

/// What this node knows of the generations: its current one and how it stands, and, while
/// it coordinates, the round that forms the next.
pub(super) struct Membership {
    generation: Generation,
    status: Status,
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
    /// Why this node left its last generation (the error that broke it), sent with its
    /// `JOIN`s until a new generation starts.
    left_because: Option<String>,
    /// The postoffice stopped.
    stopped: bool,
    /// A generation was announced while this node's was active (it did not ask): the next
    /// collective fails once, so the application resynchronizes through `settle`.
    unannounced: bool,
    /// The highest generation number seen anywhere (announced, or known by a joiner), so a
    /// new coordinator never reuses one.
    highest: u64,
}

impl Membership {
    /// Before the first generation: settling.
    pub(super) fn new() -> Membership {
        Membership {
            generation: Generation::default(),
            status: Status::Settling,
            join_sent: None,
            joins: BTreeMap::new(),
            join_reason: None,
            round_started: None,
            asked: BTreeSet::new(),
            left_because: None,
            stopped: false,
            unannounced: false,
            highest: 0,
        }
    }

    /// The current generation.
    pub(super) fn generation(&self) -> &Generation {
        &self.generation
    }

    /// The rank of `me`, when its generation is active (a collective may start).
    pub(super) fn active_rank(&self, me: NodeId) -> Result<usize> {
        let number = self.generation.number;
        if self.unannounced {
            return Err(CollectiveError::MembershipChanged {
                generation: number,
                reason: format!(
                    "generation {number} formed without this rank asking; settle() and \
                     resynchronize"
                ),
            });
        }
        self.still(number)?;
        self.generation
            .rank_of(me)
            .ok_or_else(|| CollectiveError::MembershipChanged {
                generation: number,
                reason: "this worker is not a member".into(),
            })
    }

    /// Whether a collective of `generation` may go on: that generation is current and active.
    pub(super) fn still(&self, generation: u64) -> Result<()> {
        if self.generation.number != generation {
            return Err(CollectiveError::MembershipChanged {
                generation,
                reason: format!("generation {} formed", self.generation.number),
            });
        }
        match &self.status {
            Status::Active => Ok(()),
            Status::Broken(e) => Err(e.clone()),
            Status::Settling => Err(CollectiveError::MembershipChanged {
                generation,
                reason: "the membership is settling".into(),
            }),
        }
    }

    /// What a wait for the next generation ends with, once it ends: the generation when
    /// it is active, an error when the postoffice stopped.
    pub(super) fn settled(&self) -> Option<Result<Generation>> {
        if self.stopped {
            // Why it stopped, as the status says it (the postoffice's own error: evicted,
            // failed, or stopped).
            return Some(Err(match &self.status {
                Status::Broken(e) => e.clone(),
                _ => CollectiveError::Ps("the postoffice stopped".into()),
            }));
        }
        matches!(self.status, Status::Active).then(|| Ok(self.generation.clone()))
    }

    fn forget_round(&mut self) {
        self.joins.clear();
        self.join_reason = None;
        self.asked.clear();
        self.round_started = None;
    }
}

/// The protocol's side of the node: the postoffice (which workers live), this node, the
/// communicator's customer id and settle window, and the queue control messages leave by.
pub(super) struct Protocol {
    po: Postoffice,
    me: NodeId,
    customer_id: i32,
    settle_window: Duration,
    control: mpsc::Sender<Message>,
}

impl Protocol {
    /// The protocol of the communicator `customer_id` on `po`, and the receiver of its
    /// control queue (for the background task, which sends them with
    /// [`send_control`](Self::send_control)).
    pub(super) fn new(
        po: Postoffice,
        customer_id: i32,
        settle_window: Duration,
    ) -> (Protocol, mpsc::Receiver<Message>) {
        let (control, queue) = mpsc::channel(CONTROL_QUEUE);
        let protocol = Protocol {
            me: po.my_id(),
            po,
            customer_id,
            settle_window,
            control,
        };
        (protocol, queue)
    }

    /// Sends a queued control message; a peer that takes no more must not hold up the
    /// others' messages and the ticks: what is lost here is asked for again (`JOIN`
    /// resends, the window).
    pub(super) async fn send_control(&self, msg: Message) {
        let to = msg.meta.recipient;
        match tokio::time::timeout(CONTROL_SEND, self.po.send(msg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => debug!(?to, "collective control message not sent: {e}"),
            Err(_) => warn!(
                ?to,
                "collective control message not sent within {CONTROL_SEND:?}"
            ),
        }
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

    /// Where the membership stands, for an error after waiting for it too long.
    pub(super) fn describe(&self, m: &Membership) -> String {
        format!(
            "generation {} ({:?}); live workers {:?}; coordinator {:?}",
            m.generation.number,
            m.generation.members,
            self.alive_workers(),
            self.coordinator()
        )
    }

    fn control_message(&self, to: NodeId, kind: i32, number: u64, body: Bytes) -> Message {
        Message {
            meta: Meta {
                app_id: APP_ID,
                customer_id: self.customer_id,
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
    fn post(&self, m: &mut Membership, msg: Message) {
        if msg.meta.recipient == Some(self.me) {
            self.handle_control(m, msg);
        } else if let Err(e) = self.control.try_send(msg) {
            // A round posts a few messages per worker; a full queue means the background task
            // is stuck, and a lost JOIN is sent again.
            warn!("collective control message not queued: {e}");
        }
    }

    /// Time passed: note a stopped postoffice, re-send a stale `JOIN`, close a settle window.
    pub(super) fn tick(&self, m: &mut Membership, now: Instant) {
        if self.po.is_stopped() && !m.stopped {
            m.stopped = true;
            m.status = Status::Broken(CollectiveError::Ps(self.po.stopped_error().to_string()));
        }
        if matches!(m.status, Status::Settling) {
            self.join(m, now);
        }
        self.coordinate(m, now);
    }

    /// The application waits for the next generation: it has seen the last announcement, and
    /// a broken generation asks to join the next.
    pub(super) fn rejoin(&self, m: &mut Membership, now: Instant) {
        m.unannounced = false;
        if let Status::Broken(_) = m.status {
            self.join(m, now);
        }
    }

    /// This rank's part in a collective of `generation` ended with `error` (or the call was
    /// dropped): the generation is over for it, and it asks for the next at once, so the
    /// coordinator stops the others instead of their waiting out their timeout.
    pub(super) fn abandon(&self, m: &mut Membership, generation: u64, error: &CollectiveError) {
        if m.generation.number == generation && matches!(m.status, Status::Active) {
            debug!(
                generation,
                "leaving the generation after a failed collective: {error}"
            );
            m.status = Status::Broken(error.clone());
            self.join(m, Instant::now());
        }
    }

    /// The postoffice reports `node` failed (or replaced by a new process).
    pub(super) fn failed(&self, m: &mut Membership, node: NodeId, error: &str) {
        if node == self.me {
            m.stopped = true;
            m.status = Status::Broken(CollectiveError::Ps(format!(
                "this node's postoffice stopped: {error}"
            )));
        } else if matches!(m.status, Status::Active) {
            if let Some(rank) = m.generation.rank_of(node) {
                warn!(
                    node,
                    rank,
                    generation = m.generation.number,
                    "collective member failed: {error}"
                );
                m.status = Status::Broken(CollectiveError::RankFailed {
                    node,
                    rank,
                    generation: m.generation.number,
                    reason: error.to_owned(),
                });
            }
        }
        m.joins.remove(&node);
        m.asked.remove(&node);
        if matches!(m.status, Status::Settling) && m.join_sent.is_some_and(|(to, _)| to == node) {
            // The coordinator died: ask its successor now.
            m.join_sent = None;
            self.join(m, Instant::now());
        }
        self.coordinate(m, Instant::now());
    }

    /// Asks to join the next generation (a no-op while a request is fresh).
    fn join(&self, m: &mut Membership, now: Instant) {
        if m.stopped || matches!(m.status, Status::Active) {
            return;
        }
        // Why this node left its generation, so the coordinator can tell the others what
        // broke it even before it sees the failure itself: read before the status becomes
        // `Settling` (read after, it was always empty, and a survivor the coordinator
        // interrupted heard only "workers [] ask to join").
        if let Status::Broken(e) = &m.status {
            m.left_because = Some(e.to_string());
        }
        if !matches!(m.status, Status::Settling) {
            m.status = Status::Settling;
        }
        let Some(coordinator) = self.coordinator() else {
            return;
        };
        let fresh = m
            .join_sent
            .is_some_and(|(to, at)| to == coordinator && now.duration_since(at) < JOIN_RESEND);
        if fresh {
            return;
        }
        m.join_sent = Some((coordinator, now));
        let why = m
            .left_because
            .as_ref()
            .map_or_else(Bytes::new, |why| Bytes::from(why.clone().into_bytes()));
        let msg = self.control_message(coordinator, KIND_JOIN, m.generation.number, why);
        self.post(m, msg);
    }

    /// The coordinator's part: ask those that have not joined, and form the next generation
    /// when everyone has (or the window has passed).
    fn coordinate(&self, m: &mut Membership, now: Instant) {
        if self.coordinator() != Some(self.me) {
            // Another worker coordinates: what this node gathered is stale.
            m.forget_round();
            return;
        }
        if m.joins.is_empty() {
            return;
        }
        let alive = self.alive_workers();
        m.joins.retain(|node, _| alive.contains(node));
        if m.joins.is_empty() {
            return;
        }
        let started = *m.round_started.get_or_insert(now);
        let missing: Vec<NodeId> = alive
            .iter()
            .copied()
            .filter(|w| !m.joins.contains_key(w))
            .collect();
        // Why, for the error those asked will see: what broke this node's generation, what
        // broke a joiner's, or the workers that ask to join.
        let reason = match (&m.status, &m.join_reason) {
            (Status::Broken(e), _) => e.to_string(),
            (_, Some(why)) => why.clone(),
            _ => {
                let new: Vec<NodeId> = m
                    .joins
                    .keys()
                    .copied()
                    .filter(|j| m.generation.rank_of(*j).is_none())
                    .collect();
                format!("workers {new:?} ask to join")
            }
        };
        for &worker in &missing {
            if m.asked.insert(worker) {
                let body = Bytes::from(reason.clone().into_bytes());
                let msg = self.control_message(worker, KIND_INTERRUPT, 0, body);
                self.post(m, msg);
            }
        }
        if !missing.is_empty() && now.duration_since(started) < self.settle_window {
            return;
        }
        let number = m
            .joins
            .values()
            .copied()
            .chain([m.generation.number, m.highest])
            .max()
            .unwrap_or(0)
            + 1;
        m.highest = number;
        let members: Vec<NodeId> = m.joins.keys().copied().collect();
        if !missing.is_empty() {
            warn!(
                generation = number,
                ?missing,
                "forming the next generation without workers that did not join within {:?}",
                self.settle_window
            );
        }
        let generation = Generation { number, members };
        m.forget_round();
        for &member in &generation.members {
            let msg = self.generation_message(member, &generation);
            self.post(m, msg);
        }
    }

    /// The announcement of `generation` to `to`.
    fn generation_message(&self, to: NodeId, generation: &Generation) -> Message {
        let body: Vec<u8> = generation
            .members
            .iter()
            .flat_map(|m| m.to_le_bytes())
            .collect();
        self.control_message(to, KIND_GENERATION, generation.number, Bytes::from(body))
    }

    /// A control message from another node (or this one).
    pub(super) fn handle_control(&self, m: &mut Membership, msg: Message) {
        let Some(from) = msg.meta.sender else {
            return;
        };
        let now = Instant::now();
        match msg.meta.head {
            KIND_JOIN if node_ids::is_worker(from) => {
                let known = msg.meta.key;
                m.highest = m.highest.max(known);
                let intact = matches!(m.status, Status::Active)
                    && m.generation.rank_of(from).is_some()
                    && known < m.generation.number;
                if intact {
                    // A member asking for a generation that has formed since (its JOIN
                    // crossed the announcement): tell it again rather than start a round.
                    let again = self.generation_message(from, &m.generation);
                    self.post(m, again);
                    return;
                }
                m.joins.insert(from, known);
                if m.join_reason.is_none() && !msg.meta.body.is_empty() {
                    m.join_reason = Some(bounded_text(&msg.meta.body));
                }
                self.coordinate(m, now);
            }
            KIND_INTERRUPT => {
                if matches!(m.status, Status::Active) {
                    debug!(
                        generation = m.generation.number,
                        "asked to join the next generation"
                    );
                    let why = bounded_text(&msg.meta.body);
                    m.status = Status::Broken(CollectiveError::MembershipChanged {
                        generation: m.generation.number,
                        reason: format!("worker {from}, forming the next generation, says: {why}"),
                    });
                }
            }
            KIND_GENERATION => {
                let number = msg.meta.key;
                if number <= m.generation.number {
                    return;
                }
                let members: Vec<NodeId> = msg
                    .meta
                    .body
                    .chunks_exact(4)
                    .filter_map(|c| Some(NodeId::from_le_bytes(c.try_into().ok()?)))
                    .collect();
                let member = members.contains(&self.me);
                info!(generation = number, ?members, "generation formed");
                m.highest = m.highest.max(number);
                m.unannounced = matches!(m.status, Status::Active) && member;
                if from != self.me {
                    m.forget_round();
                }
                m.generation = Generation { number, members };
                m.join_sent = None;
                m.left_because = None;
                m.status = if member {
                    Status::Active
                } else {
                    Status::Broken(CollectiveError::MembershipChanged {
                        generation: number,
                        reason: "this worker was left out of it (it did not join in time)".into(),
                    })
                };
            }
            other => debug!(
                from,
                kind = other,
                "unknown collective control message; ignored"
            ),
        }
    }
}

/// A peer's reason text, as shown in an error: lossy UTF-8, at most `MAX_REASON` bytes.
fn bounded_text(body: &[u8]) -> String {
    const MAX_REASON: usize = 1024;
    let mut text = String::from_utf8_lossy(&body[..body.len().min(MAX_REASON)]).into_owned();
    if body.len() > MAX_REASON {
        text.push_str("...");
    }
    text
}
