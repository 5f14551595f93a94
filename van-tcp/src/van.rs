//! [`TcpVan`]: the listener, the table of peer links and the `Van` implementation.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use van_core::budget::ByteBudget;
use van_core::van::{address_for, recipient_of};
use van_core::wire::{self, Limits};
use van_core::{
    Config, Endpoint, Event, FramePool, InboxSender, Message, Node, NodeId, PeerLost, Van,
    VanError, VanKind,
};

use crate::connection::{read_loop, write_loop, Closed, Frame};

thread_local! {
    /// Where frame headers are encoded: each header is split off a shared chunk, so small
    /// messages cost no allocation of their own (a chunk is freed when its last frame is).
    static ARENA: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}
/// Size of an encoding chunk.
const ARENA_CHUNK: usize = 64 * 1024;
/// Below this much room, a fresh chunk is taken.
const ARENA_REFILL: usize = 4 * 1024;

/// Idle time before the first keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the connection is declared dead.
const KEEPALIVE_PROBES: u32 = 3;

/// Tuning of a [`TcpVan`]. `Default` suits most jobs; [`TcpOptions::from_config`] takes the
/// limits and timeouts of a [`Config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOptions {
    /// Frame size limits, checked on send and on receive.
    pub limits: Limits,
    /// How long `connect` may take.
    pub connect_timeout: Duration,
    /// Frames queued per peer before `send` waits (back-pressure).
    pub send_queue_depth: usize,
    /// How long `stop` waits for queued frames to be written.
    pub flush_timeout: Duration,
    /// Bytes of large frames (64 KiB and up) one peer's queue may hold before `send` waits
    /// (0: no limit); small frames never wait for it. See [`ByteBudget`].
    pub peer_budget_bytes: usize,
    /// Idle bytes of received-frame buffers kept for reuse (0: every large frame gets a
    /// fresh buffer); see [`FramePool`].
    pub frame_pool_bytes: usize,
}

impl Default for TcpOptions {
    fn default() -> TcpOptions {
        TcpOptions {
            limits: Limits::default(),
            connect_timeout: Duration::from_secs(10),
            send_queue_depth: 4096,
            flush_timeout: Duration::from_secs(10),
            peer_budget_bytes: van_core::budget::DEFAULT_BUDGET_BYTES,
            frame_pool_bytes: van_core::pool::DEFAULT_POOL_BYTES,
        }
    }
}

impl TcpOptions {
    /// Options with the limits, connect timeout, peer budget and frame pool of `config`.
    pub fn from_config(config: &Config) -> TcpOptions {
        TcpOptions {
            limits: config.limits,
            connect_timeout: config.connect_timeout,
            peer_budget_bytes: config.peer_budget_bytes,
            frame_pool_bytes: config.frame_pool_bytes,
            ..TcpOptions::default()
        }
    }
}

/// A van over TCP; see the [crate docs](crate).
#[derive(Debug)]
pub struct TcpVan {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: TcpOptions,
    /// Buffers of large received frames, shared by every connection.
    pool: FramePool,
    state: Mutex<State>,
    next_connection: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    stopped: bool,
    inbox: Option<InboxSender>,
    local: Option<SocketAddr>,
    /// The link used to send to each peer; at most one per peer.
    links: HashMap<NodeId, Link>,
    /// Why the link to a peer went away, so later sends can say so.
    lost: HashMap<NodeId, String>,
    /// Accept loop and readers: aborted on stop.
    readers: Vec<JoinHandle<()>>,
    /// Writers: given time to flush on stop.
    writers: Vec<JoinHandle<()>>,
    /// One gate per peer, so concurrent `connect`s to it dial once (the others wait and
    /// reuse the result). Bounded by the number of peers.
    dialing: HashMap<NodeId, Arc<tokio::sync::Mutex<()>>>,
}

/// The sending side of one connection.
#[derive(Debug, Clone)]
struct Link {
    connection: u64,
    queue: mpsc::Sender<Frame>,
    /// Bytes of large frames this peer's queue may hold; a frame's share comes back when the
    /// writer drops its bytes (once written).
    budget: ByteBudget,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few map operations; a panic inside one cannot leave the
        // state half-updated in a way later calls would trip on, so poison is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the reader and writer of a new connection and returns its link. `peer` is the
    /// node we dialed, or `None` for an accepted connection (learned from its first message).
    /// Returns `None` (closing the stream) when the van has stopped meanwhile.
    fn spawn_connection(
        self: &Arc<Self>,
        stream: TcpStream,
        remote: SocketAddr,
        inbox: InboxSender,
        peer: Option<NodeId>,
    ) -> Option<Link> {
        if self.lock().stopped {
            return None;
        }
        if let Err(e) = stream.set_nodelay(true) {
            warn!(%remote, "cannot set TCP_NODELAY: {e}");
        }
        // A peer whose host vanishes without a reset is noticed in ~25 s, not ~15 min.
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES);
        if let Err(e) = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive) {
            warn!(%remote, "cannot enable TCP keepalive: {e}");
        }
        let connection = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let (read_half, write_half) = stream.into_split();
        let (queue, frames) = mpsc::channel(self.options.send_queue_depth.max(1));
        let link = Link {
            connection,
            queue,
            budget: ByteBudget::new(self.options.peer_budget_bytes),
        };

        let writer = tokio::spawn(async move {
            if let Err(e) = write_loop(frames, write_half).await {
                warn!(%remote, ?peer, "cannot write to the connection; queued frames are lost: {e}");
            }
        });
        let shared = Arc::clone(self);
        let own_link = link.clone();
        let reader = tokio::spawn(async move {
            let mut peer = peer;
            let closed = read_loop(
                read_half,
                shared.options.limits,
                &shared.pool,
                &inbox,
                |msg| {
                    if peer.is_none() {
                        if let Some(sender) = msg.meta.sender {
                            peer = Some(sender);
                            shared.learn(sender, &own_link);
                        }
                    }
                },
            )
            .await;
            drop(own_link);
            shared
                .connection_closed(connection, peer, remote, &closed, &inbox)
                .await;
        });
        let mut state = self.lock();
        if state.stopped {
            // `stop` ran while we were spawning: it will not see these tasks.
            reader.abort();
            writer.abort();
            return None;
        }
        state.readers.retain(|task| !task.is_finished());
        state.writers.retain(|task| !task.is_finished());
        state.readers.push(reader);
        state.writers.push(writer);
        Some(link)
    }

    /// A peer identified itself on a connection: reply over it unless we have a link already.
    fn learn(&self, peer: NodeId, link: &Link) {
        let mut state = self.lock();
        if !state.stopped && !state.links.contains_key(&peer) {
            debug!(peer, "learned link from incoming connection");
            state.links.insert(peer, link.clone());
            state.lost.remove(&peer);
        }
    }

    async fn connection_closed(
        &self,
        connection: u64,
        peer: Option<NodeId>,
        remote: SocketAddr,
        closed: &Closed,
        inbox: &InboxSender,
    ) {
        let reason = closed.to_string();
        let was_route = {
            let mut state = self.lock();
            let dropped: Vec<NodeId> = state
                .links
                .iter()
                .filter(|(_, link)| link.connection == connection)
                .map(|(peer, _)| *peer)
                .collect();
            for peer in &dropped {
                state.links.remove(peer);
                state.lost.insert(*peer, reason.clone());
            }
            !dropped.is_empty()
        };
        match closed {
            Closed::Eof | Closed::InboxGone => {
                debug!(%remote, ?peer, "connection closed: {reason}")
            }
            Closed::Io(_) | Closed::Wire(_) => {
                warn!(%remote, ?peer, "dropping connection: {reason}")
            }
        }
        // An identified peer is lost only when this connection was its route: a spare
        // connection (one side's, when both dialed) may close while the route lives on.
        if peer.is_some() && !was_route {
            return;
        }
        let lost = PeerLost {
            peer,
            kind: VanKind::Tcp,
            reason,
        };
        // The inbox may be gone (node shutting down); nobody is left to tell then.
        let _ = inbox.deliver(vec![Event::PeerLost(lost)]).await;
    }

    /// The link to `peer`, or why there is none.
    fn link(&self, peer: NodeId) -> Result<Link, VanError> {
        let state = self.lock();
        if state.stopped {
            return Err(VanError::Stopped(VanKind::Tcp));
        }
        if let Some(link) = state.links.get(&peer) {
            return Ok(link.clone());
        }
        Err(match state.lost.get(&peer) {
            Some(reason) => VanError::PeerGone {
                peer,
                reason: reason.clone(),
            },
            None => VanError::UnknownPeer { peer },
        })
    }

    async fn enqueue(&self, peer: NodeId, link: &Link, frame: Frame) -> Result<(), VanError> {
        let gone = || VanError::PeerGone {
            peer,
            reason: "connection closed".into(),
        };
        let frame = link.budget.attach(frame).await;
        link.queue.send(frame).await.map_err(|_| gone())
    }
}

impl TcpVan {
    /// A van with the given options, not yet bound.
    pub fn new(options: TcpOptions) -> TcpVan {
        TcpVan {
            shared: Arc::new(Shared {
                pool: FramePool::new(options.frame_pool_bytes),
                options,
                state: Mutex::new(State::default()),
                next_connection: AtomicU64::new(0),
            }),
        }
    }

    /// The address the listener is bound to, once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.lock().local
    }

    /// What the pool of received-frame buffers has done, for diagnostics and tests.
    pub fn frame_pool_stats(&self) -> van_core::pool::PoolStats {
        self.shared.pool.stats()
    }

    /// Open connections (dialed and accepted), for diagnostics and tests.
    pub fn open_connections(&self) -> usize {
        let state = self.shared.lock();
        let running = state.readers.iter().filter(|t| !t.is_finished()).count();
        // The accept loop is kept with the readers.
        running.saturating_sub(usize::from(state.local.is_some()))
    }

    /// Peers this van currently has a link to.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        let mut peers: Vec<NodeId> = self.shared.lock().links.keys().copied().collect();
        peers.sort_unstable();
        peers
    }

    fn encode(&self, msg: &Message) -> Result<Frame, VanError> {
        let mut parts = Vec::with_capacity(1 + 2 * msg.data.len());
        ARENA.with(|arena| {
            let mut arena = arena.borrow_mut();
            if arena.capacity() < ARENA_REFILL {
                *arena = BytesMut::with_capacity(ARENA_CHUNK);
            }
            wire::encode_into(msg, &self.shared.options.limits, &mut arena, &mut parts)
        })?;
        Ok(parts)
    }
}

impl Drop for TcpVan {
    /// A van dropped without [`Van::stop`] still closes its listener and connections (without
    /// flushing): its tasks would otherwise keep the sockets open.
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.stopped = true;
        state.inbox = None;
        state.links.clear();
        for task in state.readers.drain(..) {
            task.abort();
        }
        for task in state.writers.drain(..) {
            task.abort();
        }
    }
}

impl Default for TcpVan {
    fn default() -> TcpVan {
        TcpVan::new(TcpOptions::default())
    }
}

#[async_trait]
impl Van for TcpVan {
    fn kind(&self) -> VanKind {
        VanKind::Tcp
    }

    async fn bind(&self, host: &str, port: u16, inbox: InboxSender) -> Result<Endpoint, VanError> {
        {
            let state = self.shared.lock();
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Tcp));
            }
            if state.inbox.is_some() {
                return Err(VanError::AlreadyBound(VanKind::Tcp));
            }
        }
        let bind_error = |source| VanError::Bind {
            kind: VanKind::Tcp,
            address: Endpoint::stream(VanKind::Tcp, host, port).address,
            source,
        };
        let listener = TcpListener::bind((host, port)).await.map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        let shared = Arc::clone(&self.shared);
        let accept_inbox = inbox.clone();
        let accept = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, remote)) => {
                        debug!(%remote, "accepted connection");
                        let _ = shared.spawn_connection(stream, remote, accept_inbox.clone(), None);
                    }
                    Err(e) => {
                        // Out of descriptors or a connection reset before accept: keep serving.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        let mut state = self.shared.lock();
        if state.stopped || state.inbox.is_some() {
            accept.abort();
            return Err(if state.stopped {
                VanError::Stopped(VanKind::Tcp)
            } else {
                VanError::AlreadyBound(VanKind::Tcp)
            });
        }
        state.inbox = Some(inbox);
        state.local = Some(local);
        state.readers.push(accept);
        info!(%local, "tcp van listening");
        Ok(Endpoint::stream(VanKind::Tcp, host, local.port()))
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::Tcp)?;
        let gate = Arc::clone(self.shared.lock().dialing.entry(peer).or_default());
        // Held across the dial on purpose: it only orders connects to this one peer.
        let _dialing = gate.lock().await;
        let inbox = {
            let state = self.shared.lock();
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Tcp));
            }
            if state.links.contains_key(&peer) {
                return Ok(());
            }
            state
                .inbox
                .clone()
                .ok_or(VanError::NotBound(VanKind::Tcp))?
        };
        let connect_error = |source| VanError::Connect {
            kind: VanKind::Tcp,
            peer,
            address: address.clone(),
            source,
        };
        let stream = tokio::time::timeout(
            self.shared.options.connect_timeout,
            TcpStream::connect(address.as_str()),
        )
        .await
        .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
        .map_err(connect_error)?;
        let remote = stream.peer_addr().map_err(connect_error)?;
        let link = self
            .shared
            .spawn_connection(stream, remote, inbox, Some(peer))
            .ok_or(VanError::Stopped(VanKind::Tcp))?;
        let mut state = self.shared.lock();
        if state.stopped {
            return Err(VanError::Stopped(VanKind::Tcp));
        }
        // A concurrent connect (or a learned link) may have won; keep that one so the order
        // of messages to this peer never depends on two connections.
        state.links.entry(peer).or_insert(link);
        state.lost.remove(&peer);
        debug!(peer, %remote, "connected");
        Ok(())
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        let peer = recipient_of(&msg)?;
        let link = self.shared.link(peer)?;
        let frame = self.encode(&msg)?;
        self.shared.enqueue(peer, &link, frame).await
    }

    async fn send_batch(&self, msgs: Vec<Message>) -> Result<(), VanError> {
        let mut link: Option<(NodeId, Link)> = None;
        for msg in msgs {
            let peer = recipient_of(&msg)?;
            let current = match &link {
                Some((p, l)) if *p == peer => l.clone(),
                _ => {
                    let l = self.shared.link(peer)?;
                    link = Some((peer, l.clone()));
                    l
                }
            };
            let frame = self.encode(&msg)?;
            self.shared.enqueue(peer, &current, frame).await?;
        }
        Ok(())
    }

    async fn stop(&self) -> Result<(), VanError> {
        let (links, readers, writers) = {
            let mut state = self.shared.lock();
            state.stopped = true;
            state.inbox = None;
            (
                std::mem::take(&mut state.links),
                std::mem::take(&mut state.readers),
                std::mem::take(&mut state.writers),
            )
        };
        // Closing the queues lets each writer flush what it holds and exit; readers (and the
        // accept loop) hold the last queue handles and inbox handles, so they go first.
        drop(links);
        for reader in &readers {
            reader.abort();
        }
        for reader in readers {
            let _ = reader.await;
        }
        let mut writers = writers;
        let flush = async {
            for writer in writers.iter_mut() {
                let _ = writer.await;
            }
        };
        if tokio::time::timeout(self.shared.options.flush_timeout, flush)
            .await
            .is_err()
        {
            warn!(
                "tcp van stop: queued frames not written within {:?}; dropping them",
                self.shared.options.flush_timeout
            );
        }
        for writer in &writers {
            writer.abort();
        }
        Ok(())
    }
}
