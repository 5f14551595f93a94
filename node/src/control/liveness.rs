//! Liveness: nodes silent for a whole heartbeat timeout, or whose connection broke, are
//! declared dead (or merely gone, when they were leaving); every live node is told, and the
//! pending barriers are settled.

use std::time::Instant;

use tracing::{debug, info, warn};
use van_core::{node_ids, Command, Control, NodeId};

use super::output::{reply, Echo};
use super::{Output, Scheduler};

impl Scheduler {
    /// Declares silent nodes dead (or gone, if leaving). Call it at [`Self::next_deadline`].
    pub fn tick(&mut self, now: Instant) -> Vec<Output> {
        let Some(timeout) = self.config.heartbeat_timeout else {
            // finalize's barriers that wait for replacements may have waited long enough.
            return self.settle_all(now);
        };
        let mut newly_dead = Vec::new();
        for (&id, peer) in &mut self.peers {
            if peer.dead || peer.gone || now.saturating_duration_since(peer.last_seen) < timeout {
                continue;
            }
            if peer.leaving {
                info!(id, "leaving node stopped its heartbeat");
                peer.gone = true;
                self.membership_epoch += 1;
            } else {
                newly_dead.push(id);
            }
        }
        let reason = format!("no heartbeat for {timeout:?}");
        let mut out = self.bury(now, newly_dead.clone(), &reason);
        out.extend(self.replace_dead(now, &newly_dead));
        // finalize's barriers that wait for replacements may have waited long enough.
        out.extend(self.settle_all(now));
        out
    }

    /// A connection to `peer` broke: the node is dead at once, unless it is unknown, already
    /// dead, or leaving (then it is merely gone).
    pub fn peer_lost(&mut self, now: Instant, peer: NodeId, reason: &str) -> Vec<Output> {
        match self.peers.get_mut(&peer) {
            None => {
                debug!(peer, reason, "lost a connection to an unregistered node");
                Vec::new()
            }
            Some(state) if state.dead || state.gone => Vec::new(),
            Some(state) if self.me_leaving => {
                // The scheduler's final barrier is over and it only waits for everyone to
                // go: a node that closes now is gone, whether it said goodbye or not, and
                // nobody is left to be told.
                debug!(peer, reason, "a node closed while the scheduler finishes");
                state.gone = true;
                self.membership_epoch += 1;
                Vec::new()
            }
            Some(state) if state.leaving => {
                info!(peer, reason, "leaving node disconnected");
                state.gone = true;
                self.membership_epoch += 1;
                self.bury(now, Vec::new(), reason)
            }
            Some(_) => {
                let mut out = self.bury(now, vec![peer], reason);
                out.extend(self.replace_dead(now, &[peer]));
                out
            }
        }
    }

    /// The ids of the nodes declared dead, sorted.
    pub fn dead(&self) -> Vec<NodeId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.dead)
            .map(|(&id, _)| id)
            .collect()
    }

    /// When [`Self::tick`] next needs calling: the earliest heartbeat expiry of a node still
    /// watched, or the end of a `finalize` barrier's wait for a replacement; `None` if
    /// neither is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        let heartbeats = self.config.heartbeat_timeout.and_then(|timeout| {
            self.peers
                .values()
                .filter(|p| !p.dead && !p.gone)
                .filter_map(|p| p.last_seen.checked_add(timeout))
                .min()
        });
        let graces = (self.final_barriers.values())
            .filter_map(|since| since.and_then(|t| t.checked_add(self.config.replacement_grace)))
            .min();
        heartbeats.into_iter().chain(graces).min()
    }

    /// Whether `id` can be sent to: the scheduler, or a node neither dead nor gone.
    pub(super) fn is_live(&self, id: NodeId) -> bool {
        id == node_ids::SCHEDULER || self.peers.get(&id).is_some_and(|p| !p.dead && !p.gone)
    }

    /// Declares `ids` dead, tells every live node, and settles every pending barrier.
    pub(super) fn bury(&mut self, now: Instant, ids: Vec<NodeId>, reason: &str) -> Vec<Output> {
        let mut out = Vec::new();
        if !ids.is_empty() {
            warn!(dead = ?ids, reason, "declaring nodes dead");
            for id in &ids {
                if let Some(peer) = self.peers.get_mut(id) {
                    peer.dead = true;
                }
            }
            self.membership_epoch += 1;
            let control = Control {
                cmd: Command::NodeFailure,
                nodes: self.nodes(&ids),
                ..Control::default()
            };
            // Live nodes, and (best effort) the dead themselves: one declared dead wrongly
            // learns it and stops waiting.
            for node in self.table.iter() {
                let Some(id) = node.id.filter(|&id| self.is_live(id) || ids.contains(&id)) else {
                    continue;
                };
                out.push(reply(id, control.clone(), Echo::default()));
            }
        }
        out.extend(self.settle_all(now));
        out
    }
}
