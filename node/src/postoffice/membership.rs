//! A node's view of who is in the cluster and alive: the node table, failures (a broken
//! connection, the scheduler's notice, a silent scheduler), recoveries (a new process in a
//! failed node's place), and the resends of `PS_RESEND` that make a broken connection no
//! failure.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use van_core::{node_ids, Event, Message, Node, NodeId};

use super::{lock, Postoffice};
use crate::error::{PsError, Result};

impl Postoffice {
    /// With heartbeats on both ways (`PS_HEARTBEAT_INTERVAL` and `PS_HEARTBEAT_TIMEOUT`), a
    /// scheduler that has not answered for a whole timeout is lost: the same failure as a
    /// broken scheduler connection, so barriers and requests end with an error naming it.
    /// This catches a scheduler that is stalled or cut off while its connection stays open.
    pub(super) fn check_scheduler_heard(&self) {
        let Some(timeout) = self.inner.config.heartbeat_timeout else {
            return;
        };
        let silent = lock(&self.inner.scheduler_heard).elapsed();
        if silent >= timeout && !self.is_stopped() {
            self.node_failed(
                node_ids::SCHEDULER,
                &format!(
                    "no answer from the scheduler for {:.1} s (PS_HEARTBEAT_TIMEOUT is {:.1} s)",
                    silent.as_secs_f64(),
                    timeout.as_secs_f64()
                ),
            );
        }
    }

    /// Sends again what its recipient has not acknowledged in time (`PS_RESEND`), except to
    /// nodes declared dead, whose messages are dropped.
    pub(super) async fn resend_overdue(&self) {
        let Some(resend) = self.inner.router.resender() else {
            return;
        };
        let due = resend.due(Instant::now());
        if !due.is_empty() {
            debug!(count = due.len(), "resending unacknowledged messages");
        }
        // One peer that cannot be reached (a dial that times out) holds up this pass once,
        // not once per message kept for it.
        let mut unreachable = std::collections::HashSet::new();
        for msg in due {
            let Some(peer) = msg.meta.recipient else {
                continue;
            };
            if self.dead_error(peer).is_some() {
                // Unless a new process took its place meanwhile, numbered anew.
                resend.forget(peer, msg.meta.seq.map_or(0, |s| s.to));
                continue;
            }
            if unreachable.contains(&peer) {
                continue;
            }
            if let Err(e) = self.inner.router.send_once(msg).await {
                debug!(peer, "resend failed, will try again: {e}");
                unreachable.insert(peer);
            }
        }
    }

    /// For a lost connection, the incarnation the node table names for its peer as the loss
    /// is read (0 for anything else, or when not known).
    pub(super) fn lost_incarnation(&self, event: &Event) -> u64 {
        match event {
            Event::PeerLost(lost) => lost
                .peer
                .map_or(0, |peer| self.inner.router.incarnation_of(peer)),
            Event::Message(_) => 0,
        }
    }

    /// A connection to `peer` ended, read while the node table named process `read_as` for
    /// it ([`lost_incarnation`](Self::lost_incarnation)). If a new process has taken the node
    /// over since (a recovery, handled at once while the loss waited behind data), the loss
    /// is the old process's, not the new one's: ignored.
    pub(super) async fn lost_connection(&self, peer: NodeId, reason: &str, read_as: u64) {
        let now = self.inner.router.incarnation_of(peer);
        if read_as != 0 && now != 0 && now != read_as {
            debug!(
                peer,
                "a connection of the process node {peer} replaced ended ({reason}): not the new \
                 process's loss"
            );
            return;
        }
        self.peer_lost(peer, reason).await;
    }

    pub(super) async fn peer_lost(&self, peer: NodeId, reason: &str) {
        self.inner.router.peer_lost(peer);
        if self.inner.finishing.load(Ordering::Acquire) || self.is_stopped() {
            return;
        }
        if self.inner.table.get().is_none() {
            // Still joining: bootstrap sends the registration again over a new connection.
            debug!(peer, "connection lost while joining ({reason})");
            return;
        }
        if self.inner.router.resender().is_some() {
            // PS_RESEND: what the connection carried unacknowledged goes again over a new
            // one; a node that really died is declared by the heartbeat timeout.
            info!(
                peer,
                "connection lost ({reason}); unacknowledged messages will be resent"
            );
            return;
        }
        if self.inner.scheduler.is_some() {
            let outputs = self.with_scheduler(|s| s.peer_lost(Instant::now(), peer, reason));
            self.execute(outputs).await;
        } else if peer != node_ids::SCHEDULER && self.inner.finalizing.load(Ordering::Acquire) {
            // Waiting at the final barrier: a peer released before us stops in order while
            // our release is still on its way over the scheduler link, so its close is no
            // failure. A peer that really died is declared by the scheduler, which also fails
            // this barrier; only the scheduler's own loss is ours to report. (An ordinary
            // `barrier(ALL_GROUPS)` of the run is no reason to stay quiet: nobody leaves there.)
            debug!(
                peer,
                "peer closed while this node waits at the final barrier: {reason}"
            );
        } else {
            self.node_failed(peer, &format!("connection lost: {reason}"));
        }
    }

    /// Records that `node` is dead and fails everything waiting on it.
    pub(super) fn node_failed(&self, node: NodeId, reason: &str) {
        if self.inner.finishing.load(Ordering::Acquire) {
            return;
        }
        let first = lock(&self.inner.dead)
            .insert(node, reason.to_owned())
            .is_none();
        if !first {
            return;
        }
        warn!(node, "node failed: {reason}");
        self.inner.membership.send_modify(|n| *n += 1);
        self.inner.router.node_failed(node, reason);
        if let Some(resend) = self.inner.router.resender() {
            resend.forget(node, 0);
        }
        if node == node_ids::SCHEDULER {
            // Nobody is left to release barriers.
            let waiters: Vec<_> = lock(&self.inner.barriers).drain().collect();
            for (group, waiter) in waiters {
                let _ = waiter.send(Err(PsError::BarrierFailed {
                    group,
                    dead: vec![node_ids::SCHEDULER],
                }));
            }
        }
        self.tell_customers(node, reason);
    }

    /// Tells every application that `node` failed (called without holding any lock).
    pub(super) fn tell_customers(&self, node: NodeId, reason: &str) {
        let customers = lock(&self.inner.customers).all();
        for customer in customers {
            customer.node_failed(node, reason);
        }
    }

    /// The error for a request to `node`, if it is known to be dead.
    pub fn dead_error(&self, node: NodeId) -> Option<PsError> {
        lock(&self.inner.dead)
            .get(&node)
            .map(|reason| PsError::node_failed(node, reason.clone()))
    }

    /// A new process took the place of failed node `peer` at `node`'s address: reach it
    /// there (a fresh connection, a fresh resend window), no longer count it dead, and tell
    /// the applications.
    pub(super) fn node_recovered(&self, peer: NodeId, node: &Node) {
        info!(
            "node {peer} ({}) rejoined at {}:{} (a new process: recovery)",
            node.role, node.host, node.port
        );
        // What was kept for the old process is dropped as the new one becomes the target
        // (one step, so nothing is numbered for one and kept for the other); the
        // applications fail what waited on the old one (`Customer::node_recovered`).
        let dropped = self.inner.router.set_nodes(std::slice::from_ref(node));
        if dropped > 0 {
            info!(
                peer,
                dropped, "unacknowledged messages meant for the replaced process dropped"
            );
        }
        lock(&self.inner.dead).remove(&peer);
        self.inner.router.node_recovered(peer);
        self.inner.membership.send_modify(|n| *n += 1);
        let customers = lock(&self.inner.customers).all();
        for customer in customers {
            customer.node_recovered(peer);
        }
    }

    /// Whether this process took the place of a node that had failed (ps-lite's
    /// `is_recovery`): the cluster was running before it joined, so it must not wait at the
    /// start barriers the others passed long ago, and a server holds none of the old values
    /// unless it restores them ([`KvServer::restore`](crate::KvServer::restore)).
    pub fn is_recovery(&self) -> bool {
        let me = self.my_id();
        self.nodes()
            .iter()
            .any(|n| n.id == Some(me) && n.is_recovery)
    }

    /// Waits until `node` is not (or no longer) counted dead: a failed node that a new
    /// process replaced (recovery). Fails with the node's failure if that does not happen
    /// within `timeout`, or with [`PsError::Stopped`].
    pub async fn wait_alive(&self, node: NodeId, timeout: Duration) -> Result<()> {
        let mut changes = self.inner.membership.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let Some(error) = self.dead_error(node) else {
                return Ok(());
            };
            if self.is_stopped() {
                return Err(PsError::Stopped);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(PsError::Stopped),
                Err(_) => return Err(error),
            }
        }
    }

    /// The scheduler's notice that `nodes` failed.
    pub(super) fn failure_notice(&self, nodes: &[Node]) {
        for node in nodes {
            // A notice about a process that has been replaced since (recovery; a
            // resend can bring it after the news of the replacement): not ours.
            let known = match node.id {
                Some(id) if id == self.my_id() => self.inner.incarnation,
                Some(id) => self.inner.router.incarnation_of(id),
                None => 0,
            };
            if node.incarnation != 0 && known != 0 && node.incarnation != known {
                debug!("ignoring a failure notice about a replaced process: {node}");
                continue;
            }
            match node.id {
                Some(id) if id == self.my_id() => {
                    // Declared dead wrongly (we stalled, or lost the scheduler for a
                    // while): the cluster has moved on without us, so stop, which
                    // ends every wait here.
                    warn!("the scheduler declared this node dead; stopping");
                    let po = self.clone();
                    tokio::spawn(async move { po.stop().await });
                }
                Some(id) => self.node_failed(id, "declared dead by the scheduler"),
                None => {}
            }
        }
    }

    /// The node table arrived (joining), or once joined, the scheduler's notice that new
    /// processes took the place of failed nodes.
    pub(super) fn table_arrived(&self, msg: &Message) {
        let (Some(control), Some(id)) = (&msg.meta.control, msg.meta.recipient) else {
            return;
        };
        let whole_table = control
            .nodes
            .iter()
            .any(|n| n.id == Some(node_ids::SCHEDULER));
        let seq = msg.meta.seq.map(|s| s.number);
        if self.inner.table.get().is_none() {
            // Only the table itself (it holds the scheduler) makes us joined. Another node's
            // recovery notice can reach a node whose table is still on its way (a resend
            // after a broken connection overtakes it): kept until the table arrives.
            if whole_table {
                self.set_table(id, control.nodes.clone());
                let early = std::mem::take(&mut *lock(&self.inner.early_notices));
                for (notice, node) in early {
                    // Sent after the table: news the table does not hold. (Unnumbered, the
                    // link kept the order, so the table is the later word.)
                    if seq.is_some_and(|table| notice > table) {
                        self.recovered_in_notice(&node);
                    } else {
                        debug!("a recovery notice older than the table: {node}");
                    }
                }
            } else if let Some(notice) = seq {
                let mut early = lock(&self.inner.early_notices);
                for node in control.nodes.iter().filter(|n| n.is_recovery) {
                    early.push((notice, node.clone()));
                }
            }
            return;
        }
        // The whole table again (an answer to a re-sent registration): nothing new.
        if whole_table {
            return;
        }
        for node in control.nodes.iter().filter(|n| n.is_recovery) {
            self.recovered_in_notice(node);
        }
    }

    /// The scheduler's notice that a new process took the place of `node`.
    fn recovered_in_notice(&self, node: &Node) {
        if let Some(peer) = node.id.filter(|&p| p != self.my_id()) {
            self.node_recovered(peer, node);
        }
    }

    pub(super) fn set_table(&self, my_id: NodeId, table: Vec<Node>) {
        self.inner.router.set_nodes(&table);
        let _ = self.inner.my_id.set(my_id);
        let _ = self.inner.table.set(table);
        self.inner.ready.send_replace(true);
    }

    /// On the scheduler: once every node has registered, take the table.
    pub(super) fn scheduler_check_ready(&self) {
        let table = self.with_scheduler(|s| s.is_ready().then(|| s.table().to_vec()));
        if let Some(table) = table {
            self.set_table(node_ids::SCHEDULER, table);
        }
    }
}
