//! The scheduler's control plane as a deterministic state machine: registration and node-id
//! assignment, barriers, heartbeats and failure notices, termination.
//!
//! Like `quinn-proto`, [`Scheduler`] does no I/O and reads no clock. The I/O loop feeds it the
//! control messages the scheduler receives ([`Scheduler::handle`]), broken connections
//! ([`Scheduler::peer_lost`]) and the passing of time ([`Scheduler::tick`], at
//! [`Scheduler::next_deadline`]), and carries out the [`Output`]s it returns. Every protocol
//! path is therefore tested here without sockets, on a simulated clock.
//!
//! Decisions worth knowing:
//! - Ids are assigned once every expected node has registered, by sorting each role on
//!   `(host, port, host_identity)`, so a restart of the same job gives the same ids whatever
//!   the arrival order.
//! - Recovery (ps-lite's `is_recovery`): a node that registers once the cluster is complete
//!   takes the id of a dead node of its role (the one at its address if any, else the lowest),
//!   is marked `is_recovery` in the table, and every live node is told its new address. A
//!   registration at the address of a live node from another process (another
//!   [`Node::incarnation`]) means that node restarted: it is declared dead, then
//!   replaced. One with no dead node to replace waits until a node of its role dies.
//! - A node is declared dead when it has been silent for a whole heartbeat timeout
//!   (`now - last_seen >= timeout`); [`Scheduler::next_deadline`] is exactly that instant.
//! - After `Terminate`, a node is *leaving*: a broken connection or a lapsed heartbeat is then
//!   not a failure, but the node is *gone*: barriers stop waiting for it and it gets no more
//!   notices. Any later message from it makes it present again. So every barrier can end.
//! - [`Scheduler::is_finished`] is true once every node of the table, the scheduler included,
//!   has sent `Terminate` or is dead; [`Scheduler::dead`] tells a clean end from a failed one.
//! - Messages for the scheduler itself (barrier releases, failure notices) are `Send`s to
//!   id 1: the I/O loop hands them to the scheduler's own postoffice.
//! - Every heartbeat is answered: a node that hears nothing from the scheduler for a whole
//!   heartbeat timeout knows the scheduler is lost, even while its connection stays open.
//! - Replies echo `app_id`, `customer_id` and `request_id` of the request they answer, so
//!   that a postoffice can hand them to the customer that waits.
//!
//! The handlers live by concern: `registration` (joining, id assignment, the welcome),
//! `barrier` (barriers, released or failed), `liveness` (heartbeat expiry, broken
//! connections, failure notices) and `output` (what the I/O loop is asked to do, and the
//! replies with their echo). This file holds the state they share, the dispatch of incoming
//! messages, and the queries.

mod barrier;
mod liveness;
mod output;
mod registration;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};
use van_core::{node_ids, Command, Control, Message, Node, NodeId, Role};

pub use self::output::Output;
use self::output::{reply, Echo};

/// The expected shape of the cluster and how failures are detected.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Workers expected to register (`DMLC_NUM_WORKER`).
    pub num_workers: u32,
    /// Servers expected to register (`DMLC_NUM_SERVER`).
    pub num_servers: u32,
    /// A node silent this long is declared dead; `None` turns heartbeat detection off.
    pub heartbeat_timeout: Option<Duration>,
    /// How long `finalize`'s barrier waits for a new process in a dead member's place
    /// (`VANS_REPLACEMENT_GRACE_SECS`); zero fails it at once.
    pub replacement_grace: Duration,
}

/// `Control::msg_sig` of a barrier request that is `finalize`'s: the node is done and waits
/// for the others to be. With a replacement grace (`VANS_REPLACEMENT_GRACE_SECS`), such a
/// barrier survives a death followed by a replacement (a worker killed and started again
/// while the servers wait in `finalize`, or in Python's `Server.serve()`): it waits up to the
/// grace for the new process, then for its arrival, and fails only if none comes.
pub const FINAL_BARRIER: u64 = 1;

/// The incarnation a request's sender names for itself (its one node entry, when that is
/// the sender; 0 or absent: not said).
fn claimed_incarnation(control: &Control, from: NodeId) -> Option<u64> {
    control
        .nodes
        .first()
        .filter(|n| n.id == Some(from) && n.incarnation != 0)
        .map(|n| n.incarnation)
}

/// What the scheduler knows of a registered server or worker.
#[derive(Debug)]
struct Peer {
    /// Position in the table.
    index: usize,
    last_seen: Instant,
    /// Sent `Terminate`.
    leaving: bool,
    /// Leaving, and its connection broke or its heartbeat lapsed: no longer waited for.
    gone: bool,
    dead: bool,
    /// The registered process's incarnation ([`Node::incarnation`] of its `AddNode`; 0: not
    /// given).
    incarnation: u64,
}

/// The scheduler's control plane: feed it what arrives, carry out what it returns.
///
/// ```
/// # use std::time::Instant;
/// # use node::control::{Output, Scheduler, SchedulerConfig};
/// # use van_core::{Command, Control, Message, Meta, Node, Role};
/// let config = SchedulerConfig {
///     num_workers: 1,
///     num_servers: 0,
///     heartbeat_timeout: None,
///     replacement_grace: std::time::Duration::ZERO,
/// };
/// let mut scheduler = Scheduler::new(config, Node::new(Role::Scheduler, "10.0.0.1", 9000));
/// let control = Control {
///     cmd: Command::AddNode,
///     nodes: vec![Node::new(Role::Worker, "10.0.0.2", 9001)].into(),
///     ..Control::default()
/// };
/// let meta = Meta { request: true, control: Some(control), ..Meta::default() };
/// let out = scheduler.handle(Instant::now(), &Message { meta, data: van_core::smallvec::smallvec![] });
/// assert!(matches!(&out[0], Output::Connect(node) if node.id == Some(9)));
/// assert!(scheduler.is_ready());
/// ```
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    me: Node,
    /// Registrations before the cluster is complete: the node, its incarnation, the echo of
    /// its request and when it was last heard (registrations are re-sent every 2 s).
    joining: Vec<(Node, u64, Echo, Instant)>,
    /// Empty until ready; then scheduler, servers by id, workers by id. One allocation that
    /// every welcome shares.
    table: Arc<[Node]>,
    peers: BTreeMap<NodeId, Peer>,
    me_leaving: bool,
    /// Pending barriers: group mask → arrived node → echo of its request.
    barriers: BTreeMap<i32, BTreeMap<NodeId, Echo>>,
    /// Bumped whenever a node becomes dead, gone or alive again, or the table changes: the
    /// members of a barrier group are worked out once per change, not once per arrival.
    membership_epoch: u64,
    /// Per barrier group: the epoch they were worked out at, the members, the dead ones.
    barrier_members: BTreeMap<i32, (u64, BarrierMembers)>,
    /// Pending barriers that are `finalize`'s ([`FINAL_BARRIER`]): with a replacement grace,
    /// a death does not fail one at once; it waits up to the grace (from the value here,
    /// when it began to wait) for new processes in the places of the dead.
    final_barriers: BTreeMap<i32, Option<Instant>>,
    /// Registrations after the cluster was complete, waiting for a node of their role to be
    /// declared dead so that they can take its place.
    /// Each: the node, its incarnation, the echo of its request, when it was last sent.
    waiting: Vec<(Node, u64, Echo, Instant)>,
}

/// The members of a barrier group (its nodes that have not left, the dead included) and the
/// dead ones among them.
#[derive(Debug, Clone)]
struct BarrierMembers {
    members: Arc<[NodeId]>,
    dead: Arc<[NodeId]>,
}

impl Scheduler {
    /// A scheduler waiting for registrations. `me` is the scheduler's own node; its id is
    /// forced to [`node_ids::SCHEDULER`] and its role to [`Role::Scheduler`].
    pub fn new(config: SchedulerConfig, mut me: Node) -> Scheduler {
        me.id = Some(node_ids::SCHEDULER);
        me.role = Role::Scheduler;
        let table = if config.num_servers == 0 && config.num_workers == 0 {
            Arc::from([me.clone()])
        } else {
            Arc::default()
        };
        Scheduler {
            config,
            me,
            joining: Vec::new(),
            table,
            peers: BTreeMap::new(),
            me_leaving: false,
            barriers: BTreeMap::new(),
            membership_epoch: 0,
            barrier_members: BTreeMap::new(),
            final_barriers: BTreeMap::new(),
            waiting: Vec::new(),
        }
    }

    /// Handles a control message received by the scheduler (its own requests included, with
    /// sender 1). Malformed or unexpected messages are logged and ignored; nothing panics.
    pub fn handle(&mut self, now: Instant, msg: &Message) -> Vec<Output> {
        let sender = msg.meta.sender;
        let Some(control) = &msg.meta.control else {
            warn!(?sender, "ignoring a message without a control block");
            return Vec::new();
        };
        let cmd = control.cmd;
        if !msg.meta.request {
            warn!(?sender, ?cmd, "ignoring a response sent to the scheduler");
            return Vec::new();
        }
        if cmd == Command::AddNode {
            return self.on_add_node(now, control, Echo::of(&msg.meta));
        }
        let Some(from) = sender else {
            warn!(?cmd, "ignoring a control request without a sender");
            return Vec::new();
        };
        if from != node_ids::SCHEDULER {
            match self.peers.get_mut(&from) {
                None => {
                    warn!(from, ?cmd, "ignoring a request from an unknown node");
                    return Vec::new();
                }
                Some(peer) if peer.dead => {
                    warn!(
                        from,
                        ?cmd,
                        "request from a node declared dead; telling it so"
                    );
                    // It may have been declared dead wrongly (a stalled process): tell it,
                    // so its waits end instead of hanging on a scheduler that ignores it.
                    let control = Control {
                        cmd: Command::NodeFailure,
                        nodes: self.nodes(&[from]),
                        ..Control::default()
                    };
                    return vec![reply(from, control, Echo::default())];
                }
                Some(peer)
                    if claimed_incarnation(control, from)
                        .is_some_and(|sent| peer.incarnation != 0 && sent != peer.incarnation) =>
                {
                    // A process that a new one replaced (its heartbeat or barrier arrival
                    // flushed late, after a partition healed): not the node's, ignored. It
                    // hears nothing, so its lease on the scheduler runs out.
                    warn!(
                        from,
                        ?cmd,
                        "ignoring a request from a process that a new one replaced"
                    );
                    return Vec::new();
                }
                Some(peer) => {
                    peer.last_seen = peer.last_seen.max(now);
                    if std::mem::take(&mut peer.gone) {
                        self.membership_epoch += 1;
                    }
                }
            }
        }
        match cmd {
            // Answered, so that a node can tell a silent scheduler from a quiet cluster.
            Command::Heartbeat if from != node_ids::SCHEDULER => vec![reply(
                from,
                Control::command(Command::Heartbeat),
                Echo::of(&msg.meta),
            )],
            Command::Heartbeat => Vec::new(),
            Command::Barrier => self.on_barrier(
                now,
                from,
                control.barrier_group,
                control.msg_sig == FINAL_BARRIER,
                Echo::of(&msg.meta),
            ),
            Command::Terminate => {
                info!(from, "node is leaving");
                match self.peers.get_mut(&from) {
                    Some(peer) => peer.leaving = true,
                    None => self.me_leaving = true,
                }
                Vec::new()
            }
            other => {
                warn!(from, cmd = ?other, "ignoring an unexpected command");
                Vec::new()
            }
        }
    }

    /// Whether every expected node has registered and ids are assigned.
    pub fn is_ready(&self) -> bool {
        !self.table.is_empty()
    }

    /// The node table: scheduler first, then servers by id, then workers by id; empty before
    /// the cluster is ready.
    pub fn table(&self) -> &[Node] {
        &self.table
    }

    /// The node table as one shared allocation (what every welcome carries).
    pub fn shared_table(&self) -> Arc<[Node]> {
        Arc::clone(&self.table)
    }

    /// The node of the table with this id.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        match id {
            node_ids::SCHEDULER => self.table.first(),
            _ => self.peers.get(&id).and_then(|p| self.table.get(p.index)),
        }
    }

    /// Whether every node of the table (the scheduler included) has sent `Terminate`, is
    /// dead, or closed while the scheduler was finishing. Check [`Self::dead`] to tell a clean
    /// end from a failed one.
    pub fn is_finished(&self) -> bool {
        self.is_ready()
            && self.me_leaving
            && self.peers.values().all(|p| p.leaving || p.dead || p.gone)
    }

    /// Who has joined, for humans: `"1/2 servers, 3/3 workers joined; waiting for 1 server"`.
    pub fn summary(&self) -> String {
        // Before ready only `joining` holds nodes, after it only `table`.
        let joined = self
            .table
            .iter()
            .chain(self.joining.iter().map(|(n, ..)| n));
        let count = |role| joined.clone().filter(|n| n.role == role).count();
        let (servers, workers) = (count(Role::Server), count(Role::Worker));
        let want_servers = self.expected(Role::Server);
        let want_workers = self.expected(Role::Worker);
        let mut text =
            format!("{servers}/{want_servers} servers, {workers}/{want_workers} workers joined");
        let missing: Vec<String> = [
            (want_servers.saturating_sub(servers), "server"),
            (want_workers.saturating_sub(workers), "worker"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, role)| format!("{n} {role}{}", if n == 1 { "" } else { "s" }))
        .collect();
        if !missing.is_empty() {
            text.push_str("; waiting for ");
            text.push_str(&missing.join(" and "));
        }
        let dead = self.dead();
        if !dead.is_empty() {
            text.push_str(&format!("; dead: {dead:?}"));
        }
        text
    }

    fn expected(&self, role: Role) -> usize {
        let n = match role {
            Role::Scheduler => 0,
            Role::Server => self.config.num_servers,
            Role::Worker => self.config.num_workers,
        };
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// The table entries of `ids`.
    fn nodes(&self, ids: &[NodeId]) -> Arc<[Node]> {
        ids.iter()
            .filter_map(|&id| self.node(id).cloned())
            .collect()
    }
}
