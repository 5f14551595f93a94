//! The postoffice as the driver of the node's [`Member`]: it feeds the machine what happens
//! and carries out what it decides (the node table, failures, recoveries, barrier ends,
//! stopping), and resends what `PS_RESEND` keeps for peers.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use van_core::NodeId;

use super::{lock, Postoffice};
use crate::error::{NodeError, Result};
use crate::member::{Action, Input, Member};
use crate::router::Failures;
use crate::table::NodeTable;

impl Failures for Mutex<Member> {
    fn failure(&self, peer: NodeId) -> Option<String> {
        lock(self).failure(peer).map(str::to_owned)
    }
}

impl Postoffice {
    /// What the node's [`Member`] decides about `input`, now. The machine's lock is held only
    /// for the decision, never while it is carried out.
    pub(super) fn decide(&self, input: Input<'_>) -> Vec<Action> {
        lock(&self.inner.member).handle(Instant::now(), input)
    }

    /// Feeds `input` to the node's [`Member`] and carries out what it decides.
    pub(super) async fn feed(&self, input: Input<'_>) {
        let actions = self.decide(input);
        self.carry_out(actions).await;
    }

    /// Carries out the [`Member`]'s decisions, in order.
    pub(super) async fn carry_out(&self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Send(msg) => {
                    let cmd = msg.meta.control.as_ref().map(|c| c.cmd);
                    if let Err(e) = self.send_control(msg).await {
                        debug!("{cmd:?} to the scheduler not sent: {e}");
                    }
                }
                Action::Joined { my_id, table } => {
                    self.inner.router.set_table(&table);
                    let _ = self.inner.my_id.set(my_id);
                    let _ = self.inner.table.set(table);
                    self.inner.ready.send_replace(true);
                }
                Action::Retarget(node) => {
                    // What was kept for the old process is dropped as the new one becomes the
                    // target (one step, so nothing is numbered for one and kept for the other).
                    let dropped = self.inner.router.set_nodes(std::slice::from_ref(&node));
                    if dropped > 0 {
                        info!(
                            peer = node.id,
                            dropped,
                            "unacknowledged messages meant for the replaced process dropped"
                        );
                    }
                }
                Action::Recovered(peer) => {
                    self.inner.membership.send_modify(|n| *n += 1);
                    // The applications fail what waited on the old process.
                    let customers = lock(&self.inner.customers).all();
                    for customer in customers {
                        customer.node_recovered(peer);
                    }
                }
                Action::DropRoute(peer) => self.inner.router.peer_lost(peer),
                Action::NodeFailed { node, reason } => {
                    self.inner.membership.send_modify(|n| *n += 1);
                    self.inner.router.node_failed(node, &reason);
                    if let Some(resend) = self.inner.router.resender() {
                        resend.forget(node, 0);
                    }
                    self.tell_customers(node, &reason);
                }
                Action::SchedulerPeerLost { peer, reason } => {
                    let outputs =
                        self.with_scheduler(|s| s.peer_lost(Instant::now(), peer, &reason));
                    Box::pin(self.execute(outputs)).await;
                }
                Action::EndBarrier { group, result } => {
                    let waiter = lock(&self.inner.barriers).remove(&group);
                    match waiter {
                        Some(waiter) => {
                            let _ = waiter.send(result);
                        }
                        None => warn!(group, "barrier release nobody waits for"),
                    }
                }
                Action::FailBarriers { dead, reason } => {
                    let waiters: Vec<_> = lock(&self.inner.barriers).drain().collect();
                    for (_, waiter) in waiters {
                        let _ = waiter.send(Err(NodeError::node_failed(dead, reason.clone())));
                    }
                }
                Action::RefuseBarrier(e) => debug!("a barrier refused: {e}"),
                Action::Stop => {
                    // Decided while a message is handled: the dispatch loop must not wait for
                    // the vans it reads to stop.
                    let po = self.clone();
                    tokio::spawn(async move { po.shut_down("the local postoffice stopped").await });
                }
                Action::Evicted { node, reason } => {
                    // What waits fails naming the node blamed and why, before the vans stop.
                    self.tell_customers(node, &reason);
                    let po = self.clone();
                    tokio::spawn(async move { po.shut_down(&reason).await });
                }
            }
        }
    }

    /// On the scheduler: once every node has registered, take the table.
    pub(super) async fn scheduler_check_ready(&self) {
        let table = self.with_scheduler(|s| s.is_ready().then(|| NodeTable::new(s.shared_table())));
        if let Some(table) = table {
            self.feed(Input::SchedulerReady(table)).await;
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

    /// Tells every application that `node` failed (called without holding any lock).
    pub(super) fn tell_customers(&self, node: NodeId, reason: &str) {
        let customers = lock(&self.inner.customers).all();
        for customer in customers {
            customer.node_failed(node, reason);
        }
    }

    /// The error for a request to `node`, if it is known to be dead.
    pub fn dead_error(&self, node: NodeId) -> Option<NodeError> {
        let member = lock(&self.inner.member);
        let reason = member.failure(node)?;
        Some(NodeError::node_failed(node, reason))
    }

    /// Whether this process took the place of a node that had failed (ps-lite's
    /// `is_recovery`): the cluster was running before it joined, so it must not wait at the
    /// start barriers the others passed long ago, and a server holds none of the old values
    /// unless it restores them (`KvServer::restore` in `ps`).
    pub fn is_recovery(&self) -> bool {
        let me = self.my_id();
        self.nodes()
            .iter()
            .any(|n| n.id == Some(me) && n.is_recovery)
    }

    /// Waits until `node` is not (or no longer) counted dead: a failed node that a new
    /// process replaced (recovery). Fails with the node's failure if that does not happen
    /// within `timeout`, or with [`NodeError::Stopped`].
    pub async fn wait_alive(&self, node: NodeId, timeout: Duration) -> Result<()> {
        let mut changes = self.inner.membership.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let Some(error) = self.dead_error(node) else {
                return Ok(());
            };
            if self.is_stopped() {
                return Err(self.stopped_error());
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(self.stopped_error()),
                Err(_) => return Err(error),
            }
        }
    }
}
