//! The TCP I/O the vans share beyond the table: dialing a peer ([`dial`]) and accepting
//! connections ([`serve`]), each with the cluster-secret handshake, socket options
//! ([`tune`], [`keepalive`]), waiting until a socket's send queue is acknowledged
//! ([`wait_sent`]), the reasons a stream connection ends ([`Closed`]), and free loopback
//! ports ([`free_loopback_port`]). Used by van-tcp and van-uring for their connections and by
//! van-rdma for its TCP side channel. Nothing here reads or writes a frame: each van moves
//! its frames itself (tokio, io_uring, verbs).

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use crate::auth::{Gate, Side};
use crate::message::{NodeId, VanKind};
use crate::van::VanError;
use crate::wire::WireError;

/// Dials `peer` at `address` (`host:port`) for a van of `kind`, bounded by `timeout`, and
/// authenticates the connection through `gate` (nothing to do without a cluster secret): the
/// stream, positioned at the peer's first frame, and the peer's socket address; or a
/// [`VanError::Connect`] / [`VanError::Unauthenticated`] naming the van, the peer and the
/// address.
pub async fn dial(
    kind: VanKind,
    peer: NodeId,
    address: &str,
    timeout: Duration,
    gate: &Gate,
) -> Result<(TcpStream, SocketAddr), VanError> {
    let connect_error = |source| VanError::Connect {
        kind,
        peer,
        address: address.to_owned(),
        source,
    };
    let mut stream = tokio::time::timeout(timeout, TcpStream::connect(address))
        .await
        .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
        .map_err(connect_error)?;
    let remote = stream.peer_addr().map_err(connect_error)?;
    gate.authenticate(&mut stream, Side::Dialer, &remote.ip())
        .await
        .map_err(|source| VanError::Unauthenticated {
            kind,
            peer,
            address: address.to_owned(),
            source,
        })?;
    Ok((stream, remote))
}

/// Accepts connections on `listener` until the task is aborted. Each is authenticated through
/// `gate` on a task of its own (so a slow or silent peer holds up nobody, and one address may
/// have only the gate's bound authenticating at once) and then handed to `admit`; refused
/// connections are closed, logged and counted by the gate. The handshakes are this task's
/// own: aborting it ends them too, so none admits a connection after a stop. Without a
/// secret `admit` runs at once, on the accepting task.
pub async fn serve<F>(listener: TcpListener, gate: Gate, admit: F)
where
    F: Fn(TcpStream, SocketAddr) + Clone + Send + 'static,
{
    let mut handshakes = tokio::task::JoinSet::new();
    loop {
        // Forget the handshakes that have ended.
        while handshakes.try_join_next().is_some() {}
        let (mut stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors or a connection reset before accept: keep serving.
                warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        debug!(%remote, "accepted connection");
        if !gate.requires_auth() {
            admit(stream, remote);
            continue;
        }
        let Ok(place) = gate.admit(remote.ip()) else {
            continue; // dropped: closed at once
        };
        let gate = gate.clone();
        let admit = admit.clone();
        handshakes.spawn(async move {
            let authenticated = gate
                .authenticate(&mut stream, Side::Acceptor, &remote.ip())
                .await;
            drop(place);
            if authenticated.is_ok() {
                admit(stream, remote);
            }
        });
    }
}

/// Waits until everything written to `socket` has been sent and acknowledged (its send queue
/// is empty), or `timeout` passes; returns whether it emptied. Closing a TCP socket that has
/// unread input makes Linux answer with a reset and discard what its send queue still holds,
/// so a van that flushed its frames waits for this before it closes: what it wrote then
/// reaches the peer even when the peer's own frames are still arriving.
pub async fn wait_sent(socket: &impl AsFd, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    // Loopback acknowledges at once; a distant peer takes round trips: look soon, then less
    // often.
    let mut pause = Duration::from_millis(1);
    loop {
        match unsent_bytes(socket) {
            Ok(0) => return true,
            Ok(_) => {}
            // Not a socket any more: nothing left to wait for.
            Err(_) => return false,
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Bytes written to `socket` that the peer has not acknowledged yet (`TIOCOUTQ`); 0 once the
/// connection has failed (reset by the peer, timed out): the count stays where it was then,
/// but nothing will be acknowledged any more. Takes (clears) the socket's pending error.
pub fn unsent_bytes(socket: &impl AsFd) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    if socket2::SockRef::from(socket).take_error()?.is_some() {
        return Ok(0);
    }
    let mut bytes: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int through the pointer, which points at a live c_int;
    // the descriptor is borrowed for the call.
    let result = unsafe {
        libc::ioctl(
            socket.as_fd().as_raw_fd(),
            libc::TIOCOUTQ,
            &mut bytes as *mut libc::c_int,
        )
    };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(usize::try_from(bytes).unwrap_or(0))
}

/// Idle time before the first keepalive probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the connection is declared dead.
pub const KEEPALIVE_PROBES: u32 = 3;

/// Sets up a new TCP connection: `TCP_NODELAY` (frames are batched by the writer, so
/// Nagle's delay only adds latency) and keepalive, so that a peer whose host vanishes
/// without a reset is noticed in ~25 s instead of ~15 min. Failures are logged, not fatal.
pub fn tune(socket: impl AsFd, remote: &dyn std::fmt::Display) {
    let socket = socket2::SockRef::from(&socket);
    if let Err(e) = socket.set_tcp_nodelay(true) {
        warn!(%remote, "cannot set TCP_NODELAY: {e}");
    }
    keepalive(&socket, remote);
}

/// Enables keepalive (without `TCP_NODELAY`), for side channels that carry no frames.
pub fn keepalive(socket: &socket2::SockRef<'_>, remote: &dyn std::fmt::Display) {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket.set_tcp_keepalive(&keepalive) {
        warn!(%remote, "cannot enable TCP keepalive: {e}");
    }
}

/// Why a stream connection ended.
#[derive(Debug)]
pub enum Closed {
    /// The peer closed the connection between frames.
    Eof,
    /// The socket failed.
    Io(std::io::Error),
    /// The peer sent a bad frame (or closed in the middle of one).
    Wire(WireError),
    /// Our node's inbox is gone: the node is shutting down.
    InboxGone,
    /// The van stopped.
    Stopped,
}

impl Closed {
    /// Whether the end is a failure worth a warning (not an orderly close).
    pub fn is_failure(&self) -> bool {
        matches!(self, Closed::Io(_) | Closed::Wire(_))
    }
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::Eof => f.write_str("connection closed by peer"),
            Closed::Io(e) => write!(f, "socket error: {e}"),
            Closed::Wire(e) => write!(f, "bad frame from peer: {e}"),
            Closed::InboxGone => f.write_str("local inbox closed"),
            Closed::Stopped => f.write_str("van stopped"),
        }
    }
}

/// A free port on 127.0.0.1 for a node that others must be told about before it binds (or
/// that binds it again after a restart), picked at random below Linux's ephemeral range
/// (32768 and up): a port the kernel handed out and took back can be handed to any outgoing
/// connection before the node binds it; one picked down here only meets another such pick.
/// A process never gets a port among its last 1024 picks again: picks for nodes not started
/// yet are still free, and two of them once named the same port (vans-soak's seven nodes, a
/// 10-minute run).
pub fn free_loopback_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    // Only this function takes the lock, and nothing in it panics while holding it.
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        let port = 20_000 + (hasher.finish() % 12_000) as u16;
        if !handed_out.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            // The last 1024 are remembered: older picks have been bound (or dropped) long ago,
            // and the search never runs out of ports.
            if handed_out.len() >= 1024 {
                handed_out.remove(0);
            }
            handed_out.push(port);
            return port;
        }
    }
}
