//! [`Error`]: what can go wrong setting up a rendezvous manager, and [`MessageError`]: why a
//! peer's rendezvous message was rejected.
//!
//! Failures of rendezvous *calls* (send, receive, abort, deadlines, dead peers) are
//! [`RendezvousError`], the contract's own error, so that code written against the
//! [`Rendezvous`](van_core::Rendezvous) trait sees one type; the crate builds the ones that
//! name a peer here.

use node::NodeError;
use van_core::rendezvous::KeyError;
use van_core::{node_ids, NodeId, RendezvousError};

/// An error of the rendezvous crate outside the calls themselves: building a manager,
/// parsing a protocol name.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The postoffice refused (e.g. the app and customer ids are taken by another
    /// application on this node: pick another `customer_id`).
    #[error(transparent)]
    Ps(#[from] NodeError),
    /// An option of the manager's builder is out of range; the text names it.
    #[error("invalid rendezvous option: {0}")]
    InvalidOption(String),
    /// A protocol name that is neither pull nor push.
    #[error(
        "unknown rendezvous protocol `{0}`: expected grpc or grpc+seastar (pull), \
         star_server or star_server_lite (push)"
    )]
    UnknownProtocol(String),
}

impl From<Error> for van_core::Error {
    fn from(error: Error) -> van_core::Error {
        match error {
            Error::Ps(NodeError::Van(e)) => van_core::Error::Van(e),
            Error::Ps(NodeError::Config(e)) => van_core::Error::Config(e),
            other => van_core::Error::Other(other.to_string()),
        }
    }
}

/// Why a rendezvous message from a peer could not be decoded. Decoding never panics and
/// never trusts a length it has not checked; a bad message is logged and answered with an
/// error where it had a request id, never acted on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// The body is shorter than the fixed header.
    #[error("rendezvous message body has {len} bytes, fewer than the {needed}-byte header")]
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes the header needs.
        needed: usize,
    },
    /// The body's format version is not the one this build speaks.
    #[error("rendezvous message version {found}, this node speaks version {supported}")]
    Version {
        /// The version found.
        found: u8,
        /// The version this build speaks.
        supported: u8,
    },
    /// The message's `head` is not a rendezvous command.
    #[error("unknown rendezvous command {0} (meta.head)")]
    UnknownCommand(i32),
    /// A response's status code is unknown.
    #[error("unknown rendezvous status code {0}")]
    UnknownStatus(u8),
    /// The key or error text is not UTF-8.
    #[error("rendezvous message text is not UTF-8")]
    NotUtf8,
    /// The key does not parse.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The message has the wrong number of data segments for its command.
    #[error("rendezvous {command} carries {found} data segments, expected {expected}")]
    Segments {
        /// The command.
        command: &'static str,
        /// Segments found.
        found: usize,
        /// Segments expected.
        expected: usize,
    },
    /// The message has no sender.
    #[error("rendezvous message without a sender")]
    NoSender,
}

/// `node 9 (worker)`: how errors name a peer.
pub(crate) fn peer_name(node: NodeId) -> String {
    let role = node_ids::role_of(node).map_or("group", |r| r.as_str());
    format!("node {node} ({role})")
}

/// The error for a call on `key` of `step_id` that `peer` can no longer answer.
pub(crate) fn remote_error(
    step_id: i64,
    key: &str,
    peer: NodeId,
    reason: String,
) -> RendezvousError {
    RendezvousError::Remote {
        step_id,
        key: key.to_owned(),
        peer: peer_name(peer),
        reason,
    }
}
