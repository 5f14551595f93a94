//! [`IpcVan`]: the van over shared-memory rings (see the crate docs for the design).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::os::linux::net::SocketAddrExt;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use van_core::link::{self, Links};
use van_core::van::{address_for, recipient_of};
use van_core::wire::{self, Limits};
use van_core::{
    Config, Endpoint, Event, InboxSender, Message, Node, NodeId, Van, VanError, VanKind,
};

use crate::arena::{self, Arena, PeerArena, Ref, RefTable};
use crate::fdpass;
use crate::named::{self, Liveness, NamedListener, PeerStatus, HEARTBEAT_INTERVAL};
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
/// Frames up to this size may be written into the ring by the sending task itself (when
/// nothing is queued and the ring has room), saving the writer thread's wake-up.
const DIRECT_MAX: usize = 64 << 10;

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
    /// Bytes of the shared arena that [`Van::alloc`] carves zero-copy buffers from (see
    /// [`crate::arena`]); 0 disables zero-copy sends. Reserved when the van binds.
    pub arena_bytes: usize,
    /// Listen through a mailbox in `/dev/shm` instead of an abstract Unix socket
    /// (`VANS_IPC_NAMED`): for peers that share `/dev/shm` but not a network namespace (see
    /// [`crate::named`]). Dialers follow the address they are given either way. Zero-copy
    /// buffers need the socket (they travel as memfds), so named connections copy.
    pub named: bool,
}

impl Default for IpcOptions {
    fn default() -> IpcOptions {
        IpcOptions {
            limits: Limits::default(),
            ring_bytes: DEFAULT_RING_BYTES,
            busy_polling: false,
            spins: DEFAULT_SPINS,
            flush_timeout: Duration::from_secs(10),
            arena_bytes: van_core::config::DEFAULT_IPC_ARENA_BYTES,
            named: false,
        }
    }
}

impl IpcOptions {
    /// Options with the limits and polling switch of `config`.
    pub fn from_config(config: &Config) -> IpcOptions {
        IpcOptions {
            limits: config.limits,
            busy_polling: config.busy_polling,
            arena_bytes: config.ipc_arena_bytes,
            named: config.ipc_named,
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
    links: Links<Link>,
    /// Our arena, created by `bind` when `arena_bytes > 0`.
    arena: OnceLock<Arc<Arena>>,
    /// Named mode: the thread accepting from the mailbox; joined by `stop` and `Drop` so the
    /// mailbox is removed before they return.
    accept_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The sending side of one connection.
#[derive(Debug, Clone)]
struct Link {
    connection: Arc<Connection>,
    queue: mpsc::Sender<Outgoing>,
    /// The ring, shared by the writer thread and senders taking the direct path.
    direct: Arc<Direct>,
    /// Counts references into our arena held by the peer (when both sides have arenas).
    table: Option<Arc<RefTable>>,
}

/// The producing end of a connection's ring and what keeps its messages in order: a sender
/// writes directly only while no queued message is pending (`pending == 0`, checked under
/// the lock the writer thread holds while it writes one).
#[derive(Debug)]
struct Direct {
    producer: Mutex<Producer>,
    /// Messages queued for the writer thread and not yet completely written.
    pending: std::sync::atomic::AtomicUsize,
}

impl Direct {
    /// Writes a small frame into the ring from the calling task when nothing is queued and
    /// the ring has room now; `false` when the caller must queue it instead.
    fn try_write(&self, frame: &[Bytes], connection: &Connection) -> bool {
        let total: usize = frame.iter().map(Bytes::len).sum();
        if total > DIRECT_MAX || total == 0 || connection.is_closed() {
            return false;
        }
        // Never wait for the lock: the writer may hold it while it waits for room.
        let Ok(mut producer) = self.producer.try_lock() else {
            return false;
        };
        if self.pending.load(Ordering::Acquire) != 0 || total > producer.max_record() {
            return false;
        }
        let slices: Vec<&[u8]> = frame.iter().map(|p| p.as_ref()).collect();
        match producer.try_push_message(&slices, 0) {
            Ok(Some(written)) if written == total => {
                producer.wake_consumer();
                true
            }
            Ok(_) => false,
            Err(e) => {
                // A corrupt cursor: the queued path reports it and closes the connection.
                debug!("IPC direct write refused: {e}");
                false
            }
        }
    }
}

/// One queued message: its encoded frame, preceded in the ring by a references record when
/// some data segments travel by reference.
#[derive(Debug)]
struct Outgoing {
    refs: Option<Bytes>,
    frame: Vec<Bytes>,
}

/// The arenas of one connection: ours with the peer's reference table, and the peer's.
#[derive(Debug, Default)]
struct Arenas {
    ours: Option<Arc<RefTable>>,
    theirs: Option<PeerArena>,
}

/// One connection's shared flags.
#[derive(Debug)]
struct Connection {
    /// Set when the connection ends for any reason; threads exit when they see it.
    closed: AtomicBool,
    /// Why the liveness watcher ended the connection, when it did (named mode: "no
    /// heartbeat for …"); reported instead of the reader's generic reason.
    lost_reason: Mutex<Option<String>>,
}

/// How a connection notices that its peer is gone.
#[derive(Debug)]
enum Watch {
    /// The handshake socket's end of file (the kernel closes it when the peer dies).
    Socket(UnixStream),
    /// Heartbeats in a named segment (no socket is shared).
    Heartbeat(Liveness),
}

impl Connection {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl link::Connection for Connection {
    /// The writer thread flushes and ends once its queue closes; nothing more to do.
    fn abort(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn is_closed(&self) -> bool {
        Connection::is_closed(self)
    }
}

/// A fresh name for a ring or a listening socket: purpose, pid, and random bits so that
/// names cannot be guessed by other local users (the segment module adds the `vans-` prefix
/// to rings).
fn unique_name(what: &str) -> Result<String, crate::IpcError> {
    let random = crate::named::random_u64()?;
    Ok(format!("{what}-{}-{random:016x}", std::process::id()))
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
                links: Links::new(VanKind::Ipc),
                arena: OnceLock::new(),
                accept_thread: Mutex::new(None),
            }),
        }
    }

    /// The shared arena's size and how much of it is free now (after reclaiming what
    /// peers released), or `None` before `bind` or when zero-copy is off.
    pub fn arena_usage(&self) -> Option<(usize, usize)> {
        self.shared
            .arena
            .get()
            .map(|arena| (arena.capacity(), arena.free_bytes()))
    }

    /// Peers this van currently has a link to.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        self.shared.links.peers()
    }
}

impl IpcVan {
    /// `bind` in named mode: a mailbox in `/dev/shm` (after removing segments that dead
    /// processes of ours left there) and a thread accepting from it until the van stops.
    fn bind_named(&self, inbox: InboxSender) -> Result<Endpoint, VanError> {
        let bind_error = |e: crate::IpcError| VanError::Bind {
            kind: VanKind::Ipc,
            address: named::SHM_DIR.into(),
            source: std::io::Error::other(e.to_string()),
        };
        match named::clean_stale() {
            Ok(report) if !report.removed.is_empty() => {
                info!("removed {} stale vans segments", report.removed.len());
            }
            Ok(_) => {}
            Err(e) => warn!("could not clean stale vans segments: {e}"),
        }
        let mut listener = NamedListener::bind().map_err(bind_error)?;
        // Dialers size their rings as we do; refuse what is far larger.
        listener.set_max_ring_bytes(self.shared.options.ring_bytes.max(DEFAULT_RING_BYTES) * 4);
        let address = listener.address().to_owned();
        self.shared.links.bound(inbox.clone(), None)?;
        let shared = Arc::clone(&self.shared);
        let runtime = tokio::runtime::Handle::current();
        let max_frame = usize::try_from(self.shared.options.limits.max_frame).unwrap_or(usize::MAX);
        let accept = std::thread::Builder::new()
            .name("vans-ipc-accept".into())
            .spawn(move || {
                let _runtime = runtime.enter();
                // Dropping the listener at the end closes and removes the mailbox.
                while !shared.links.is_stopped() {
                    match listener.accept(WAIT_SLICE) {
                        Ok(Some(mut connection)) => {
                            connection.consumer.set_max_message(max_frame);
                            let started = shared.start_connection(
                                Watch::Heartbeat(connection.liveness),
                                connection.producer,
                                connection.consumer,
                                None,
                                Arenas::default(),
                                inbox.clone(),
                            );
                            if let Err(e) = started {
                                warn!("named IPC connection not started: {e}");
                            }
                        }
                        Ok(None) => {}
                        Err(e) => warn!("refused a named IPC dialer: {e}"),
                    }
                }
            })
            .map_err(|e| io_error("cannot start the IPC accept thread", e))?;
        *self
            .shared
            .accept_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(accept);
        info!("ipc van listening at {address}");
        Ok(Endpoint {
            kind: VanKind::Ipc,
            address,
        })
    }

    /// Dials a named-mode address (`shm:…`) and starts the connection.
    async fn connect_named(
        &self,
        peer: NodeId,
        address: String,
        inbox: InboxSender,
    ) -> Result<(), VanError> {
        let ring_bytes = self.shared.options.ring_bytes;
        let max_frame = usize::try_from(self.shared.options.limits.max_frame).unwrap_or(usize::MAX);
        let dial = address.clone();
        let mut connection =
            tokio::task::spawn_blocking(move || named::connect(&dial, ring_bytes, CONNECT_TIMEOUT))
                .await
                .map_err(|e| io_error("named IPC connect", e))?
                .map_err(|e| VanError::Connect {
                    kind: VanKind::Ipc,
                    peer,
                    address,
                    source: std::io::Error::other(e.to_string()),
                })?;
        connection.consumer.set_max_message(max_frame);
        self.shared.start_connection(
            Watch::Heartbeat(connection.liveness),
            connection.producer,
            connection.consumer,
            Some(peer),
            Arenas::default(),
            inbox,
        )?;
        debug!(peer, "connected over named shared memory");
        Ok(())
    }
}

impl Drop for IpcVan {
    /// A van dropped without [`Van::stop`] still ends its connections: threads see the
    /// closed flags within a wait slice and exit; nothing is flushed.
    fn drop(&mut self) {
        self.shared.links.abort();
        if let Some(accept) = self.shared.take_accept_thread() {
            // It sees the stop within one wait slice and removes the mailbox.
            let _ = accept.join();
        }
    }
}

impl Default for IpcVan {
    fn default() -> IpcVan {
        IpcVan::new(IpcOptions::default())
    }
}

impl Shared {
    /// The named-mode accept thread, if it runs (taken: joined once).
    fn take_accept_thread(&self) -> Option<std::thread::JoinHandle<()>> {
        self.accept_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Registers a connection with the link table, then starts its threads and liveness
    /// watcher.
    fn start_connection(
        self: &Arc<Self>,
        watch: Watch,
        producer: Producer,
        consumer: Consumer,
        peer: Option<NodeId>,
        arenas: Arenas,
        inbox: InboxSender,
    ) -> Result<(), VanError> {
        let id = self.links.next_id();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let connection = Arc::new(Connection {
            closed: AtomicBool::new(false),
            lost_reason: Mutex::new(None),
        });
        let (queue, frames) = mpsc::channel(SEND_QUEUE);
        let table = arenas.ours;
        let direct = Arc::new(Direct {
            producer: Mutex::new(producer),
            pending: std::sync::atomic::AtomicUsize::new(0),
        });
        let writer_direct = Arc::clone(&direct);
        let link = Link {
            connection: Arc::clone(&connection),
            queue,
            direct,
            table: table.clone(),
        };
        let peer_arena = arenas.theirs;
        let spins = self.options.spins();
        // Registered before the threads start, so that what the reader learns finds it.
        self.links
            .add(id, peer, link, Arc::clone(&connection) as _, Some(done_rx))?;

        let writer_connection = Arc::clone(&connection);
        let writer = std::thread::Builder::new()
            .name(format!("vans-ipc-w{id}"))
            .spawn(move || {
                write_loop(frames, &writer_direct, &writer_connection, spins);
                if let Some(table) = table {
                    table.close();
                }
                let _ = done_tx.send(());
            });
        if let Err(e) = writer {
            connection.closed.store(true, Ordering::Release);
            self.links.closed(id, "no writer thread");
            return Err(io_error("cannot start the IPC writer thread", e));
        }

        let shared = Arc::clone(self);
        let reader_connection = Arc::clone(&connection);
        let reader = std::thread::Builder::new()
            .name(format!("vans-ipc-r{id}"))
            .spawn(move || {
                let mut peer = peer;
                let reason = read_loop(
                    consumer,
                    peer_arena.as_ref(),
                    &reader_connection,
                    &shared,
                    &inbox,
                    |sender| {
                        if peer.is_none() {
                            peer = Some(sender);
                            shared.links.learn(id, sender);
                        }
                    },
                );
                shared.connection_closed(id, &reader_connection, peer, &reason, &inbox);
            });
        if let Err(e) = reader {
            connection.closed.store(true, Ordering::Release);
            self.links.closed(id, "no reader thread");
            return Err(io_error("cannot start the IPC reader thread", e));
        }
        self.links
            .track(tokio::spawn(watch_connection(watch, connection)));
        Ok(())
    }

    /// Forgets a closed connection and reports its peer lost (unless the van stopped or the
    /// connection was a spare).
    fn connection_closed(
        &self,
        id: link::ConnectionId,
        connection: &Connection,
        peer: Option<NodeId>,
        reason: &str,
        inbox: &InboxSender,
    ) {
        connection.closed.store(true, Ordering::Release);
        // The liveness watcher's reason ("no heartbeat for …") says more than the reader's.
        let reason = connection
            .lost_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| reason.to_owned());
        let Some(lost) = self.links.closed(id, &reason) else {
            return;
        };
        match peer {
            Some(peer) => warn!(peer, "IPC connection closed: {reason}"),
            None => debug!("unidentified IPC connection closed: {reason}"),
        }
        let _ = inbox.deliver_blocking(vec![Event::PeerLost(lost)], || self.links.is_stopped());
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
        if words[0] != HANDSHAKE_MAGIC || (fds.len() != 2 && fds.len() != 4) {
            return Err(io_error(
                "IPC handshake",
                format!("not a vans peer ({} descriptors)", fds.len()),
            ));
        }
        let theirs = fds.remove(0);
        let ours = fds.remove(0);
        let peer_arena = open_peer_arena(fds)?;
        // Reply with our arena and the table counting the peer's references into it.
        let table = self.new_table(credentials.pid())?;
        let reply: Vec<i32> = match (self.arena.get(), &table) {
            (Some(arena), Some(table)) => vec![
                arena.segment().fd().as_raw_fd(),
                table.segment().fd().as_raw_fd(),
            ],
            _ => Vec::new(),
        };
        fdpass::send(&socket, [HANDSHAKE_MAGIC, 0, 0, 0], &reply)
            .await
            .map_err(|e| io_error("IPC handshake", e))?;
        let incoming = Arc::new(Segment::open(theirs).map_err(|e| io_error("IPC ring", e))?);
        let outgoing = Arc::new(Segment::open(ours).map_err(|e| io_error("IPC ring", e))?);
        let mut consumer = Consumer::new(incoming, false).map_err(|e| io_error("IPC ring", e))?;
        consumer
            .set_max_message(usize::try_from(self.options.limits.max_frame).unwrap_or(usize::MAX));
        let producer = Producer::new(outgoing, false).map_err(|e| io_error("IPC ring", e))?;
        let arenas = Arenas {
            ours: table,
            theirs: peer_arena,
        };
        self.start_connection(
            Watch::Socket(socket),
            producer,
            consumer,
            None,
            arenas,
            inbox,
        )?;
        Ok(())
    }

    /// A reference table for a new connection, when we have an arena.
    fn new_table(&self, peer_pid: Option<i32>) -> Result<Option<Arc<RefTable>>, VanError> {
        self.arena
            .get()
            .map(|arena| arena.new_table(&unique_name("refs")?, peer_pid))
            .transpose()
            .map_err(|e| io_error("IPC reference table", e))
    }

    /// Replaces the data segments of `msg` that lie in our arena with empty ones and returns
    /// the references record that names them (counted in the peer's table), if any.
    fn take_refs(&self, link: &Link, msg: &mut Message) -> Option<Bytes> {
        let (arena, table) = (self.arena.get()?, link.table.as_ref()?);
        let mut refs = Vec::new();
        for (index, data) in msg.data.iter_mut().enumerate() {
            if let Some((block, offset)) = arena.locate(data) {
                table.acquire(block);
                refs.push(Ref {
                    index: index as u32,
                    block,
                    offset,
                    len: data.len() as u64,
                });
                *data = Bytes::new();
            }
        }
        (!refs.is_empty()).then(|| arena::encode_refs(&refs))
    }
}

/// Marks `connection` closed when its peer is gone: the handshake socket's end of file, or
/// (named mode) a peer whose heartbeat stopped.
async fn watch_connection(watch: Watch, connection: Arc<Connection>) {
    match watch {
        Watch::Socket(socket) => {
            // The socket carries nothing after the handshake: its end is the peer's end.
            let mut buf = [0u8; 64];
            while !connection.is_closed() {
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
        }
        Watch::Heartbeat(mut liveness) => {
            while !connection.is_closed() {
                liveness.beat();
                match liveness.status() {
                    PeerStatus::Alive => tokio::time::sleep(HEARTBEAT_INTERVAL).await,
                    // An orderly close: the reader drains what was written, then reports the
                    // end; keep beating so the peer does not take us for dead meanwhile.
                    PeerStatus::Closed => tokio::time::sleep(WAIT_SLICE).await,
                    PeerStatus::Silent { since } => {
                        *connection
                            .lost_reason
                            .lock()
                            .unwrap_or_else(|e| e.into_inner()) =
                            Some(format!("no heartbeat from the peer for {since:?}"));
                        break;
                    }
                }
            }
        }
    }
    connection.closed.store(true, Ordering::Release);
}

/// Maps the arena and reference table a peer passed (none, or exactly both).
fn open_peer_arena(fds: Vec<std::os::fd::OwnedFd>) -> Result<Option<PeerArena>, VanError> {
    let mut fds = fds.into_iter();
    let (Some(arena), Some(table)) = (fds.next(), fds.next()) else {
        return Ok(None);
    };
    let arena = Segment::open(arena).map_err(|e| io_error("IPC arena", e))?;
    let table = Segment::open(table).map_err(|e| io_error("IPC arena", e))?;
    PeerArena::new(arena, table)
        .map(Some)
        .map_err(|e| io_error("IPC arena", e))
}

/// Copies queued frames into the ring until the queue closes or the connection ends: each
/// frame's parts are copied once, straight into the ring, fragmented into records of at
/// most `max_record` bytes when larger.
fn write_loop(
    mut frames: mpsc::Receiver<Outgoing>,
    direct: &Direct,
    connection: &Connection,
    spins: u32,
) {
    let lock = || direct.producer.lock().unwrap_or_else(|e| e.into_inner());
    while let Some(outgoing) = frames.blocking_recv() {
        let mut producer = lock();
        let sent = outgoing
            .refs
            .is_none_or(|refs| write_message(&mut producer, &[refs], connection, spins))
            && write_message(&mut producer, &outgoing.frame, connection, spins);
        // Under the lock: a direct sender sees the count and the ring change together.
        direct.pending.fetch_sub(1, Ordering::AcqRel);
        drop(producer);
        if !sent {
            break;
        }
    }
    lock().close();
}

/// Copies one message into the ring, waiting for room; `false` when the connection ended.
fn write_message(
    producer: &mut Producer,
    parts: &[Bytes],
    connection: &Connection,
    spins: u32,
) -> bool {
    {
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_ref()).collect();
        let total: usize = slices.iter().map(|s| s.len()).sum();
        let mut offset = 0;
        loop {
            if connection.is_closed() {
                return false;
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
                        return false;
                    }
                }
                Err(e) => {
                    warn!("IPC writer: {e}");
                    connection.closed.store(true, Ordering::Release);
                    return false;
                }
            }
        }
        producer.wake_consumer();
    }
    true
}

/// Reassembles frames from the ring and delivers them in batches; returns why it stopped.
fn read_loop(
    mut consumer: Consumer,
    peer_arena: Option<&PeerArena>,
    connection: &Connection,
    shared: &Shared,
    inbox: &InboxSender,
    mut on_sender: impl FnMut(NodeId),
) -> String {
    let limits = shared.options.limits;
    let spins = shared.options.spins();
    // A full inbox nobody drains holds this thread only until the van stops.
    let abandon = || shared.links.is_stopped();
    let mut frame = BytesMut::new();
    let mut in_frame = false;
    let mut batch = Vec::new();
    let mut ring_closed = false;
    // References announced for the next frame.
    let mut refs: Option<Vec<Ref>> = None;
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
                if frame.starts_with(&arena::REFS_MAGIC) {
                    if refs.is_some() || peer_arena.is_none() {
                        return "peer sent references it may not send".into();
                    }
                    match arena::decode_refs(&frame) {
                        Ok(r) => refs = Some(r),
                        Err(e) => return format!("peer corrupted the ring: {e}"),
                    }
                    frame.clear();
                    continue;
                }
                match wire::decode(frame.split().freeze(), &limits) {
                    Ok(mut msg) => {
                        if let (Some(refs), Some(arena)) = (refs.take(), peer_arena) {
                            if let Err(e) = resolve_refs(&mut msg, &refs, arena) {
                                return format!("peer sent a bad reference: {e}");
                            }
                        }
                        if let Some(sender) = msg.meta.sender {
                            on_sender(sender);
                        }
                        batch.push(Event::Message(msg));
                        if batch.len() >= MAX_BATCH
                            && inbox
                                .deliver_blocking(std::mem::take(&mut batch), abandon)
                                .is_err()
                        {
                            return "the local inbox closed".into();
                        }
                    }
                    Err(e) => return format!("bad frame from peer: {e}"),
                }
            }
            Ok(None) => {
                if !batch.is_empty()
                    && inbox
                        .deliver_blocking(std::mem::take(&mut batch), abandon)
                        .is_err()
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

impl IpcVan {
    /// Dials an abstract-socket address (`@name`), hands over the rings and starts the
    /// connection.
    async fn connect_socket(
        &self,
        peer: NodeId,
        address: String,
        inbox: InboxSender,
    ) -> Result<(), VanError> {
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
            let outgoing =
                create_ring(&unique_name("ring").map_err(ring)?, ring_bytes).map_err(ring)?;
            let incoming =
                create_ring(&unique_name("ring").map_err(ring)?, ring_bytes).map_err(ring)?;
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
        let peer_pid = socket.peer_cred().ok().and_then(|c| c.pid());
        let table = self.shared.new_table(peer_pid)?;
        let mut fds = vec![outgoing.fd().as_raw_fd(), incoming.fd().as_raw_fd()];
        if let (Some(arena), Some(table)) = (self.shared.arena.get(), &table) {
            fds.push(arena.segment().fd().as_raw_fd());
            fds.push(table.segment().fd().as_raw_fd());
        }
        fdpass::send(&socket, [HANDSHAKE_MAGIC, ring_bytes as u64, 0, 0], &fds)
            .await
            .map_err(connect_error)?;
        // The peer answers with its arena (or nothing) once it mapped the rings.
        let (words, reply) = tokio::time::timeout(HANDSHAKE_TIMEOUT, fdpass::recv(&socket))
            .await
            .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
            .map_err(connect_error)?;
        if words[0] != HANDSHAKE_MAGIC || (!reply.is_empty() && reply.len() != 2) {
            return Err(io_error(
                "IPC handshake",
                format!("bad reply from peer {peer} ({} descriptors)", reply.len()),
            ));
        }
        let arenas = Arenas {
            ours: table,
            theirs: open_peer_arena(reply)?,
        };
        self.shared.start_connection(
            Watch::Socket(socket),
            producer,
            consumer,
            Some(peer),
            arenas,
            inbox,
        )?;
        debug!(peer, "connected over shared memory");
        Ok(())
    }
}

/// Puts the referenced bytes of the peer's arena into the data segments they replace.
fn resolve_refs(msg: &mut Message, refs: &[Ref], arena: &PeerArena) -> Result<(), String> {
    for r in refs {
        let slot = msg
            .data
            .get_mut(r.index as usize)
            .filter(|d| d.is_empty())
            .ok_or_else(|| format!("no empty data segment {} to fill", r.index))?;
        *slot = arena.bytes(r).map_err(|e| e.to_string())?;
    }
    Ok(())
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
        self.shared.links.check_bindable()?;
        if self.shared.options.arena_bytes > 0 && self.shared.arena.get().is_none() {
            let arena = unique_name("arena")
                .and_then(|name| Arena::create(&name, self.shared.options.arena_bytes))
                .map_err(|e| VanError::Bind {
                    kind: VanKind::Ipc,
                    address: "shared arena".into(),
                    source: std::io::Error::other(e.to_string()),
                })?;
            let _ = self.shared.arena.set(arena);
        }
        if self.shared.options.named {
            return self.bind_named(inbox);
        }
        // Abstract namespace: no file to clean up, gone with the process.
        let name = format!(
            "vans-{}",
            unique_name("sock").map_err(|e| io_error("IPC socket name", e))?
        );
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
                        shared.links.track(handshake);
                    }
                    Err(e) => {
                        warn!("IPC accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        self.shared.links.bound(inbox, Some(accept))?;
        info!("ipc van listening at @{name}");
        Ok(Endpoint {
            kind: VanKind::Ipc,
            address: format!("@{name}"),
        })
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::Ipc)?;
        self.shared
            .links
            .connect(peer, |inbox| async move {
                if address.starts_with(named::ADDRESS_PREFIX) {
                    self.connect_named(peer, address, inbox).await
                } else {
                    self.connect_socket(peer, address, inbox).await
                }
            })
            .await
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        let peer = recipient_of(&msg)?;
        let link = self.shared.links.link(peer)?;
        let mut msg = msg;
        let refs = self.shared.take_refs(&link, &mut msg);
        let frame = wire::encode(&msg, &self.shared.options.limits)?;
        if refs.is_none() && link.direct.try_write(&frame, &link.connection) {
            return Ok(());
        }
        link.direct.pending.fetch_add(1, Ordering::AcqRel);
        link.queue
            .send(Outgoing { refs, frame })
            .await
            .map_err(|_| VanError::PeerGone {
                peer,
                reason: "the connection closed".into(),
            })
    }

    fn alloc(&self, len: usize) -> Result<Option<van_core::SharedBuf>, VanError> {
        let Some(arena) = self.shared.arena.get() else {
            return Ok(None);
        };
        arena
            .alloc(len)
            .map(Some)
            .map_err(|e| io_error("IPC arena", e))
    }

    async fn stop(&self) -> Result<(), VanError> {
        // Closing the queues lets each writer flush and exit (closing its ring, which tells
        // the peer's reader that nothing more comes); then the connections close.
        if !self
            .shared
            .links
            .stop(self.shared.options.flush_timeout)
            .await
        {
            warn!("ipc van stop: queued frames not written in time; dropping them");
        }
        if let Some(accept) = self.shared.take_accept_thread() {
            // It sees the stop within one wait slice and removes the mailbox.
            let _ = tokio::task::spawn_blocking(move || accept.join()).await;
        }
        Ok(())
    }
}
