//! The selection policy: which van carries traffic to a peer. A pure function of the
//! configuration, the vans compiled in, and what the node table says about both nodes, so
//! it is tested as a table and every node of a cluster decides the same way.
//!
//! In order:
//! 1. the scheduler link is always the stream van: it bootstraps everything else;
//! 2. a peer on the same host (equal, non-empty host identities) that announced an IPC
//!    endpoint is reached over shared memory when IPC is enabled and compiled in;
//! 3. with `DMLC_ENABLE_RDMA`, remote peers that announced an RDMA endpoint use RDMA. When
//!    RDMA cannot be used (the van is not compiled in or did not start here, or the peer has
//!    no RDMA endpoint), selection fails naming the cause — unless `VANS_RDMA_FALLBACK=tcp`
//!    allows the stream van (no silent fallback);
//! 4. otherwise the configured stream van (`tcp`, `uring`, `inproc`), which must be compiled
//!    in.

use crate::config::{Config, RdmaFallback};
use crate::message::{Node, Role, VanKind};
use crate::van::VanError;

/// The vans compiled into this build (and usable in this process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Available {
    /// The TCP van.
    pub tcp: bool,
    /// The io_uring van.
    pub uring: bool,
    /// The RDMA van.
    pub rdma: bool,
    /// The shared-memory van.
    pub ipc: bool,
    /// The in-process van (single-process clusters).
    pub inproc: bool,
}

impl Available {
    /// Whether `kind` is available.
    pub fn has(&self, kind: VanKind) -> bool {
        match kind {
            VanKind::Tcp => self.tcp,
            VanKind::Uring => self.uring,
            VanKind::Rdma => self.rdma,
            VanKind::Ipc => self.ipc,
            VanKind::InProcess => self.inproc,
        }
    }
}

/// Whether two nodes run on the same machine (and may share memory).
pub fn same_host(a: &Node, b: &Node) -> bool {
    !a.host_identity.is_empty() && a.host_identity == b.host_identity
}

/// The van for traffic from `me` to `peer`; see the [module docs](self) for the rules.
pub fn select_van(
    config: &Config,
    available: Available,
    me: &Node,
    peer: &Node,
) -> Result<VanKind, VanError> {
    let stream = || {
        if available.has(config.stream_van) {
            Ok(config.stream_van)
        } else {
            Err(VanError::NotCompiled {
                kind: config.stream_van,
            })
        }
    };
    if me.role == Role::Scheduler || peer.role == Role::Scheduler {
        return stream();
    }
    if config.enable_ipc
        && available.ipc
        && same_host(me, peer)
        && peer.endpoint(VanKind::Ipc).is_some()
    {
        return Ok(VanKind::Ipc);
    }
    if config.enable_rdma.is_enabled() {
        let peer_has_rdma = peer.endpoint(VanKind::Rdma).is_some();
        if available.rdma && peer_has_rdma {
            return Ok(VanKind::Rdma);
        }
        if config.rdma.fallback == RdmaFallback::Stream {
            return stream();
        }
        if !available.rdma {
            return Err(VanError::NotCompiled {
                kind: VanKind::Rdma,
            });
        }
        return Err(VanError::Unsupported {
            kind: VanKind::Rdma,
            reason: format!(
                "node {peer} announced no RDMA endpoint (RDMA is off or failed to start \
                 there); enable it on every node, or allow the stream van with \
                 VANS_RDMA_FALLBACK=tcp"
            ),
        });
    }
    stream()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RdmaMode;
    use crate::message::Endpoint;

    fn node(role: Role, host: &str, ipc: bool) -> Node {
        let mut node = Node::new(role, "10.0.0.1", 9000).with_id(9);
        node.host_identity = host.to_owned();
        if ipc {
            node.endpoints.push(Endpoint {
                kind: VanKind::Ipc,
                address: "@vans-x".into(),
            });
        }
        node.endpoints
            .push(Endpoint::stream(VanKind::Rdma, "10.0.0.1", 9001));
        node
    }

    const ALL: Available = Available {
        tcp: true,
        uring: true,
        rdma: true,
        ipc: true,
        inproc: true,
    };
    const TCP_ONLY: Available = Available {
        tcp: true,
        uring: false,
        rdma: false,
        ipc: false,
        inproc: false,
    };

    #[test]
    fn a_remote_peer_without_rdma_is_an_error_naming_it_unless_the_fallback_allows_tcp() {
        let rdma = Config {
            enable_rdma: RdmaMode::Ibverbs,
            ..Config::default()
        };
        let me = node(Role::Worker, "host-a", false);
        let mut peer = node(Role::Server, "host-b", false);
        peer.endpoints.clear();
        let err = select_van(&rdma, ALL, &me, &peer).unwrap_err().to_string();
        assert!(
            err.contains("announced no RDMA endpoint") && err.contains("VANS_RDMA_FALLBACK=tcp"),
            "{err}"
        );
        let err = select_van(&rdma, TCP_ONLY, &me, &peer)
            .unwrap_err()
            .to_string();
        assert!(err.contains("feature `rdma`"), "{err}");
    }

    #[test]
    fn the_policy_table() {
        let plain = Config::default();
        let no_ipc = Config {
            enable_ipc: false,
            ..Config::default()
        };
        let rdma = Config {
            enable_rdma: RdmaMode::Ibverbs,
            ..Config::default()
        };
        let rdma_or_tcp = Config {
            enable_rdma: RdmaMode::Ibverbs,
            rdma: crate::config::RdmaSettings {
                fallback: RdmaFallback::Stream,
                ..Default::default()
            },
            ..Config::default()
        };
        let mut remote_without_rdma = node(Role::Server, "host-b", false);
        remote_without_rdma.endpoints.clear();
        let uring = Config {
            stream_van: VanKind::Uring,
            ..Config::default()
        };
        let me = node(Role::Worker, "host-a", true);
        let local = node(Role::Server, "host-a", true);
        let local_without_ipc = node(Role::Server, "host-a", false);
        let remote = node(Role::Server, "host-b", true);
        let anonymous = node(Role::Server, "", true);
        let scheduler = node(Role::Scheduler, "host-a", true);
        let cases = [
            (&plain, ALL, &local, Ok(VanKind::Ipc)),
            (&plain, ALL, &remote, Ok(VanKind::Tcp)),
            (&plain, ALL, &scheduler, Ok(VanKind::Tcp)),
            (&plain, ALL, &local_without_ipc, Ok(VanKind::Tcp)),
            (&plain, ALL, &anonymous, Ok(VanKind::Tcp)),
            (&plain, TCP_ONLY, &local, Ok(VanKind::Tcp)),
            (&no_ipc, ALL, &local, Ok(VanKind::Tcp)),
            (&rdma, ALL, &remote, Ok(VanKind::Rdma)),
            (&rdma, ALL, &local, Ok(VanKind::Ipc)),
            (&rdma, ALL, &scheduler, Ok(VanKind::Tcp)),
            (&rdma, TCP_ONLY, &remote, Err(VanKind::Rdma)),
            (&rdma_or_tcp, ALL, &remote, Ok(VanKind::Rdma)),
            (&rdma_or_tcp, TCP_ONLY, &remote, Ok(VanKind::Tcp)),
            (&rdma_or_tcp, ALL, &remote_without_rdma, Ok(VanKind::Tcp)),
            (&uring, ALL, &remote, Ok(VanKind::Uring)),
            (&uring, TCP_ONLY, &remote, Err(VanKind::Uring)),
        ];
        for (i, (config, available, peer, want)) in cases.into_iter().enumerate() {
            let got = select_van(config, available, &me, peer).map_err(|e| match e {
                VanError::NotCompiled { kind } | VanError::Unsupported { kind, .. } => kind,
                other => panic!("case {i}: unexpected error {other}"),
            });
            assert_eq!(got, want, "case {i}");
        }
    }
}
