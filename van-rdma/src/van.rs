//! [`RdmaVan`]: the van over RC queue pairs (see the crate docs for the design).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use van_core::config::RdmaSettings;
use van_core::van::{address_for, recipient_of};
use van_core::wire::{self, Limits};
use van_core::{
    Config, Endpoint, Event, InboxSender, Message, Node, NodeId, PeerLost, SharedBuf, Van,
    VanError, VanKind,
};

use crate::connection::{ConnShared, EventFd, Outgoing, RingSizes, Setup};
use crate::device::{self, Device};
use crate::engine::{End, Engine, EngineContext};
use crate::memlock;
use crate::pool::{Pool, PoolStats};
use crate::protocol::{QpAttributes, READY};
use crate::RdmaError;

/// Frames queued per peer before `send` waits.
const SEND_QUEUE: usize = 1024;
/// Keepalive of the side channel (as van-tcp and van-uring): its end is how a connection
/// learns that the peer's host vanished, which an idle RC queue pair never notices.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the side channel is declared dead.
const KEEPALIVE_PROBES: u32 = 3;
/// Default bytes of each receive buffer: frames up to this size (less a 16-byte header) go
/// by SEND, larger ones by RDMA WRITE.
pub const DEFAULT_SLOT_BYTES: usize = 8192;

/// Tuning of an [`RdmaVan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaOptions {
    /// Frame size limits.
    pub limits: Limits,
    /// Device, GID, depths, pool size (`VANS_RDMA_*`, `BYTEPS_RDMA_*`).
    pub settings: RdmaSettings,
    /// Bytes of each receive buffer (256 B ..= 1 MiB).
    pub slot_bytes: usize,
    /// Bound on opening one connection, handshake included.
    pub connect_timeout: Duration,
    /// How long `stop` waits for queued frames to be acknowledged.
    pub flush_timeout: Duration,
}

impl Default for RdmaOptions {
    fn default() -> RdmaOptions {
        RdmaOptions {
            limits: Limits::default(),
            settings: RdmaSettings::default(),
            slot_bytes: DEFAULT_SLOT_BYTES,
            connect_timeout: van_core::config::DEFAULT_CONNECT_TIMEOUT,
            flush_timeout: Duration::from_secs(10),
        }
    }
}

impl RdmaOptions {
    /// Options with the limits, timeouts and RDMA settings of `config`.
    pub fn from_config(config: &Config) -> RdmaOptions {
        RdmaOptions {
            limits: config.limits,
            settings: config.rdma.clone(),
            connect_timeout: config.connect_timeout,
            ..RdmaOptions::default()
        }
    }

    fn sizes(&self) -> RingSizes {
        RingSizes {
            rx_depth: self.settings.rx_depth.clamp(4, 32768),
            slot_bytes: self.slot_bytes.clamp(256, 1 << 20),
            start_depth: self.settings.start_depth.max(1),
        }
    }

    /// Bytes the van registers up front: the pool it may keep plus the two rings of one
    /// connection (each further connection registers its rings as it opens).
    pub fn registered_bytes(&self) -> u64 {
        let sizes = self.sizes();
        self.settings.pool_bytes as u64 + 2 * u64::from(sizes.rx_depth) * sizes.slot_bytes as u64
    }
}

/// A van over RDMA verbs; see the [crate docs](crate).
pub struct RdmaVan {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RdmaVan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaVan")
            .field("device", &self.shared.device)
            .finish_non_exhaustive()
    }
}

struct Shared {
    options: RdmaOptions,
    device: Arc<Device>,
    pool: Arc<Pool>,
    state: Mutex<State>,
    next_connection: AtomicU64,
}

#[derive(Default)]
struct State {
    stopped: bool,
    inbox: Option<InboxSender>,
    links: HashMap<NodeId, Link>,
    /// Accepted connections whose peer has not identified itself yet.
    accepted: HashMap<u64, Link>,
    lost: HashMap<NodeId, String>,
    connections: Vec<Arc<ConnShared>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Clone)]
struct Link {
    connection: Arc<ConnShared>,
    queue: mpsc::Sender<Outgoing>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Map operations only: a poisoned lock still holds consistent data.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

fn io_error(context: &str, error: impl std::fmt::Display) -> VanError {
    VanError::Io {
        kind: VanKind::Rdma,
        source: std::io::Error::other(format!("{context}: {error}")),
    }
}

impl RdmaVan {
    /// Opens the RDMA device and checks the memlock limit: fails with a clear error when
    /// there is no device, no driver, no kernel support, no usable GID, or too little
    /// lockable memory. Not yet bound.
    pub fn new(options: RdmaOptions) -> Result<RdmaVan, RdmaError> {
        let device = device::open(&options.settings)?;
        memlock::current().check(options.registered_bytes())?;
        let pool = Pool::new(Arc::clone(&device.pd), options.settings.pool_bytes);
        info!("rdma van on {}", device.describe());
        Ok(RdmaVan {
            shared: Arc::new(Shared {
                options,
                device: Arc::new(device),
                pool,
                state: Mutex::new(State::default()),
                next_connection: AtomicU64::new(0),
            }),
        })
    }

    /// The device, port, GID and MTU in use, in one line.
    pub fn device_description(&self) -> String {
        self.shared.device.describe()
    }

    /// The registration cache's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.shared.pool.stats()
    }

    /// Peers this van has a live connection to.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        let state = lock(&self.shared.state);
        let mut peers: Vec<NodeId> = state
            .links
            .iter()
            .filter(|(_, l)| !l.connection.is_closed())
            .map(|(p, _)| *p)
            .collect();
        peers.sort_unstable();
        peers
    }
}

impl Drop for RdmaVan {
    /// A van dropped without [`Van::stop`] still ends its connections: their threads see
    /// the closed flag within a wait slice and exit; nothing is flushed.
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        state.stopped = true;
        state.inbox = None;
        state.links.clear();
        state.accepted.clear();
        for connection in state.connections.drain(..) {
            connection.closed.store(true, Ordering::Release);
            connection.wake.notify();
        }
        for task in state.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Shared {
    /// Exchanges queue-pair attributes over `stream` and starts the connection's thread.
    async fn handshake(
        self: &Arc<Self>,
        mut stream: TcpStream,
        peer: Option<NodeId>,
        inbox: InboxSender,
        address: &str,
    ) -> Result<(), VanError> {
        let fail = |reason: String| -> VanError {
            RdmaError::Handshake {
                peer: address.to_owned(),
                reason,
            }
            .into()
        };
        let device = Arc::clone(&self.device);
        let sizes = self.options.sizes();
        let setup = tokio::task::spawn_blocking(move || Setup::new(&device, sizes))
            .await
            .map_err(|e| fail(format!("setup task: {e}")))?
            .map_err(|e| fail(format!("creating the queue pair and rings: {e}")))?;
        let ours = setup.attributes(&self.device);
        let exchange = async {
            stream.set_nodelay(true).ok();
            stream
                .write_all(&ours.encode())
                .await
                .map_err(|e| format!("sending attributes: {e}"))?;
            let mut buf = [0u8; QpAttributes::LEN];
            stream
                .read_exact(&mut buf)
                .await
                .map_err(|e| format!("reading attributes: {e}"))?;
            let theirs = QpAttributes::decode(&buf).map_err(|e| e.to_string())?;
            setup
                .connect(&self.device, &theirs)
                .map_err(|e| format!("connecting the queue pair: {e}"))?;
            stream
                .write_all(&[READY])
                .await
                .map_err(|e| format!("sending ready: {e}"))?;
            let mut ready = [0u8; 1];
            stream
                .read_exact(&mut ready)
                .await
                .map_err(|e| format!("waiting for ready: {e}"))?;
            if ready[0] != READY {
                return Err("peer did not confirm".to_owned());
            }
            Ok(theirs)
        };
        let theirs = tokio::time::timeout(self.options.connect_timeout, exchange)
            .await
            .map_err(|_| fail("no answer within the connect timeout".into()))?
            .map_err(fail)?;
        let tcp = stream
            .into_std()
            .map_err(|e| fail(format!("side channel: {e}")))?;
        tcp.set_nonblocking(true)
            .map_err(|e| fail(format!("side channel: {e}")))?;
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES);
        if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive) {
            warn!(
                peer = address,
                "cannot enable TCP keepalive on the side channel: {e}"
            );
        }
        self.start_connection(setup, theirs, tcp, peer, inbox)
    }

    /// Starts the engine thread of a connected setup and registers its link.
    fn start_connection(
        self: &Arc<Self>,
        setup: Setup,
        theirs: QpAttributes,
        tcp: std::net::TcpStream,
        peer: Option<NodeId>,
        inbox: InboxSender,
    ) -> Result<(), VanError> {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let connection = Arc::new(ConnShared {
            id,
            closed: AtomicBool::new(false),
            superseded: AtomicBool::new(false),
            wake: EventFd::new().map_err(|e| io_error("eventfd", e))?,
            done: Mutex::new(Some(done_rx)),
        });
        let (queue, frames) = mpsc::channel(SEND_QUEUE);
        let link = Link {
            connection: Arc::clone(&connection),
            queue,
        };
        // Weak: the engine must not keep its own queue open (stop waits for it to close).
        let weak_queue = link.queue.downgrade();
        let learner = Arc::clone(self);
        let learn_connection = Arc::clone(&connection);
        let on_peer = Box::new(move |sender: NodeId| {
            if let Some(queue) = weak_queue.upgrade() {
                learner.learn(
                    sender,
                    Link {
                        connection: Arc::clone(&learn_connection),
                        queue,
                    },
                );
            }
        });
        let engine = Engine::new(
            setup,
            &theirs,
            &self.device,
            EngineContext {
                queue: frames,
                tcp,
                inbox: inbox.clone(),
                limits: self.options.limits,
                pool: Arc::clone(&self.pool),
                shared: Arc::clone(&connection),
                peer,
                on_peer,
            },
        );
        let shared = Arc::clone(self);
        let thread_connection = Arc::clone(&connection);
        std::thread::Builder::new()
            .name(format!("vans-rdma-{id}"))
            .spawn(move || {
                let end = engine.run();
                shared.connection_closed(&thread_connection, peer, end, &inbox);
                let _ = done_tx.send(());
            })
            .map_err(|e| io_error("cannot start the RDMA connection thread", e))?;
        let mut state = lock(&self.state);
        if state.stopped {
            connection.closed.store(true, Ordering::Release);
            return Err(VanError::Stopped(VanKind::Rdma));
        }
        state.connections.retain(|c| !c.is_closed());
        state.connections.push(Arc::clone(&connection));
        match peer {
            None => {
                state.accepted.insert(id, link);
            }
            Some(peer) => {
                let live = state
                    .links
                    .get(&peer)
                    .is_some_and(|l| !l.connection.is_closed());
                if live {
                    // A concurrent connect won: close this one quietly.
                    connection.superseded.store(true, Ordering::Release);
                    connection.closed.store(true, Ordering::Release);
                } else {
                    state.links.insert(peer, link);
                    state.lost.remove(&peer);
                }
            }
        }
        Ok(())
    }

    /// A peer identified itself on an accepted connection: reply over it.
    fn learn(&self, peer: NodeId, link: Link) {
        let mut state = lock(&self.state);
        if state.stopped {
            return;
        }
        if state
            .links
            .get(&peer)
            .is_none_or(|l| l.connection.is_closed())
        {
            debug!(peer, "learned RDMA link from an accepted connection");
            state.accepted.remove(&link.connection.id);
            state.links.insert(peer, link);
            state.lost.remove(&peer);
        }
    }

    /// Called by a connection's thread when it ends.
    fn connection_closed(
        &self,
        connection: &ConnShared,
        peer: Option<NodeId>,
        end: End,
        inbox: &InboxSender,
    ) {
        connection.closed.store(true, Ordering::Release);
        let reason = match end {
            End::Flushed => return,
            End::Lost(reason) => reason,
        };
        let (stopped, learned) = {
            let mut state = lock(&self.state);
            let dropped: Vec<NodeId> = state
                .links
                .iter()
                .filter(|(_, l)| l.connection.id == connection.id)
                .map(|(p, _)| *p)
                .collect();
            for p in &dropped {
                state.links.remove(p);
                state.lost.insert(*p, reason.clone());
            }
            state.accepted.remove(&connection.id);
            (state.stopped, dropped.first().copied())
        };
        if stopped || connection.superseded.load(Ordering::Acquire) {
            return;
        }
        let peer = peer.or(learned);
        warn!(?peer, "RDMA connection closed: {reason}");
        let lost = PeerLost {
            peer,
            kind: VanKind::Rdma,
            reason,
        };
        let _ = inbox.deliver_blocking(vec![Event::PeerLost(lost)], || lock(&self.state).stopped);
    }

    fn link(&self, peer: NodeId) -> Result<Link, VanError> {
        let state = lock(&self.state);
        if state.stopped {
            return Err(VanError::Stopped(VanKind::Rdma));
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
}

#[async_trait]
impl Van for RdmaVan {
    fn kind(&self) -> VanKind {
        VanKind::Rdma
    }

    async fn bind(&self, host: &str, port: u16, inbox: InboxSender) -> Result<Endpoint, VanError> {
        {
            let state = lock(&self.shared.state);
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Rdma));
            }
            if state.inbox.is_some() {
                return Err(VanError::AlreadyBound(VanKind::Rdma));
            }
        }
        let bind_error = |source| VanError::Bind {
            kind: VanKind::Rdma,
            address: format!("{host}:{port}"),
            source,
        };
        let listener = TcpListener::bind((host, port)).await.map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        let endpoint = Endpoint::stream(VanKind::Rdma, host, local.port());
        let shared = Arc::clone(&self.shared);
        let accept_inbox = inbox.clone();
        let accept = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((socket, from)) => {
                        let handshake_shared = Arc::clone(&shared);
                        let inbox = accept_inbox.clone();
                        let handshake = tokio::spawn(async move {
                            let address = from.to_string();
                            if let Err(e) = handshake_shared
                                .handshake(socket, None, inbox, &address)
                                .await
                            {
                                warn!("refused an RDMA connection: {e}");
                            }
                        });
                        let mut state = lock(&shared.state);
                        state.tasks.retain(|t| !t.is_finished());
                        state.tasks.push(handshake);
                    }
                    Err(e) => {
                        warn!("RDMA side-channel accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        let mut state = lock(&self.shared.state);
        if state.stopped || state.inbox.is_some() {
            accept.abort();
            return Err(if state.stopped {
                VanError::Stopped(VanKind::Rdma)
            } else {
                VanError::AlreadyBound(VanKind::Rdma)
            });
        }
        state.inbox = Some(inbox);
        state.tasks.push(accept);
        info!(
            "rdma van listening at {} on {}",
            endpoint.address,
            self.shared.device.describe()
        );
        Ok(endpoint)
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::Rdma)?;
        let inbox = {
            let state = lock(&self.shared.state);
            if state.stopped {
                return Err(VanError::Stopped(VanKind::Rdma));
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
                .ok_or(VanError::NotBound(VanKind::Rdma))?
        };
        let connect_error = |source| VanError::Connect {
            kind: VanKind::Rdma,
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
        self.shared
            .handshake(stream, Some(peer), inbox, &address)
            .await?;
        debug!(peer, "connected over RDMA");
        Ok(())
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        let peer = recipient_of(&msg)?;
        let link = self.shared.link(peer)?;
        let frame = wire::encode(&msg, &self.shared.options.limits)?;
        let len: usize = frame.iter().map(Bytes::len).sum();
        link.queue
            .send(Outgoing { frame, len })
            .await
            .map_err(|_| VanError::PeerGone {
                peer,
                reason: "the connection closed".into(),
            })?;
        link.connection.wake.notify();
        Ok(())
    }

    fn alloc(&self, len: usize) -> Result<Option<SharedBuf>, VanError> {
        if len < self.shared.options.slot_bytes {
            // Small messages are copied into the send ring anyway.
            return Ok(None);
        }
        let lease = self
            .shared
            .pool
            .take(len)
            .map_err(|e| io_error("registering a buffer", e))?;
        let ptr = lease.ptr();
        // SAFETY: the lease owns a registered region of at least `len` bytes that stays
        // allocated while the lease (moved into the buffer as its owner) lives, and the pool
        // hands a region to one lease at a time, so nobody else touches these bytes.
        Ok(Some(unsafe {
            SharedBuf::from_raw_parts(ptr, len, VanKind::Rdma, Box::new(lease))
        }))
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
        for task in &tasks {
            task.abort();
        }
        // Closing the queues lets each engine flush, tell its peer and exit.
        drop(links);
        drop(accepted);
        for connection in &connections {
            connection.wake.notify();
        }
        let flush = async {
            for connection in &connections {
                let done = connection
                    .done
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
            warn!("rdma van stop: queued frames not acknowledged in time; dropping them");
        }
        for connection in &connections {
            connection.closed.store(true, Ordering::Release);
            connection.wake.notify();
        }
        Ok(())
    }
}
