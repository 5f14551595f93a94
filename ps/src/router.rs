//! The per-peer van router: which van carries traffic to each peer, with lazy connections.
//!
//! Today every peer is reached through the node's stream van (TCP, or the in-process van for
//! single-process clusters); the shared-memory and RDMA vans will plug in here, chosen per
//! peer by the selection policy. [`Router::van_for`] answers "what am I using for this peer?"
//! and the choice is logged once per peer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::{debug, info};
use van_core::endpoint_map::EndpointMap;
use van_core::{Endpoint, InboxSender, Message, Node, NodeId, Van, VanError, VanKind};

use crate::error::PsError;

/// Routes messages to peers over the right van, connecting on first use.
pub struct Router {
    van: Arc<dyn Van>,
    /// Control address → data address, from a `.endpoint_map` file.
    endpoint_map: Option<EndpointMap>,
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
    /// A router sending everything through `van`. With an endpoint map (the `.endpoint_map`
    /// of TensorFlow Seastar / StarServer deployments), a peer announced at a mapped control
    /// address is reached at its data address instead.
    pub fn new(van: Arc<dyn Van>, endpoint_map: Option<EndpointMap>) -> Router {
        Router {
            van,
            endpoint_map,
            state: Mutex::new(RouterState::default()),
        }
    }

    /// `node` with its addresses rewritten by the endpoint map, if any maps them.
    fn mapped(&self, node: &Node) -> Node {
        let Some(map) = &self.endpoint_map else {
            return node.clone();
        };
        let mut node = node.clone();
        if let Some(data) = map.get(&node.host, node.port) {
            info!("{node}: endpoint map sends its traffic to {data}");
            node.host = data.host.clone();
            node.port = data.port;
        }
        for endpoint in &mut node.endpoints {
            if let Some(data) = map.lookup(&endpoint.address) {
                endpoint.address = data.to_string();
            }
        }
        node
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
        self.van.connect(&self.mapped(node)).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use van_core::inproc::{Hub, InProcessVan};
    use van_core::Role;

    #[test]
    fn the_endpoint_map_redirects_control_addresses_to_data_addresses() {
        let map = EndpointMap::parse("10.0.0.1:2222=10.1.0.1:3333\n").unwrap();
        let router = Router::new(Arc::new(InProcessVan::new(&Hub::new())), Some(map));
        let mut node = Node::new(Role::Server, "10.0.0.1", 2222).with_id(8);
        node.endpoints
            .push(Endpoint::stream(VanKind::Tcp, "10.0.0.1", 2222));
        let mapped = router.mapped(&node);
        assert_eq!((mapped.host.as_str(), mapped.port), ("10.1.0.1", 3333));
        assert_eq!(mapped.endpoints[0].address, "10.1.0.1:3333");
        // Unmapped nodes are untouched.
        let other = Node::new(Role::Worker, "10.0.0.2", 2222).with_id(9);
        assert_eq!(router.mapped(&other), other);
    }
}
