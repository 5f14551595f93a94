//! [`TcpVan`]: the listener, the table of peer links and the `Van` implementation.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};
use van_core::auth::{AuthOptions, Gate};
use van_core::link::{stream, Connection, FrameQueue, Links};
use van_core::van::address_for;
use van_core::wire::Limits;
use van_core::{
    Config, Endpoint, Event, FramePool, InboxSender, Message, Node, NodeId, Van, VanError, VanKind,
};

use crate::connection::{read_loop, write_loop};

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
    /// (0: no limit); small frames never wait for it. See [`ByteBudget`](van_core::budget::ByteBudget).
    pub peer_budget_bytes: usize,
    /// Idle bytes of received-frame buffers kept for reuse (0: every large frame gets a
    /// fresh buffer); see [`FramePool`].
    pub frame_pool_bytes: usize,
    /// Authentication of every connection (the cluster secret); none by default.
    pub auth: AuthOptions,
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
            auth: AuthOptions::default(),
        }
    }
}

impl TcpOptions {
    /// Options with the limits, connect timeout, peer budget, frame pool and authentication
    /// of `config`.
    pub fn from_config(config: &Config) -> TcpOptions {
        TcpOptions {
            auth: AuthOptions::from_config(config),
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
    links: Links<FrameQueue>,
    /// The address the listener is bound to, once bound.
    local: OnceLock<SocketAddr>,
    /// Authenticates every new connection (see [`van_core::auth`]).
    gate: Gate,
}

/// A connection's reader and writer tasks, as the link table ends them.
#[derive(Debug, Default)]
struct ConnectionIo {
    /// `None` once aborted: a task started later is aborted at once.
    handles: Mutex<Option<Vec<AbortHandle>>>,
}

impl ConnectionIo {
    fn lock(&self) -> MutexGuard<'_, Option<Vec<AbortHandle>>> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(&self, task: AbortHandle) {
        match self.lock().as_mut() {
            Some(handles) => handles.push(task),
            None => task.abort(),
        }
    }
}

impl Connection for ConnectionIo {
    fn abort(&self) {
        for task in self.lock().take().into_iter().flatten() {
            task.abort();
        }
    }
}

impl Shared {
    /// Starts the writer and reader of a new connection and registers it. `peer` is the
    /// node we dialed, or `None` for an accepted connection (learned from its first message).
    fn spawn_connection(
        self: &Arc<Self>,
        stream: TcpStream,
        remote: SocketAddr,
        inbox: InboxSender,
        peer: Option<NodeId>,
    ) -> Result<(), VanError> {
        stream::tune(&stream, &remote);
        let id = self.links.next_id();
        // Accepted: within the connection limits, or closed at once (the stream drops here;
        // the gate has logged the refusal).
        if peer.is_none() && self.links.admit(id, remote.ip(), &self.gate).is_err() {
            return Ok(());
        }
        let (read_half, write_half) = stream.into_split();
        let (queue, frames) = FrameQueue::new(
            self.options.send_queue_depth,
            self.options.peer_budget_bytes,
        );
        let (flushed_tx, flushed) = oneshot::channel();
        let tasks = Arc::new(ConnectionIo {
            handles: Mutex::new(Some(Vec::with_capacity(2))),
        });
        let linger = self.options.flush_timeout;
        let writer = tokio::spawn(async move {
            if let Err(e) = write_loop(frames, write_half, linger).await {
                warn!(%remote, ?peer, "cannot write to the connection; queued frames are lost: {e}");
            }
            let _ = flushed_tx.send(());
        });
        let writer_abort = writer.abort_handle();
        tasks.keep(writer.abort_handle());
        // Registered before the reader starts, so that what it learns finds the connection.
        self.links
            .add(id, peer, queue, Arc::clone(&tasks) as _, Some(flushed))?;
        let shared = Arc::clone(self);
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
                            shared.links.learn(id, sender);
                        }
                    }
                },
            )
            .await;
            let reason = closed.to_string();
            if closed.is_failure() {
                warn!(%remote, ?peer, "dropping connection: {reason}");
                // A reset (or garbage) ends the connection both ways: what is queued for it
                // cannot arrive, and a writer left waiting would hold up a stop's flush. (After
                // a clean end of stream the peer may still be reading: it flushed its side and
                // lingers for ours.)
                writer_abort.abort();
            } else {
                debug!(%remote, ?peer, "connection closed: {reason}");
            }
            if let Some(lost) = shared.links.closed(id, &reason) {
                // The inbox may be gone (node shutting down); nobody is left to tell then.
                let _ = inbox.deliver(vec![Event::PeerLost(lost)]).await;
            }
        });
        tasks.keep(reader.abort_handle());
        Ok(())
    }
}

impl TcpVan {
    /// A van with the given options, not yet bound.
    pub fn new(options: TcpOptions) -> TcpVan {
        TcpVan {
            shared: Arc::new(Shared {
                pool: FramePool::new(options.frame_pool_bytes),
                gate: Gate::new(options.auth.clone()),
                options,
                links: Links::new(VanKind::Tcp),
                local: OnceLock::new(),
            }),
        }
    }

    /// The address the listener is bound to, once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.local.get().copied()
    }

    /// What the pool of received-frame buffers has done, for diagnostics and tests.
    pub fn frame_pool_stats(&self) -> van_core::pool::PoolStats {
        self.shared.pool.stats()
    }

    /// Open connections (dialed and accepted), for diagnostics and tests.
    pub fn open_connections(&self) -> usize {
        self.shared.links.connections()
    }

    /// Peers this van currently has a link to.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        self.shared.links.peers()
    }

    /// Connections refused so far: failed authentication, or too many from one address
    /// authenticating at once.
    pub fn refused_connections(&self) -> u64 {
        self.shared.gate.refused_count()
    }
}

impl Drop for TcpVan {
    /// A van dropped without [`Van::stop`] still closes its listener and connections (without
    /// flushing): its tasks would otherwise keep the sockets open.
    fn drop(&mut self) {
        self.shared.links.abort();
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
        self.shared.links.check_bindable()?;
        let bind_error = |source| VanError::Bind {
            kind: VanKind::Tcp,
            address: Endpoint::stream(VanKind::Tcp, host, port).address,
            source,
        };
        let listener = TcpListener::bind((host, port)).await.map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        self.shared.gate.warn_if_open(host);
        let shared = Arc::clone(&self.shared);
        let accept_inbox = inbox.clone();
        let accept = tokio::spawn(stream::serve(
            listener,
            self.shared.gate.clone(),
            move |stream, remote| {
                let _ = shared.spawn_connection(stream, remote, accept_inbox.clone(), None);
            },
        ));
        self.shared.links.bound(inbox, Some(accept))?;
        let _ = self.shared.local.set(local);
        info!(%local, "tcp van listening");
        Ok(Endpoint::stream(VanKind::Tcp, host, local.port()))
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::Tcp)?;
        self.shared
            .links
            .connect(peer, |inbox| async move {
                let (stream, remote) = stream::dial(
                    VanKind::Tcp,
                    peer,
                    &address,
                    self.shared.options.connect_timeout,
                    &self.shared.gate,
                )
                .await?;
                self.shared
                    .spawn_connection(stream, remote, inbox, Some(peer))?;
                debug!(peer, %remote, "connected");
                Ok(())
            })
            .await
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        self.shared
            .links
            .send(&msg, &self.shared.options.limits)
            .await
    }

    fn try_send(&self, msg: Message) -> Result<Option<Message>, VanError> {
        self.shared.links.try_send(msg, &self.shared.options.limits)
    }

    async fn send_batch(&self, msgs: Vec<Message>) -> Result<(), VanError> {
        self.shared
            .links
            .send_batch(&msgs, &self.shared.options.limits)
            .await
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
            warn!("tcp van stop: queued frames not written within {flush:?}; dropping them");
        }
        Ok(())
    }
}
