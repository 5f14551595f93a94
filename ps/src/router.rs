//! The per-peer van router: which van carries traffic to each peer, with lazy connections.
//!
//! Today every peer is reached through the node's stream van (TCP, or the in-process van for
//! single-process clusters); the shared-memory and RDMA vans will plug in here, chosen per
//! peer by the selection policy. [`Router::van_for`] answers "what am I using for this peer?"
//! and the choice is logged once per peer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::{debug, info};
use van_core::{Endpoint, InboxSender, Message, Node, NodeId, Van, VanError, VanKind};

use crate::error::PsError;

/// Routes messages to peers over the right van, connecting on first use.
pub struct Router {
    van: Arc<dyn Van>,
    state: Mutex<RouterState>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("van", &self.van.kind())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct RouterState {
    /// Every node we know an address for.
    nodes: HashMap<NodeId, Node>,
    /// Peers with an open connection.
    connected: HashSet<NodeId>,
}

impl Router {
    /// A router sending everything through `van`.
    pub fn new(van: Arc<dyn Van>) -> Router {
        Router {
            van,
            state: Mutex::new(RouterState::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RouterState> {
        // Single map operations only: a poisoned lock holds consistent data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kind of the stream van.
    pub fn stream_kind(&self) -> VanKind {
        self.van.kind()
    }

    /// Binds the van(s) and delivers into `inbox`; returns the endpoints to announce.
    pub async fn bind(
        &self,
        host: &str,
        port: u16,
        inbox: InboxSender,
    ) -> Result<Vec<Endpoint>, PsError> {
        Ok(vec![self.van.bind(host, port, inbox).await?])
    }

    /// Learns the addresses of `nodes` (the node table); connections open on first send.
    pub fn set_nodes(&self, nodes: &[Node]) {
        let mut state = self.lock();
        for node in nodes {
            if let Some(id) = node.id {
                state.nodes.insert(id, node.clone());
            }
        }
    }

    /// The van that carries traffic to `peer`, if the peer is known.
    pub fn van_for(&self, peer: NodeId) -> Option<VanKind> {
        self.lock()
            .nodes
            .contains_key(&peer)
            .then(|| self.van.kind())
    }

    /// Connects to `node` now (and remembers its address).
    pub async fn connect(&self, node: &Node) -> Result<(), PsError> {
        let id = node.id.ok_or_else(|| {
            PsError::InvalidArgument(format!("cannot connect to {node}: it has no id"))
        })?;
        self.van.connect(node).await?;
        let mut state = self.lock();
        state.nodes.insert(id, node.clone());
        if state.connected.insert(id) {
            info!(peer = id, van = %self.van.kind(), "route to {node}: {} van", self.van.kind());
        }
        Ok(())
    }

    /// Sends `msg` to its recipient, connecting first if needed. A broken connection is
    /// reported as [`PsError::NodeFailed`] naming the peer.
    pub async fn send(&self, msg: Message) -> Result<(), PsError> {
        let peer = msg.meta.recipient.ok_or(VanError::NoRecipient)?;
        self.ensure_connected(peer).await?;
        self.van.send(msg).await.map_err(peer_error)
    }

    /// Sends many messages (to any recipients), connecting first where needed.
    pub async fn send_batch(&self, msgs: Vec<Message>) -> Result<(), PsError> {
        let mut seen = HashSet::new();
        for msg in &msgs {
            let peer = msg.meta.recipient.ok_or(VanError::NoRecipient)?;
            if seen.insert(peer) {
                self.ensure_connected(peer).await?;
            }
        }
        self.van.send_batch(msgs).await.map_err(peer_error)
    }

    async fn ensure_connected(&self, peer: NodeId) -> Result<(), PsError> {
        let node = {
            let state = self.lock();
            if state.connected.contains(&peer) {
                return Ok(());
            }
            state
                .nodes
                .get(&peer)
                .cloned()
                .ok_or(VanError::UnknownPeer { peer })?
        };
        self.connect(&node).await
    }

    /// Forgets the connection to `peer` (it broke); the next send reconnects or fails.
    pub fn peer_lost(&self, peer: NodeId) {
        if self.lock().connected.remove(&peer) {
            debug!(peer, "route dropped");
        }
    }

    /// Stops the van(s).
    pub async fn stop(&self) -> Result<(), PsError> {
        Ok(self.van.stop().await?)
    }
}

/// A lost peer is a failed node, for the layers above.
fn peer_error(error: VanError) -> PsError {
    match error {
        VanError::PeerGone { peer, reason } => PsError::NodeFailed {
            node: peer,
            role: crate::postoffice::role_name(peer),
            reason: format!("connection lost: {reason}"),
        },
        other => other.into(),
    }
}
