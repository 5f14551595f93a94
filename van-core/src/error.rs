//! [`Error`]: the error every vans crate's own error type converts into.

use crate::config::ConfigError;
use crate::rendezvous::{KeyError, RendezvousError};
use crate::van::VanError;
use crate::wire::WireError;

/// Any error of the vans workspace, by the layer it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A transport failed.
    #[error(transparent)]
    Van(#[from] VanError),
    /// A frame was malformed.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A rendezvous key was malformed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A rendezvous operation failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// Anything else, from a higher layer (cluster, bindings), with its own message.
    #[error("{0}")]
    Other(String),
}
