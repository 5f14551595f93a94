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
//! - A node is declared dead when it has been silent for a whole heartbeat timeout
//!   (`now - last_seen >= timeout`); [`Scheduler::next_deadline`] is exactly that instant.
//! - After `Terminate`, a node is *leaving*: a broken connection or a lapsed heartbeat is then
//!   not a failure, but the node is *gone*: barriers stop waiting for it and it gets no more
//!   notices. Any later message from it makes it present again. So every barrier can end.
//! - [`Scheduler::is_finished`] is true once every node of the table, the scheduler included,
//!   has sent `Terminate` or is dead; [`Scheduler::dead`] tells a clean end from a failed one.
//! - Messages for the scheduler itself (barrier releases, failure notices) are `Send`s to
//!   id 1: the I/O loop hands them to the scheduler's own postoffice.
//! - Replies echo `app_id`, `customer_id` and `request_id` of the request they answer, so
//!   that a postoffice can hand them to the customer that waits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use van_core::{node_ids, Command, Control, Message, Meta, Node, NodeId, Role};

/// Every group bit a barrier mask may use: scheduler, servers, workers.
const ALL_GROUPS: i32 = node_ids::SCHEDULER | node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;

/// What the I/O loop must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Open a connection to this node (it has its id set) before sending to it.
    Connect(Node),
    /// Send this message (`meta.recipient` set; `meta.sender` is [`node_ids::SCHEDULER`]).
    Send(Message),
}

/// The expected shape of the cluster and how failures are detected.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Workers expected to register (`DMLC_NUM_WORKER`).
    pub num_workers: u32,
    /// Servers expected to register (`DMLC_NUM_SERVER`).
    pub num_servers: u32,
    /// A node silent this long is declared dead; `None` turns heartbeat detection off.
    pub heartbeat_timeout: Option<Duration>,
}

/// The fields of a request that its reply echoes.
#[derive(Debug, Clone, Copy, Default)]
struct Echo {
    app_id: i32,
    customer_id: i32,
    request_id: i32,
}

impl Echo {
    fn of(meta: &Meta) -> Echo {
        Echo {
            app_id: meta.app_id,
            customer_id: meta.customer_id,
            request_id: meta.request_id,
        }
    }
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
}

/// The scheduler's control plane: feed it what arrives, carry out what it returns.
///
/// ```
/// # use std::time::Instant;
/// # use ps::control::{Output, Scheduler, SchedulerConfig};
/// # use van_core::{Command, Control, Message, Meta, Node, Role};
/// let config = SchedulerConfig { num_workers: 1, num_servers: 0, heartbeat_timeout: None };
/// let mut scheduler = Scheduler::new(config, Node::new(Role::Scheduler, "10.0.0.1", 9000));
/// let control = Control {
///     cmd: Command::AddNode,
///     nodes: vec![Node::new(Role::Worker, "10.0.0.2", 9001)],
///     ..Control::default()
/// };
/// let meta = Meta { request: true, control: Some(control), ..Meta::default() };
/// let out = scheduler.handle(Instant::now(), &Message { meta, data: vec![] });
/// assert!(matches!(&out[0], Output::Connect(node) if node.id == Some(9)));
/// assert!(scheduler.is_ready());
/// ```
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    me: Node,
    /// Registrations before the cluster is complete, with the echo of each request.
    joining: Vec<(Node, Echo)>,
    /// Empty until ready; then scheduler, servers by id, workers by id.
    table: Vec<Node>,
    peers: BTreeMap<NodeId, Peer>,
    me_leaving: bool,
    /// Pending barriers: group mask → arrived node → echo of its request.
    barriers: BTreeMap<i32, BTreeMap<NodeId, Echo>>,
}

impl Scheduler {
    /// A scheduler waiting for registrations. `me` is the scheduler's own node; its id is
    /// forced to [`node_ids::SCHEDULER`] and its role to [`Role::Scheduler`].
    pub fn new(config: SchedulerConfig, mut me: Node) -> Scheduler {
        me.id = Some(node_ids::SCHEDULER);
        me.role = Role::Scheduler;
        let table = if config.num_servers == 0 && config.num_workers == 0 {
            vec![me.clone()]
        } else {
            Vec::new()
        };
        Scheduler {
            config,
            me,
            joining: Vec::new(),
            table,
            peers: BTreeMap::new(),
            me_leaving: false,
            barriers: BTreeMap::new(),
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
                Some(peer) => {
                    peer.last_seen = peer.last_seen.max(now);
                    peer.gone = false;
                }
            }
        }
        match cmd {
            Command::Heartbeat => Vec::new(),
            Command::Barrier => self.on_barrier(from, control.barrier_group, Echo::of(&msg.meta)),
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

    /// Declares silent nodes dead (or gone, if leaving). Call it at [`Self::next_deadline`].
    pub fn tick(&mut self, now: Instant) -> Vec<Output> {
        let Some(timeout) = self.config.heartbeat_timeout else {
            return Vec::new();
        };
        let mut newly_dead = Vec::new();
        for (&id, peer) in &mut self.peers {
            if peer.dead || peer.gone || now.saturating_duration_since(peer.last_seen) < timeout {
                continue;
            }
            if peer.leaving {
                info!(id, "leaving node stopped its heartbeat");
                peer.gone = true;
            } else {
                newly_dead.push(id);
            }
        }
        let reason = format!("no heartbeat for {timeout:?}");
        self.bury(newly_dead, &reason)
    }

    /// A connection to `peer` broke: the node is dead at once, unless it is unknown, already
    /// dead, or leaving (then it is merely gone).
    pub fn peer_lost(&mut self, _now: Instant, peer: NodeId, reason: &str) -> Vec<Output> {
        match self.peers.get_mut(&peer) {
            None => {
                debug!(peer, reason, "lost a connection to an unregistered node");
                Vec::new()
            }
            Some(state) if state.dead || state.gone => Vec::new(),
            Some(state) if state.leaving => {
                info!(peer, reason, "leaving node disconnected");
                state.gone = true;
                self.bury(Vec::new(), reason)
            }
            Some(_) => self.bury(vec![peer], reason),
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

    /// The node of the table with this id.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        match id {
            node_ids::SCHEDULER => self.table.first(),
            _ => self.peers.get(&id).and_then(|p| self.table.get(p.index)),
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

    /// Whether every node of the table (the scheduler included) has sent `Terminate` or is
    /// dead. Check [`Self::dead`] to tell a clean end from a failed one.
    pub fn is_finished(&self) -> bool {
        self.is_ready() && self.me_leaving && self.peers.values().all(|p| p.leaving || p.dead)
    }

    /// Who has joined, for humans: `"1/2 servers, 3/3 workers joined; waiting for 1 server"`.
    pub fn summary(&self) -> String {
        // Before ready only `joining` holds nodes, after it only `table`.
        let joined = self.table.iter().chain(self.joining.iter().map(|(n, _)| n));
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

    /// When [`Self::tick`] next needs calling: the earliest heartbeat expiry of a node still
    /// watched; `None` if heartbeats are off or nobody is watched.
    pub fn next_deadline(&self) -> Option<Instant> {
        let timeout = self.config.heartbeat_timeout?;
        self.peers
            .values()
            .filter(|p| !p.dead && !p.gone)
            .filter_map(|p| p.last_seen.checked_add(timeout))
            .min()
    }

    fn expected(&self, role: Role) -> usize {
        let n = match role {
            Role::Scheduler => 0,
            Role::Server => self.config.num_servers,
            Role::Worker => self.config.num_workers,
        };
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    fn on_add_node(&mut self, now: Instant, control: &Control, echo: Echo) -> Vec<Output> {
        let [node] = control.nodes.as_slice() else {
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
        let same = |known: &Node| {
            known.role == node.role && known.host == node.host && known.port == node.port
        };
        if self.is_ready() {
            if node.is_recovery {
                warn!(%node, "ignoring a recovery registration (not supported)");
                return Vec::new();
            }
            let Some(index) = self.table.iter().skip(1).position(same).map(|i| i + 1) else {
                warn!(%node, "ignoring a registration: the cluster is complete");
                return Vec::new();
            };
            let id = self.table[index].id.unwrap_or_default();
            match self.peers.get_mut(&id) {
                Some(peer) if !peer.dead => {
                    peer.last_seen = peer.last_seen.max(now);
                    peer.gone = false;
                }
                _ => {
                    warn!(%node, "ignoring a registration from a dead node");
                    return Vec::new();
                }
            }
            debug!(id, "registration re-sent; sending the table again");
            return self.welcome(index, echo);
        }
        if self.joining.iter().any(|(known, _)| same(known)) {
            debug!(%node, "duplicate registration ignored");
            return Vec::new();
        }
        let want = self.expected(node.role);
        let have = self
            .joining
            .iter()
            .filter(|(n, _)| n.role == node.role)
            .count();
        if have >= want {
            warn!(%node, want, "ignoring a registration beyond the expected count");
            return Vec::new();
        }
        let mut node = node.clone();
        node.id = None;
        node.is_recovery = false;
        info!(%node, "registered ({})", self.summary());
        self.joining.push((node, echo));
        if self.joining.len()
            < self
                .expected(Role::Server)
                .saturating_add(self.expected(Role::Worker))
        {
            return Vec::new();
        }
        self.assign_ids(now)
    }

    /// Everyone is here: assign ids by sorted address, build the table, welcome everyone.
    fn assign_ids(&mut self, now: Instant) -> Vec<Output> {
        let mut joining = std::mem::take(&mut self.joining);
        // Role orders Server before Worker, so the table comes out in id order.
        joining
            .sort_by_cached_key(|(n, _)| (n.role, n.host.clone(), n.port, n.host_identity.clone()));
        self.table = vec![self.me.clone()];
        let (mut servers, mut workers) = (0u32, 0u32);
        let mut echoes = Vec::with_capacity(joining.len());
        for (mut node, echo) in joining {
            let id = if node.role == Role::Server {
                servers += 1;
                node_ids::server_rank_to_id(servers - 1)
            } else {
                workers += 1;
                node_ids::worker_rank_to_id(workers - 1)
            };
            node.id = Some(id);
            let peer = Peer {
                index: self.table.len(),
                last_seen: now,
                leaving: false,
                gone: false,
                dead: false,
            };
            self.peers.insert(id, peer);
            self.table.push(node);
            echoes.push(echo);
        }
        info!(nodes = self.table.len(), "cluster complete, ids assigned");
        let mut out = Vec::with_capacity(2 * echoes.len());
        for (i, echo) in echoes.into_iter().enumerate() {
            out.extend(self.welcome(i + 1, echo));
        }
        out
    }

    /// Connect to the node at `index` of the table and send it the table.
    fn welcome(&self, index: usize, echo: Echo) -> Vec<Output> {
        let Some(node) = self.table.get(index) else {
            return Vec::new();
        };
        let control = Control {
            cmd: Command::AddNode,
            nodes: self.table.clone(),
            ..Control::default()
        };
        let id = node.id.unwrap_or_default();
        vec![Output::Connect(node.clone()), reply(id, control, echo)]
    }

    fn on_barrier(&mut self, from: NodeId, group: i32, echo: Echo) -> Vec<Output> {
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
        self.settle(group)
    }

    /// Whether `id` can be sent to: the scheduler, or a node neither dead nor gone.
    fn is_live(&self, id: NodeId) -> bool {
        id == node_ids::SCHEDULER || self.peers.get(&id).is_some_and(|p| !p.dead && !p.gone)
    }

    /// Releases or fails the barrier of `group` if it can be decided.
    fn settle(&mut self, group: i32) -> Vec<Output> {
        let Some(arrived) = self.barriers.get(&group) else {
            return Vec::new();
        };
        // Members: the group's nodes that have not left, the dead ones included.
        let members: Vec<NodeId> = (self.table.iter())
            .filter(|n| node_ids::group_of(n.role) & group != 0)
            .filter_map(|n| n.id)
            .filter(|id| self.peers.get(id).is_none_or(|p| !p.gone))
            .collect();
        let dead: Vec<NodeId> = (members.iter().copied())
            .filter(|id| self.peers.get(id).is_some_and(|p| p.dead))
            .collect();
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

    /// The table entries of `ids`.
    fn nodes(&self, ids: &[NodeId]) -> Vec<Node> {
        ids.iter()
            .filter_map(|&id| self.node(id).cloned())
            .collect()
    }

    /// Declares `ids` dead, tells every live node, and settles every pending barrier.
    fn bury(&mut self, ids: Vec<NodeId>, reason: &str) -> Vec<Output> {
        let mut out = Vec::new();
        if !ids.is_empty() {
            warn!(dead = ?ids, reason, "declaring nodes dead");
            for id in &ids {
                if let Some(peer) = self.peers.get_mut(id) {
                    peer.dead = true;
                }
            }
            let control = Control {
                cmd: Command::NodeFailure,
                nodes: self.nodes(&ids),
                ..Control::default()
            };
            // Live nodes, and (best effort) the dead themselves: one declared dead wrongly
            // learns it and stops waiting.
            for node in &self.table {
                let Some(id) = node.id.filter(|&id| self.is_live(id) || ids.contains(&id)) else {
                    continue;
                };
                out.push(reply(id, control.clone(), Echo::default()));
            }
        }
        let groups: Vec<i32> = self.barriers.keys().copied().collect();
        for group in groups {
            out.extend(self.settle(group));
        }
        out
    }
}

/// A reply of the scheduler to `to`.
fn reply(to: NodeId, control: Control, echo: Echo) -> Output {
    Output::Send(Message {
        meta: Meta {
            app_id: echo.app_id,
            customer_id: echo.customer_id,
            request_id: echo.request_id,
            sender: Some(node_ids::SCHEDULER),
            recipient: Some(to),
            request: false,
            control: Some(control),
            ..Meta::default()
        },
        data: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TIMEOUT: Duration = Duration::from_secs(10);
    const MS: Duration = Duration::from_millis(1);
    use Command::{AddNode, Barrier, Heartbeat, NodeFailure, Terminate};

    fn me() -> Node {
        Node::new(Role::Scheduler, "10.0.0.1", 9000)
    }

    fn fresh(servers: u16, workers: u16, heartbeat_timeout: Option<Duration>) -> Scheduler {
        let (num_servers, num_workers) = (servers.into(), workers.into());
        let config = SchedulerConfig {
            num_workers,
            num_servers,
            heartbeat_timeout,
        };
        Scheduler::new(config, me())
    }

    /// Servers then workers; addresses deliberately not in id order.
    fn nodes(servers: u16, workers: u16) -> Vec<Node> {
        let make = |role, i: u16| {
            let mut node = Node::new(role, format!("10.0.0.{}", 9 - i % 3), 7000 - i);
            node.host_identity = format!("boot-{}", i % 3);
            node
        };
        let workers = (0..workers).map(|i| make(Role::Worker, 100 + i));
        (0..servers)
            .map(|i| make(Role::Server, i))
            .chain(workers)
            .collect()
    }

    fn message(sender: Option<NodeId>, cmd: Command, group: i32, nodes: Vec<Node>) -> Message {
        let mut control = Control::command(cmd);
        (control.barrier_group, control.nodes) = (group, nodes);
        let mut msg = Message::default();
        (msg.meta.sender, msg.meta.request, msg.meta.control) = (sender, true, Some(control));
        msg
    }

    fn add_node(node: &Node) -> Message {
        message(None, AddNode, 0, vec![node.clone()])
    }

    fn request(from: NodeId, cmd: Command, group: i32) -> Message {
        message(Some(from), cmd, group, Vec::new())
    }

    /// A scheduler whose `servers` and `workers` all joined at `t0`.
    fn ready(servers: u16, workers: u16, timeout: Option<Duration>, t0: Instant) -> Scheduler {
        let mut s = fresh(servers, workers, timeout);
        for node in nodes(servers, workers) {
            s.handle(t0, &add_node(&node));
        }
        assert!(s.is_ready());
        s
    }

    /// (recipient, command, group, ids of control.nodes) of each Send; no Connect allowed.
    fn sends(out: &[Output]) -> Vec<(NodeId, Command, i32, Vec<NodeId>)> {
        let summarize = |o: &Output| match o {
            Output::Send(m) => {
                assert_eq!((m.meta.sender, m.meta.request), (Some(1), false));
                let c = m.meta.control.clone().unwrap();
                let ids = c.nodes.iter().map(|n| n.id.unwrap()).collect();
                (m.meta.recipient.unwrap(), c.cmd, c.barrier_group, ids)
            }
            Output::Connect(n) => panic!("unexpected connect to {n}"),
        };
        out.iter().map(summarize).collect()
    }

    fn barrier(s: &mut Scheduler, now: Instant, from: NodeId, group: i32) -> Vec<Output> {
        s.handle(now, &request(from, Barrier, group))
    }

    /// Checks the welcome of every node: Connect(node) then the table, in table order.
    fn assert_welcomes(out: &[Output], table: &[Node]) {
        assert_eq!(out.len(), 2 * (table.len() - 1));
        for (pair, node) in out.chunks(2).zip(&table[1..]) {
            assert_eq!(pair[0], Output::Connect(node.clone()));
            let Output::Send(m) = &pair[1] else {
                panic!("expected a send")
            };
            assert_eq!(m.meta.recipient, node.id);
            let c = m.meta.control.as_ref().unwrap();
            assert_eq!((c.cmd, c.nodes.as_slice()), (AddNode, table));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn join_order_does_not_change_ids_or_table(
            order in Just((0..8usize).collect::<Vec<_>>()).prop_shuffle()
        ) {
            let t0 = Instant::now();
            let all = nodes(3, 5);
            let mut s = fresh(3, 5, Some(TIMEOUT));
            for (k, &i) in order.iter().enumerate() {
                let out = s.handle(t0, &add_node(&all[i]));
                if k + 1 < order.len() {
                    prop_assert!(out.is_empty() && !s.is_ready() && s.table().is_empty());
                } else {
                    assert_welcomes(&out, s.table());
                }
            }
            // Each role sorted by (host, port, host_identity), ids 8, 10, … and 9, 11, ….
            let mut expected = vec![me().with_id(1)];
            for (role, first) in [(Role::Server, 8), (Role::Worker, 9)] {
                let mut group: Vec<Node> = all.iter().filter(|n| n.role == role).cloned().collect();
                group.sort_by_key(|n| (n.host.clone(), n.port, n.host_identity.clone()));
                let ids = (first..).step_by(2);
                expected.extend(group.into_iter().zip(ids).map(|(n, id)| n.with_id(id)));
            }
            prop_assert_eq!(s.table(), expected.as_slice());
        }

        #[test]
        fn arbitrary_control_messages_never_panic(
            cmd in 0usize..7, sender in proptest::option::of(-3i32..20), group in -2i32..10,
            request_flag: bool, with_control: bool, secs in 0u64..30,
        ) {
            let t0 = Instant::now();
            let mut s = ready(2, 2, Some(TIMEOUT), t0);
            let cmds = [Command::Empty, Terminate, AddNode, Barrier, Command::Ack, Heartbeat,
                NodeFailure];
            let mut msg = message(sender, cmds[cmd], group, nodes(1, 1));
            msg.meta.request = request_flag;
            if !with_control { msg.meta.control = None; }
            let now = t0 + Duration::from_secs(secs);
            let _ = s.handle(now, &msg);
            let _ = s.tick(now);
            let _ = s.peer_lost(now, sender.unwrap_or(0), "test");
        }
    }

    #[test]
    fn duplicate_registration_is_idempotent_and_resend_after_ready_gets_the_table() {
        let t0 = Instant::now();
        let mut s = fresh(1, 1, None);
        let all = nodes(1, 1);
        assert!(s.handle(t0, &add_node(&all[0])).is_empty());
        assert!(s.handle(t0, &add_node(&all[0])).is_empty());
        assert!(
            !s.is_ready(),
            "a duplicate must not count as the missing worker"
        );
        assert_welcomes(&s.handle(t0, &add_node(&all[1])), s.table());
        // Re-sent after ready: that node gets Connect + the table again, nobody else.
        let out = s.handle(t0, &add_node(&all[1]));
        assert_eq!(out[0], Output::Connect(s.table()[2].clone()));
        assert_eq!(sends(&out[1..]), [(9, AddNode, 0, vec![1, 8, 9])]);
        // Strangers and recoveries after ready are ignored.
        let stranger = Node::new(Role::Worker, "x", 1);
        assert!(s.handle(t0, &add_node(&stranger)).is_empty());
        let mut recovering = all[1].clone();
        recovering.is_recovery = true;
        assert!(s.handle(t0, &add_node(&recovering)).is_empty());
    }

    #[test]
    fn extra_and_scheduler_registrations_are_ignored() {
        let t0 = Instant::now();
        let mut s = fresh(1, 2, None);
        let all = nodes(2, 2);
        assert!(s.handle(t0, &add_node(&all[0])).is_empty());
        assert!(
            s.handle(t0, &add_node(&all[1])).is_empty(),
            "one server too many"
        );
        let other = Node::new(Role::Scheduler, "10.0.0.2", 9000);
        assert!(s.handle(t0, &add_node(&other)).is_empty());
        assert!(s.handle(t0, &add_node(&all[2])).is_empty());
        assert_eq!(s.handle(t0, &add_node(&all[3])).len(), 6);
        assert_eq!(s.table().len(), 4);
        assert!(
            fresh(0, 0, None).is_ready(),
            "an empty cluster is ready at once"
        );
    }

    #[test]
    fn summary_names_missing_counts_per_role() {
        let t0 = Instant::now();
        let mut s = fresh(2, 3, None);
        let all = nodes(2, 3);
        let nobody = "0/2 servers, 0/3 workers joined; waiting for 2 servers and 3 workers";
        assert_eq!(s.summary(), nobody);
        for node in &all[1..] {
            s.handle(t0, &add_node(node));
        }
        let partial = "1/2 servers, 3/3 workers joined; waiting for 1 server";
        assert_eq!(s.summary(), partial);
        s.handle(t0, &add_node(&all[0]));
        assert_eq!(s.summary(), "2/2 servers, 3/3 workers joined");
        s.peer_lost(t0, 9, "reset");
        assert_eq!(s.summary(), "2/2 servers, 3/3 workers joined; dead: [9]");
    }

    #[test]
    fn barriers_release_only_when_the_last_member_arrives_and_only_to_members() {
        let t0 = Instant::now();
        let mut s = ready(2, 3, Some(TIMEOUT), t0);
        let cases: [(i32, &[NodeId]); 4] = [
            (2, &[8, 10]),
            (4, &[9, 11, 13]),
            (6, &[8, 10, 9, 11, 13]),
            (7, &[1, 8, 10, 9, 11, 13]),
        ];
        for (group, members) in cases {
            let (&last, first) = members.split_last().unwrap();
            for &id in first {
                assert!(barrier(&mut s, t0, id, group).is_empty(), "{group}: {id}");
                assert!(
                    barrier(&mut s, t0, id, group).is_empty(),
                    "duplicates count once"
                );
            }
            let mut got = sends(&barrier(&mut s, t0, last, group));
            got.sort_unstable_by_key(|(to, ..)| *to);
            let mut want: Vec<_> = members
                .iter()
                .map(|&m| (m, Barrier, group, vec![]))
                .collect();
            want.sort_unstable_by_key(|(to, ..)| *to);
            assert_eq!(got, want);
            // The count was reset: a new round waits again.
            assert!(barrier(&mut s, t0, last, group).is_empty());
        }
    }

    #[test]
    fn invalid_barriers_are_ignored() {
        let t0 = Instant::now();
        assert!(
            barrier(&mut fresh(1, 1, None), t0, 1, 1).is_empty(),
            "before ready"
        );
        let mut s = ready(1, 1, None, t0);
        for group in [0, -1, 8, 9] {
            assert!(barrier(&mut s, t0, 8, group).is_empty(), "group {group}");
        }
        assert!(
            barrier(&mut s, t0, 9, 2).is_empty(),
            "a worker is no server"
        );
        let mut anonymous = request(8, Barrier, 2);
        anonymous.meta.sender = None;
        assert!(s.handle(t0, &anonymous).is_empty());
        assert!(s.barriers.is_empty());
        assert_eq!(
            barrier(&mut s, t0, 8, 2).len(),
            1,
            "a lone server releases itself"
        );
    }

    #[test]
    fn pending_barrier_fails_when_a_member_stops_its_heartbeat() {
        let t0 = Instant::now();
        let mut s = ready(2, 2, Some(TIMEOUT), t0);
        for id in [8, 9, 11] {
            assert!(barrier(&mut s, t0, id, 6).is_empty());
        }
        // Everyone but server 10 keeps beating.
        let mut now = t0;
        while now < t0 + TIMEOUT {
            now += Duration::from_secs(2);
            for id in [8, 9, 11] {
                assert!(s.handle(now, &request(id, Heartbeat, 0)).is_empty());
            }
        }
        let notice = |to| (to, NodeFailure, 0, vec![10]);
        let failed = |to| (to, Barrier, 6, vec![10]);
        // The dead node itself is told too (best effort), in table order.
        let want = [
            notice(1),
            notice(8),
            notice(10),
            notice(9),
            notice(11),
            failed(8),
            failed(9),
            failed(11),
        ];
        assert_eq!(sends(&s.tick(now + MS)), want);
        assert_eq!(s.dead(), [10]);
        // A new barrier with the dead member fails at once, to the requester only.
        assert_eq!(sends(&barrier(&mut s, now, 9, 2 | 4)), [failed(9)]);
        assert!(
            barrier(&mut s, now, 11, 4).is_empty(),
            "group 4 has no dead member"
        );
        // The dead stay dead, and are not declared again; a dead node that speaks is told.
        assert_eq!(
            sends(&s.handle(now, &request(10, Heartbeat, 0))),
            [notice(10)]
        );
        let later = sends(&s.tick(now + TIMEOUT));
        assert!(!later.is_empty() && later.iter().all(|(.., dead)| !dead.contains(&10)));
    }

    #[test]
    fn silent_node_is_declared_dead_once_and_only_after_the_timeout() {
        let t0 = Instant::now();
        let mut s = ready(1, 1, Some(TIMEOUT), t0);
        assert_eq!(s.next_deadline(), Some(t0 + TIMEOUT));
        assert!(s.tick(t0 + TIMEOUT - MS).is_empty());
        s.handle(t0 + TIMEOUT - MS, &request(8, Heartbeat, 0));
        let notice = |to, dead| (to, NodeFailure, 0, vec![dead]);
        assert_eq!(
            sends(&s.tick(t0 + TIMEOUT + MS)),
            [notice(1, 9), notice(8, 9), notice(9, 9)]
        );
        assert!(
            s.tick(t0 + 2 * TIMEOUT - 2 * MS).is_empty(),
            "declared once"
        );
        assert_eq!(s.next_deadline(), Some(t0 + 2 * TIMEOUT - MS));
        assert_eq!(
            sends(&s.tick(t0 + 2 * TIMEOUT - MS)),
            [notice(1, 8), notice(8, 8)]
        );
        assert_eq!((s.dead(), s.next_deadline()), (vec![8, 9], None));
    }

    #[test]
    fn heartbeats_and_any_message_keep_nodes_alive_and_no_timeout_never_kills() {
        let t0 = Instant::now();
        let mut s = ready(1, 1, Some(TIMEOUT), t0);
        for step in 1..100u32 {
            let now = t0 + step * TIMEOUT / 3;
            s.handle(now, &request(8, Heartbeat, 0));
            // The worker only ever sends barriers; that is a sign of life too.
            barrier(&mut s, now, 9, 4);
            assert!(s.tick(now + MS).is_empty());
        }
        let mut silent = ready(1, 1, None, t0);
        assert_eq!(silent.next_deadline(), None);
        assert!(silent.tick(t0 + 1000 * TIMEOUT).is_empty());
        assert!(silent.dead().is_empty());
    }

    #[test]
    fn peer_lost_kills_at_once_except_leaving_nodes() {
        let t0 = Instant::now();
        let mut s = ready(1, 2, Some(TIMEOUT), t0);
        let notice = |to| (to, NodeFailure, 0, vec![11]);
        assert_eq!(
            sends(&s.peer_lost(t0, 11, "reset")),
            [notice(1), notice(8), notice(9), notice(11)]
        );
        assert!(s.peer_lost(t0, 11, "again").is_empty(), "dead once");
        assert!(s.peer_lost(t0, 42, "unknown").is_empty());
        assert!(s.peer_lost(t0, 1, "myself").is_empty());
        s.handle(t0, &request(9, Terminate, 0));
        assert!(s.peer_lost(t0, 9, "closed after terminate").is_empty());
        let later = sends(&s.tick(t0 + 2 * TIMEOUT));
        assert_eq!(
            later,
            [(1, NodeFailure, 0, vec![8]), (8, NodeFailure, 0, vec![8])],
            "9 is gone, not dead"
        );
        assert_eq!(s.dead(), [8, 11]);
    }

    #[test]
    fn leaving_node_that_disconnects_no_longer_holds_a_barrier() {
        let t0 = Instant::now();
        let mut s = ready(1, 2, None, t0);
        let mut req = request(9, Barrier, 4);
        (req.meta.customer_id, req.meta.request_id) = (3, 42);
        assert!(s.handle(t0, &req).is_empty());
        s.handle(t0, &request(11, Terminate, 0));
        let out = s.peer_lost(t0, 11, "closed");
        assert_eq!(sends(&out), [(9, Barrier, 4, vec![])]);
        let Output::Send(release) = &out[0] else {
            panic!("expected a send")
        };
        assert_eq!(
            (release.meta.customer_id, release.meta.request_id),
            (3, 42),
            "echoed"
        );
        assert!(s.dead().is_empty());
    }

    #[test]
    fn finished_once_every_node_terminated() {
        let t0 = Instant::now();
        let mut s = ready(2, 2, Some(TIMEOUT), t0);
        for id in [8, 10, 9, 11] {
            assert!(!s.is_finished());
            assert!(s.handle(t0, &request(id, Terminate, 0)).is_empty());
        }
        assert!(!s.is_finished(), "the scheduler itself has not terminated");
        s.handle(t0, &request(1, Terminate, 0));
        assert!(s.is_finished());
        assert!(
            s.tick(t0 + 2 * TIMEOUT).is_empty(),
            "leaving nodes are not failures"
        );
        // A dead node counts as done; dead() tells the difference.
        let mut failed = ready(1, 1, Some(TIMEOUT), t0);
        failed.peer_lost(t0, 9, "killed");
        for id in [8, 1] {
            failed.handle(t0, &request(id, Terminate, 0));
        }
        assert!(failed.is_finished() && failed.dead() == [9]);
    }

    #[test]
    fn malformed_messages_are_ignored() {
        let t0 = Instant::now();
        let mut s = ready(1, 1, Some(TIMEOUT), t0);
        let mut no_control = request(8, Barrier, 2);
        no_control.meta.control = None;
        let mut response = request(8, Barrier, 2);
        response.meta.request = false;
        let two_nodes = message(None, AddNode, 0, nodes(1, 1));
        let (empty_add, stranger) = (message(None, AddNode, 0, vec![]), request(99, Barrier, 2));
        let (ack, failure) = (request(8, Command::Ack, 0), request(8, NodeFailure, 0));
        for msg in [
            no_control, response, two_nodes, empty_add, stranger, ack, failure,
        ] {
            assert!(s.handle(t0, &msg).is_empty(), "{msg:?}");
        }
        assert!(s.barriers.is_empty());
    }
}
