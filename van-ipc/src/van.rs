//! [`IpcVan`]: the van over shared-memory rings (see the crate docs for the design).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::os::linux::net::SocketAddrExt;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use van_core::auth::Gate;
use van_core::link::{ConnectionId, Links};
use van_core::van::{address_for, recipient_of};
use van_core::wire;
use van_core::{
    Endpoint, Event, InboxSender, Message, Node, NodeId, PeerLost, Van, VanError, VanKind,
};

use crate::arena::{self, Arena, Ref, RefTable};
use crate::named;

mod conn;
mod handshake;
mod options;
mod pipe;

use conn::{io_error, unique_name, ConnectionIo, Established};
pub use options::IpcOptions;
use pipe::{read_async, read_blocking, write_loop, Direct, Outgoing, Reader, PEER_CLOSED};

/// Data segments at least this large travel through the shared arena (one copy) rather
/// than through the ring (two copies).
const ARENA_STAGE_MIN: usize = 64 << 10;
/// Frames queued per peer before `send` waits.
const SEND_QUEUE: usize = 4096;
/// Spins of a reader task on the runtime before it sleeps on its doorbell (at most; fewer
/// when `IpcOptions::spins` says so). Few: the task holds a runtime thread while it spins,
/// and on a host with fewer cores than busy processes spinning takes the core the peer needs
/// to answer. Measured on 2 cores with 3 nodes, 8 B push-pull: 2,000 spins gave a p50 of
/// 128 µs and 230k ops/s at 64 in flight, 32 spins 22 µs and 350k ops/s.
const TASK_SPINS: u32 = 32;

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
    /// Named mode: the thread accepting from the accept queue; joined by `stop` and `Drop` so
    /// the queue's file is removed before they return.
    accept_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Authenticates every socket-mode connection (see [`van_core::auth`]).
    gate: Gate,
}

/// The sending side of one connection.
#[derive(Debug, Clone)]
struct Link {
    connection: Arc<ConnectionIo>,
    queue: mpsc::Sender<Outgoing>,
    /// The ring, shared by the writer thread and senders taking the direct path.
    direct: Arc<Direct>,
    /// Counts references into our arena held by the peer (when both sides have arenas).
    table: Option<Arc<RefTable>>,
}

impl IpcVan {
    /// A van with the given options, not yet bound.
    pub fn new(options: IpcOptions) -> IpcVan {
        IpcVan {
            shared: Arc::new(Shared {
                gate: Gate::new(options.auth.clone()),
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

    /// Socket-mode connections refused so far for failing authentication.
    pub fn refused_connections(&self) -> u64 {
        self.shared.gate.refused_count()
    }
}

impl IpcVan {
    /// `bind` in named mode: a listening file in `/dev/shm` and a thread accepting from it
    /// until the van stops.
    fn bind_named(&self, inbox: InboxSender) -> Result<Endpoint, VanError> {
        if self.shared.gate.requires_auth() {
            warn!(
                "named shared-memory mode does not exchange the cluster secret: its peers are \
                 limited to processes of this user by file permissions"
            );
        }
        let listener = handshake::named_listener(&self.shared.options)?;
        let address = listener.address().to_owned();
        self.shared.links.bound(inbox.clone(), None)?;
        let shared = Arc::clone(&self.shared);
        let stopped = Arc::clone(&self.shared);
        let accept = handshake::accept_named(
            listener,
            &self.shared.options,
            move |established| {
                if let Err(e) = shared.start_connection(established, None, inbox.clone()) {
                    warn!("named IPC connection not started: {e}");
                }
            },
            move || stopped.links.is_stopped(),
        )?;
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
}

impl Drop for IpcVan {
    /// A van dropped without [`Van::stop`] still ends its connections: threads see the
    /// closed flags within a wait slice and exit; nothing is flushed.
    fn drop(&mut self) {
        self.shared.links.abort();
        if let Some(accept) = self.shared.take_accept_thread() {
            // It sees the stop within one wait slice and removes the accept queue.
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

    /// Registers a connection with the link table, then starts its writer thread, its
    /// reader (a task on this runtime, or a thread in named mode) and its liveness watcher.
    fn start_connection(
        self: &Arc<Self>,
        established: Established,
        peer: Option<NodeId>,
        inbox: InboxSender,
    ) -> Result<(), VanError> {
        let Established {
            watch,
            producer,
            consumer,
            doorbell,
            arenas,
        } = established;
        let id = self.links.next_id();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let connection = ConnectionIo::new();
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
        let reader = Reader::new(consumer, self.options.limits, arenas.theirs);
        let spins = self.options.spins();
        // Registered before the reader starts, so that what it learns finds the connection.
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
            connection.close();
            self.links.closed(id, "no writer thread");
            return Err(io_error("cannot start the IPC writer thread", e));
        }

        let shared = Arc::clone(self);
        let reader_connection = Arc::clone(&connection);
        match doorbell {
            Some(doorbell) => {
                let busy = self.options.busy_polling;
                let spins = self.options.spins.min(TASK_SPINS);
                self.links.track(tokio::spawn(async move {
                    let mut peer = peer;
                    let reason = read_async(
                        reader,
                        doorbell,
                        &reader_connection,
                        spins,
                        busy,
                        &inbox,
                        |sender| {
                            if peer.is_none() {
                                peer = Some(sender);
                                shared.links.learn(id, sender);
                            }
                        },
                    )
                    .await;
                    if let Some(lost) =
                        shared.connection_closed(id, &reader_connection, peer, &reason)
                    {
                        let _ = inbox.deliver(vec![Event::PeerLost(lost)]).await;
                    }
                }));
            }
            None => {
                let started = std::thread::Builder::new()
                    .name(format!("vans-ipc-r{id}"))
                    .spawn(move || {
                        let mut peer = peer;
                        // A full inbox nobody drains holds this thread only until the van stops.
                        let abandon = || shared.links.is_stopped();
                        let reason = read_blocking(
                            reader,
                            &reader_connection,
                            spins,
                            &inbox,
                            abandon,
                            |sender| {
                                if peer.is_none() {
                                    peer = Some(sender);
                                    shared.links.learn(id, sender);
                                }
                            },
                        );
                        if let Some(lost) =
                            shared.connection_closed(id, &reader_connection, peer, &reason)
                        {
                            let _ = inbox.deliver_blocking(vec![Event::PeerLost(lost)], abandon);
                        }
                    });
                if let Err(e) = started {
                    connection.close();
                    self.links.closed(id, "no reader thread");
                    return Err(io_error("cannot start the IPC reader thread", e));
                }
            }
        }
        self.links
            .track(tokio::spawn(handshake::watch_connection(watch, connection)));
        Ok(())
    }

    /// Forgets a closed connection; returns the loss to report, unless the van stopped or
    /// the connection was a spare.
    fn connection_closed(
        &self,
        id: ConnectionId,
        connection: &ConnectionIo,
        peer: Option<NodeId>,
        reason: &str,
    ) -> Option<PeerLost> {
        connection.close();
        // The liveness watcher's reason ("no heartbeat for …") says more than the reader's.
        let reason = connection.end_reason(reason);
        let lost = self.links.closed(id, &reason)?;
        match peer {
            Some(peer) if reason != PEER_CLOSED => warn!(peer, "IPC connection closed: {reason}"),
            _ => debug!(?peer, "IPC connection closed: {reason}"),
        }
        Some(lost)
    }

    /// Copies each large data segment of `msg` that is not in our arena into it, so that it
    /// travels by reference: the payload is copied once (here) instead of twice (into the
    /// ring, and out of it on the other side). When the arena is full, the rest goes through
    /// the ring at once: arena blocks come back only when the peer's application drops what
    /// it read, so waiting for them could wait on an application that is itself waiting for
    /// this send (a worker blocked in a push while holding the answers that would free the
    /// server's arena).
    fn stage_in_arena(&self, link: &Link, msg: &mut Message) {
        let (Some(arena), Some(_)) = (self.arena.get(), &link.table) else {
            return;
        };
        for data in msg.data.iter_mut() {
            if data.len() < ARENA_STAGE_MIN || arena.locate(data).is_some() {
                continue;
            }
            match arena.alloc(data.len()) {
                Ok(mut staged) => {
                    staged.as_mut_slice().copy_from_slice(data);
                    *data = staged.freeze();
                }
                Err(_) => return,
            }
        }
    }

    /// The data segments of `msg` that lie in our arena, to go to the peer as references
    /// (none without an arena, or when the peer maps no table of ours).
    fn refs_of(&self, link: &Link, msg: &Message) -> Vec<Ref> {
        let (Some(arena), Some(_)) = (self.arena.get(), &link.table) else {
            return Vec::new();
        };
        msg.data
            .iter()
            .enumerate()
            .filter_map(|(index, data)| {
                let (block, offset) = arena.locate(data)?;
                Some(Ref {
                    index: index as u32,
                    block,
                    offset,
                    len: data.len() as u64,
                })
            })
            .collect()
    }

    /// Counts `refs` ([`refs_of`](Self::refs_of) `msg`) in the peer's table, replaces their
    /// segments of `msg` with empty ones, and returns the record that names them.
    fn take_refs(link: &Link, msg: &mut Message, refs: &[Ref]) -> Bytes {
        for r in refs {
            if let Some(table) = &link.table {
                table.acquire(r.block);
            }
            if let Some(data) = msg.data.get_mut(r.index as usize) {
                *data = Bytes::new();
            }
        }
        arena::encode_refs(refs)
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
                        let handshake =
                            tokio::spawn(async move {
                                let shared = handshake_shared;
                                let accepted = handshake::accept(
                                    socket,
                                    &shared.options,
                                    shared.arena.get(),
                                    &shared.gate,
                                )
                                .await
                                .and_then(|established| match established {
                                    Some(established) => {
                                        shared.start_connection(established, None, inbox)
                                    }
                                    None => Ok(()), // refused by the gate, which logged it
                                });
                                if let Err(e) = accepted {
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
                let options = &self.shared.options;
                let established = if address.starts_with(named::ADDRESS_PREFIX) {
                    handshake::dial_named(peer, &address, options).await?
                } else {
                    handshake::dial_socket(
                        peer,
                        &address,
                        options,
                        self.shared.arena.get(),
                        &self.shared.gate,
                    )
                    .await?
                };
                self.shared
                    .start_connection(established, Some(peer), inbox)?;
                debug!(peer, "connected over shared memory");
                Ok(())
            })
            .await
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        let peer = recipient_of(&msg)?;
        let link = self.shared.links.link(peer)?;
        let mut msg = msg;
        self.shared.stage_in_arena(&link, &mut msg);
        // Straight into the ring when nothing of it lives in the arena and the ring has room.
        let refs = self.shared.refs_of(&link, &msg);
        let plain = if refs.is_empty() {
            let frame = wire::encode(&msg, &self.shared.options.limits)?;
            if link.direct.try_write(&frame, &link.connection) {
                return Ok(());
            }
            Some(frame)
        } else {
            None
        };
        // The one wait comes before anything is counted (arena references, the pending
        // message), so a send dropped while it waits (the router gives up on a peer declared
        // dead) leaves nothing behind.
        let slot = link.queue.reserve().await.map_err(|_| VanError::PeerGone {
            peer,
            reason: "the connection closed".into(),
        })?;
        let (refs, frame) = match plain {
            Some(frame) => (None, frame),
            None => {
                let refs = Shared::take_refs(&link, &mut msg, &refs);
                (Some(refs), wire::encode(&msg, &self.shared.options.limits)?)
            }
        };
        link.direct.pending.fetch_add(1, Ordering::AcqRel);
        slot.send(Outgoing { refs, frame });
        Ok(())
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

    fn shared_region(&self) -> Option<van_core::buf::SharedRegion> {
        let segment = self.shared.arena.get()?.segment();
        Some(van_core::buf::SharedRegion {
            fd: std::os::fd::AsRawFd::as_raw_fd(&segment.fd()),
            start: segment.as_ptr() as usize,
            len: segment.len(),
        })
    }

    fn forget(&self, peer: van_core::NodeId) {
        self.shared.links.forget(peer);
    }

    fn drop_peer(&self, peer: van_core::NodeId, reason: &str) {
        self.shared.links.drop_peer(peer, reason);
        if self.shared.options.named {
            // A dead peer's accept queue (its owner lock now free) goes with the verdict.
            handshake::sweep_in_background();
        }
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
            // It sees the stop within one wait slice and removes the accept queue.
            let _ = tokio::task::spawn_blocking(move || accept.join()).await;
        }
        if self.shared.options.named {
            // The last survivors of a crash leave nothing behind: what dead peers left in
            // /dev/shm goes before this process exits (their owner locks tell).
            let _ = tokio::task::spawn_blocking(handshake::sweep_logged).await;
        }
        Ok(())
    }
}
