//! [`IoUringVan`]: the routes to peers, the I/O threads, and the `Van` implementation.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};
use van_core::van::address_for;
use van_core::{Endpoint, InboxSender, Message, Node, NodeId, Van, VanError, VanKind};

use crate::command_queue::{Command, CommandQueue};
use crate::error::UringError;
use crate::options::UringOptions;
use crate::shared::Shared;
use crate::worker::{allowed_cpus, Worker, WorkerSetup, DRAIN_TIMEOUT};

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
    /// Bytes of large frames copied out of provided receive buffers rather than received
    /// straight into the frame's own buffer (only a frame's first chunk should be).
    pub large_copied: u64,
    /// Most events handed to the inbox in one batch so far (bounded: under a continuous flood
    /// a ring delivers what it has every [`MAX_BATCH_EVENTS`](crate::MAX_BATCH_EVENTS) or so).
    pub largest_batch: usize,
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
        let mut command_queues = Vec::with_capacity(threads);
        for _ in 0..threads {
            command_queues.push(Arc::new(CommandQueue::new().map_err(UringError::Thread)?));
        }
        let cpus = if options.pin_cores {
            allowed_cpus()
        } else {
            Vec::new()
        };
        let busy_polling = options.busy_polling;
        let shared = Arc::new(Shared::new(options, command_queues));
        let van = IoUringVan {
            shared: Arc::clone(&shared),
        };
        let on_runtime = !(shared.options.dedicated_threads || busy_polling || !cpus.is_empty());
        let runtime = on_runtime
            .then(tokio::runtime::Handle::try_current)
            .and_then(Result::ok);
        let mut exited = Vec::with_capacity(threads);
        for index in 0..threads {
            let setup = WorkerSetup {
                index,
                busy_polling,
                pin_to: (!cpus.is_empty()).then(|| cpus[index % cpus.len()]),
            };
            let command_queue = Arc::clone(&shared.command_queues[index]);
            let (done_tx, done_rx) = oneshot::channel();
            if let Some(runtime) = &runtime {
                let worker = Worker::new(&setup, command_queue, Arc::clone(&shared))?;
                runtime.spawn(worker.run_task(done_tx));
                exited.push(done_rx);
                continue;
            }
            let thread_shared = Arc::clone(&shared);
            let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
            std::thread::Builder::new()
                .name(format!("vans-uring-{index}"))
                .spawn(
                    move || match Worker::new(&setup, command_queue, thread_shared) {
                        Ok(worker) => {
                            let _ = ready_tx.send(Ok(()));
                            worker.run(done_tx);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    },
                )
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
        *shared.exited.lock().unwrap_or_else(|e| e.into_inner()) = exited;
        Ok(van)
    }

    /// The address the listener is bound to, once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.local.get().copied()
    }

    /// Peers this van currently has a link to.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        self.shared.links.peers()
    }

    /// What the pool of large-frame buffers has done, for diagnostics and tests.
    pub fn frame_pool_stats(&self) -> van_core::pool::PoolStats {
        self.shared.pool.stats()
    }

    /// Connections refused so far: failed authentication, or too many from one address
    /// authenticating at once.
    pub fn refused_connections(&self) -> u64 {
        self.shared.gate.refused_count()
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
            large_copied: stats.large_copied.load(Ordering::Relaxed),
            largest_batch: stats.largest_batch.load(Ordering::Relaxed),
        }
    }

    /// A cheap handle that reads [`stats`](Self::stats) without keeping the van alive
    /// (for code that runs where the van is not at hand, such as a buffer's destructor).
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle {
            shared: Arc::downgrade(&self.shared),
        }
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
        self.shared.links.abort();
        self.shared.stop_threads(false, Instant::now());
    }
}

#[async_trait]
impl Van for IoUringVan {
    fn kind(&self) -> VanKind {
        VanKind::Uring
    }

    async fn bind(&self, host: &str, port: u16, inbox: InboxSender) -> Result<Endpoint, VanError> {
        self.shared.links.check_bindable()?;
        let bind_error = |source| VanError::Bind {
            kind: VanKind::Uring,
            address: Endpoint::stream(VanKind::Uring, host, port).address,
            source,
        };
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        for command_queue in &self.shared.command_queues {
            // A loop that has ended takes no connections either (see `Shared::adopt`).
            let _ = command_queue.post(Command::Inbox(inbox.clone()));
        }
        // Accepting (and authenticating) runs on the runtime; each connection is then handed
        // to a ring, as a dialed one is.
        self.shared.gate.warn_if_open(host);
        let shared = Arc::clone(&self.shared);
        let accept = tokio::spawn(van_core::link::stream::serve(
            listener,
            self.shared.gate.clone(),
            move |stream, remote| {
                let stream = match stream.into_std() {
                    Ok(stream) => stream,
                    Err(e) => {
                        warn!(%remote, "cannot take over an accepted connection: {e}");
                        return;
                    }
                };
                shared.adopt(stream, remote, None);
            },
        ));
        self.shared.links.bound(inbox, Some(accept))?;
        let _ = self.shared.local.set(local);
        info!(%local, threads = self.shared.command_queues.len(), "uring van listening");
        Ok(Endpoint::stream(VanKind::Uring, host, local.port()))
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::Uring)?;
        self.shared
            .links
            .connect(peer, |_inbox| async move {
                let (stream, remote) = van_core::link::stream::dial(
                    VanKind::Uring,
                    peer,
                    &address,
                    self.shared.options.connect_timeout,
                    &self.shared.gate,
                )
                .await?;
                // From here on the ring drives the socket; tokio lets go of it.
                let stream = stream.into_std().map_err(|source| VanError::Connect {
                    kind: VanKind::Uring,
                    peer,
                    address: address.clone(),
                    source,
                })?;
                let thread = self
                    .shared
                    .adopt(stream, remote, Some(peer))
                    .ok_or(VanError::Stopped(VanKind::Uring))?;
                debug!(peer, %remote, thread, "connected");
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

    fn forget(&self, peer: NodeId) {
        self.shared.links.forget(peer);
    }

    /// Sends to the peer fail at once with `reason`, and each of its connections' threads
    /// closes it abortively, dropping what is queued, so a stop does not flush to it.
    fn drop_peer(&self, peer: NodeId, reason: &str) {
        self.shared.links.drop_peer(peer, reason);
    }

    async fn stop(&self) -> Result<(), VanError> {
        // Closing the routes lets each connection's queue end once drained; the threads
        // flush them.
        self.shared.links.stop(Duration::ZERO).await;
        let exited =
            std::mem::take(&mut *self.shared.exited.lock().unwrap_or_else(|e| e.into_inner()));
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
