//! [`IpcVan`]: the van over shared-memory rings (see the crate docs for the design).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::os::linux::net::SocketAddrExt;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use van_core::link::{self, Links};
use van_core::van::{address_for, recipient_of};
use van_core::wire::{self, Limits};
use van_core::{
    Config, Endpoint, Event, InboxSender, Message, Node, NodeId, Van, VanError, VanKind,
};

use crate::arena::{self, Arena, Ref, RefTable};
use crate::named::{self};
use crate::ring::{Consumer, Producer, DEFAULT_RING_BYTES};

mod handshake;
mod pipe;

use handshake::{watch_connection, Arenas, Watch};
use pipe::{read_loop, write_loop, Direct, Outgoing};

/// Frames queued per peer before `send` waits.
const SEND_QUEUE: usize = 4096;
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

/// One connection's shared flags.
#[derive(Debug)]
struct Connection {
    /// Set when the connection ends for any reason; threads exit when they see it.
    closed: AtomicBool,
    /// Why the liveness watcher ended the connection, when it did (named mode: "no
    /// heartbeat for …"); reported instead of the reader's generic reason.
    lost_reason: Mutex<Option<String>>,
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
