//! The handshakes of a connection: the abstract-socket dial and accept (rings, arenas and
//! doorbells passed as descriptors), named mode through an accept queue in `/dev/shm`, and
//! the watcher that notices a peer's end. Each handshake ends in an [`Established`]
//! connection that the van registers and starts.
//!
//! The socket handshake: the dialer creates both rings and its doorbell and sends
//! `[MAGIC, ring_bytes, 0, 0]` with `[outgoing, incoming, doorbell]` (plus its arena and the
//! table counting our references into it, when it has one); the listener maps them and
//! answers `[MAGIC, 0, 0, 0]` with `[doorbell]` (plus its arena and table).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use std::os::linux::net::SocketAddrExt;

use tokio::net::UnixStream;
use tracing::{debug, info, warn};
use van_core::auth::{Gate, Side};
use van_core::{NodeId, VanError, VanKind};

use super::conn::{io_error, unique_name, Arenas, ConnectionIo, Established, Watch, WAIT_SLICE};
use super::options::IpcOptions;
use crate::arena::{Arena, PeerArena, RefTable};
use crate::fdpass;
use crate::named::{self, NamedListener, PeerStatus, HEARTBEAT_INTERVAL};
use crate::ring::{create_ring, Consumer, Producer, DEFAULT_RING_BYTES};
use crate::segment::Segment;
use crate::Doorbell;

/// First handshake word (version 2: doorbells).
const HANDSHAKE_MAGIC: u64 = u64::from_le_bytes(*b"VANSIPC2");
/// How long dialing a peer and creating the rings may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connecting peer may take to hand over its rings.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn max_frame(options: &IpcOptions) -> usize {
    usize::try_from(options.limits.max_frame).unwrap_or(usize::MAX)
}

/// The listener side of the socket handshake; `None` when the gate refused the peer (it logs
/// and counts that itself).
pub(super) async fn accept(
    mut socket: UnixStream,
    options: &IpcOptions,
    arena: Option<&Arc<Arena>>,
    gate: &Gate,
) -> Result<Option<Established>, VanError> {
    // Abstract sockets ignore file permissions: only our own user may connect.
    let credentials = socket
        .peer_cred()
        .map_err(|e| io_error("IPC peer credentials", e))?;
    let me = rustix::process::geteuid().as_raw();
    if credentials.uid() != me {
        return Err(io_error(
            "IPC handshake",
            format!(
                "refused a connection from uid {} (we are {me})",
                credentials.uid()
            ),
        ));
    }
    // The cluster secret, before any descriptor is taken.
    // Only this user's processes get this far: one label for all of them, so the gate logs
    // the first refusal loudly and counts the rest.
    let peer = format!("uid {}", credentials.uid());
    if gate
        .authenticate(&mut socket, Side::Acceptor, &peer)
        .await
        .is_err()
    {
        return Ok(None); // counted and logged by the gate
    }
    let fds = receive(&socket, [3, 5]).await.map_err(|e| {
        io_error(
            "IPC handshake",
            format!("not a vans peer of this version: {e}"),
        )
    })?;
    let mut fds = fds.into_iter();
    let (Some(theirs), Some(ours), Some(their_bell)) = (fds.next(), fds.next(), fds.next()) else {
        return Err(io_error("IPC handshake", "descriptors missing"));
    };
    let peer_arena = open_peer_arena(fds.collect())?;
    // Reply with our doorbell, our arena and the table counting the peer's references.
    let doorbell = Doorbell::new().map_err(|e| io_error("IPC doorbell", e))?;
    let table = new_table(arena, credentials.pid())?;
    let mut reply: Vec<BorrowedFd<'_>> = vec![doorbell.as_fd()];
    if let (Some(arena), Some(table)) = (arena, &table) {
        reply.push(arena.segment().fd());
        reply.push(table.segment().fd());
    }
    fdpass::send(&socket, [HANDSHAKE_MAGIC, 0, 0, 0], &reply)
        .await
        .map_err(|e| io_error("IPC handshake", e))?;
    drop(reply);
    let incoming = Arc::new(Segment::open(theirs).map_err(|e| io_error("IPC ring", e))?);
    let outgoing = Arc::new(Segment::open(ours).map_err(|e| io_error("IPC ring", e))?);
    let mut consumer = Consumer::new(incoming, false).map_err(|e| io_error("IPC ring", e))?;
    consumer.set_max_message(max_frame(options));
    let mut producer = Producer::new(outgoing, false).map_err(|e| io_error("IPC ring", e))?;
    producer.set_consumer_doorbell(
        Doorbell::from_peer(their_bell).map_err(|e| io_error("IPC handshake", e))?,
    );
    Ok(Some(Established {
        watch: Watch::Socket(socket),
        producer,
        consumer,
        doorbell: Some(doorbell),
        arenas: Arenas {
            ours: table,
            theirs: peer_arena,
        },
    }))
}

/// Dials an abstract-socket address (`@name`) and hands over the rings.
pub(super) async fn dial_socket(
    peer: NodeId,
    address: &str,
    options: &IpcOptions,
    arena: Option<&Arc<Arena>>,
    gate: &Gate,
) -> Result<Established, VanError> {
    let connect_error = |source| VanError::Connect {
        kind: VanKind::Ipc,
        peer,
        address: address.to_owned(),
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
    let ring_bytes = options.ring_bytes;
    let max_frame = max_frame(options);
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    let dial = tokio::task::spawn_blocking(move || {
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let socket = std::os::unix::net::UnixStream::connect_addr(&address)?;
        socket.set_nonblocking(true)?;
        Ok::<_, std::io::Error>(socket)
    });
    let socket = tokio::time::timeout_at(deadline, dial)
        .await
        .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
        .map_err(|e| connect_error(std::io::Error::other(e.to_string())))?
        .map_err(connect_error)?;
    let mut socket = UnixStream::from_std(socket).map_err(connect_error)?;
    // Authenticated before any ring is created: a refused dial costs no shared memory.
    gate.authenticate(&mut socket, Side::Dialer, &address)
        .await
        .map_err(|source| VanError::Unauthenticated {
            kind: VanKind::Ipc,
            peer,
            address: address.to_owned(),
            source,
        })?;
    let rings = tokio::task::spawn_blocking(move || {
        let ring = |e: crate::IpcError| std::io::Error::other(e.to_string());
        let outgoing =
            create_ring(&unique_name("ring").map_err(ring)?, ring_bytes).map_err(ring)?;
        let incoming =
            create_ring(&unique_name("ring").map_err(ring)?, ring_bytes).map_err(ring)?;
        let producer = Producer::new(Arc::clone(&outgoing), false).map_err(ring)?;
        let mut consumer = Consumer::new(Arc::clone(&incoming), false).map_err(ring)?;
        consumer.set_max_message(max_frame);
        Ok::<_, std::io::Error>((outgoing, incoming, producer, consumer))
    });
    let (outgoing, incoming, mut producer, consumer) = tokio::time::timeout_at(deadline, rings)
        .await
        .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
        .map_err(|e| connect_error(std::io::Error::other(e.to_string())))?
        .map_err(connect_error)?;
    let peer_pid = socket.peer_cred().ok().and_then(|c| c.pid());
    let table = new_table(arena, peer_pid)?;
    let doorbell = Doorbell::new().map_err(connect_error)?;
    let mut fds = vec![outgoing.fd(), incoming.fd(), doorbell.as_fd()];
    if let (Some(arena), Some(table)) = (arena, &table) {
        fds.push(arena.segment().fd());
        fds.push(table.segment().fd());
    }
    fdpass::send(&socket, [HANDSHAKE_MAGIC, ring_bytes as u64, 0, 0], &fds)
        .await
        .map_err(connect_error)?;
    drop(fds);
    // The peer answers with its doorbell (and arena) once it mapped the rings.
    let reply = receive(&socket, [1, 3]).await.map_err(|e| {
        io_error(
            "IPC handshake",
            format!("bad reply from peer {peer} ({e}; another vans version?)"),
        )
    })?;
    let mut reply = reply.into_iter();
    if let Some(bell) = reply.next() {
        producer.set_consumer_doorbell(
            Doorbell::from_peer(bell).map_err(|e| io_error("IPC handshake", e))?,
        );
    }
    Ok(Established {
        watch: Watch::Socket(socket),
        producer,
        consumer,
        doorbell: Some(doorbell),
        arenas: Arenas {
            ours: table,
            theirs: open_peer_arena(reply.collect())?,
        },
    })
}

/// Receives one handshake message within the handshake timeout: its descriptors, when it
/// starts with the magic and carries one of the `counts` of them (without and with arenas).
async fn receive(socket: &UnixStream, counts: [usize; 2]) -> Result<Vec<OwnedFd>, String> {
    let (words, fds) = tokio::time::timeout(HANDSHAKE_TIMEOUT, fdpass::recv(socket))
        .await
        .map_err(|_| "nothing within the handshake timeout".to_owned())?
        .map_err(|e| e.to_string())?;
    if words[0] != HANDSHAKE_MAGIC || !counts.contains(&fds.len()) {
        return Err(format!("{} descriptors", fds.len()));
    }
    Ok(fds)
}

/// Named mode's accept queue in `/dev/shm`, after removing segments that dead processes of
/// ours left there.
pub(super) fn named_listener(options: &IpcOptions) -> Result<NamedListener, VanError> {
    let bind_error = |e: crate::IpcError| VanError::Bind {
        kind: VanKind::Ipc,
        address: named::SHM_DIR.into(),
        source: std::io::Error::other(e.to_string()),
    };
    if let Err(e) = sweep_stale() {
        warn!("could not clean stale vans segments: {e}");
    }
    let mut listener = NamedListener::bind().map_err(bind_error)?;
    // Dialers size their rings as we do; refuse what is far larger.
    listener.set_max_ring_bytes(options.ring_bytes.max(DEFAULT_RING_BYTES) * 4);
    Ok(listener)
}

/// Removes what dead processes of ours left in `/dev/shm` (`named::clean_stale`: a listing
/// of the directory and an owner-lock probe per `vans-*` file), logging what it removed.
/// Named mode runs it when a van binds, when it learns of a peer's death (a heartbeat that
/// stopped, the scheduler's verdict) and when it stops, so that a crashed process's accept
/// queue goes with the survivors instead of outliving the job.
fn sweep_stale() -> Result<(), crate::IpcError> {
    let report = named::clean_stale()?;
    for entry in &report.removed {
        info!(
            "removed {} of dead process {:?} from {}",
            entry.file_name,
            entry.owner_pid(),
            named::SHM_DIR
        );
    }
    for (entry, why) in &report.failed {
        debug!("cannot remove stale {}: {why}", entry.file_name);
    }
    Ok(())
}

/// Accepts named-mode dialers on a thread of its own until `stopped` says so, handing each
/// connection to `start`. Dropping the listener at the end removes its file.
pub(super) fn accept_named(
    mut listener: NamedListener,
    options: &IpcOptions,
    mut start: impl FnMut(Established) + Send + 'static,
    stopped: impl Fn() -> bool + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, VanError> {
    let max_frame = max_frame(options);
    let runtime = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("vans-ipc-accept".into())
        .spawn(move || {
            let _runtime = runtime.enter();
            while !stopped() {
                match listener.accept(WAIT_SLICE) {
                    Ok(Some(mut connection)) => {
                        connection.consumer.set_max_message(max_frame);
                        start(Established {
                            watch: Watch::Heartbeat(connection.liveness),
                            producer: connection.producer,
                            consumer: connection.consumer,
                            doorbell: None,
                            arenas: Arenas::default(),
                        });
                    }
                    Ok(None) => {}
                    Err(e) => warn!("refused a named IPC dialer: {e}"),
                }
            }
        })
        .map_err(|e| io_error("cannot start the IPC accept thread", e))
}

/// Dials a named-mode address (`shm:…`).
pub(super) async fn dial_named(
    peer: NodeId,
    address: &str,
    options: &IpcOptions,
) -> Result<Established, VanError> {
    let ring_bytes = options.ring_bytes;
    let dial = address.to_owned();
    let mut connection =
        tokio::task::spawn_blocking(move || named::connect(&dial, ring_bytes, CONNECT_TIMEOUT))
            .await
            .map_err(|e| io_error("named IPC connect", e))?
            .map_err(|e| VanError::Connect {
                kind: VanKind::Ipc,
                peer,
                address: address.to_owned(),
                source: std::io::Error::other(e.to_string()),
            })?;
    connection.consumer.set_max_message(max_frame(options));
    Ok(Established {
        watch: Watch::Heartbeat(connection.liveness),
        producer: connection.producer,
        consumer: connection.consumer,
        doorbell: None,
        arenas: Arenas::default(),
    })
}

/// Marks `connection` closed when its peer is gone: the handshake socket's end of file, or
/// (named mode) a peer whose heartbeat stopped.
pub(super) async fn watch_connection(watch: Watch, connection: Arc<ConnectionIo>) {
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
                        // What the dead peer left in /dev/shm goes now, not when someone
                        // next binds.
                        sweep_in_background();
                        break;
                    }
                }
            }
        }
    }
    connection.close();
}

/// [`sweep_stale`], its failure at debug level (the next sweep tries again).
pub(super) fn sweep_logged() {
    if let Err(e) = sweep_stale() {
        debug!("could not clean stale vans segments: {e}");
    }
}

/// [`sweep_logged`] on a blocking thread of the runtime (a directory listing is no work for
/// an I/O thread). Requests made while one waits to start are one sweep: a death seen by
/// several connections and by the scheduler's verdict lists `/dev/shm` once.
pub(super) fn sweep_in_background() {
    static QUEUED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    use std::sync::atomic::Ordering;
    if QUEUED.swap(true, Ordering::AcqRel) {
        return;
    }
    let sweep = || {
        // Cleared before the listing: a death noticed from now on gets a sweep of its own.
        QUEUED.store(false, Ordering::Release);
        sweep_logged();
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(sweep)),
        Err(_) => sweep(),
    }
}

/// A reference table for a new connection, when we have an arena.
fn new_table(
    arena: Option<&Arc<Arena>>,
    peer_pid: Option<i32>,
) -> Result<Option<Arc<RefTable>>, VanError> {
    arena
        .map(|arena| arena.new_table(&unique_name("refs")?, peer_pid))
        .transpose()
        .map_err(|e| io_error("IPC reference table", e))
}

/// Maps the arena and reference table a peer passed (none, or exactly both).
fn open_peer_arena(fds: Vec<OwnedFd>) -> Result<Option<PeerArena>, VanError> {
    let mut fds = fds.into_iter();
    let (Some(arena), Some(table)) = (fds.next(), fds.next()) else {
        return Ok(None);
    };
    // Only read here: mapped read-only, so nothing on this side can change the peer's memory.
    let arena = Segment::open_read_only(arena).map_err(|e| io_error("IPC arena", e))?;
    let table = Segment::open(table).map_err(|e| io_error("IPC arena", e))?;
    PeerArena::new(arena, table)
        .map(Some)
        .map_err(|e| io_error("IPC arena", e))
}
