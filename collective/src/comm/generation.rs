//! The membership protocol of a communicator's generations: a worker that leaves its
//! generation asks the coordinator (the live worker of lowest id) to join the next; the
//! coordinator asks the others, then announces the members of the next generation.

use std::time::Instant;

use bytes::Bytes;
use tracing::{debug, info, warn};
use van_core::{node_ids, Message, NodeId};

use super::{
    Generation, Shared, State, Status, JOIN_RESEND, KIND_GENERATION, KIND_INTERRUPT, KIND_JOIN,
};
use crate::error::CollectiveError;

impl Shared {
    /// Asks to join the next generation (a no-op while a request is fresh).
    pub(super) fn join(&self, st: &mut State, now: Instant) {
        if st.stopped || matches!(st.status, Status::Active) {
            return;
        }
        if !matches!(st.status, Status::Settling) {
            st.status = Status::Settling;
        }
        let Some(coordinator) = self.coordinator() else {
            return;
        };
        let fresh = st
            .join_sent
            .is_some_and(|(to, at)| to == coordinator && now.duration_since(at) < JOIN_RESEND);
        if fresh {
            return;
        }
        st.join_sent = Some((coordinator, now));
        // Why this node left its generation, so the coordinator can tell the others what
        // broke it even before it sees the failure itself.
        let why = match &st.status {
            Status::Broken(e) => Bytes::from(e.to_string().into_bytes()),
            _ => Bytes::new(),
        };
        let msg = self.control_message(coordinator, KIND_JOIN, st.generation.number, why);
        self.post(st, msg);
    }

    /// The coordinator's part: ask those that have not joined, and form the next generation
    /// when everyone has (or the window has passed).
    pub(super) fn coordinate(&self, st: &mut State, now: Instant) {
        if self.coordinator() != Some(self.me) {
            // Another worker coordinates: what this node gathered is stale.
            Self::forget_round(st);
            return;
        }
        if st.joins.is_empty() {
            return;
        }
        let alive = self.alive_workers();
        st.joins.retain(|node, _| alive.contains(node));
        if st.joins.is_empty() {
            return;
        }
        let started = *st.round_started.get_or_insert(now);
        let missing: Vec<NodeId> = alive
            .iter()
            .copied()
            .filter(|w| !st.joins.contains_key(w))
            .collect();
        // Why, for the error those asked will see: what broke this node's generation, what
        // broke a joiner's, or the workers that ask to join.
        let reason = match (&st.status, &st.join_reason) {
            (Status::Broken(e), _) => e.to_string(),
            (_, Some(why)) => why.clone(),
            _ => {
                let new: Vec<NodeId> = st
                    .joins
                    .keys()
                    .copied()
                    .filter(|j| st.generation.rank_of(*j).is_none())
                    .collect();
                format!("workers {new:?} ask to join")
            }
        };
        for &worker in &missing {
            if st.asked.insert(worker) {
                let body = Bytes::from(reason.clone().into_bytes());
                let msg = self.control_message(worker, KIND_INTERRUPT, 0, body);
                self.post(st, msg);
            }
        }
        if !missing.is_empty() && now.duration_since(started) < self.options.settle_window {
            return;
        }
        let number = st
            .joins
            .values()
            .copied()
            .chain([st.generation.number, st.highest])
            .max()
            .unwrap_or(0)
            + 1;
        st.highest = number;
        let members: Vec<NodeId> = st.joins.keys().copied().collect();
        if !missing.is_empty() {
            warn!(
                generation = number,
                ?missing,
                "forming the next generation without workers that did not join within {:?}",
                self.options.settle_window
            );
        }
        let generation = Generation { number, members };
        Self::forget_round(st);
        for &member in &generation.members {
            let msg = self.generation_message(member, &generation);
            self.post(st, msg);
        }
    }

    pub(super) fn forget_round(st: &mut State) {
        st.joins.clear();
        st.join_reason = None;
        st.asked.clear();
        st.round_started = None;
    }

    /// The announcement of `generation` to `to`.
    pub(super) fn generation_message(&self, to: NodeId, generation: &Generation) -> Message {
        let body: Vec<u8> = generation
            .members
            .iter()
            .flat_map(|m| m.to_le_bytes())
            .collect();
        self.control_message(to, KIND_GENERATION, generation.number, Bytes::from(body))
    }

    /// A control message from another node (or this one).
    pub(super) fn handle_control(&self, st: &mut State, msg: Message) {
        let Some(from) = msg.meta.sender else {
            return;
        };
        let now = Instant::now();
        match msg.meta.head {
            KIND_JOIN if node_ids::is_worker(from) => {
                let known = msg.meta.key;
                st.highest = st.highest.max(known);
                let intact = matches!(st.status, Status::Active)
                    && st.generation.rank_of(from).is_some()
                    && known < st.generation.number;
                if intact {
                    // A member asking for a generation that has formed since (its JOIN
                    // crossed the announcement): tell it again rather than start a round.
                    let again = self.generation_message(from, &st.generation);
                    self.post(st, again);
                    return;
                }
                st.joins.insert(from, known);
                if st.join_reason.is_none() && !msg.meta.body.is_empty() {
                    st.join_reason = Some(bounded_text(&msg.meta.body));
                }
                self.coordinate(st, now);
            }
            KIND_INTERRUPT => {
                if matches!(st.status, Status::Active) {
                    debug!(
                        generation = st.generation.number,
                        "asked to join the next generation"
                    );
                    let why = bounded_text(&msg.meta.body);
                    st.status = Status::Broken(CollectiveError::MembershipChanged {
                        generation: st.generation.number,
                        reason: format!("worker {from}, forming the next generation, says: {why}"),
                    });
                }
            }
            KIND_GENERATION => {
                let number = msg.meta.key;
                if number <= st.generation.number {
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
                st.highest = st.highest.max(number);
                st.unannounced = matches!(st.status, Status::Active) && member;
                if from != self.me {
                    Self::forget_round(st);
                }
                st.generation = Generation { number, members };
                st.next_op = 0;
                st.p2p.clear();
                st.join_sent = None;
                st.mailbox.retain(|key, _| key.generation >= number);
                st.status = if member {
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
