//! [`RdmaVan`]: the van over RC queue pairs (see the crate docs for the design).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};
use van_core::auth::Gate;
use van_core::config::RdmaSettings;
use van_core::link::{stream, FrameQueue, Links};
use van_core::van::{address_for, recipient_of};
use van_core::wire::{self, Limits};
use van_core::{
    Config, Endpoint, Event, InboxSender, Message, Node, NodeId, SharedBuf, Van, VanError, VanKind,
};

use crate::connection::{ConnectionIo, Setup};
use crate::device::{self, Device};
use crate::engine::{Engine, EngineContext};
use crate::handshakes::{Handshakes, Turn};
use crate::machine::End;
use crate::memlock;
use crate::pool::{Pool, PoolStats};
use crate::protocol::{QpAttributes, READY};
use crate::sizing::RingSizes;
use crate::RdmaError;

/// Frames queued per peer before `send` waits.
const SEND_QUEUE: usize = 1024;
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
    /// Bytes of large frames (64 KiB and up) one peer's queue may hold before `send` waits
    /// (0: no limit); small frames never wait for it. See [`van_core::budget::ByteBudget`].
    pub peer_budget_bytes: usize,
    /// Authentication of every connection's side channel (the cluster secret), before any
    /// queue pair or ring is created for it; none by default.
    pub auth: van_core::auth::AuthOptions,
}

impl Default for RdmaOptions {
    fn default() -> RdmaOptions {
        RdmaOptions {
            limits: Limits::default(),
            settings: RdmaSettings::default(),
            slot_bytes: DEFAULT_SLOT_BYTES,
            connect_timeout: van_core::config::DEFAULT_CONNECT_TIMEOUT,
            flush_timeout: Duration::from_secs(10),
            peer_budget_bytes: van_core::budget::DEFAULT_BUDGET_BYTES,
            auth: van_core::auth::AuthOptions::default(),
        }
    }
}

impl RdmaOptions {
    /// Options with the limits, connect timeout, peer budget, RDMA settings and
    /// authentication of `config`.
    pub fn from_config(config: &Config) -> RdmaOptions {
        RdmaOptions {
            auth: van_core::auth::AuthOptions::from_config(config),
            limits: config.limits,
            settings: config.rdma.clone(),
            connect_timeout: config.connect_timeout,
            peer_budget_bytes: config.peer_budget_bytes,
            ..RdmaOptions::default()
        }
    }

    /// The sizes of each connection's queues and rings these options ask for.
    pub(crate) fn sizes(&self) -> RingSizes {
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
    links: Links<Link>,
    /// Authenticates every side channel (see [`van_core::auth`]).
    gate: Gate,
    /// Bounds the accepted handshakes that hold a queue pair and rings at once.
    handshakes: Handshakes,
}

/// The sending side of one connection: its queue, and the flags whose eventfd wakes its
/// engine.
#[derive(Clone)]
struct Link {
    queue: FrameQueue,
    connection: Arc<ConnectionIo>,
}

fn io_error(context: &str, error: impl std::fmt::Display) -> VanError {
    VanError::Io {
        kind: VanKind::Rdma,
        source: std::io::Error::other(format!("{context}: {error}")),
    }
}

/// The error of a failed handshake with `address`, from its reason.
fn handshake_error(address: &str) -> impl Fn(String) -> VanError + '_ {
    move |reason| {
        RdmaError::Handshake {
            peer: address.to_owned(),
            reason,
        }
        .into()
    }
}

/// Reads and checks the peer's queue-pair attributes.
async fn read_attributes(stream: &mut TcpStream) -> Result<QpAttributes, String> {
    let mut buf = [0u8; QpAttributes::LEN];
    stream
        .read_exact(&mut buf)
        .await
        .map_err(|e| format!("reading attributes: {e}"))?;
    QpAttributes::decode(&buf).map_err(|e| e.to_string())
}

/// Writes our attributes, reads the peer's unless they came first (an acceptor reads the
/// dialer's before it creates anything), moves the queue pair to RTS towards the peer and
/// exchanges [`READY`], so that neither side sends before the other can receive.
async fn exchange(
    stream: &mut TcpStream,
    setup: &Setup,
    device: &Device,
    theirs: Option<QpAttributes>,
) -> Result<QpAttributes, String> {
    stream.set_nodelay(true).ok();
    stream
        .write_all(&setup.attributes(device).encode())
        .await
        .map_err(|e| format!("sending attributes: {e}"))?;
    let theirs = match theirs {
        Some(theirs) => theirs,
        None => read_attributes(stream).await?,
    };
    setup
        .connect(device, &theirs)
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
}

impl RdmaVan {
    /// Opens the RDMA device and checks the queue depths against it and the memlock limit:
    /// fails with a clear error when there is no device, no driver, no kernel support, no
    /// usable GID, a depth above the device's limits
    /// ([`RdmaError::DepthAboveDeviceLimit`]), or too little lockable memory. Not yet bound.
    pub fn new(options: RdmaOptions) -> Result<RdmaVan, RdmaError> {
        let device = device::open(&options.settings)?;
        options
            .sizes()
            .check(device.context.name(), &device.attributes)?;
        memlock::current().check(options.registered_bytes())?;
        let pool = Pool::new(Arc::clone(&device.pd), options.settings.pool_bytes);
        info!("rdma van on {}", device.describe());
        Ok(RdmaVan {
            shared: Arc::new(Shared {
                gate: Gate::new(options.auth.clone()),
                handshakes: Handshakes::new(options.settings.max_handshakes),
                options,
                device: Arc::new(device),
                pool,
                links: Links::new(VanKind::Rdma),
            }),
        })
    }

    /// The device, port, GID and MTU in use, in one line.
    pub fn device_description(&self) -> String {
        self.shared.device.describe()
    }

    /// Side-channel connections refused so far: failed authentication, too many from one
    /// address authenticating at once, or closed before their handshake began (no valid
    /// queue-pair attributes, or no turn among `VANS_RDMA_MAX_HANDSHAKES`, within the connect
    /// timeout; too many waiting already).
    pub fn refused_connections(&self) -> u64 {
        self.shared.gate.refused_count()
    }

    /// Handshakes whose queue pair and rings exist but that are not connections yet, dialed
    /// or accepted; accepted ones are at most `VANS_RDMA_MAX_HANDSHAKES` (see
    /// [`RdmaOptions::settings`]).
    pub fn handshakes_in_progress(&self) -> usize {
        self.shared.handshakes.in_progress()
    }

    /// The registration cache's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.shared.pool.stats()
    }

    /// Peers this van has a live connection to.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        self.shared.links.peers()
    }
}

impl Drop for RdmaVan {
    /// A van dropped without [`Van::stop`] still ends its connections: their threads, woken,
    /// see the closed flag and exit; nothing is flushed.
    fn drop(&mut self) {
        self.shared.links.abort();
    }
}

impl Shared {
    /// Creates a connection's queue pair and rings, on a blocking thread (registration pins
    /// pages, which can take a while for large rings).
    async fn create_setup(&self, fail: &impl Fn(String) -> VanError) -> Result<Setup, VanError> {
        let device = Arc::clone(&self.device);
        let sizes = self.options.sizes();
        tokio::task::spawn_blocking(move || Setup::new(&device, sizes))
            .await
            .map_err(|e| fail(format!("setup task: {e}")))?
            .map_err(|e| fail(format!("creating the queue pair and rings: {e}")))
    }

    /// Sets up a connection: creates our queue pair and rings, exchanges attributes over
    /// `stream` (ours first; the dialer's are `known` to an acceptor, which read them before it
    /// took a turn) by `deadline`, and starts the connection's thread. `peer`: the node
    /// dialed, or `None` for an accepted connection.
    async fn set_up(
        self: &Arc<Self>,
        mut stream: TcpStream,
        known: Option<QpAttributes>,
        deadline: tokio::time::Instant,
        peer: Option<NodeId>,
        inbox: InboxSender,
        address: &str,
    ) -> Result<(), VanError> {
        let fail = handshake_error(address);
        let _in_progress = self.handshakes.start();
        let setup = self.create_setup(&fail).await?;
        let theirs =
            tokio::time::timeout_at(deadline, exchange(&mut stream, &setup, &self.device, known))
                .await
                .map_err(|_| fail("no answer within the connect timeout".into()))?
                .map_err(&fail)?;
        self.established(stream, setup, theirs, peer, inbox, address)
    }

    /// Serves a side channel accepted (and authenticated, with a secret) from `from`: admits
    /// it ([`admit`](Self::admit)), then sets it up. Refusals are counted and logged by the
    /// gate, with those of authentication; a failed setup is logged.
    async fn serve_accepted(
        self: &Arc<Self>,
        mut stream: TcpStream,
        from: std::net::SocketAddr,
        inbox: InboxSender,
    ) {
        let address = from.to_string();
        let deadline = tokio::time::Instant::now() + self.options.connect_timeout;
        match self.admit(&mut stream, &address, deadline).await {
            Err(e) => self.gate.refuse(&address, &e),
            Ok((theirs, turn)) => {
                let accepted = self.set_up(stream, Some(theirs), deadline, None, inbox, &address);
                if let Err(e) = accepted.await {
                    warn!("refused an RDMA connection: {e}");
                }
                // Held until the connection is established or has failed.
                drop(turn);
            }
        }
    }

    /// What an accepted side channel goes through before anything is created for it (see
    /// [`crate::handshakes`]): the dialer's attributes (which it writes first), a place among
    /// those waiting and a turn among the handshakes in progress, by `deadline`; and the
    /// dialer must still be there.
    async fn admit(
        &self,
        stream: &mut TcpStream,
        address: &str,
        deadline: tokio::time::Instant,
    ) -> Result<(QpAttributes, Turn), RdmaError> {
        let not_started = |what| RdmaError::HandshakeNotStarted {
            peer: address.to_owned(),
            what,
            waited: self.options.connect_timeout,
            max: self.handshakes.max(),
        };
        let theirs = tokio::time::timeout_at(deadline, read_attributes(stream))
            .await
            .map_err(|_| not_started("no queue-pair attributes arrived"))?
            .map_err(|reason| RdmaError::Handshake {
                peer: address.to_owned(),
                reason,
            })?;
        let place = self.handshakes.place(address)?;
        let turn = tokio::time::timeout_at(deadline, self.handshakes.turn(place))
            .await
            .ok()
            .flatten()
            .ok_or_else(|| not_started("no turn among the handshakes in progress came"))?;
        // A dialer writes nothing more before our answer, so anything readable now is the end
        // of a dialer that gave up while it waited (its connect timed out): no queue pair for
        // it.
        let mut next = [0u8; 1];
        let gone = match stream.try_read(&mut next) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Ok(0) => Some("the dialer closed the side channel while it waited for a turn".into()),
            Ok(_) => Some("bytes after the attributes, before our answer".into()),
            Err(e) => Some(format!("side channel: {e}")),
        };
        if let Some(reason) = gone {
            return Err(RdmaError::Handshake {
                peer: address.to_owned(),
                reason,
            });
        }
        Ok((theirs, turn))
    }

    /// Hands a connected queue pair and its side channel to a new connection.
    fn established(
        self: &Arc<Self>,
        stream: TcpStream,
        setup: Setup,
        theirs: QpAttributes,
        peer: Option<NodeId>,
        inbox: InboxSender,
        address: &str,
    ) -> Result<(), VanError> {
        let fail = handshake_error(address);
        let tcp = stream
            .into_std()
            .map_err(|e| fail(format!("side channel: {e}")))?;
        tcp.set_nonblocking(true)
            .map_err(|e| fail(format!("side channel: {e}")))?;
        // The side channel's end is how a connection learns that the peer's host vanished,
        // which an idle RC queue pair never notices.
        stream::keepalive(&socket2::SockRef::from(&tcp), &address);
        self.start_connection(setup, theirs, tcp, peer, inbox)
    }

    /// Registers a connected setup in the link table, then starts its engine thread.
    fn start_connection(
        self: &Arc<Self>,
        setup: Setup,
        theirs: QpAttributes,
        tcp: std::net::TcpStream,
        peer: Option<NodeId>,
        inbox: InboxSender,
    ) -> Result<(), VanError> {
        let id = self.links.next_id();
        let connection = Arc::new(ConnectionIo::new().map_err(|e| io_error("eventfd", e))?);
        let (queue, frames) = FrameQueue::new(SEND_QUEUE, self.options.peer_budget_bytes);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let link = Link {
            queue,
            connection: Arc::clone(&connection),
        };
        // Registered before the engine starts, so that what it learns finds the connection.
        self.links
            .add(id, peer, link, Arc::clone(&connection) as _, Some(done_rx))?;
        let learner = Arc::clone(self);
        let on_peer = Box::new(move |sender: NodeId| learner.links.learn(id, sender));
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
        let started = std::thread::Builder::new()
            .name(format!("vans-rdma-{id}"))
            .spawn(move || {
                let (end, peer) = engine.run();
                thread_connection.closed.store(true, Ordering::Release);
                shared.connection_ended(id, peer, end, &inbox);
                let _ = done_tx.send(());
            });
        if let Err(e) = started {
            let error = io_error("cannot start the RDMA connection thread", e);
            connection.closed.store(true, Ordering::Release);
            let _ = self.links.closed(id, &error.to_string());
            return Err(error);
        }
        Ok(())
    }

    /// Called by a connection's thread when its engine has ended: forgets the connection and
    /// reports the loss, if it is one (our stop's flush is none).
    fn connection_ended(&self, id: u64, peer: Option<NodeId>, end: End, inbox: &InboxSender) {
        let reason = match end {
            End::Flushed => {
                let _ = self.links.closed(id, "flushed on stop");
                return;
            }
            End::Lost(reason) => reason,
        };
        let Some(lost) = self.links.closed(id, &reason) else {
            // A spare connection, or the van stopped: nothing lost.
            debug!(?peer, "RDMA connection closed: {reason}");
            return;
        };
        if let Some(peer) = lost.peer {
            warn!(peer, "RDMA connection lost: {reason}");
        } else {
            debug!("RDMA connection from an unidentified peer closed: {reason}");
        }
        let _ = inbox.deliver_blocking(vec![Event::PeerLost(lost)], || self.links.is_stopped());
    }
}

#[async_trait]
impl Van for RdmaVan {
    fn kind(&self) -> VanKind {
        VanKind::Rdma
    }

    async fn bind(&self, host: &str, port: u16, inbox: InboxSender) -> Result<Endpoint, VanError> {
        self.shared.links.check_bindable()?;
        let bind_error = |source| VanError::Bind {
            kind: VanKind::Rdma,
            address: format!("{host}:{port}"),
            source,
        };
        let listener = TcpListener::bind((host, port)).await.map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        let endpoint = Endpoint::stream(VanKind::Rdma, host, local.port());
        self.shared.gate.warn_if_open(host);
        let shared = Arc::clone(&self.shared);
        let accept_inbox = inbox.clone();
        // Authenticated first (by `serve`), then admitted (`Shared::admit`): only then are
        // a queue pair and rings created.
        let accept = tokio::spawn(stream::serve(
            listener,
            self.shared.gate.clone(),
            move |socket, from| {
                let serving = Arc::clone(&shared);
                let inbox = accept_inbox.clone();
                let handshake = tokio::spawn(async move {
                    serving.serve_accepted(socket, from, inbox).await;
                });
                shared.links.track(handshake);
            },
        ));
        self.shared.links.bound(inbox, Some(accept))?;
        info!(
            "rdma van listening at {} on {}",
            endpoint.address,
            self.shared.device.describe()
        );
        Ok(endpoint)
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::Rdma)?;
        self.shared
            .links
            .connect(peer, |inbox| async move {
                let (stream, _) = stream::dial(
                    VanKind::Rdma,
                    peer,
                    &address,
                    self.shared.options.connect_timeout,
                    &self.shared.gate,
                )
                .await?;
                let deadline = tokio::time::Instant::now() + self.shared.options.connect_timeout;
                self.shared
                    .set_up(stream, None, deadline, Some(peer), inbox, &address)
                    .await?;
                debug!(peer, "connected over RDMA");
                Ok(())
            })
            .await
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        let peer = recipient_of(&msg)?;
        let link = self.shared.links.link(peer)?;
        let frame = wire::encode(&msg, &self.shared.options.limits)?;
        link.queue.push(peer, frame).await?;
        link.connection.wake.notify();
        Ok(())
    }

    fn try_send(&self, msg: Message) -> Result<Option<Message>, VanError> {
        let peer = recipient_of(&msg)?;
        let link = self.shared.links.link(peer)?;
        if !link.queue.may_take_at_once(msg.data_len()) {
            return Ok(Some(msg));
        }
        let frame = wire::encode(&msg, &self.shared.options.limits)?;
        if link.queue.try_push(peer, frame)?.is_some() {
            return Ok(Some(msg));
        }
        link.connection.wake.notify();
        Ok(None)
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

    fn forget(&self, peer: van_core::NodeId) {
        self.shared.links.forget(peer);
    }

    fn drop_peer(&self, peer: van_core::NodeId, reason: &str) {
        self.shared.links.drop_peer(peer, reason);
    }

    async fn stop(&self) -> Result<(), VanError> {
        let flush = self.shared.options.flush_timeout;
        if !self.shared.links.stop(flush).await {
            warn!("rdma van stop: queued frames not acknowledged within {flush:?}; dropping them");
        }
        Ok(())
    }
}
