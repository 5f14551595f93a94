//! The per-peer van router: which van carries traffic to each peer, with lazy connections.
//!
//! A node binds every van it has (the stream van, and the shared-memory van when compiled in
//! and enabled); for each peer, [`van_core::select::select_van`] picks one from what the node
//! table says about both nodes. [`Router::van_for`] answers "what am I using for this peer?",
//! and the choice is logged once per peer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::{debug, info};
use van_core::select::{select_van, Available};
use van_core::{Config, Endpoint, InboxSender, Message, Node, NodeId, Van, VanError, VanKind};

use crate::error::NodeError;
use crate::resend::Resender;
use crate::table::NodeTable;

/// Routes messages to peers over the right van, connecting on first use.
pub struct Router {
    /// Every van of this node; the first is the stream van.
    vans: Vec<Arc<dyn Van>>,
    available: Available,
    config: Config,
    /// This node (its role and host identity drive the selection).
    me: Node,
    state: Mutex<RouterState>,
    /// With `PS_RESEND`: numbers what is sent and keeps it until acknowledged.
    resend: Option<Resender>,
    /// Who is declared failed (the node's membership): sends waiting for room towards such a
    /// peer give up.
    failed: Arc<dyn Failures>,
    /// Rung when a node is declared failed.
    failures: tokio::sync::Notify,
}

/// Who is declared failed, as the node's membership knows it
/// ([`Member::failure`](crate::member::Member::failure)).
pub trait Failures: Send + Sync {
    /// Why `peer` counts as dead, if it does.
    fn failure(&self, peer: NodeId) -> Option<String>;
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<VanKind> = self.vans.iter().map(|v| v.kind()).collect();
        f.debug_struct("Router")
            .field("vans", &kinds)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct RouterState {
    /// The node table (shared with the postoffice and, in one process, every node).
    table: NodeTable,
    /// Nodes learnt one by one, newer than the table's entry: recoveries, direct connects.
    learnt: HashMap<NodeId, Node>,
    /// The van chosen for each peer we have connected to.
    connected: HashMap<NodeId, VanKind>,
}

impl RouterState {
    /// What this router knows of `id`: learnt one by one, else the table's entry.
    fn node(&self, id: NodeId) -> Option<&Node> {
        self.learnt.get(&id).or_else(|| self.table.get(id))
    }
}

impl Router {
    /// A router over `vans` (the stream van first) for the node `me`. The configuration gives
    /// the selection switches and, with an endpoint map (the `.endpoint_map` of TensorFlow
    /// Seastar / StarServer deployments), the data address of each mapped control address.
    /// `incarnation` tells this process from another that later takes its node id (the top
    /// bits of its resend sequence numbers, with `PS_RESEND`). `failed` says who is declared
    /// failed.
    pub fn new(
        vans: Vec<Arc<dyn Van>>,
        config: &Config,
        me: Node,
        incarnation: u64,
        failed: Arc<dyn Failures>,
    ) -> Router {
        let mut available = Available::default();
        for van in &vans {
            match van.kind() {
                VanKind::Tcp => available.tcp = true,
                VanKind::Uring => available.uring = true,
                VanKind::Rdma => available.rdma = true,
                VanKind::Ipc => available.ipc = true,
                VanKind::InProcess => available.inproc = true,
            }
        }
        Router {
            vans,
            available,
            config: config.clone(),
            me,
            state: Mutex::new(RouterState::default()),
            resend: config
                .resend_timeout
                .map(|timeout| Resender::new(timeout, incarnation)),
            failed,
            failures: tokio::sync::Notify::new(),
        }
    }

    /// `node` with its addresses rewritten by the endpoint map, if any maps them.
    fn mapped(&self, node: &Node) -> Node {
        let Some(map) = &self.config.endpoint_map else {
            return node.clone();
        };
        let mut node = node.clone();
        if let Some(data) = map.get(&node.host, node.port) {
            info!("{node}: endpoint map sends its traffic to {data}");
            node.host = data.host.clone();
            node.port = data.port;
        }
        for endpoint in &mut node.endpoints {
            if let Some(data) = map.lookup(&endpoint.address) {
                endpoint.address = data.to_string();
            }
        }
        node
    }

    fn lock(&self) -> MutexGuard<'_, RouterState> {
        // Single map operations only: a poisoned lock holds consistent data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn van(&self, kind: VanKind) -> Result<&Arc<dyn Van>, NodeError> {
        self.vans
            .iter()
            .find(|v| v.kind() == kind)
            .ok_or_else(|| VanError::NotCompiled { kind }.into())
    }

    /// A buffer of `len` bytes from the first van that offers memory it sends without
    /// copying ([`Van::alloc`]); `Ok(None)` when none does.
    pub fn alloc(&self, len: usize) -> Result<Option<van_core::SharedBuf>, VanError> {
        for van in &self.vans {
            if let Some(buf) = van.alloc(len)? {
                return Ok(Some(buf));
            }
        }
        Ok(None)
    }

    /// The memory of the first van whose buffers co-located processes can map where they
    /// are ([`Van::shared_region`]).
    pub fn shared_region(&self) -> Option<van_core::buf::SharedRegion> {
        self.vans.iter().find_map(|van| van.shared_region())
    }

    /// Binds every van and delivers into `inbox`; returns the endpoints to announce.
    pub async fn bind(
        &self,
        host: &str,
        port: u16,
        inbox: InboxSender,
    ) -> Result<Vec<Endpoint>, NodeError> {
        let mut endpoints = Vec::with_capacity(self.vans.len());
        for (i, van) in self.vans.iter().enumerate() {
            // Only the stream van takes the configured port; the others pick their own.
            let port = if i == 0 { port } else { 0 };
            endpoints.push(van.bind(host, port, inbox.clone()).await?);
        }
        Ok(endpoints)
    }

    /// Learns the node table: the addresses and processes of every node (connections open
    /// on first send). Nodes learnt before it one by one ([`Router::set_nodes`]) are
    /// checked against it as `set_nodes` checks, then the table's word is kept: the work is
    /// per node learnt, not per node of the table, so that each of 10,000 nodes of one
    /// process joins in constant time (with `PS_RESEND`, the resender still learns every
    /// node's process: work per node of the table).
    pub fn set_table(&self, table: &NodeTable) -> usize {
        let learnt: Vec<Node> = {
            let mut state = self.lock();
            state.table = table.clone();
            state.learnt.drain().map(|(_, node)| node).collect()
        };
        // Each learnt node against the table's entry: a different process is reached anew.
        let mut dropped = 0;
        for known in learnt {
            let Some(node) = known.id.and_then(|id| table.get(id)) else {
                self.lock().learnt.extend(known.id.map(|id| (id, known)));
                continue;
            };
            self.lock()
                .learnt
                .insert(node.id.unwrap_or_default(), known);
            dropped += self.set_nodes(std::slice::from_ref(node));
        }
        if let Some(resend) = &self.resend {
            for node in table.nodes() {
                if let Some(id) = node.id {
                    dropped += resend.retarget(id, node.incarnation);
                }
            }
        }
        dropped
    }

    /// Learns the addresses and processes of `nodes`; connections open on first send. A
    /// node now held by another process than the one known (recovery: a new incarnation or
    /// address) is reached afresh: its route is dropped and the vans retire the connections
    /// to the old process. With `PS_RESEND`, returns how many unacknowledged messages were
    /// dropped because they were meant for the old process.
    pub fn set_nodes(&self, nodes: &[Node]) -> usize {
        let mut state = self.lock();
        let mut dropped = 0;
        for node in nodes {
            let Some(id) = node.id else { continue };
            if let Some(resend) = &self.resend {
                dropped += resend.retarget(id, node.incarnation);
            }
            let replaced = state.node(id).is_some_and(|known| {
                (known.incarnation != node.incarnation
                    && known.incarnation != 0
                    && node.incarnation != 0)
                    || known.host != node.host
                    || known.port != node.port
            });
            if replaced {
                state.connected.remove(&id);
                for van in &self.vans {
                    van.forget(id);
                }
            }
            state.learnt.insert(id, node.clone());
        }
        dropped
    }

    /// The van that carries (or will carry) traffic to `peer`, if the peer is known.
    pub fn van_for(&self, peer: NodeId) -> Option<VanKind> {
        let state = self.lock();
        if let Some(kind) = state.connected.get(&peer) {
            return Some(*kind);
        }
        let node = state.node(peer)?;
        select_van(&self.config, self.available, &self.me, node).ok()
    }

    /// The peers with an open connection, and the van of each, sorted by id.
    pub fn connected(&self) -> Vec<(NodeId, VanKind)> {
        let mut peers: Vec<_> = self
            .lock()
            .connected
            .iter()
            .map(|(p, k)| (*p, *k))
            .collect();
        peers.sort_unstable();
        peers
    }

    /// Connects to `node` now over the van the policy picks (and remembers its address).
    pub async fn connect(&self, node: &Node) -> Result<(), NodeError> {
        let id = node.id.ok_or_else(|| {
            NodeError::InvalidArgument(format!("cannot connect to {node}: it has no id"))
        })?;
        let kind = select_van(&self.config, self.available, &self.me, node)?;
        self.set_nodes(std::slice::from_ref(node));
        self.van(kind)?.connect(&self.mapped(node)).await?;
        let mut state = self.lock();
        if state.connected.insert(id, kind).is_none() {
            info!(peer = id, van = %kind, "route to {node}: {kind} van");
        }
        Ok(())
    }

    /// The incarnation the node table names for `peer` (0: not known).
    pub(crate) fn incarnation_of(&self, peer: NodeId) -> u64 {
        self.lock().node(peer).map_or(0, |n| n.incarnation)
    }

    /// Whether `peer` counts as failed ([`Failures`]).
    pub(crate) fn is_failed(&self, peer: NodeId) -> bool {
        self.failed.failure(peer).is_some()
    }

    /// The resender, when `PS_RESEND` is on.
    pub(crate) fn resender(&self) -> Option<&Resender> {
        self.resend.as_ref()
    }

    /// Sends `msg` to its recipient, connecting first if needed. A broken connection is
    /// reported as [`NodeError::NodeFailed`] naming the peer, unless `PS_RESEND` is on: then
    /// the message is kept and sent again over a new connection until acknowledged.
    pub async fn send(&self, mut msg: Message) -> Result<(), NodeError> {
        if let Some(resend) = &self.resend {
            resend.stamp(&mut msg, std::time::Instant::now());
        }
        // Inline, so that a send without PS_RESEND allocates nothing for it.
        let numbered = msg.meta.recipient.zip(msg.meta.seq.map(|s| s.number));
        let result = self.send_once(msg).await;
        self.forgiven(numbered.as_slice(), result)
    }

    /// Sends `msg` as it is (a resend keeps its sequence number).
    pub(crate) async fn send_once(&self, msg: Message) -> Result<(), NodeError> {
        let peer = msg.meta.recipient.ok_or(VanError::NoRecipient)?;
        let kind = self.ensure_connected(peer).await?;
        if self.config.verbose >= 2 {
            info!("send {} via {kind}", msg.summary());
        }
        let van = self.van(kind)?;
        let sent = match van.try_send(msg) {
            Ok(None) => Ok(()),
            Ok(Some(msg)) => self.unless_failed(&[peer], van.send(msg)).await?,
            Err(e) => Err(e),
        };
        self.checked(kind, sent)
    }

    /// `send`, unless one of `peers` is declared failed while it waits (for room in the
    /// peer's queue, which a process that stopped reading never makes): then
    /// [`NodeError::NodeFailed`], and `send` is dropped (a van's send is cancel-safe: what it
    /// had not queued is not sent). Without this, a send to a stopped peer would wait for as
    /// long as the peer's socket stays open.
    async fn unless_failed<'a>(
        &self,
        peers: impl IntoIterator<Item = &'a NodeId> + Copy,
        send: impl std::future::Future<Output = Result<(), VanError>>,
    ) -> Result<Result<(), VanError>, NodeError> {
        tokio::select! {
            biased;
            sent = send => Ok(sent),
            failed = self.until_failed(peers) => Err(failed),
        }
    }

    /// Waits until one of `peers` is declared failed; the error naming it.
    async fn until_failed<'a>(
        &self,
        peers: impl IntoIterator<Item = &'a NodeId> + Copy,
    ) -> NodeError {
        loop {
            let news = self.failures.notified();
            tokio::pin!(news);
            // Registered before looking, so a failure recorded in between still wakes us.
            news.as_mut().enable();
            let failed = peers
                .into_iter()
                .find_map(|p| Some((*p, self.failed.failure(*p)?)));
            if let Some((node, reason)) = failed {
                return NodeError::node_failed(
                    node,
                    format!("{reason} (while a send to it waited for room)"),
                );
            }
            news.await;
        }
    }

    /// The result of a send over van `kind`. When the van says it has no route to the peer
    /// (the connection ended, perhaps before this router even recorded it as connected),
    /// the router forgets the route too, so the next send dials again instead of failing
    /// the same way forever.
    /// A peer declared dead is reported with the scheduler's verdict, not as the van saw it
    /// (its connections end with the verdict: [`Van::drop_peer`]).
    fn checked(&self, kind: VanKind, sent: Result<(), VanError>) -> Result<(), NodeError> {
        if let Err(VanError::PeerGone { peer, .. } | VanError::UnknownPeer { peer }) = &sent {
            {
                let mut state = self.lock();
                if state.connected.get(peer) == Some(&kind) {
                    state.connected.remove(peer);
                    debug!(peer, van = %kind, "the van has no route: dialing again next time");
                }
            }
            if let Some(reason) = self.failed.failure(*peer) {
                return Err(NodeError::node_failed(*peer, reason));
            }
        }
        sent.map_err(peer_error)
    }

    /// A failed send of numbered messages that the resender will repeat is no error: the
    /// peer is unreachable for now, and only the scheduler declares it dead. Any other
    /// failure is the caller's, and the messages are not resent behind its back.
    fn forgiven(
        &self,
        numbered: &[(NodeId, u64)],
        result: Result<(), NodeError>,
    ) -> Result<(), NodeError> {
        match result {
            Err(e) if !numbered.is_empty() && is_transient(&e) => {
                debug!("send failed, will resend: {e}");
                Ok(())
            }
            Err(e) => {
                if let Some(resend) = &self.resend {
                    resend.unstamp(numbered);
                }
                Err(e)
            }
            ok => ok,
        }
    }

    /// Sends many messages (to any recipients), connecting first where needed; one batch
    /// per van.
    pub async fn send_batch(&self, mut msgs: Vec<Message>) -> Result<(), NodeError> {
        if let Some(resend) = &self.resend {
            let now = std::time::Instant::now();
            for msg in &mut msgs {
                resend.stamp(msg, now);
            }
        }
        let numbered = if self.resend.is_some() {
            numbered(&msgs)
        } else {
            Vec::new()
        };
        let result = self.send_batch_once(msgs).await;
        self.forgiven(&numbered, result)
    }

    async fn send_batch_once(&self, msgs: Vec<Message>) -> Result<(), NodeError> {
        let mut by_van: Vec<(VanKind, Vec<Message>)> = Vec::new();
        let mut seen = HashSet::new();
        for msg in msgs {
            let peer = msg.meta.recipient.ok_or(VanError::NoRecipient)?;
            let kind = if seen.insert(peer) {
                self.ensure_connected(peer).await?
            } else {
                self.lock()
                    .connected
                    .get(&peer)
                    .copied()
                    .ok_or(VanError::UnknownPeer { peer })?
            };
            if self.config.verbose >= 2 {
                info!("send {} via {kind}", msg.summary());
            }
            match by_van.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, batch)) => batch.push(msg),
                None => by_van.push((kind, vec![msg])),
            }
        }
        for (kind, batch) in by_van {
            // A recipient of this batch declared failed ends it if it waits; what the van
            // had queued by then goes out, the rest does not.
            let peers: Vec<NodeId> = batch.iter().filter_map(|m| m.meta.recipient).collect();
            let sent = self
                .unless_failed(&peers, self.van(kind)?.send_batch(batch))
                .await?;
            self.checked(kind, sent)?;
        }
        Ok(())
    }

    async fn ensure_connected(&self, peer: NodeId) -> Result<VanKind, NodeError> {
        let node = {
            let state = self.lock();
            if let Some(kind) = state.connected.get(&peer) {
                return Ok(*kind);
            }
            state
                .node(peer)
                .cloned()
                .ok_or(VanError::UnknownPeer { peer })?
        };
        self.connect(&node).await?;
        self.lock()
            .connected
            .get(&peer)
            .copied()
            .ok_or_else(|| VanError::UnknownPeer { peer }.into())
    }

    /// Forgets the connection to `peer` (it broke); the next send reconnects or fails.
    pub fn peer_lost(&self, peer: NodeId) {
        if self.lock().connected.remove(&peer).is_some() {
            debug!(peer, "route dropped");
        }
    }

    /// `peer` was declared failed for `reason` (its [`Failures`] now says so): its route is
    /// dropped as by [`peer_lost`](Self::peer_lost), every van ends its connections and
    /// drops what is queued to it ([`Van::drop_peer`]: a stop does not wait for a process
    /// that will never read), and sends to it that wait, or come to wait, for room in its
    /// queue end with [`NodeError::NodeFailed`], for as long as it counts as failed.
    pub fn node_failed(&self, peer: NodeId, reason: &str) {
        self.peer_lost(peer);
        for van in &self.vans {
            van.drop_peer(peer, reason);
        }
        self.failures.notify_waiters();
    }

    /// Stops every van; the first error is returned after all have been asked to stop.
    pub async fn stop(&self) -> Result<(), NodeError> {
        let mut first = Ok(());
        for van in &self.vans {
            if let Err(e) = van.stop().await {
                if first.is_ok() {
                    first = Err(e.into());
                }
            }
        }
        first
    }
}

/// The (recipient, number) of each numbered message.
fn numbered(msgs: &[Message]) -> Vec<(NodeId, u64)> {
    msgs.iter()
        .filter_map(|m| Some((m.meta.recipient?, m.meta.seq?.number)))
        .collect()
}

/// Whether a send failed because the peer cannot be reached right now (a broken or refused
/// connection, a handshake that did not finish), which a resend may cure.
fn is_transient(e: &NodeError) -> bool {
    use van_core::auth::AuthError;
    matches!(
        e,
        NodeError::NodeFailed { .. }
            | NodeError::Van(
                VanError::PeerGone { .. }
                    | VanError::Connect { .. }
                    | VanError::Io { .. }
                    | VanError::Unauthenticated {
                        source: AuthError::Timeout(_)
                            | AuthError::Closed
                            | AuthError::Io(_)
                            | AuthError::TooManyPending { .. }
                            | AuthError::TooManyConnections { .. },
                        ..
                    }
            )
    )
}

/// A lost peer is a failed node, for the layers above.
fn peer_error(error: VanError) -> NodeError {
    match error {
        VanError::PeerGone { peer, reason } => {
            NodeError::node_failed(peer, format!("connection lost: {reason}"))
        }
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use van_core::endpoint_map::EndpointMap;
    use van_core::inproc::{Hub, InProcessVan};
    use van_core::Role;

    /// Failures kept by hand, as the membership would.
    #[derive(Default)]
    struct Dead(Mutex<HashMap<NodeId, String>>);

    impl Failures for Dead {
        fn failure(&self, peer: NodeId) -> Option<String> {
            self.0.lock().unwrap().get(&peer).cloned()
        }
    }

    fn nobody_dead() -> Arc<dyn Failures> {
        Arc::new(Dead::default())
    }

    #[test]
    fn the_endpoint_map_redirects_control_addresses_to_data_addresses() {
        let map = EndpointMap::parse("10.0.0.1:2222=10.1.0.1:3333\n").unwrap();
        let config = Config {
            endpoint_map: Some(map),
            ..Config::default()
        };
        let me = Node::new(Role::Worker, "10.0.0.3", 1);
        let vans: Vec<Arc<dyn Van>> = vec![Arc::new(InProcessVan::new(&Hub::new()))];
        let router = Router::new(vans, &config, me, 1, nobody_dead());
        let mut node = Node::new(Role::Server, "10.0.0.1", 2222).with_id(8);
        node.endpoints
            .push(Endpoint::stream(VanKind::Tcp, "10.0.0.1", 2222));
        let mapped = router.mapped(&node);
        assert_eq!((mapped.host.as_str(), mapped.port), ("10.1.0.1", 3333));
        assert_eq!(mapped.endpoints[0].address, "10.1.0.1:3333");
        // Unmapped nodes are untouched.
        let other = Node::new(Role::Worker, "10.0.0.2", 2222).with_id(9);
        assert_eq!(router.mapped(&other), other);
    }

    /// A connection that ends just after it was dialed (a proxy whose target is down drops
    /// it at once) must not leave the router sending into a route the van no longer has:
    /// the next send dials again and reaches the peer's new listener.
    #[cfg(feature = "tcp")]
    #[tokio::test]
    async fn a_route_the_van_lost_is_dialed_again() {
        use std::time::{Duration, Instant};
        let tcp =
            || -> Arc<dyn Van> { Arc::new(van_tcp::TcpVan::new(van_tcp::TcpOptions::default())) };
        let (first, (inbox, _first_inbox)) = (tcp(), van_core::inbox(16));
        let bound = first.bind("127.0.0.1", 0, inbox).await.unwrap();
        let port: u16 = bound.address.rsplit(':').next().unwrap().parse().unwrap();
        let config = Config {
            enable_ipc: false,
            ..Config::default()
        };
        let me = Node::new(Role::Worker, "127.0.0.1", 1).with_id(9);
        let (mine, (inbox, _my_inbox)) = (tcp(), van_core::inbox(16));
        mine.bind("127.0.0.1", 0, inbox).await.unwrap();
        let router = Router::new(vec![mine], &config, me, 1, nobody_dead());
        let peer = Node::new(Role::Server, "127.0.0.1", port).with_id(8);
        router.connect(&peer).await.unwrap();
        // The peer's process ends; a new one listens at the same address.
        first.stop().await.unwrap();
        let (second, (inbox, mut second_inbox)) = (tcp(), van_core::inbox(16));
        second.bind("127.0.0.1", port, inbox).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut msg = Message::default();
            (msg.meta.sender, msg.meta.recipient) = (Some(9), Some(8));
            // The first sends may go into the old connection or fail on it.
            let _ = router.send(msg).await;
            let got = tokio::time::timeout(Duration::from_millis(100), second_inbox.recv()).await;
            if let Ok(Some(van_core::Event::Message(msg))) = got {
                assert_eq!(msg.meta.recipient, Some(8));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the router never dialed the peer's new listener"
            );
        }
    }

    /// A van whose sends never find room: a peer that stopped reading.
    struct Full;

    #[async_trait::async_trait]
    impl Van for Full {
        fn kind(&self) -> VanKind {
            VanKind::Tcp
        }
        async fn bind(&self, host: &str, port: u16, _: InboxSender) -> Result<Endpoint, VanError> {
            Ok(Endpoint::stream(VanKind::Tcp, host, port))
        }
        async fn connect(&self, _: &Node) -> Result<(), VanError> {
            Ok(())
        }
        async fn send(&self, _: Message) -> Result<(), VanError> {
            std::future::pending().await
        }
        async fn stop(&self) -> Result<(), VanError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_send_waiting_for_a_failed_peer_ends_until_a_new_process_takes_its_place() {
        use std::time::Duration;
        let config = Config {
            enable_ipc: false,
            ..Config::default()
        };
        let me = Node::new(Role::Worker, "127.0.0.1", 1).with_id(9);
        let dead = Arc::new(Dead::default());
        let failed: Arc<dyn Failures> = dead.clone();
        let router = Arc::new(Router::new(vec![Arc::new(Full)], &config, me, 1, failed));
        for id in [8, 10] {
            let peer = Node::new(Role::Server, "127.0.0.1", 2).with_id(id);
            router.connect(&peer).await.unwrap();
        }
        let send = |to: NodeId| {
            let router = Arc::clone(&router);
            let mut msg = Message::default();
            (msg.meta.sender, msg.meta.recipient) = (Some(9), Some(to));
            tokio::spawn(async move { router.send(msg).await })
        };
        let (to_8, to_10) = (send(8), send(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !to_8.is_finished() && !to_10.is_finished(),
            "a send found room"
        );
        let reason = "declared dead by the scheduler".to_owned();
        dead.0.lock().unwrap().insert(8, reason);
        router.node_failed(8, "declared dead");
        match tokio::time::timeout(Duration::from_secs(5), to_8).await {
            Ok(Ok(Err(NodeError::NodeFailed {
                node: 8, reason, ..
            }))) => {
                assert!(reason.contains("while a send to it waited"), "{reason}");
            }
            other => panic!("the send to the failed peer did not end as NodeFailed: {other:?}"),
        }
        // Another peer's send still waits; so does a new send to 8 once a new process took
        // its place.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!to_10.is_finished(), "a live peer's send ended");
        dead.0.lock().unwrap().remove(&8);
        let again = send(8);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !again.is_finished(),
            "a send to the replacement did not wait"
        );
        again.abort();
        to_10.abort();
    }
}
