//! Registration: nodes join with `AddNode`; once every expected node has, ids are assigned
//! in TensorFlow task order (nodes that announce a task: chief, master, worker, then other
//! jobs, each by index), then by sorted address, and everyone is welcomed with the table. A
//! registration re-sent after that gets the table again; one from a new process takes the
//! place of a dead node of its role (recovery) — of its own task's node when it announces a
//! task — declaring the node at its place dead first if that one still counts as alive, or
//! waits for such a node to die.
//!
//! A node's *place* is its task when it announces one (a restarted Kubernetes pod keeps its
//! task and gets a new address), its address otherwise.

use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};
use van_core::{node_ids, Command, Control, Node, NodeId, Role};

use super::output::{reply, Echo};

/// How long a registration waiting for a place counts without being re-sent (nodes re-send
/// theirs every 2 s until the table arrives): one from a process that gave up is dropped.
const WAITING_TTL: std::time::Duration = std::time::Duration::from_secs(10);
/// While the cluster forms, how long a TensorFlow task's registration holds the task against
/// one from another address: a live process re-sends within this, so a second live claimant
/// (two processes given one task) is refused instead of the two taking turns forever, and a
/// restarted pod at a new address takes over once the old one has gone quiet.
const TASK_CLAIM_TTL: std::time::Duration = std::time::Duration::from_secs(5);
use super::{Output, Peer, Scheduler};

/// Whether `known` and `node` are the same place of the cluster: the same role and the same
/// TensorFlow task when both announce one, else the same address.
fn same_place(known: &Node, node: &Node) -> bool {
    known.role == node.role
        && match (&known.task, &node.task) {
            (Some(a), Some(b)) => a == b,
            _ => known.host == node.host && known.port == node.port,
        }
}

impl Scheduler {
    pub(super) fn on_add_node(
        &mut self,
        now: Instant,
        control: &Control,
        echo: Echo,
    ) -> Vec<Output> {
        let [node] = &control.nodes[..] else {
            warn!(
                nodes = control.nodes.len(),
                "AddNode must carry exactly one node"
            );
            return Vec::new();
        };
        if node.role == Role::Scheduler {
            warn!(%node, "ignoring the registration of another scheduler");
            return Vec::new();
        }
        if self.is_ready() {
            return self.on_late_registration(now, node, node.incarnation, echo);
        }
        if let Some(entry) = self
            .joining
            .iter_mut()
            .find(|(known, ..)| same_place(known, node))
        {
            let elsewhere = entry.0.host != node.host || entry.0.port != node.port;
            let held = now.saturating_duration_since(entry.3) < TASK_CLAIM_TTL;
            if elsewhere && held {
                warn!(
                    %node,
                    holder = %entry.0,
                    "refusing a registration for a TensorFlow task that a live process at \
                     another address holds (two processes given the same task?)"
                );
            } else if node.incarnation != 0 && node.incarnation != entry.1 {
                // The process registered before died while the cluster formed (or, for a
                // task, went quiet: a pod restarted at a new address); this one takes its
                // place (its own endpoints, its own answer).
                info!(%node, "registration from a new process in the same place");
                let mut fresh = node.clone();
                (fresh.id, fresh.is_recovery) = (None, false);
                *entry = (fresh, node.incarnation, echo, now);
            } else {
                debug!(%node, "duplicate registration ignored");
                entry.3 = entry.3.max(now);
            }
            return Vec::new();
        }
        let want = self.expected(node.role);
        let have = self
            .joining
            .iter()
            .filter(|(n, ..)| n.role == node.role)
            .count();
        if have >= want {
            warn!(%node, want, "ignoring a registration beyond the expected count");
            return Vec::new();
        }
        let mut node = node.clone();
        node.id = None;
        node.is_recovery = false;
        info!(%node, "registered ({})", self.summary());
        let incarnation = node.incarnation;
        self.joining.push((node, incarnation, echo, now));
        if self.joining.len()
            < self
                .expected(Role::Server)
                .saturating_add(self.expected(Role::Worker))
        {
            return Vec::new();
        }
        self.assign_ids(now)
    }

    /// Everyone is here: assign ids in task order, then by sorted address, build the table,
    /// welcome everyone.
    fn assign_ids(&mut self, now: Instant) -> Vec<Output> {
        let mut joining = std::mem::take(&mut self.joining);
        // Role orders Server before Worker, so the table comes out in id order; within a
        // role, nodes with a TensorFlow task come first, in task order (TensorFlow's chief is
        // worker rank 0, then `/job:worker/task:0` …).
        joining.sort_by_cached_key(|(n, ..)| {
            let task = n.task.as_ref().map(|t| {
                let (job, name, index) = t.order();
                (job, name.to_owned(), index)
            });
            (
                n.role,
                task.is_none(),
                task,
                n.host.clone(),
                n.port,
                n.host_identity.clone(),
            )
        });
        let mut table = vec![self.me.clone()];
        let (mut servers, mut workers) = (0u32, 0u32);
        let mut echoes = Vec::with_capacity(joining.len());
        for (mut node, incarnation, echo, _) in joining {
            let id = if node.role == Role::Server {
                servers += 1;
                node_ids::server_rank_to_id(servers - 1)
            } else {
                workers += 1;
                node_ids::worker_rank_to_id(workers - 1)
            };
            node.id = Some(id);
            let peer = Peer {
                index: table.len(),
                last_seen: now,
                leaving: false,
                gone: false,
                dead: false,
                incarnation,
            };
            self.peers.insert(id, peer);
            table.push(node);
            echoes.push(echo);
        }
        self.table = table.into();
        self.membership_epoch += 1;
        info!(nodes = self.table.len(), "cluster complete, ids assigned");
        let mut out = Vec::with_capacity(2 * echoes.len());
        for (i, echo) in echoes.into_iter().enumerate() {
            out.extend(self.welcome(i + 1, echo));
        }
        out
    }

    /// A registration once the cluster is complete: the same process again (the table
    /// again), a restart or a replacement (recovery), or one that waits for a place.
    fn on_late_registration(
        &mut self,
        now: Instant,
        node: &Node,
        incarnation: u64,
        echo: Echo,
    ) -> Vec<Output> {
        let at_place = self
            .table
            .iter()
            .skip(1)
            .position(|known| same_place(known, node));
        let mut out = Vec::new();
        if let Some(index) = at_place.map(|i| i + 1) {
            let id = self.table[index].id.unwrap_or_default();
            let Some(peer) = self.peers.get_mut(&id) else {
                return out;
            };
            let same_process =
                incarnation == 0 || peer.incarnation == 0 || incarnation == peer.incarnation;
            let same_address = {
                let known = &self.table[index];
                known.host == node.host && known.port == node.port
            };
            if !peer.dead && same_process && same_address {
                peer.last_seen = peer.last_seen.max(now);
                if std::mem::take(&mut peer.gone) {
                    self.membership_epoch += 1;
                }
                debug!(id, "registration re-sent; sending the table again");
                return self.welcome(index, echo);
            }
            if !peer.dead {
                // Another process in its place: the one we knew is gone.
                // Not told itself: the old process is gone, and its place is the new one's.
                let notices = self.bury(
                    now,
                    vec![id],
                    "restarted: a new process registered in its place (address or task)",
                );
                out.extend(
                    notices
                        .into_iter()
                        .filter(|o| !matches!(o, Output::Send(m) if m.meta.recipient == Some(id))),
                );
            }
            out.extend(self.revive(now, id, node, incarnation, echo));
            return out;
        }
        // Waiting registrations not re-sent for a while are of processes that gave up.
        self.waiting
            .retain(|w| now.saturating_duration_since(w.3) < WAITING_TTL);
        if let Some(entry) = self.waiting.iter_mut().find(|(n, ..)| same_place(n, node)) {
            // Re-sent (or sent by a new process in that place): one entry per place.
            debug!(%node, "waiting registration re-sent");
            *entry = (node.clone(), incarnation, echo, now);
            return out;
        }
        match self.replaceable(node.role) {
            Some(id) => self.revive(now, id, node, incarnation, echo),
            None => {
                let waiting = self
                    .waiting
                    .iter()
                    .filter(|(n, ..)| n.role == node.role)
                    .count();
                if waiting >= self.expected(node.role) {
                    warn!(%node, "ignoring a registration: the cluster is complete");
                    return out;
                }
                warn!(
                    %node,
                    "registration after the cluster is complete: it will take the place of the \
                     next {} declared dead",
                    node.role
                );
                self.waiting.push((node.clone(), incarnation, echo, now));
                out
            }
        }
    }

    /// The lowest id of a dead node of `role`, if any.
    fn replaceable(&self, role: Role) -> Option<NodeId> {
        self.table
            .iter()
            .skip(1)
            .filter(|n| n.role == role)
            .filter_map(|n| n.id)
            .find(|id| self.peers.get(id).is_some_and(|p| p.dead))
    }

    /// Nodes just declared dead whose place a waiting registration takes.
    pub(super) fn replace_dead(&mut self, now: Instant, dead: &[NodeId]) -> Vec<Output> {
        let mut out = Vec::new();
        for &id in dead {
            let Some(dead_node) = self.node(id) else {
                continue;
            };
            let fresh = |w: &(Node, u64, Echo, Instant)| {
                w.0.role == dead_node.role && now.saturating_duration_since(w.3) < WAITING_TTL
            };
            // The process of the dead node's own task (or address) first, else any.
            let own = self
                .waiting
                .iter()
                .position(|w| fresh(w) && same_place(dead_node, &w.0));
            let Some(at) = own.or_else(|| self.waiting.iter().position(fresh)) else {
                continue;
            };
            let (node, incarnation, echo, _) = self.waiting.remove(at);
            out.extend(self.revive(now, id, &node, incarnation, echo));
        }
        out
    }

    /// `node` (a new process) takes the place of dead node `id`: it is alive again at its new
    /// address and marked `is_recovery`; the scheduler, then every live node, is told (so
    /// that they reconnect), then the node gets the table.
    fn revive(
        &mut self,
        now: Instant,
        id: NodeId,
        node: &Node,
        incarnation: u64,
        echo: Echo,
    ) -> Vec<Output> {
        let Some(peer) = self.peers.get_mut(&id) else {
            return Vec::new();
        };
        (peer.dead, peer.gone, peer.leaving) = (false, false, false);
        self.membership_epoch += 1;
        peer.last_seen = now;
        peer.incarnation = incarnation;
        let index = peer.index;
        self.forget_arrivals(id);
        let mut node = node.clone();
        node.id = Some(id);
        node.is_recovery = true;
        info!(%node, "a new process takes the place of node {id} (recovery)");
        // A copy of the table with the new entry (a recovery is rare; welcomes share it).
        let mut table = self.table.to_vec();
        let Some(entry) = table.get_mut(index) else {
            return Vec::new();
        };
        *entry = node.clone();
        self.table = table.into();
        let control = Control {
            cmd: Command::AddNode,
            nodes: vec![node].into(),
            ..Control::default()
        };
        let mut out: Vec<Output> = self
            .table
            .iter()
            .filter_map(|n| n.id)
            .filter(|&other| other != id && self.is_live(other))
            .map(|other| reply(other, control.clone(), Echo::default()))
            .collect();
        out.extend(self.welcome(index, echo));
        // A barrier of finalize's that waited for this replacement now waits for its arrival.
        out.extend(self.settle_all(now));
        out
    }

    /// Connect to the node at `index` of the table and send it the table.
    fn welcome(&self, index: usize, echo: Echo) -> Vec<Output> {
        let Some(node) = self.table.get(index) else {
            return Vec::new();
        };
        let control = Control {
            cmd: Command::AddNode,
            nodes: Arc::clone(&self.table),
            ..Control::default()
        };
        let id = node.id.unwrap_or_default();
        vec![Output::Connect(node.clone()), reply(id, control, echo)]
    }
}
