//! [`NodeError`]: what can go wrong in a node (the parameter server, rendezvous and
//! collectives above it report it too).

use std::time::Duration;

use van_core::{ConfigError, NodeId, VanError};

/// An error of a node: joining, messaging, barriers, requests to applications, stopping.
/// Every variant names the node or setting concerned.
///
/// Not `#[non_exhaustive]`, unlike the other error enums: the C ABI (`vans_c`'s status codes)
/// and the Python module (its exception classes) match every variant, so that a new one
/// cannot reach them without a code and a class of its own.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A van failed. (A van that is stopped is [`NodeError::Stopped`]: the node stopped.)
    #[error(transparent)]
    Van(VanError),
    /// The cluster did not form before the deadline.
    #[error("cluster did not form within {waited:?}: {summary}")]
    Bootstrap {
        /// How long we waited.
        waited: Duration,
        /// Which roles and how many nodes joined, and which did not.
        summary: String,
    },
    /// A node died or its connection broke; requests to it fail with this.
    #[error("node {node} ({role}) failed: {reason}")]
    NodeFailed {
        /// The node.
        node: NodeId,
        /// Its role, as text (`server`, `worker`, `scheduler`).
        role: String,
        /// What was seen.
        reason: String,
    },
    /// A server's request handler refused or failed a request (its
    /// `ps::RequestHandler` returned an error or panicked, or the server
    /// could not route the request to it). The server is alive and goes on serving other
    /// requests; only this request failed. `reason` is the handler's own text.
    #[error("server {server} could not handle the request: {reason}")]
    HandlerFailed {
        /// The server that answered with the failure.
        server: NodeId,
        /// The handler's text.
        reason: String,
    },
    /// A barrier cannot complete because members died (as the scheduler, which releases
    /// barriers, declared them). A barrier that loses the scheduler itself fails with
    /// [`NodeError::NodeFailed`] naming it and saying why (its connection, or no answer to
    /// heartbeats: it died, or this node is cut off).
    #[error("barrier of group {group} failed: nodes {dead:?} are dead")]
    BarrierFailed {
        /// The barrier group.
        group: i32,
        /// The dead members.
        dead: Vec<NodeId>,
    },
    /// A request id that was never issued or was already waited for.
    #[error("unknown request id {0} (never issued, or already waited for)")]
    UnknownRequest(i32),
    /// A peer sent something that does not follow the protocol.
    #[error("protocol error from node {from:?}: {reason}")]
    Protocol {
        /// The sender, if known.
        from: Option<NodeId>,
        /// What was wrong.
        reason: String,
    },
    /// The node is shutting down or has shut down.
    #[error("the postoffice is stopped")]
    Stopped,
    /// Invalid arguments to a call.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A rendezvous operation failed (aborted step, deadline, remote failure, bad key).
    #[error(transparent)]
    Rendezvous(#[from] van_core::RendezvousError),
    /// A wait with a time limit ([`Call::wait_timeout`](crate::handle::Call::wait_timeout))
    /// ran out; the operation itself goes on.
    #[error("timed out after {waited:?} waiting for the operation")]
    Timeout {
        /// How long the caller waited.
        waited: Duration,
    },
}

impl From<VanError> for NodeError {
    /// A van's error as the node's: a stopped van means the node has stopped (finalized,
    /// stopped, or its scheduler gone), which callers see as [`NodeError::Stopped`] whatever
    /// van carried the call.
    fn from(e: VanError) -> NodeError {
        match e {
            VanError::Stopped(_) => NodeError::Stopped,
            e => NodeError::Van(e),
        }
    }
}

impl NodeError {
    /// [`NodeError::NodeFailed`] for `node`, its role named from its id.
    pub fn node_failed(node: NodeId, reason: impl Into<String>) -> NodeError {
        NodeError::NodeFailed {
            node,
            role: role_name(node),
            reason: reason.into(),
        }
    }
}

/// `server`, `worker` or `scheduler` (or `group` for a group id), for error messages.
pub fn role_name(node: NodeId) -> String {
    van_core::node_ids::role_of(node).map_or_else(|| "group".to_owned(), |r| r.to_string())
}

/// Results of a node's operations.
pub type Result<T, E = NodeError> = std::result::Result<T, E>;
