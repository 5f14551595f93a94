//! The `Van` trait every transport implements, the inbox it delivers into, and its errors.
//!
//! A van moves framed [`Message`]s between nodes and does nothing else: membership,
//! barriers, heartbeats and retries belong to the `ps` crate. The surface is ps-lite's —
//! bind, connect, send, receive, stop — shaped for batching:
//!
//! - sending takes a message (or a batch) and returns once it is queued for its peer; a van
//!   drains its per-peer queue in batches (many frames per system call);
//! - receiving goes through an [`Inbox`] that the caller creates and hands to
//!   [`Van::bind`]; vans deliver *batches* of messages (one channel hop per batch), and
//!   several vans can share one inbox so a node reads all its traffic from one place.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::message::{Endpoint, Message, Node, NodeId};
use crate::wire::WireError;

// `VanKind` is defined beside `Endpoint`, which names it, so that `message` need not import
// this file; `van_core::van::VanKind` stays a path to it.
pub use crate::message::VanKind;

/// What can go wrong in a van. Every variant says what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VanError {
    /// The message has no recipient.
    #[error("message has no recipient; set meta.recipient to a node id")]
    NoRecipient,
    /// No connection to this peer: `connect` was never called for it, or it was dropped.
    #[error("no connection to node {peer}; connect to it first (it may have left the cluster)")]
    UnknownPeer {
        /// The peer.
        peer: NodeId,
    },
    /// The connection to this peer broke or the peer stopped.
    #[error("connection to node {peer} is gone: {reason}")]
    PeerGone {
        /// The peer.
        peer: NodeId,
        /// Why, as far as the van knows.
        reason: String,
    },
    /// The node to connect to has no id or no address this van can use.
    #[error("cannot connect to {node}: {reason}")]
    BadNode {
        /// The node, as displayed.
        node: String,
        /// What is missing.
        reason: String,
    },
    /// Binding the listening endpoint failed.
    #[error("{kind} van cannot bind {address}: {source}")]
    Bind {
        /// The van.
        kind: VanKind,
        /// The address asked for.
        address: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Connecting to a peer failed.
    #[error("{kind} van cannot connect to node {peer} at {address}: {source}")]
    Connect {
        /// The van.
        kind: VanKind,
        /// The peer.
        peer: NodeId,
        /// The address tried.
        address: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The van was asked to do something before `bind`.
    #[error("{0} van is not bound; call bind first")]
    NotBound(VanKind),
    /// `bind` was called twice.
    #[error("{0} van is already bound")]
    AlreadyBound(VanKind),
    /// The van has been stopped.
    #[error("{0} van is stopped")]
    Stopped(VanKind),
    /// A message could not be encoded (too large for the limits).
    #[error("cannot encode message: {0}")]
    Wire(#[from] WireError),
    /// This van cannot serve the request; a router may try the next van.
    #[error("{kind} van cannot serve this: {reason}")]
    Unsupported {
        /// The van.
        kind: VanKind,
        /// Why.
        reason: String,
    },
    /// A van that was not compiled into this build.
    #[error("the {kind} van is not compiled in; rebuild with the Cargo feature `{}`", kind.feature())]
    NotCompiled {
        /// The van.
        kind: VanKind,
    },
    /// A connection to a peer failed to authenticate (see [`auth`](crate::auth)): the peer
    /// has a different cluster secret, or none, or did not answer in time.
    #[error("{kind} van: connection to node {peer} at {address} not authenticated: {source}")]
    Unauthenticated {
        /// The van.
        kind: VanKind,
        /// The peer.
        peer: NodeId,
        /// The address dialed.
        address: String,
        /// Why.
        #[source]
        source: crate::auth::AuthError,
    },
    /// Any other I/O error.
    #[error("{kind} van I/O error: {source}")]
    Io {
        /// The van.
        kind: VanKind,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What a van delivers into an [`Inbox`].
#[derive(Debug)]
// Messages are nearly every event: boxing them would cost an allocation each.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// A message from a peer.
    Message(Message),
    /// A connection ended: the peer stopped, the network broke, or the peer sent a bad
    /// frame. Messages to that peer fail until it is connected again.
    PeerLost(PeerLost),
}

/// Details of a lost connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLost {
    /// The peer, if it had identified itself (by sending a message with a sender).
    pub peer: Option<NodeId>,
    /// The van the connection belonged to.
    pub kind: VanKind,
    /// Why the connection ended.
    pub reason: String,
}

/// Default bound of an inbox, in batches.
pub const DEFAULT_INBOX_BATCHES: usize = 1024;

/// Creates an inbox holding at most `capacity` undelivered batches (at least 1).
///
/// A full inbox pushes back on the vans, which stop reading their sockets, which pushes back
/// on the senders: memory stays bounded when a node cannot keep up.
pub fn inbox(capacity: usize) -> (InboxSender, Inbox) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (
        InboxSender { tx },
        Inbox {
            rx,
            pending: Vec::new().into_iter(),
        },
    )
}

/// The delivering side of an [`Inbox`], given to [`Van::bind`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct InboxSender {
    tx: mpsc::Sender<Vec<Event>>,
}

impl InboxSender {
    /// Delivers a batch, waiting while the inbox is full. Fails when the inbox is gone.
    pub async fn deliver(&self, batch: Vec<Event>) -> Result<(), InboxClosed> {
        if batch.is_empty() {
            return Ok(());
        }
        self.tx.send(batch).await.map_err(|_| InboxClosed)
    }

    /// [`deliver`](Self::deliver) for threads outside the async runtime (a van's own I/O
    /// threads; must not be called from a runtime thread). While the inbox is full it checks
    /// `abandon` between short sleeps and gives up with [`InboxClosed`] once it returns
    /// `true` (the van stopped): a node that no longer drains its inbox cannot hold a van's
    /// thread forever. The sleeps only happen under back-pressure.
    pub fn deliver_blocking(
        &self,
        batch: Vec<Event>,
        abandon: impl Fn() -> bool,
    ) -> Result<(), InboxClosed> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut batch = batch;
        let mut pause = std::time::Duration::from_micros(50);
        loop {
            match self.tx.try_send(batch) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(InboxClosed),
                Err(mpsc::error::TrySendError::Full(back)) => {
                    if abandon() {
                        return Err(InboxClosed);
                    }
                    batch = back;
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(10));
                }
            }
        }
    }

    /// A handle that does not keep the inbox open (see [`WeakInboxSender`]).
    pub fn downgrade(&self) -> WeakInboxSender {
        WeakInboxSender {
            tx: self.tx.downgrade(),
        }
    }
}

/// A handle to an inbox that does not keep it open: once every [`InboxSender`] is dropped the
/// inbox ends, and [`WeakInboxSender::upgrade`] fails. The in-process van uses it for routes
/// to peers, so a stopped peer's inbox ends even while others still know its address.
#[derive(Debug, Clone)]
pub struct WeakInboxSender {
    tx: mpsc::WeakSender<Vec<Event>>,
}

impl WeakInboxSender {
    /// A strong handle, if the inbox is still open.
    pub fn upgrade(&self) -> Option<InboxSender> {
        self.tx.upgrade().map(|tx| InboxSender { tx })
    }
}

/// The inbox was dropped: its node is shutting down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the inbox is closed")]
pub struct InboxClosed;

/// Where a node receives everything its vans deliver.
///
/// The inbox ends (`recv` returns `None`) when every van delivering into it has stopped and
/// everything delivered has been read.
#[derive(Debug)]
pub struct Inbox {
    rx: mpsc::Receiver<Vec<Event>>,
    pending: std::vec::IntoIter<Event>,
}

impl Inbox {
    /// The next event, or `None` once the inbox has ended.
    pub async fn recv(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.pending.next() {
                return Some(event);
            }
            self.pending = self.rx.recv().await?.into_iter();
        }
    }

    /// Moves every event that is ready (at least one, waiting for it) into `out`; returns
    /// how many, 0 once the inbox has ended. One wake-up for many messages.
    pub async fn recv_batch(&mut self, out: &mut Vec<Event>) -> usize {
        let before = out.len();
        out.extend(self.pending.by_ref());
        if out.len() == before {
            match self.rx.recv().await {
                Some(batch) => out.extend(batch),
                None => return 0,
            }
        }
        while let Ok(batch) = self.rx.try_recv() {
            out.extend(batch);
        }
        out.len() - before
    }

    /// The next message, skipping nothing: a [`PeerLost`] event is returned as an error.
    /// `Ok(None)` once the inbox has ended.
    pub async fn recv_message(&mut self) -> Result<Option<Message>, PeerLost> {
        match self.recv().await {
            Some(Event::Message(msg)) => Ok(Some(msg)),
            Some(Event::PeerLost(lost)) => Err(lost),
            None => Ok(None),
        }
    }
}

/// A transport: moves framed messages between nodes.
///
/// Implementations run the conformance suite of [`testkit`](crate::testkit) (feature
/// `testkit`), which pins down the contract:
///
/// - messages from one van to one peer arrive in the order they were sent, none lost or
///   duplicated while both ends run;
/// - `send` to a peer that was never connected fails with [`VanError::UnknownPeer`]; to a
///   peer that stopped or whose connection broke, sends fail within a bounded time;
/// - after [`stop`](Van::stop), messages queued before it have been flushed, every call
///   fails with [`VanError::Stopped`], and the inbox ends once drained.
///
/// Connections are explicit: a node connects to every peer it sends to (as in ps-lite,
/// where each node connects to the nodes of the table). A van may reuse a connection the peer
/// opened, but callers must not rely on that.
#[async_trait]
pub trait Van: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> VanKind;

    /// Listens at `host:port` (port 0: an ephemeral port) and delivers everything received
    /// into `inbox`. Returns the endpoint peers should connect to, with the real port.
    async fn bind(&self, host: &str, port: u16, inbox: InboxSender) -> Result<Endpoint, VanError>;

    /// Opens (or reuses) the connection to `node`, which must have an id and an address for
    /// this van (its endpoint of this kind, else `host:port`).
    async fn connect(&self, node: &Node) -> Result<(), VanError>;

    /// Queues `msg` for its recipient (`meta.recipient`). Returns once queued; waits while
    /// that peer's queue is full. Cancel-safe: dropped while it waits, the message is not
    /// sent and nothing of it stays behind (the router drops the sends waiting for a peer
    /// declared dead).
    async fn send(&self, msg: Message) -> Result<(), VanError>;

    /// Queues `msg` like [`send`](Self::send) when that needs no waiting, without the
    /// future `send` allocates: `Ok(None)` once queued, `Ok(Some(msg))` when it would have to
    /// wait (a full queue, a large frame under the byte budget), so the caller sends it with
    /// `send`. Errors are those of `send`. The default queues nothing.
    fn try_send(&self, msg: Message) -> Result<Option<Message>, VanError> {
        Ok(Some(msg))
    }

    /// Queues many messages; a van may hand them to its writers in one step. Stops at the
    /// first error, returning it; earlier messages stay queued. Cancel-safe as
    /// [`send`](Self::send): dropped, what was queued goes out and the rest does not.
    async fn send_batch(&self, msgs: Vec<Message>) -> Result<(), VanError> {
        for msg in msgs {
            self.send(msg).await?;
        }
        Ok(())
    }

    /// Flushes what is queued (bounded by a timeout), closes every connection and the
    /// listener, and lets the inbox end. Idempotent.
    async fn stop(&self) -> Result<(), VanError>;

    /// A new process took `peer`'s id (recovery): stop sending over the connections to the
    /// one before, so the next [`connect`](Self::connect) dials the address the caller now
    /// gives, and do not report their end as the peer's loss (a van may notice a killed
    /// process's connections close only after its successor is reached). The default does
    /// nothing (a van without connections of its own).
    fn forget(&self, peer: NodeId) {
        let _ = peer;
    }

    /// `peer` was declared dead: end its connections now and drop what is queued to them,
    /// so that neither a send nor [`stop`](Self::stop) waits for a process that will never
    /// read (without it, a stop waits out its flush timeout). Sends to it then fail with
    /// [`VanError::PeerGone`] giving `reason` until [`connect`](Self::connect) reaches a
    /// process that took its id. The default does nothing (a van without connections of its
    /// own).
    fn drop_peer(&self, peer: NodeId, reason: &str) {
        let _ = (peer, reason);
    }

    /// A buffer of `len` bytes this van can send without copying the payload (see
    /// [`SharedBuf`](crate::SharedBuf)), or `Ok(None)` when the van has no such memory (the
    /// default) or `len` is too small to be worth it. Fill it, freeze it, and send the
    /// `Bytes` (or slices of them) as data segments.
    ///
    /// # Errors
    ///
    /// When the van has such memory but cannot provide it (for example, it is exhausted and
    /// not released by peers in time); callers may fall back to ordinary memory.
    fn alloc(&self, len: usize) -> Result<Option<crate::SharedBuf>, VanError> {
        let _ = len;
        Ok(None)
    }

    /// The memory [`alloc`](Self::alloc) carves its buffers from, when co-located processes
    /// can map it where it is (see [`SharedRegion`](crate::buf::SharedRegion)); `None` (the
    /// default) for any other van.
    fn shared_region(&self) -> Option<crate::buf::SharedRegion> {
        None
    }
}

/// The future of [`Van::send`] and [`Van::send_batch`] as `async_trait` boxes it.
type BoxedSend<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), VanError>> + Send + 'a>>;

#[async_trait]
impl<V: Van + ?Sized> Van for Arc<V> {
    fn kind(&self) -> VanKind {
        (**self).kind()
    }
    async fn bind(&self, host: &str, port: u16, inbox: InboxSender) -> Result<Endpoint, VanError> {
        (**self).bind(host, port, inbox).await
    }
    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        (**self).connect(node).await
    }
    // The data path hands the inner van's future through instead of boxing it a second time.
    fn send<'life0, 'async_trait>(&'life0 self, msg: Message) -> BoxedSend<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        (**self).send(msg)
    }
    fn try_send(&self, msg: Message) -> Result<Option<Message>, VanError> {
        (**self).try_send(msg)
    }
    fn send_batch<'life0, 'async_trait>(&'life0 self, msgs: Vec<Message>) -> BoxedSend<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        (**self).send_batch(msgs)
    }
    async fn stop(&self) -> Result<(), VanError> {
        (**self).stop().await
    }
    fn forget(&self, peer: NodeId) {
        (**self).forget(peer);
    }
    fn drop_peer(&self, peer: NodeId, reason: &str) {
        (**self).drop_peer(peer, reason);
    }
    fn alloc(&self, len: usize) -> Result<Option<crate::SharedBuf>, VanError> {
        (**self).alloc(len)
    }
    fn shared_region(&self) -> Option<crate::buf::SharedRegion> {
        (**self).shared_region()
    }
}

/// The recipient of `msg`, or [`VanError::NoRecipient`].
pub fn recipient_of(msg: &Message) -> Result<NodeId, VanError> {
    msg.meta.recipient.ok_or(VanError::NoRecipient)
}

/// The address to reach `node` with a van of `kind`, and its id.
///
/// Uses the node's endpoint of that kind, else `host:port`.
pub fn address_for(node: &Node, kind: VanKind) -> Result<(NodeId, String), VanError> {
    let bad = |reason: &str| VanError::BadNode {
        node: node.to_string(),
        reason: reason.to_owned(),
    };
    let id = node.id.ok_or_else(|| bad("the node has no id yet"))?;
    if let Some(endpoint) = node.endpoint(kind) {
        return Ok((id, endpoint.address.clone()));
    }
    if node.host.is_empty() || node.port == 0 {
        return Err(bad(&format!("no {kind} endpoint and no host:port")));
    }
    Ok((id, Endpoint::stream(kind, &node.host, node.port).address))
}
