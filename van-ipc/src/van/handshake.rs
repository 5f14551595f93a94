//! The handshakes of a connection: the abstract-socket dial and accept (rings and arenas
//! passed as descriptors), named mode through a mailbox in `/dev/shm`, and the watcher that
//! notices a peer's end.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use std::os::linux::net::SocketAddrExt;

use tokio::net::UnixStream;
use tracing::{debug, info, warn};
use van_core::{Endpoint, InboxSender, NodeId, VanError, VanKind};

use super::{io_error, unique_name, Connection, IpcVan, Shared, WAIT_SLICE};
use crate::arena::{PeerArena, RefTable};
use crate::fdpass;
use crate::named::{self, Liveness, NamedListener, PeerStatus, HEARTBEAT_INTERVAL};
use crate::ring::{create_ring, Consumer, Producer, DEFAULT_RING_BYTES};
use crate::segment::Segment;

/// First handshake word.
const HANDSHAKE_MAGIC: u64 = u64::from_le_bytes(*b"VANSIPC1");
/// How long dialing a peer and creating the rings may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connecting peer may take to hand over its rings.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The arenas of one connection: ours with the peer's reference table, and the peer's.
#[derive(Debug, Default)]
pub(super) struct Arenas {
    pub(super) ours: Option<Arc<RefTable>>,
    pub(super) theirs: Option<PeerArena>,
}

/// How a connection notices that its peer is gone.
#[derive(Debug)]
pub(super) enum Watch {
    /// The handshake socket's end of file (the kernel closes it when the peer dies).
    Socket(UnixStream),
    /// Heartbeats in a named segment (no socket is shared).
    Heartbeat(Liveness),
}

impl IpcVan {
    /// `bind` in named mode: a mailbox in `/dev/shm` (after removing segments that dead
    /// processes of ours left there) and a thread accepting from it until the van stops.
    pub(super) fn bind_named(&self, inbox: InboxSender) -> Result<Endpoint, VanError> {
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
    pub(super) async fn connect_named(
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

impl Shared {
    /// The listener side of the handshake.
    pub(super) async fn accept(
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
}

/// Marks `connection` closed when its peer is gone: the handshake socket's end of file, or
/// (named mode) a peer whose heartbeat stopped.
pub(super) async fn watch_connection(watch: Watch, connection: Arc<Connection>) {
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

impl IpcVan {
    /// Dials an abstract-socket address (`@name`), hands over the rings and starts the
    /// connection.
    pub(super) async fn connect_socket(
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
