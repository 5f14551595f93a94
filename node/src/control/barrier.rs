//! Barriers: a barrier on a group mask is released to every member once all members have
//! arrived, and failed (to those that arrived and can be reached) as soon as a member is
//! dead — but `finalize`'s ([`FINAL_BARRIER`](super::FINAL_BARRIER)) when the scheduler has
//! a replacement grace (`VANS_REPLACEMENT_GRACE_SECS`): it waits that long for a new process
//! in the dead member's place, and then for that process's own arrival.

use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, warn};
use van_core::{node_ids, Command, Control, NodeId};

use super::output::{reply, Echo};
use super::{BarrierMembers, Output, Scheduler};

/// Every group bit a barrier mask may use: scheduler, servers, workers.
const ALL_GROUPS: i32 = node_ids::SCHEDULER | node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;

impl Scheduler {
    pub(super) fn on_barrier(
        &mut self,
        now: Instant,
        from: NodeId,
        group: i32,
        is_final: bool,
        echo: Echo,
    ) -> Vec<Output> {
        if !self.is_ready() {
            warn!(
                from,
                group, "ignoring a barrier before the cluster is ready"
            );
            return Vec::new();
        }
        if group <= 0 || group & !ALL_GROUPS != 0 {
            warn!(from, group, "ignoring a barrier on an invalid group");
            return Vec::new();
        }
        let is_member = self
            .node(from)
            .is_some_and(|n| node_ids::group_of(n.role) & group != 0);
        if !is_member {
            warn!(from, group, "ignoring a barrier from a non-member");
            return Vec::new();
        }
        self.barriers.entry(group).or_default().insert(from, echo);
        if is_final {
            self.final_barriers.entry(group).or_default();
        }
        self.settle(now, group)
    }

    /// A new process took `id`'s place: an arrival of the process before it is none of the
    /// new one's, which must arrive itself.
    pub(super) fn forget_arrivals(&mut self, id: NodeId) {
        for arrived in self.barriers.values_mut() {
            arrived.remove(&id);
        }
    }

    /// Settles every pending barrier (a death, a revival, or a grace ending may decide one).
    pub(super) fn settle_all(&mut self, now: Instant) -> Vec<Output> {
        let groups: Vec<i32> = self.barriers.keys().copied().collect();
        groups
            .into_iter()
            .flat_map(|group| self.settle(now, group))
            .collect()
    }

    /// Releases or fails the barrier of `group` if it can be decided. Constant work per
    /// arrival until as many nodes as members have arrived (10,000 workers arriving at a
    /// barrier cost 10,000 steps, not 10,000²).
    pub(super) fn settle(&mut self, now: Instant, group: i32) -> Vec<Output> {
        if !self.barriers.contains_key(&group) {
            return Vec::new();
        }
        let BarrierMembers { members, dead } = self.members(group);
        let grace = self.config.replacement_grace;
        if let Some(waiting) = self
            .final_barriers
            .get_mut(&group)
            .filter(|_| !grace.is_zero())
        {
            if dead.is_empty() {
                *waiting = None;
            } else {
                let since = *waiting.get_or_insert_with(|| {
                    warn!(
                        group,
                        ?dead,
                        "finalize's barrier waits up to {grace:?} for new processes in the \
                         places of the dead (VANS_REPLACEMENT_GRACE_SECS)"
                    );
                    now
                });
                if now.saturating_duration_since(since) < grace {
                    return Vec::new();
                }
            }
        }
        let Some(arrived) = self.barriers.get(&group) else {
            return Vec::new();
        };
        if dead.is_empty() && arrived.len() < members.len() {
            return Vec::new();
        }
        let recipients: Vec<(NodeId, Echo)> = if !dead.is_empty() {
            warn!(group, ?dead, "barrier failed");
            let live = arrived.iter().filter(|(id, _)| self.is_live(**id));
            live.map(|(&id, &echo)| (id, echo)).collect()
        } else if members.iter().all(|id| arrived.contains_key(id)) {
            debug!(group, "barrier released");
            let echo = |id| arrived.get(&id).copied().unwrap_or_default();
            members.iter().map(|&id| (id, echo(id))).collect()
        } else {
            return Vec::new();
        };
        self.barriers.remove(&group);
        self.final_barriers.remove(&group);
        let nodes = self.nodes(&dead);
        let control = Control {
            cmd: Command::Barrier,
            nodes,
            barrier_group: group,
            msg_sig: 0,
        };
        let replies = recipients.into_iter();
        replies
            .map(|(id, echo)| reply(id, control.clone(), echo))
            .collect()
    }

    /// The members of barrier `group` (its nodes that have not left, the dead included) and
    /// the dead ones among them, worked out again only after a membership change.
    fn members(&mut self, group: i32) -> BarrierMembers {
        let epoch = self.membership_epoch;
        if let Some((at, members)) = self.barrier_members.get(&group) {
            if *at == epoch {
                return members.clone();
            }
        }
        let members: Arc<[NodeId]> = (self.table.iter())
            .filter(|n| node_ids::group_of(n.role) & group != 0)
            .filter_map(|n| n.id)
            .filter(|id| self.peers.get(id).is_none_or(|p| !p.gone))
            .collect();
        let dead: Arc<[NodeId]> = (members.iter().copied())
            .filter(|id| self.peers.get(id).is_some_and(|p| p.dead))
            .collect();
        let found = BarrierMembers { members, dead };
        self.barrier_members.insert(group, (epoch, found.clone()));
        found
    }
}
