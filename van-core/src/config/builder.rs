//! [`ConfigBuilder`]: every [`Config`] field set in code, with the same validation as the
//! environment.

use std::time::Duration;

use super::collective::CollectiveSettings;
use super::error::ConfigError;
use super::rank::apply_rank;
use super::rdma::{RdmaMode, RdmaSettings};
use super::{non_zero, Config};
use crate::endpoint_map::EndpointMap;
use crate::message::{Role, VanKind};
use crate::wire::Limits;

impl Config {
    /// A builder starting from [`Config::default`].
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }
}

/// Chainable setters for every [`Config`] field; [`build`](ConfigBuilder::build) applies the
/// same validation as the environment parser, and its errors name the matching variables.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    config: Config,
    /// `VANS_RANK`: applied by `build`, once the role and counts are known.
    rank: Option<u32>,
}

impl ConfigBuilder {
    /// Whether peers on this host use shared memory (`DMLC_ENABLE_IPC`).
    pub fn enable_ipc(mut self, on: bool) -> Self {
        self.config.enable_ipc = on;
        self
    }

    /// Whether vans spin instead of sleeping (`VANS_BUSY_POLLING`).
    pub fn busy_polling(mut self, on: bool) -> Self {
        self.config.busy_polling = on;
        self
    }

    /// Whether to connect to every peer when the table arrives (`VANS_EAGER_CONNECT`).
    pub fn eager_connect(mut self, on: bool) -> Self {
        self.config.eager_connect = on;
        self
    }

    /// Shared memory per IPC van for zero-copy buffers (`VANS_IPC_ARENA_BYTES`; 0: none).
    pub fn ipc_arena_bytes(mut self, bytes: usize) -> Self {
        self.config.ipc_arena_bytes = bytes;
        self
    }

    /// Whether the IPC van listens through an accept queue in `/dev/shm` (`VANS_IPC_NAMED`).
    pub fn ipc_named(mut self, on: bool) -> Self {
        self.config.ipc_named = on;
        self
    }

    /// The host identity to announce (`VANS_HOST_ID`).
    pub fn host_id(mut self, id: impl Into<String>) -> Self {
        self.config.host_id = non_empty(id.into());
        self
    }

    /// I/O threads of the io_uring van (`VANS_URING_THREADS`); `None`: its default.
    pub fn io_threads(mut self, threads: Option<u32>) -> Self {
        self.config.io_threads = threads;
        self
    }

    /// Whether io_uring I/O threads are pinned to cores (`VANS_PIN_CORES`).
    pub fn pin_io_threads(mut self, on: bool) -> Self {
        self.config.pin_io_threads = on;
        self
    }

    /// Smallest zero-copy send batch of the io_uring van (`VANS_URING_ZC_BYTES`); `None`:
    /// never.
    pub fn uring_zc_bytes(mut self, bytes: Option<usize>) -> Self {
        self.config.uring_zc_bytes = bytes;
        self
    }

    /// The cluster secret connections must prove they know (`VANS_CLUSTER_SECRET`); `None`:
    /// no authentication.
    pub fn cluster_secret(mut self, secret: Option<crate::auth::ClusterSecret>) -> Self {
        self.config.cluster_secret = secret;
        self
    }

    /// How long a new connection may take to authenticate (`VANS_HANDSHAKE_TIMEOUT_MS`).
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.config.handshake_timeout = timeout;
        self
    }

    /// Sets the resend timeout (`PS_RESEND=1` with `PS_RESEND_TIMEOUT`); `None`: off.
    pub fn resend_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.resend_timeout = timeout;
        self
    }

    /// Sets the role (`DMLC_ROLE`); a cluster node then needs a root port.
    pub fn role(mut self, role: Role) -> Self {
        self.config.role = Some(role);
        self
    }
    /// Sets the number of workers (`DMLC_NUM_WORKER`).
    pub fn num_workers(mut self, n: u32) -> Self {
        self.config.num_workers = n;
        self
    }
    /// Sets the number of servers (`DMLC_NUM_SERVER`).
    pub fn num_servers(mut self, n: u32) -> Self {
        self.config.num_servers = n;
        self
    }
    /// Sets the scheduler's host (`DMLC_PS_ROOT_URI`).
    pub fn root_uri(mut self, uri: impl Into<String>) -> Self {
        self.config.root_uri = uri.into();
        self
    }
    /// Sets the scheduler's port (`DMLC_PS_ROOT_PORT`).
    pub fn root_port(mut self, port: u16) -> Self {
        self.config.root_port = port;
        self
    }
    /// Sets the interface to announce (`DMLC_INTERFACE`); empty: unset.
    pub fn interface(mut self, interface: impl Into<String>) -> Self {
        self.config.interface = non_empty(interface.into());
        self
    }
    /// Sets the address to announce (`DMLC_NODE_HOST`); empty: unset.
    pub fn node_host(mut self, host: impl Into<String>) -> Self {
        self.config.node_host = non_empty(host.into());
        self
    }
    /// Sets the port to listen on (`DMLC_PORT`); 0: ephemeral.
    pub fn port(mut self, port: u16) -> Self {
        self.config.port = port;
        self
    }
    /// Sets whether remote peers use RDMA (`DMLC_ENABLE_RDMA`).
    pub fn enable_rdma(mut self, mode: RdmaMode) -> Self {
        self.config.enable_rdma = mode;
        self
    }
    /// Sets the log verbosity (`PS_VERBOSE`, 0..=2).
    pub fn verbose(mut self, level: u8) -> Self {
        self.config.verbose = level;
        self
    }
    /// Sets the heartbeat interval (`PS_HEARTBEAT_INTERVAL`); zero: off.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = non_zero(interval);
        self
    }
    /// Sets the heartbeat timeout (`PS_HEARTBEAT_TIMEOUT`); zero: off.
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.config.heartbeat_timeout = non_zero(timeout);
        self
    }
    /// Sets the stream van (`VANS_STREAM_VAN`): `Tcp`, `Uring` or `InProcess`.
    pub fn stream_van(mut self, kind: VanKind) -> Self {
        self.config.stream_van = kind;
        self
    }
    /// Sets how a summing server answers a pull of a key no one pushed
    /// (`VANS_UNPUSHED_KEYS`).
    pub fn unpushed_keys(mut self, unpushed: super::UnpushedKeys) -> Self {
        self.config.unpushed_keys = unpushed;
        self
    }
    /// Sets the wire limits (`VANS_MAX_*`); each must be at least 1.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.config.limits = limits;
        self
    }
    /// Sets the connect timeout (`VANS_CONNECT_TIMEOUT_MS`); at least 1 ms.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }
    /// Sets the bootstrap timeout (`VANS_BOOTSTRAP_TIMEOUT_SECS`); at least 1 s.
    pub fn bootstrap_timeout(mut self, timeout: Duration) -> Self {
        self.config.bootstrap_timeout = timeout;
        self
    }
    /// Sets how long `finalize`'s barrier waits for a replacement of a dead member
    /// (`VANS_REPLACEMENT_GRACE_SECS`); zero (the default) fails it at once.
    pub fn replacement_grace(mut self, grace: Duration) -> Self {
        self.config.replacement_grace = grace;
        self
    }
    /// Sets whether this process also runs the scheduler on the root port (as `TF_CONFIG`'s
    /// `chief:0` does); needs a worker or server role and a port other than the root port.
    pub fn hosts_scheduler(mut self, hosts: bool) -> Self {
        self.config.hosts_scheduler = hosts;
        self
    }
    /// Asks the scheduler for this node's rank within its role (`VANS_RANK`); `None`: ranks
    /// by address (or by `TF_CONFIG` task). The node announces task `worker:N` (a worker) or
    /// `ps:N` (a server), so nodes that ask are numbered by rank (worker rank N is node
    /// 9 + 2N, server rank N node 8 + 2N) and a new process asking for a rank takes its
    /// place (recovery). [`build`](ConfigBuilder::build) fails for the scheduler, without a
    /// role, or when the rank is not below the role's count.
    ///
    /// ```
    /// use van_core::{Config, Role};
    ///
    /// let config = Config::builder()
    ///     .role(Role::Worker)
    ///     .num_workers(4)
    ///     .root_port(8123)
    ///     .rank(Some(2))
    ///     .build()?;
    /// assert_eq!(config.tf_task.unwrap().to_string(), "/job:worker/task:2");
    /// # Ok::<(), van_core::ConfigError>(())
    /// ```
    pub fn rank(mut self, rank: Option<u32>) -> Self {
        self.rank = rank;
        self
    }
    /// Sets the endpoint map (`VANS_ENDPOINT_MAP`).
    pub fn endpoint_map(mut self, map: EndpointMap) -> Self {
        self.config.endpoint_map = Some(map);
        self
    }
    /// Sets the RDMA van's settings (`VANS_RDMA_*`).
    pub fn rdma(mut self, settings: RdmaSettings) -> Self {
        self.config.rdma = settings;
        self
    }
    /// Sets the defaults of the collectives among the workers (`VANS_COLLECTIVE_*`).
    pub fn collective(mut self, settings: CollectiveSettings) -> Self {
        self.config.collective = settings;
        self
    }
    /// The configuration, or the first problem found (see [`Config::validate`]).
    pub fn build(mut self) -> Result<Config, ConfigError> {
        if let Some(rank) = self.rank {
            apply_rank(&mut self.config, rank)?;
        }
        self.config.validate()?;
        Ok(self.config)
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.trim().is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_applies_the_same_validation() {
        let e = Config::builder().role(Role::Worker).build().unwrap_err();
        assert!(e.to_string().contains("DMLC_PS_ROOT_PORT"), "{e}");
        let node = || Config::builder().role(Role::Worker).root_port(8123);
        node().build().unwrap();
        let cases = [
            (
                node().role(Role::Server).num_servers(0).build(),
                "DMLC_NUM_SERVER",
            ),
            (node().num_workers(0).build(), "DMLC_NUM_WORKER"),
            (node().root_uri(" ").build(), "DMLC_PS_ROOT_URI"),
            (node().verbose(3).build(), "PS_VERBOSE"),
            (node().stream_van(VanKind::Rdma).build(), "VANS_STREAM_VAN"),
            (node().stream_van(VanKind::Ipc).build(), "VANS_STREAM_VAN"),
            (
                node()
                    .limits(Limits {
                        max_segments: 0,
                        ..Limits::default()
                    })
                    .build(),
                "VANS_MAX_SEGMENTS",
            ),
            (
                node().connect_timeout(Duration::ZERO).build(),
                "VANS_CONNECT_TIMEOUT_MS",
            ),
            (
                node().bootstrap_timeout(Duration::ZERO).build(),
                "VANS_BOOTSTRAP_TIMEOUT_SECS",
            ),
            (
                node()
                    .heartbeat_interval(Duration::from_secs(5))
                    .heartbeat_timeout(Duration::from_secs(2))
                    .build(),
                "PS_HEARTBEAT_INTERVAL",
            ),
        ];
        for (result, var) in cases {
            let message = result.unwrap_err().to_string();
            assert!(message.contains(var), "{message:?} lacks {var}");
        }
        // Zero heartbeats are off, empty hosts unset, as in the environment.
        let c = node()
            .heartbeat_interval(Duration::ZERO)
            .node_host("")
            .interface("")
            .build()
            .unwrap();
        assert_eq!(
            (c.heartbeat_interval, c.node_host, c.interface),
            (None, None, None)
        );
    }

    #[test]
    fn builder_hosts_scheduler_needs_a_role_and_its_own_port() {
        assert!(!Config::default().hosts_scheduler);
        let message = Config::builder()
            .hosts_scheduler(true)
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("DMLC_ROLE") && message.contains("TF_CONFIG"),
            "{message}"
        );
        let node = || {
            Config::builder()
                .role(Role::Worker)
                .root_port(8123)
                .hosts_scheduler(true)
        };
        assert!(node().build().unwrap().hosts_scheduler);
        let message = node().port(8123).build().unwrap_err().to_string();
        assert!(message.contains("DMLC_PORT") && message.contains("DMLC_PS_ROOT_PORT"));
        let message = Config::builder()
            .role(Role::Scheduler)
            .root_port(8123)
            .hosts_scheduler(true)
            .build()
            .unwrap_err()
            .to_string();
        assert!(message.contains("DMLC_ROLE"), "{message}");
    }
}
