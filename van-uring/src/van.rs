//! [`IoUringVan`]: the routes to peers, the I/O threads, and the `Van` implementation.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use van_core::budget::ByteBudget;
use van_core::van::{address_for, recipient_of};
use van_core::wire;
use van_core::{Endpoint, InboxSender, Message, Node, NodeId, Van, VanError, VanKind};

use crate::mailbox::{Command, Mailbox};
use crate::options::UringOptions;
use crate::worker::{allowed_cpus, NewConnection, Worker, WorkerSetup, DRAIN_TIMEOUT};
use crate::UringError;

/// An encoded frame waiting in a peer queue: its parts, ready for vectored I/O.
pub(crate) type Frame = Vec<Bytes>;

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

/// The sending side of one connection.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    connection: u64,
    queue: mpsc::Sender<Frame>,
    /// Bytes of large frames this peer's queue may hold; a frame's share comes back when the
    /// I/O thread drops its bytes (after the kernel's completion).
    budget: ByteBudget,
}

/// Counters the I/O threads keep, for diagnostics and the buffer-ownership tests.
#[derive(Debug)]
pub(crate) struct Stats {
    pub(crate) connections: AtomicUsize,
    pub(crate) send_ops: AtomicUsize,
    pub(crate) recv_ops: AtomicUsize,
    pub(crate) zc_sends: AtomicU64,
    pub(crate) zc_copied: AtomicU64,
    pub(crate) ring_lent: Vec<AtomicUsize>,
}

/// What the I/O threads of a van hold in the kernel right now; see [`IoUringVan::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringStats {
    /// Open connections (dialed and accepted), including those still closing.
    pub connections: usize,
    /// Sends the kernel may still read: submitted and not completed, or zero-copy sends
    /// whose notification has not arrived. Their bytes are alive until this drops.
    pub send_ops: usize,
    /// Receives in the kernel (multishot, or direct into a large frame's buffer).
    pub recv_ops: usize,
    /// Provided buffers lent to the kernel, over all threads.
    pub ring_buffers: usize,
    /// Provided buffers each thread's ring holds when none is taken.
    pub ring_capacity: usize,
    /// Sends submitted as `SENDMSG_ZC` so far.
    pub zc_sends: u64,
    /// Connections that dropped back to plain sends because the kernel reported it copied.
    pub zc_copied: u64,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) options: UringOptions,
    /// Buffers of large received frames, shared by every connection of every I/O thread.
    pub(crate) pool: van_core::FramePool,
    state: Mutex<State>,
    next_connection: AtomicU64,
    next_thread: AtomicUsize,
    pub(crate) mailboxes: Vec<Arc<Mailbox>>,
    pub(crate) stats: Stats,
}

#[derive(Debug, Default)]
struct State {
    stopped: bool,
    bound: bool,
    local: Option<SocketAddr>,
    /// The link used to send to each peer; at most one per peer.
    links: HashMap<NodeId, Link>,
    /// Why the link to a peer went away, so later sends can say so.
    lost: HashMap<NodeId, String>,
    /// One gate per peer, so concurrent `connect`s to it dial once.
    dialing: HashMap<NodeId, Arc<tokio::sync::Mutex<()>>>,
    /// One per I/O thread: fires when the thread has exited.
    exited: Vec<oneshot::Receiver<()>>,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mailbox")
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few map operations; a panic inside one cannot leave the
        // state half-updated in a way later calls would trip on, so poison is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The thread the next connection goes to (round robin).
    pub(crate) fn pick_thread(&self) -> usize {
        self.next_thread.fetch_add(1, Ordering::Relaxed) % self.mailboxes.len().max(1)
    }

    /// Prepares a connection for an I/O thread: socket options, its queue and its link.
    pub(crate) fn new_connection(
        &self,
        stream: std::net::TcpStream,
        remote: SocketAddr,
        peer: Option<NodeId>,
    ) -> NewConnection {
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
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let (tx, queue) = mpsc::channel(self.options.send_queue_depth.max(1));
        let link = Link {
            connection: id,
            queue: tx,
            budget: ByteBudget::new(self.options.peer_budget_bytes),
        };
        NewConnection {
            id,
            stream,
            remote,
            peer,
            queue,
            link: Some(link),
        }
    }

    /// A peer identified itself on a connection: reply over it unless we have a link already.
    pub(crate) fn learn(&self, peer: NodeId, link: &Link) {
        let mut state = self.lock();
        if !state.stopped && !state.links.contains_key(&peer) {
            debug!(peer, "learned link from incoming connection");
            state.links.insert(peer, link.clone());
            state.lost.remove(&peer);
        }
    }

    /// Connection `connection` ended: drops the routes over it. Returns whether the loss is
    /// to be reported (an unidentified connection, or the route of its peer — a spare
    /// connection of a peer whose route lives on is not that peer's loss).
    pub(crate) fn connection_closed(
        &self,
        connection: u64,
        peer: Option<NodeId>,
        reason: &str,
    ) -> bool {
        let mut state = self.lock();
        let dropped: Vec<NodeId> = state
            .links
            .iter()
            .filter(|(_, link)| link.connection == connection)
            .map(|(peer, _)| *peer)
            .collect();
        for peer in &dropped {
            state.links.remove(peer);
            state.lost.insert(*peer, reason.to_owned());
        }
        !state.stopped && (peer.is_none() || !dropped.is_empty())
    }

    /// The link to `peer`, or why there is none.
    fn link(&self, peer: NodeId) -> Result<Link, VanError> {
        let state = self.lock();
        if state.stopped {
            return Err(VanError::Stopped(VanKind::Uring));
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

    fn stop_threads(&self, flush: bool, deadline: Instant) {
        for mailbox in &self.mailboxes {
            mailbox.post(Command::Stop { flush, deadline });
        }
    }
}

/// A van over TCP sockets driven by io_uring; see the [crate docs](crate).
#[derive(Debug)]
pub struct IoUringVan {
    shared: Arc<Shared>,
}

impl IoUringVan {
    /// Starts the I/O threads (each sets up its ring and provided-buffer ring).
    ///
    /// # Errors
    ///
    /// [`UringError::Unavailable`] when io_uring cannot be used here — disabled by
    /// `/proc/sys/kernel/io_uring_disabled`, blocked by seccomp, a kernel older than 6.0 —
    /// naming the cause and the fallback setting (`VANS_STREAM_VAN=tcp`);
    /// [`UringError::Thread`] when a thread cannot be started.
    pub fn new(options: UringOptions) -> Result<IoUringVan, UringError> {
        crate::error::check_kernel()?;
        let threads = options.thread_count();
        let mut mailboxes = Vec::with_capacity(threads);
        for _ in 0..threads {
            mailboxes.push(Arc::new(Mailbox::new().map_err(UringError::Thread)?));
        }
        let cpus = if options.pin_cores {
            allowed_cpus()
        } else {
            Vec::new()
        };
        let busy_polling = options.busy_polling;
        let shared = Arc::new(Shared {
            stats: Stats {
                connections: AtomicUsize::new(0),
                send_ops: AtomicUsize::new(0),
                recv_ops: AtomicUsize::new(0),
                zc_sends: AtomicU64::new(0),
                zc_copied: AtomicU64::new(0),
                ring_lent: (0..threads).map(|_| AtomicUsize::new(0)).collect(),
            },
            pool: van_core::FramePool::new(options.frame_pool_bytes),
            options,
            state: Mutex::new(State::default()),
            next_connection: AtomicU64::new(0),
            next_thread: AtomicUsize::new(0),
            mailboxes,
        });
        let van = IoUringVan {
            shared: Arc::clone(&shared),
        };
        let mut exited = Vec::with_capacity(threads);
        for index in 0..threads {
            let setup = WorkerSetup {
                index,
                busy_polling,
                pin_to: (!cpus.is_empty()).then(|| cpus[index % cpus.len()]),
            };
            let mailbox = Arc::clone(&shared.mailboxes[index]);
            let thread_shared = Arc::clone(&shared);
            let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
            let (done_tx, done_rx) = oneshot::channel();
            std::thread::Builder::new()
                .name(format!("vans-uring-{index}"))
                .spawn(move || match Worker::new(&setup, mailbox, thread_shared) {
                    Ok(worker) => {
                        let _ = ready_tx.send(Ok(()));
                        worker.run(done_tx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                })
                .map_err(UringError::Thread)?;
            // A thread that fails to report (it panicked) counts as unavailable.
            match ready_rx.recv() {
                Ok(Ok(())) => exited.push(done_rx),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(UringError::Thread(std::io::Error::other(
                        "the I/O thread ended during setup",
                    )))
                }
            }
        }
        shared.lock().exited = exited;
        Ok(van)
    }

    /// The address the listener is bound to, once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.lock().local
    }

    /// Peers this van currently has a link to.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        let mut peers: Vec<NodeId> = self.shared.lock().links.keys().copied().collect();
        peers.sort_unstable();
        peers
    }

    /// What the pool of large-frame buffers has done, for diagnostics and tests.
    pub fn frame_pool_stats(&self) -> van_core::pool::PoolStats {
        self.shared.pool.stats()
    }

    /// Open connections (dialed and accepted), for diagnostics and tests.
    pub fn open_connections(&self) -> usize {
        self.shared.stats.connections.load(Ordering::Relaxed)
    }

    /// What the kernel holds of this van right now.
    pub fn stats(&self) -> UringStats {
        let stats = &self.shared.stats;
        UringStats {
            connections: stats.connections.load(Ordering::Relaxed),
            send_ops: stats.send_ops.load(Ordering::Relaxed),
            recv_ops: stats.recv_ops.load(Ordering::Relaxed),
            ring_buffers: stats
                .ring_lent
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .sum(),
            ring_capacity: usize::from(self.shared.options.ring_buffers()),
            zc_sends: stats.zc_sends.load(Ordering::Relaxed),
            zc_copied: stats.zc_copied.load(Ordering::Relaxed),
        }
    }

    /// A cheap handle that reads [`stats`](Self::stats) without keeping the van alive
    /// (for code that runs where the van is not at hand, such as a buffer's destructor).
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle {
            shared: Arc::downgrade(&self.shared),
        }
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

/// Reads a van's [`UringStats`] without keeping the van alive; see
/// [`IoUringVan::stats_handle`].
#[derive(Debug, Clone)]
pub struct StatsHandle {
    shared: std::sync::Weak<Shared>,
}

impl StatsHandle {
    /// Sends the kernel may still read (see [`UringStats::send_ops`]); 0 once the van and
    /// its threads are gone.
    pub fn send_ops(&self) -> usize {
        self.shared
            .upgrade()
            .map_or(0, |s| s.stats.send_ops.load(Ordering::Relaxed))
    }

    /// Receives in the kernel (see [`UringStats::recv_ops`]).
    pub fn recv_ops(&self) -> usize {
        self.shared
            .upgrade()
            .map_or(0, |s| s.stats.recv_ops.load(Ordering::Relaxed))
    }
}

impl Drop for IoUringVan {
    /// A van dropped without [`Van::stop`] still closes its listener and connections
    /// (without flushing). Its threads finish on their own: each keeps every buffer until
    /// the kernel has returned it, then exits.
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stopped = true;
            state.links.clear();
        }
        self.shared.stop_threads(false, Instant::now());
    }
}

#[async_trait]
impl Van for IoUringVan {
    fn kind(&self) -> VanKind {
        VanKind::Uring
    }

    async fn bind(&self, host: &str, port: u16, inbox: InboxSender) -> Result<Endpoint, VanError> {
        {
            let state = self.shared.lock();
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Uring));
            }
            if state.bound {
                return Err(VanError::AlreadyBound(VanKind::Uring));
            }
        }
        let bind_error = |source| VanError::Bind {
            kind: VanKind::Uring,
            address: Endpoint::stream(VanKind::Uring, host, port).address,
            source,
        };
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .map_err(bind_error)?
            .into_std()
            .map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        {
            let mut state = self.shared.lock();
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Uring));
            }
            if state.bound {
                return Err(VanError::AlreadyBound(VanKind::Uring));
            }
            state.bound = true;
            state.local = Some(local);
        }
        for mailbox in &self.shared.mailboxes {
            mailbox.post(Command::Inbox(inbox.clone()));
        }
        if let Some(first) = self.shared.mailboxes.first() {
            first.post(Command::Listen(listener));
        }
        info!(%local, threads = self.shared.mailboxes.len(), "uring van listening");
        Ok(Endpoint::stream(VanKind::Uring, host, local.port()))
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::Uring)?;
        let gate = Arc::clone(self.shared.lock().dialing.entry(peer).or_default());
        // Held across the dial on purpose: it only orders connects to this one peer.
        let _dialing = gate.lock().await;
        {
            let state = self.shared.lock();
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Uring));
            }
            if state.links.contains_key(&peer) {
                return Ok(());
            }
            if !state.bound {
                return Err(VanError::NotBound(VanKind::Uring));
            }
        }
        let connect_error = |source| VanError::Connect {
            kind: VanKind::Uring,
            peer,
            address: address.clone(),
            source,
        };
        let stream = tokio::time::timeout(
            self.shared.options.connect_timeout,
            tokio::net::TcpStream::connect(address.as_str()),
        )
        .await
        .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
        .map_err(connect_error)?;
        let remote = stream.peer_addr().map_err(connect_error)?;
        // From here on the ring drives the socket; tokio lets go of it.
        let stream = stream.into_std().map_err(connect_error)?;
        let mut new = self.shared.new_connection(stream, remote, Some(peer));
        // A dialed connection's route is known; it needs no link of its own to learn with.
        let Some(link) = new.link.take() else {
            return Err(VanError::Stopped(VanKind::Uring));
        };
        let thread = self.shared.pick_thread();
        {
            let mut state = self.shared.lock();
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Uring));
            }
            // A concurrent connect (or a learned link) may have won; keep that one so the
            // order of messages to this peer never depends on two connections.
            state.links.entry(peer).or_insert(link);
            state.lost.remove(&peer);
        }
        if let Some(mailbox) = self.shared.mailboxes.get(thread) {
            mailbox.post(Command::Adopt(new));
        }
        debug!(peer, %remote, thread, "connected");
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
        let (links, exited) = {
            let mut state = self.shared.lock();
            state.stopped = true;
            (
                std::mem::take(&mut state.links),
                std::mem::take(&mut state.exited),
            )
        };
        // Closing the routes lets each connection's queue end once drained.
        drop(links);
        let flush = self.shared.options.flush_timeout;
        self.shared.stop_threads(true, Instant::now() + flush);
        let all = async {
            for done in exited {
                let _ = done.await;
            }
        };
        if tokio::time::timeout(flush + DRAIN_TIMEOUT + Duration::from_secs(1), all)
            .await
            .is_err()
        {
            warn!("uring van stop: I/O threads did not exit in time");
        }
        Ok(())
    }
}
