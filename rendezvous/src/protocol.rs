//! [`Protocol`]: how tensors cross between tasks, chosen per manager and named after the
//! TensorFlow `protocol` / `rpc_layer` values of the deployments vans learns from.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// How a [`RendezvousMgr`](crate::RendezvousMgr) moves a tensor to the task that consumes it.
///
/// ```
/// use rendezvous::Protocol;
///
/// assert_eq!("grpc+seastar".parse::<Protocol>().unwrap(), Protocol::Pull);
/// assert_eq!("star_server".parse::<Protocol>().unwrap(), Protocol::Push);
/// assert_eq!(Protocol::Push.to_string(), "star_server");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Protocol {
    /// TensorFlow's send/recv (`grpc`, `grpc+seastar`): a sent value waits in its producer's
    /// table; the consumer's receive sends a RecvTensor request (step id and key) to the
    /// producer's task, which answers when the value is there. One round trip per tensor, and
    /// the producer keeps the value until someone asks.
    #[default]
    Pull,
    /// StarServer's push (`star_server`, `star_server_lite`): the producer's send delivers the
    /// value straight into the consumer task's table for that step, where the receive finds
    /// it. One message per tensor and no request, which saves a round trip.
    Push,
}

impl Protocol {
    /// The canonical name: `grpc+seastar` for pull, `star_server` for push.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Pull => "grpc+seastar",
            Protocol::Push => "star_server",
        }
    }

    /// The short name used in tables and logs: `pull` or `push`.
    pub fn mode(self) -> &'static str {
        match self {
            Protocol::Pull => "pull",
            Protocol::Push => "push",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = Error;

    /// Accepts TensorFlow's names (`grpc`, `grpc+seastar`, `star_server`, `star_server_lite`,
    /// any case) and the plain `pull` / `push`.
    fn from_str(s: &str) -> Result<Protocol, Error> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pull" | "grpc" | "grpc+seastar" | "seastar" => Ok(Protocol::Pull),
            "push" | "star_server" | "star_server_lite" | "starserver" => Ok(Protocol::Push),
            _ => Err(Error::UnknownProtocol(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() {
        for (name, protocol) in [
            ("grpc", Protocol::Pull),
            ("GRPC+Seastar", Protocol::Pull),
            ("pull", Protocol::Pull),
            ("star_server", Protocol::Push),
            ("star_server_lite", Protocol::Push),
            (" push ", Protocol::Push),
        ] {
            assert_eq!(name.parse::<Protocol>().unwrap(), protocol, "{name}");
        }
        for protocol in [Protocol::Pull, Protocol::Push] {
            assert_eq!(protocol.as_str().parse::<Protocol>().unwrap(), protocol);
            assert_eq!(protocol.mode().parse::<Protocol>().unwrap(), protocol);
        }
        let error = "grpc+verbs".parse::<Protocol>().unwrap_err().to_string();
        assert!(
            error.contains("grpc+verbs") && error.contains("star_server"),
            "{error}"
        );
    }
}
