//! [`IpcVan`]: the van over shared-memory rings (see the crate docs for the design).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use std::os::linux::net::SocketAddrExt;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use van_core::van::{address_for, recipient_of};
use van_core::wire::{self, Limits};
use van_core::{
    Config, Endpoint, Event, InboxSender, Message, Node, NodeId, PeerLost, Van, VanError, VanKind,
};

use crate::fdpass;
use crate::ring::{create_ring, Consumer, Producer, DEFAULT_RING_BYTES, FIRST, LAST};
use crate::segment::Segment;
use crate::WaitResult;

/// First handshake word.
const HANDSHAKE_MAGIC: u64 = u64::from_le_bytes(*b"VANSIPC1");
/// How long dialing a peer and creating the rings may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connecting peer may take to hand over its rings.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Frames queued per peer before `send` waits.
const SEND_QUEUE: usize = 4096;
/// Messages a reader delivers in one batch at most.
const MAX_BATCH: usize = 256;
/// How long a waiting thread sleeps before it re-checks whether the van stopped.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// Spins per wait with busy polling (then the wait re-checks the connection).
const BUSY_SPINS: u32 = 1 << 22;
/// Spins before sleeping, in adaptive mode.
const DEFAULT_SPINS: u32 = 2_000;

/// Tuning of an [`IpcVan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcOptions {
    /// Frame size limits.
    pub limits: Limits,
    /// Bytes of each ring (per direction, per connection); a power of two.
    pub ring_bytes: usize,
    /// Spin forever instead of sleeping on a futex (`VANS_BUSY_POLLING` and the StarServer
    /// names): lowest latency, one core per waiting thread.
    pub busy_polling: bool,
    /// Spins before sleeping in adaptive mode.
    pub spins: u32,
    /// How long `stop` waits for queued frames to be written.
    pub flush_timeout: Duration,
}

impl Default for IpcOptions {
    fn default() -> IpcOptions {
        IpcOptions {
            limits: Limits::default(),
            ring_bytes: DEFAULT_RING_BYTES,
            busy_polling: false,
            spins: DEFAULT_SPINS,
            flush_timeout: Duration::from_secs(10),
        }
    }
}

impl IpcOptions {
    /// Options with the limits and polling switch of `config`.
    pub fn from_config(config: &Config) -> IpcOptions {
        IpcOptions {
            limits: config.limits,
            busy_polling: config.busy_polling,
            ..IpcOptions::default()
        }
    }

    fn spins(&self) -> u32 {
        if self.busy_polling {
            // Long enough to never sleep under load, short enough to notice a stop.
            BUSY_SPINS
        } else {
            self.spins
        }
    }
}

/// A van over shared memory; see the [crate docs](crate).
#[derive(Debug)]
pub struct IpcVan {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: IpcOptions,
    state: Mutex<State>,
    next_connection: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    stopped: bool,
    inbox: Option<InboxSender>,
    links: HashMap<NodeId, Link>,
    /// Accepted connections whose peer has not identified itself yet, by connection id:
    /// holding their link keeps their writer (and so the peer's reading side) open.
    accepted: HashMap<u64, Link>,
    lost: HashMap<NodeId, String>,
    connections: Vec<Arc<Connection>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The sending side of one connection.
#[derive(Debug, Clone)]
struct Link {
    connection: Arc<Connection>,
    queue: mpsc::Sender<Vec<Bytes>>,
}

/// One connection's shared flags.
#[derive(Debug)]
struct Connection {
    id: u64,
    /// Set when the connection ends for any reason; threads exit when they see it.
    closed: AtomicBool,
    /// Set when another connection to the same peer won a race: its end is not a loss.
    superseded: AtomicBool,
    /// Signalled by the writer thread when it has flushed and exited.
    writer_done: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

impl Connection {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Map operations only; a poisoned lock still holds consistent data.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh name for a ring or a listening socket: purpose, pid, and random bits so that
/// names cannot be guessed by other local users (the segment module adds the `vans-` prefix
/// to rings).
fn unique_name(what: &str) -> String {
    let mut random = [0u8; 8];
    // SAFETY: getrandom writes at most `random.len()` bytes into the buffer we own.
    let filled = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
    if filled != random.len() as isize {
        // Fall back to the clock: the name is still unique per process and instant.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        random = nanos.to_le_bytes();
    }
    format!(
        "{what}-{}-{:016x}",
        std::process::id(),
        u64::from_le_bytes(random)
    )
}

fn io_error(context: &str, error: impl std::fmt::Display) -> VanError {
    VanError::Io {
        kind: VanKind::Ipc,
        source: std::io::Error::other(format!("{context}: {error}")),
    }
}

impl IpcVan {
    /// A van with the given options, not yet bound.
    pub fn new(options: IpcOptions) -> IpcVan {
        IpcVan {
            shared: Arc::new(Shared {
                options,
                state: Mutex::new(State::default()),
                next_connection: AtomicU64::new(0),
            }),
        }
    }

    /// Peers this van currently has a link to.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        let mut peers: Vec<NodeId> = lock(&self.shared.state).links.keys().copied().collect();
        peers.sort_unstable();
        peers
    }
}

impl Drop for IpcVan {
    /// A van dropped without [`Van::stop`] still ends its connections: threads see the
    /// closed flags within a wait slice and exit; nothing is flushed.
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        state.stopped = true;
        state.inbox = None;
        state.links.clear();
        state.accepted.clear();
        for connection in state.connections.drain(..) {
            connection.closed.store(true, Ordering::Release);
        }
        for task in state.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Default for IpcVan {
    fn default() -> IpcVan {
        IpcVan::new(IpcOptions::default())
    }
}

impl Shared {
    /// Starts the threads and the liveness watcher of a connection; returns its link.
    fn start_connection(
        self: &Arc<Self>,
        socket: UnixStream,
        producer: Producer,
        consumer: Consumer,
        peer: Option<NodeId>,
        inbox: InboxSender,
    ) -> Result<Link, VanError> {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let connection = Arc::new(Connection {
            id,
            closed: AtomicBool::new(false),
            superseded: AtomicBool::new(false),
            writer_done: Mutex::new(Some(done_rx)),
        });
        let (queue, frames) = mpsc::channel(SEND_QUEUE);
        let link = Link {
            connection: Arc::clone(&connection),
            queue,
        };
        let spins = self.options.spins();

        let writer_connection = Arc::clone(&connection);
        std::thread::Builder::new()
            .name(format!("vans-ipc-w{id}"))
            .spawn(move || {
                write_loop(frames, producer, &writer_connection, spins);
                let _ = done_tx.send(());
            })
            .map_err(|e| io_error("cannot start the IPC writer thread", e))?;

        let shared = Arc::clone(self);
        let reader_connection = Arc::clone(&connection);
        // Weak: a reader must not keep its own connection's queue open (stop waits for the
        // writer to see the queue close).
        let reader_queue = link.queue.downgrade();
        let reader_link_connection = Arc::clone(&connection);
        let reader_inbox = inbox.clone();
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name(format!("vans-ipc-r{id}"))
            .spawn(move || {
                let mut peer = peer;
                let reason = read_loop(
                    consumer,
                    &reader_connection,
                    shared.options.limits,
                    spins,
                    &reader_inbox,
                    |sender| {
                        if peer.is_none() {
                            peer = Some(sender);
                            if let Some(queue) = reader_queue.upgrade() {
                                let link = Link {
                                    connection: Arc::clone(&reader_link_connection),
                                    queue,
                                };
                                shared.learn(sender, &link);
                            }
                        }
                    },
                );
                runtime.block_on(shared.connection_closed(
                    &reader_connection,
                    peer,
                    &reason,
                    &reader_inbox,
                ));
            })
            .map_err(|e| io_error("cannot start the IPC reader thread", e))?;

        // The socket carries nothing after the handshake: its end is the peer's end.
        let watched = Arc::clone(&connection);
        let watcher = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                if watched.is_closed() {
                    break;
                }
                match tokio::time::timeout(WAIT_SLICE * 5, socket.readable()).await {
                    Err(_) => continue,
                    Ok(Err(_)) => break,
                    Ok(Ok(())) => match socket.try_read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(_) => break,
                    },
                }
            }
            watched.closed.store(true, Ordering::Release);
        });
        let mut state = lock(&self.state);
        if state.stopped {
            connection.closed.store(true, Ordering::Release);
            watcher.abort();
            return Err(VanError::Stopped(VanKind::Ipc));
        }
        state.tasks.retain(|t| !t.is_finished());
        state.tasks.push(watcher);
        state.connections.retain(|c| !c.is_closed());
        state.connections.push(Arc::clone(&connection));
        // Registered under the same lock that checks `stopped`, so `stop` always sees it.
        if !connection.is_closed() {
            match peer {
                None => {
                    state.accepted.insert(id, link.clone());
                }
                Some(peer) => {
                    let live = state
                        .links
                        .get(&peer)
                        .is_some_and(|l| !l.connection.is_closed());
                    if live {
                        // A connection the peer opened (or a concurrent connect) won: close
                        // this one quietly; messages keep flowing over the winner.
                        connection.superseded.store(true, Ordering::Release);
                        connection.closed.store(true, Ordering::Release);
                    } else {
                        state.links.insert(peer, link.clone());
                        state.lost.remove(&peer);
                    }
                }
            }
        }
        Ok(link)
    }

    /// A peer identified itself on an accepted connection: reply over it.
    fn learn(&self, peer: NodeId, link: &Link) {
        let mut state = lock(&self.state);
        if !state.stopped && !state.links.contains_key(&peer) {
            debug!(peer, "learned IPC link from an accepted connection");
            state.links.insert(peer, link.clone());
            state.lost.remove(&peer);
            state.accepted.remove(&link.connection.id);
        }
        // Otherwise we already send to this peer over another connection; this one stays
        // open (held in `accepted`) because the peer sends over it.
    }

    async fn connection_closed(
        &self,
        connection: &Connection,
        peer: Option<NodeId>,
        reason: &str,
        inbox: &InboxSender,
    ) {
        connection.closed.store(true, Ordering::Release);
        let stopped = {
            let mut state = lock(&self.state);
            let dropped: Vec<NodeId> = state
                .links
                .iter()
                .filter(|(_, l)| l.connection.id == connection.id)
                .map(|(p, _)| *p)
                .collect();
            for p in dropped {
                state.links.remove(&p);
                state.lost.insert(p, reason.to_owned());
            }
            state.accepted.remove(&connection.id);
            state.stopped
        };
        if stopped || connection.superseded.load(Ordering::Acquire) {
            return;
        }
        warn!(?peer, "IPC connection closed: {reason}");
        let lost = PeerLost {
            peer,
            kind: VanKind::Ipc,
            reason: reason.to_owned(),
        };
        let _ = inbox.deliver(vec![Event::PeerLost(lost)]).await;
    }

    fn link(&self, peer: NodeId) -> Result<Link, VanError> {
        let state = lock(&self.state);
        if state.stopped {
            return Err(VanError::Stopped(VanKind::Ipc));
        }
        if let Some(link) = state.links.get(&peer) {
            if !link.connection.is_closed() {
                return Ok(link.clone());
            }
        }
        Err(match state.lost.get(&peer) {
            Some(reason) => VanError::PeerGone {
                peer,
                reason: reason.clone(),
            },
            None if state.links.contains_key(&peer) => VanError::PeerGone {
                peer,
                reason: "the connection closed".into(),
            },
            None => VanError::UnknownPeer { peer },
        })
    }

    /// The listener side of the handshake.
    async fn accept(
        self: &Arc<Self>,
        socket: UnixStream,
        inbox: InboxSender,
    ) -> Result<(), VanError> {
        // Abstract sockets ignore file permissions: only our own user may connect.
        let credentials = socket
            .peer_cred()
            .map_err(|e| io_error("IPC peer credentials", e))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if credentials.uid() != me {
            return Err(io_error(
                "IPC handshake",
                format!(
                    "refused a connection from uid {} (we are {me})",
                    credentials.uid()
                ),
            ));
        }
        let (words, mut fds) = tokio::time::timeout(HANDSHAKE_TIMEOUT, fdpass::recv(&socket))
            .await
            .map_err(|_| io_error("IPC handshake", "no handshake within the timeout"))?
            .map_err(|e| io_error("IPC handshake", e))?;
        if words[0] != HANDSHAKE_MAGIC || fds.len() != 2 {
            return Err(io_error(
                "IPC handshake",
                format!("not a vans peer ({} descriptors)", fds.len()),
            ));
        }
        let theirs = fds.remove(0);
        let ours = fds.remove(0);
        let incoming = Arc::new(Segment::open(theirs).map_err(|e| io_error("IPC ring", e))?);
        let outgoing = Arc::new(Segment::open(ours).map_err(|e| io_error("IPC ring", e))?);
        let mut consumer = Consumer::new(incoming, false).map_err(|e| io_error("IPC ring", e))?;
        consumer
            .set_max_message(usize::try_from(self.options.limits.max_frame).unwrap_or(usize::MAX));
        let producer = Producer::new(outgoing, false).map_err(|e| io_error("IPC ring", e))?;
        self.start_connection(socket, producer, consumer, None, inbox)?;
        Ok(())
    }
}

/// Copies queued frames into the ring until the queue closes or the connection ends: each
/// frame's parts are copied once, straight into the ring, fragmented into records of at
/// most `max_record` bytes when larger.
fn write_loop(
    mut frames: mpsc::Receiver<Vec<Bytes>>,
    mut producer: Producer,
    connection: &Connection,
    spins: u32,
) {
    'frames: while let Some(parts) = frames.blocking_recv() {
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_ref()).collect();
        let total: usize = slices.iter().map(|s| s.len()).sum();
        let mut offset = 0;
        loop {
            if connection.is_closed() {
                break 'frames;
            }
            match producer.try_push_message(&slices, offset) {
                Ok(Some(next)) => {
                    offset = next;
                    if offset >= total {
                        break;
                    }
                }
                Ok(None) => {
                    producer.wake_consumer();
                    let want = (total - offset).min(producer.max_record());
                    if let WaitResult::Closed = producer.wait_for_space(want, spins, WAIT_SLICE) {
                        connection.closed.store(true, Ordering::Release);
                        break 'frames;
                    }
                }
                Err(e) => {
                    warn!("IPC writer: {e}");
                    connection.closed.store(true, Ordering::Release);
                    break 'frames;
                }
            }
        }
        producer.wake_consumer();
    }
    producer.close();
}

/// Reassembles frames from the ring and delivers them in batches; returns why it stopped.
fn read_loop(
    mut consumer: Consumer,
    connection: &Connection,
    limits: Limits,
    spins: u32,
    inbox: &InboxSender,
    mut on_sender: impl FnMut(NodeId),
) -> String {
    let mut frame = BytesMut::new();
    let mut in_frame = false;
    let mut batch = Vec::new();
    let mut ring_closed = false;
    loop {
        match consumer.try_pop(&mut frame) {
            Ok(Some(flags)) => {
                if flags & FIRST != 0 {
                    if in_frame {
                        return "peer started a frame inside another".into();
                    }
                    in_frame = true;
                } else if !in_frame {
                    return "peer continued a frame it never started".into();
                }
                if frame.len() as u64 > limits.max_frame {
                    return format!(
                        "peer sent a frame over the limit of {} bytes",
                        limits.max_frame
                    );
                }
                if flags & LAST == 0 {
                    // A fragmented frame: its header (in the first record) says how long it
                    // is, so the rest lands in one buffer without reallocating (the length
                    // was checked against the limits; a lie only costs this allocation).
                    if flags & FIRST != 0 {
                        if let Ok(header) = wire::FrameHeader::parse(&frame, &limits) {
                            let total = usize::try_from(header.frame_len).unwrap_or(0);
                            frame.reserve(total.saturating_sub(frame.len()));
                        }
                    }
                    continue;
                }
                in_frame = false;
                match wire::decode(frame.split().freeze(), &limits) {
                    Ok(msg) => {
                        if let Some(sender) = msg.meta.sender {
                            on_sender(sender);
                        }
                        batch.push(Event::Message(msg));
                        if batch.len() >= MAX_BATCH
                            && inbox.deliver_blocking(std::mem::take(&mut batch)).is_err()
                        {
                            return "the local inbox closed".into();
                        }
                    }
                    Err(e) => return format!("bad frame from peer: {e}"),
                }
            }
            Ok(None) => {
                if !batch.is_empty() && inbox.deliver_blocking(std::mem::take(&mut batch)).is_err()
                {
                    return "the local inbox closed".into();
                }
                // Only an empty ring ends the connection: what was written before a close
                // is always delivered.
                if ring_closed {
                    return "the peer closed the connection".into();
                }
                if connection.is_closed() {
                    // Drain once more (records may have landed just before), then end.
                    ring_closed = true;
                    continue;
                }
                if let WaitResult::Closed = consumer.wait_for_data(spins, WAIT_SLICE) {
                    // Drain once more: records may have landed just before the close.
                    ring_closed = true;
                }
            }
            Err(e) => return format!("peer corrupted the ring: {e}"),
        }
    }
}

#[async_trait]
impl Van for IpcVan {
    fn kind(&self) -> VanKind {
        VanKind::Ipc
    }

    async fn bind(
        &self,
        _host: &str,
        _port: u16,
        inbox: InboxSender,
    ) -> Result<Endpoint, VanError> {
        {
            let state = lock(&self.shared.state);
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Ipc));
            }
            if state.inbox.is_some() {
                return Err(VanError::AlreadyBound(VanKind::Ipc));
            }
        }
        // Abstract namespace: no file to clean up, gone with the process.
        let name = format!("vans-{}", unique_name("sock"));
        let bind_error = |source| VanError::Bind {
            kind: VanKind::Ipc,
            address: format!("@{name}"),
            source,
        };
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(bind_error)?;
        let listener = std::os::unix::net::UnixListener::bind_addr(&address).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let listener = UnixListener::from_std(listener).map_err(bind_error)?;
        let shared = Arc::clone(&self.shared);
        let accept_inbox = inbox.clone();
        let accept = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((socket, _)) => {
                        let handshake_shared = Arc::clone(&shared);
                        let inbox = accept_inbox.clone();
                        let handshake = tokio::spawn(async move {
                            if let Err(e) = handshake_shared.accept(socket, inbox).await {
                                warn!("refused an IPC connection: {e}");
                            }
                        });
                        // Tracked so `stop` ends a handshake that never completes.
                        let mut state = lock(&shared.state);
                        state.tasks.retain(|t| !t.is_finished());
                        state.tasks.push(handshake);
                    }
                    Err(e) => {
                        warn!("IPC accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        let mut state = lock(&self.shared.state);
        if state.stopped || state.inbox.is_some() {
            accept.abort();
            return Err(if state.stopped {
                VanError::Stopped(VanKind::Ipc)
            } else {
                VanError::AlreadyBound(VanKind::Ipc)
            });
        }
        state.inbox = Some(inbox);
        state.tasks.push(accept);
        info!("ipc van listening at @{name}");
        Ok(Endpoint {
            kind: VanKind::Ipc,
            address: format!("@{name}"),
        })
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::Ipc)?;
        let inbox = {
            let state = lock(&self.shared.state);
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Ipc));
            }
            if state
                .links
                .get(&peer)
                .is_some_and(|l| !l.connection.is_closed())
            {
                return Ok(());
            }
            state
                .inbox
                .clone()
                .ok_or(VanError::NotBound(VanKind::Ipc))?
        };
        let connect_error = |source| VanError::Connect {
            kind: VanKind::Ipc,
            peer,
            address: address.clone(),
            source,
        };
        let name = address.strip_prefix('@').ok_or_else(|| {
            connect_error(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not an IPC address (expected @name)",
            ))
        })?;
        // The dial and the ring allocations block (briefly, or long if the peer's backlog is
        // full): keep them off the runtime threads, and bound them like a TCP connect.
        let name = name.to_owned();
        let ring_bytes = self.shared.options.ring_bytes;
        let max_frame = usize::try_from(self.shared.options.limits.max_frame).unwrap_or(usize::MAX);
        let setup = tokio::task::spawn_blocking(move || {
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            let socket = std::os::unix::net::UnixStream::connect_addr(&address)?;
            socket.set_nonblocking(true)?;
            let ring = |e: crate::IpcError| std::io::Error::other(e.to_string());
            let outgoing = create_ring(&unique_name("ring"), ring_bytes).map_err(ring)?;
            let incoming = create_ring(&unique_name("ring"), ring_bytes).map_err(ring)?;
            let producer = Producer::new(Arc::clone(&outgoing), false).map_err(ring)?;
            let mut consumer = Consumer::new(Arc::clone(&incoming), false).map_err(ring)?;
            consumer.set_max_message(max_frame);
            Ok::<_, std::io::Error>((socket, outgoing, incoming, producer, consumer))
        });
        let (socket, outgoing, incoming, producer, consumer) =
            tokio::time::timeout(CONNECT_TIMEOUT, setup)
                .await
                .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
                .map_err(|e| connect_error(std::io::Error::other(e.to_string())))?
                .map_err(connect_error)?;
        let socket = UnixStream::from_std(socket).map_err(connect_error)?;
        let fds = [outgoing.fd().as_raw_fd(), incoming.fd().as_raw_fd()];
        fdpass::send(&socket, [HANDSHAKE_MAGIC, ring_bytes as u64, 0, 0], &fds)
            .await
            .map_err(connect_error)?;
        // Registers the link (or, if another connection to this peer won meanwhile, closes
        // this one quietly).
        self.shared
            .start_connection(socket, producer, consumer, Some(peer), inbox)?;
        debug!(peer, "connected over shared memory");
        Ok(())
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        let peer = recipient_of(&msg)?;
        let link = self.shared.link(peer)?;
        let frame = wire::encode(&msg, &self.shared.options.limits)?;
        link.queue
            .send(frame)
            .await
            .map_err(|_| VanError::PeerGone {
                peer,
                reason: "the connection closed".into(),
            })
    }

    async fn stop(&self) -> Result<(), VanError> {
        let (links, accepted, connections, tasks) = {
            let mut state = lock(&self.shared.state);
            state.stopped = true;
            state.inbox = None;
            (
                std::mem::take(&mut state.links),
                std::mem::take(&mut state.accepted),
                std::mem::take(&mut state.connections),
                std::mem::take(&mut state.tasks),
            )
        };
        // Closing the queues lets each writer flush and exit (closing its ring, which tells
        // the peer's reader that nothing more comes); then the connections close.
        drop(links);
        drop(accepted);
        let flush = async {
            for connection in &connections {
                let done = connection
                    .writer_done
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                if let Some(done) = done {
                    let _ = done.await;
                }
            }
        };
        if tokio::time::timeout(self.shared.options.flush_timeout, flush)
            .await
            .is_err()
        {
            warn!("ipc van stop: queued frames not written in time; dropping them");
        }
        for connection in &connections {
            connection.closed.store(true, Ordering::Release);
        }
        for task in &tasks {
            task.abort();
        }
        Ok(())
    }
}
