//! [`CollectiveError`]: what can end a collective.

use std::time::Duration;

use van_core::NodeId;

/// An error of a collective. A collective that fails on one rank fails (or has failed) on
/// the others too; the caller's buffer then holds partial results and the elastic loop
/// goes on with [`Communicator::settle`](crate::Communicator::settle).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A member of the generation died (or its connection broke) while it was in use.
    #[error("rank {rank} (node {node}) of generation {generation} failed: {reason}")]
    RankFailed {
        /// The failed member's node id.
        node: NodeId,
        /// Its rank in the generation.
        rank: usize,
        /// The generation it was a member of.
        generation: u64,
        /// What was seen.
        reason: String,
    },
    /// The membership is changing (a worker asked to join, or this node was left out of
    /// the new generation): settle, then go on.
    #[error("generation {generation} ended: {reason}; call settle() to join the next")]
    MembershipChanged {
        /// The generation that ended.
        generation: u64,
        /// Why.
        reason: String,
    },
    /// The membership did not settle in time.
    #[error("membership did not settle within {waited:?}: {detail}")]
    SettleTimeout {
        /// How long we waited.
        waited: Duration,
        /// Who had joined and who had not.
        detail: String,
    },
    /// A call that does not fit: mismatched lengths, a bad root, a non-worker node.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A peer sent what this rank did not expect: another collective, element type or
    /// length (every rank must call the same collectives in the same order, with the same
    /// arguments).
    #[error("protocol mismatch with rank {rank} (node {node}): {reason}")]
    Mismatch {
        /// The peer's rank.
        rank: usize,
        /// Its node id.
        node: NodeId,
        /// What differed.
        reason: String,
    },
    /// The node's postoffice failed or stopped.
    #[error("postoffice: {0}")]
    Ps(String),
}

impl From<node::NodeError> for CollectiveError {
    fn from(e: node::NodeError) -> CollectiveError {
        CollectiveError::Ps(e.to_string())
    }
}

/// The result of a collective.
pub type Result<T> = std::result::Result<T, CollectiveError>;
