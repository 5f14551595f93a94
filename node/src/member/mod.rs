//! A node's side of membership as a deterministic state machine: joining (the node table and
//! the recovery notices that overtake it), who is dead, barriers, scheduler liveness, failure
//! and recovery notices, connection losses tagged with the process they were read for, and
//! finalize.
//!
//! Like the scheduler's [`Scheduler`](crate::control::Scheduler), [`Member`] does no I/O and
//! reads no clock. The postoffice feeds it what happens ([`Member::handle`] with an
//! [`Input`] and the time) and carries out the [`Action`]s it returns, in order. Every race
//! between those inputs is therefore a sequence of calls, tested here on a simulated clock.
//!
//! Decisions worth knowing:
//! - **One set of dead nodes.** A node is dead from the first failure seen (a broken
//!   connection, the scheduler's notice, a silent scheduler) until a new process takes its
//!   place. The router asks this set before a send waits for room ([`Member::failure`]).
//! - **Losses belong to a process.** A lost connection carries the incarnation the node table
//!   named for its peer when the loss was read. A loss read before a recovery notice but
//!   handled after it (it waited behind data) is the old process's: ignored.
//! - **Early notices.** A recovery notice can overtake the node table (a resend after a broken
//!   connection). It is kept, and applied once the table arrives if it was sent after it.
//! - **Finalize.** Once finalize's all-nodes barrier is released, or finalize gave up on it,
//!   departures are no longer failures; while waiting at it, a peer's close is none either
//!   (it was released first), but the scheduler's loss is.
//! - **A silent scheduler** (no answer to this node's heartbeats for a whole heartbeat
//!   timeout, with heartbeats on) is a dead scheduler, or this node is cut off: every barrier
//!   fails, since nobody is left to release it, and the node stops (a lease: the scheduler,
//!   which has not heard it either, declares it dead).
//! - **Declared dead by the scheduler**, this node stops: the cluster moved on without it.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use van_core::{node_ids, Command, Control, Message, Meta, Node, NodeId, Role};

use crate::error::NodeError;
use crate::table::NodeTable;

/// Barrier group of every node (scheduler, servers and workers).
pub const ALL_GROUPS: i32 = node_ids::SCHEDULER | node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;

/// What a node is and how it detects failures.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The node's role.
    pub role: Role,
    /// This process's incarnation ([`Node::incarnation`] of its registration).
    pub incarnation: u64,
    /// With heartbeats on (`PS_HEARTBEAT_INTERVAL` and `PS_HEARTBEAT_TIMEOUT`), a scheduler
    /// silent this long is lost; `None` turns that detection off.
    pub heartbeat_timeout: Option<Duration>,
    /// `PS_RESEND` is on: a broken connection is no failure (what it carried goes again over
    /// a new one); a node that really died is declared by the heartbeat timeout.
    pub resend: bool,
}

/// What happened to the node, for [`Member::handle`].
#[derive(Debug)]
pub enum Input<'a> {
    /// A control message from the scheduler that is not a request: the node table, a
    /// recovery notice, a barrier release, a failure notice, an answer to a heartbeat.
    Control(&'a Message),
    /// On the scheduler: its state machine has every node registered, with this table.
    SchedulerReady(NodeTable),
    /// The connection to `peer` ended. `read_as` is what [`Member::incarnation_of`] said for
    /// the peer when the loss was read (0: unknown).
    Lost {
        /// The peer.
        peer: NodeId,
        /// What the van saw.
        reason: &'a str,
        /// The peer's process as the loss was read.
        read_as: u64,
    },
    /// Time passed (call it at the heartbeat interval): checks the scheduler is still heard.
    Tick,
    /// The application calls `barrier(group)`.
    Barrier(i32),
    /// `finalize` begins: the all-nodes barrier it now waits at is the final one.
    Finalize,
    /// `finalize`'s barrier ended, either way: the node leaves.
    Leave,
    /// The node is asked to stop.
    Stop,
}

/// What an evicted node's errors say of its place in the cluster (see [`Action::Evicted`]).
pub const EVICTED: &str =
    "removed from the cluster, where a new process may now hold its id; this process must exit";

/// What the postoffice must do, in order.
#[derive(Debug)]
pub enum Action {
    /// Send this control request to the scheduler (on the scheduler, hand it to its own state
    /// machine).
    Send(Message),
    /// The node table arrived: this node is `my_id`; the others are reached at the table's
    /// addresses.
    Joined {
        /// This node's id.
        my_id: NodeId,
        /// Scheduler, servers by id, workers by id.
        table: NodeTable,
    },
    /// Reach `node` (a new process in a failed node's place) at its address from now on: the
    /// router and the resender retarget it.
    Retarget(Node),
    /// The node is alive again (a new process took its place): applications fail what waited
    /// on the old process.
    Recovered(NodeId),
    /// The connection to this peer is gone: drop its route.
    DropRoute(NodeId),
    /// `node` died: fail what waits on it (sends, resends, applications).
    NodeFailed {
        /// The node.
        node: NodeId,
        /// Why it counts as dead.
        reason: String,
    },
    /// On the scheduler: its state machine decides about this lost connection.
    SchedulerPeerLost {
        /// The peer.
        peer: NodeId,
        /// What the van saw.
        reason: String,
    },
    /// The barrier on `group` ended: released, or failed by the scheduler.
    EndBarrier {
        /// The barrier group.
        group: i32,
        /// `Ok` when released.
        result: Result<(), NodeError>,
    },
    /// Every pending barrier fails: `dead` (the scheduler) will not release it, for
    /// `reason` (the barriers fail with [`NodeError::NodeFailed`] naming it, as every later
    /// barrier is refused).
    FailBarriers {
        /// The node whose death ends them.
        dead: NodeId,
        /// Why it is taken for dead.
        reason: String,
    },
    /// A barrier call is refused before it is sent.
    RefuseBarrier(NodeError),
    /// Stop the node: it was asked to.
    Stop,
    /// Stop the node: the cluster went on without it (the scheduler declared it dead, or it
    /// lost the scheduler for the heartbeat timeout, after which the scheduler will have).
    /// Whatever waits on it fails naming this node and `reason`; nothing more of it may
    /// reach the cluster, where a new process may hold its id (fencing).
    Evicted {
        /// The node the errors blame: the scheduler when it went silent (it may have died),
        /// this node when the scheduler declared it dead.
        node: NodeId,
        /// Why, for the errors.
        reason: String,
    },
}

/// The node's side of membership: feed it what happens, carry out what it returns.
#[derive(Debug)]
pub struct Member {
    config: MemberConfig,
    my_id: Option<NodeId>,
    /// Empty until joined; then scheduler, servers by id, workers by id, with recovered nodes'
    /// new processes.
    table: NodeTable,
    /// Recovery notices that arrived before the table, by sequence number.
    early_notices: Vec<(u64, Node)>,
    /// Dead nodes (not replaced since), with the reason.
    dead: BTreeMap<NodeId, String>,
    /// When the scheduler last answered a heartbeat.
    scheduler_heard: Instant,
    /// Why the cluster went on without this node, once it did: the node blamed and the
    /// reason ([`Action::Evicted`]), set with `stopped`.
    evicted: Option<(NodeId, String)>,
    finalizing: bool,
    finishing: bool,
    stopped: bool,
}

impl Member {
    /// A node that has not joined yet, at `now`.
    pub fn new(config: MemberConfig, now: Instant) -> Member {
        Member {
            config,
            my_id: None,
            table: NodeTable::default(),
            early_notices: Vec::new(),
            dead: BTreeMap::new(),
            scheduler_heard: now,
            evicted: None,
            finalizing: false,
            finishing: false,
            stopped: false,
        }
    }

    /// Takes in what happened at `now`; returns what to do, in order.
    pub fn handle(&mut self, now: Instant, input: Input<'_>) -> Vec<Action> {
        let mut out = Vec::new();
        match input {
            Input::Control(msg) => self.on_control(now, msg, &mut out),
            Input::SchedulerReady(table) => self.join(now, node_ids::SCHEDULER, table, &mut out),
            Input::Lost {
                peer,
                reason,
                read_as,
            } => self.on_lost(peer, reason, read_as, &mut out),
            Input::Tick => self.on_tick(now, &mut out),
            Input::Barrier(group) => out.push(self.on_barrier(group)),
            Input::Finalize => self.finalizing = true,
            Input::Leave => {
                self.finishing = true;
                out.push(Action::Send(control_request(Command::Terminate)));
            }
            Input::Stop => {
                if !self.stopped {
                    self.stopped = true;
                    out.push(Action::Stop);
                }
            }
        }
        out
    }

    /// This node's id, once joined.
    pub fn my_id(&self) -> Option<NodeId> {
        self.my_id
    }

    /// Whether the node table has arrived.
    pub fn is_joined(&self) -> bool {
        self.my_id.is_some()
    }

    /// Why `node` counts as dead, if it does.
    pub fn failure(&self, node: NodeId) -> Option<&str> {
        self.dead.get(&node).map(String::as_str)
    }

    /// The process the table names for `peer` (0: not known).
    pub fn incarnation_of(&self, peer: NodeId) -> u64 {
        if Some(peer) == self.my_id {
            return self.config.incarnation;
        }
        self.table.get(peer).map_or(0, |n| n.incarnation)
    }

    /// Whether the node leaves: finalize's barrier is behind it.
    pub fn is_finishing(&self) -> bool {
        self.finishing
    }

    /// Whether the node stopped.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Why the cluster went on without this node, if it did: the node its errors blame and
    /// the reason (see [`Action::Evicted`]).
    pub fn eviction(&self) -> Option<(NodeId, &str)> {
        self.evicted
            .as_ref()
            .map(|(node, reason)| (*node, reason.as_str()))
    }

    fn on_control(&mut self, now: Instant, msg: &Message, out: &mut Vec<Action>) {
        let Some(control) = &msg.meta.control else {
            return;
        };
        // The lease on the scheduler is renewed by answers to this node's own heartbeats
        // only: a round trip. What the scheduler sends unasked (a notice to every node)
        // reaches a node that is cut off one way as well, whose heartbeats never arrive and
        // which the scheduler declares dead meanwhile.
        if msg.meta.sender == Some(node_ids::SCHEDULER)
            && self.config.role != Role::Scheduler
            && control.cmd == Command::Heartbeat
        {
            self.scheduler_heard = now;
        }
        match control.cmd {
            Command::AddNode => self.on_table(now, msg, control, out),
            Command::Barrier => {
                let group = control.barrier_group;
                let result = if control.nodes.is_empty() {
                    Ok(())
                } else {
                    Err(NodeError::BarrierFailed {
                        group,
                        dead: control.nodes.iter().filter_map(|n| n.id).collect(),
                    })
                };
                // Only the release of finalize's barrier ends the run (peers may leave from
                // now on, before `finalize` resumes); an ordinary all-nodes barrier does not.
                if group == ALL_GROUPS && result.is_ok() && self.finalizing {
                    self.finishing = true;
                }
                out.push(Action::EndBarrier { group, result });
            }
            Command::NodeFailure => self.on_failure_notice(&control.nodes, out),
            // The scheduler's answer to a heartbeat, or an acknowledgement (the resender's):
            // noted above.
            Command::Heartbeat | Command::Ack => {}
            other => debug!("ignoring control {other:?} from {:?}", msg.meta.sender),
        }
    }

    /// The node table (joining), or once joined, the scheduler's notice that new processes
    /// took the place of failed nodes.
    fn on_table(&mut self, now: Instant, msg: &Message, control: &Control, out: &mut Vec<Action>) {
        let Some(recipient) = msg.meta.recipient else {
            return;
        };
        let whole_table = control
            .nodes
            .iter()
            .any(|n| n.id == Some(node_ids::SCHEDULER));
        let seq = msg.meta.seq.map(|s| s.number);
        if !self.is_joined() {
            // Only the table itself (it holds the scheduler) makes us joined. Another node's
            // recovery notice can reach a node whose table is still on its way: kept.
            if whole_table {
                let table = NodeTable::new(Arc::clone(&control.nodes));
                self.join(now, recipient, table, out);
                for (notice, node) in std::mem::take(&mut self.early_notices) {
                    // Sent after the table: news the table does not hold. (Unnumbered, the
                    // link kept the order, so the table is the later word.)
                    if seq.is_some_and(|table| notice > table) {
                        self.recover(&node, out);
                    } else {
                        debug!("a recovery notice older than the table: {node}");
                    }
                }
            } else if let Some(notice) = seq {
                let recovered = control.nodes.iter().filter(|n| n.is_recovery);
                self.early_notices
                    .extend(recovered.map(|n| (notice, n.clone())));
            }
            return;
        }
        // The whole table again (an answer to a re-sent registration): nothing new.
        if whole_table {
            return;
        }
        for node in control.nodes.iter().filter(|n| n.is_recovery) {
            self.recover(node, out);
        }
    }

    fn join(&mut self, now: Instant, my_id: NodeId, table: NodeTable, out: &mut Vec<Action>) {
        if self.is_joined() {
            return;
        }
        self.my_id = Some(my_id);
        self.table = table.clone();
        self.scheduler_heard = now;
        out.push(Action::Joined { my_id, table });
    }

    /// A new process took the place of `node`: reach it there, no longer count it dead.
    fn recover(&mut self, node: &Node, out: &mut Vec<Action>) {
        let Some(peer) = node.id.filter(|&p| Some(p) != self.my_id) else {
            return;
        };
        info!(
            "node {peer} ({}) rejoined at {}:{} (a new process: recovery)",
            node.role, node.host, node.port
        );
        self.table = self.table.with(node.clone());
        self.dead.remove(&peer);
        out.push(Action::Retarget(node.clone()));
        out.push(Action::Recovered(peer));
    }

    fn on_lost(&mut self, peer: NodeId, reason: &str, read_as: u64, out: &mut Vec<Action>) {
        let now = self.incarnation_of(peer);
        if read_as != 0 && now != 0 && now != read_as {
            // A new process took the node over since the loss was read (a recovery, handled
            // at once while the loss waited behind data): the old process's loss.
            debug!(
                peer,
                "a connection of the process node {peer} replaced ended ({reason}): not the new \
                 process's loss"
            );
            return;
        }
        out.push(Action::DropRoute(peer));
        // A scheduler that is finishing still hears of them: it waits for every node to be
        // gone before it stops, and one that closes without a goodbye is gone too.
        if self.stopped || (self.finishing && self.config.role != Role::Scheduler) {
            return;
        }
        if !self.is_joined() {
            // Still joining: bootstrap sends the registration again over a new connection.
            debug!(peer, "connection lost while joining ({reason})");
            return;
        }
        if self.config.resend {
            info!(
                peer,
                "connection lost ({reason}); unacknowledged messages will be resent"
            );
            return;
        }
        if self.config.role == Role::Scheduler {
            out.push(Action::SchedulerPeerLost {
                peer,
                reason: reason.to_owned(),
            });
        } else if peer != node_ids::SCHEDULER && self.finalizing {
            // Waiting at the final barrier: a peer released before us stops in order while
            // our release is still on its way, so its close is no failure. One that really
            // died is declared by the scheduler, which also fails this barrier.
            debug!(
                peer,
                "peer closed while this node waits at the final barrier: {reason}"
            );
        } else {
            self.fail(peer, format!("connection lost: {reason}"), out);
        }
    }

    fn on_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Some(timeout) = self.config.heartbeat_timeout else {
            return;
        };
        if self.config.role == Role::Scheduler
            || self.stopped
            || !self.is_joined()
            || !crate::fencing::enabled()
        {
            return;
        }
        let silent = now.saturating_duration_since(self.scheduler_heard);
        if silent >= timeout {
            let reason = format!(
                "no answer from the scheduler for {:.1} s (PS_HEARTBEAT_TIMEOUT is {:.1} s)",
                silent.as_secs_f64(),
                timeout.as_secs_f64()
            );
            if self.finishing {
                return;
            }
            // The scheduler died, or this node is cut off from it; in the second case the
            // scheduler has declared it dead by now (its clock started no later than ours),
            // so it stops before a replacement can meet anything it still sends. What waits
            // (a barrier too) fails saying both.
            let reason =
                format!("{reason}: the scheduler died, or this node is cut off ({EVICTED})");
            self.fail(node_ids::SCHEDULER, reason.clone(), out);
            self.evict(node_ids::SCHEDULER, format!("{reason}; stopping"), out);
        }
    }

    /// The cluster went on without this node: stop, failing what waits with `reason`.
    fn evict(&mut self, node: NodeId, reason: String, out: &mut Vec<Action>) {
        if self.stopped || !crate::fencing::enabled() {
            return;
        }
        warn!("{reason}");
        self.stopped = true;
        self.evicted = Some((node, reason.clone()));
        out.push(Action::Evicted { node, reason });
    }

    fn on_barrier(&self, group: i32) -> Action {
        // A stopped node waits for nothing (its scheduler's loss, when that stopped it, is
        // said below, naming the scheduler).
        if self.stopped && self.failure(node_ids::SCHEDULER).is_none() {
            return Action::RefuseBarrier(NodeError::Stopped);
        }
        if group <= 0 || group & !ALL_GROUPS != 0 {
            return Action::RefuseBarrier(NodeError::InvalidArgument(format!(
                "barrier group {group} is not a combination of 1 (scheduler), 2 (servers), 4 (workers)"
            )));
        }
        if group & node_ids::group_of(self.config.role) == 0 {
            return Action::RefuseBarrier(NodeError::InvalidArgument(format!(
                "this {} is not a member of barrier group {group}; it would wait forever",
                self.config.role
            )));
        }
        if let Some(reason) = self.failure(node_ids::SCHEDULER) {
            return Action::RefuseBarrier(NodeError::node_failed(node_ids::SCHEDULER, reason));
        }
        let mut msg = control_request(Command::Barrier);
        if let Some(control) = &mut msg.meta.control {
            control.barrier_group = group;
            if self.finalizing && group == ALL_GROUPS {
                control.msg_sig = crate::control::FINAL_BARRIER;
            }
        }
        Action::Send(msg)
    }

    /// The scheduler's notice that `nodes` failed.
    fn on_failure_notice(&mut self, nodes: &[Node], out: &mut Vec<Action>) {
        for node in nodes {
            let Some(id) = node.id else { continue };
            // A notice about a process that has been replaced since (a resend can bring it
            // after the news of the replacement): not ours.
            let known = self.incarnation_of(id);
            if node.incarnation != 0 && known != 0 && node.incarnation != known {
                debug!("ignoring a failure notice about a replaced process: {node}");
                continue;
            }
            if Some(id) == self.my_id {
                // Declared dead wrongly (we stalled, or lost the scheduler for a while): the
                // cluster has moved on without us.
                self.evict(
                    id,
                    format!("the scheduler declared this node dead ({EVICTED}); stopping"),
                    out,
                );
            } else {
                self.fail(id, "declared dead by the scheduler".to_owned(), out);
            }
        }
    }

    /// `node` is dead, unless the node is leaving or already knew.
    fn fail(&mut self, node: NodeId, reason: String, out: &mut Vec<Action>) {
        if self.finishing || self.dead.contains_key(&node) {
            return;
        }
        warn!(node, "node failed: {reason}");
        self.dead.insert(node, reason.clone());
        if node == node_ids::SCHEDULER {
            // Nobody is left to release barriers.
            out.push(Action::FailBarriers {
                dead: node,
                reason: reason.clone(),
            });
        }
        out.push(Action::NodeFailed { node, reason });
    }
}

/// A control request to the scheduler.
pub(crate) fn control_request(cmd: Command) -> Message {
    Message {
        meta: Meta {
            recipient: Some(node_ids::SCHEDULER),
            request: true,
            control: Some(Control::command(cmd)),
            ..Meta::default()
        },
        data: van_core::Parts::new(),
    }
}
