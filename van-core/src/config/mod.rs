//! [`Config`]: everything a node reads from its environment, parsed once into typed fields.
//!
//! Variable names follow ps-lite and BytePS (`DMLC_*`, `PS_*`) so existing launch scripts run
//! unchanged; knobs of our own are `VANS_*`. [`VARIABLES`] lists every variable with its
//! default and effect; the book's configuration chapter (`docs/src/operators/configuration.md`,
//! generated from it by `van-core/tests/docs_variables.rs`) and diagnostics print that list.
//!
//! Rules, the same for the environment and the [`ConfigBuilder`]:
//!
//! - Values are trimmed; an empty value counts as unset (so `DMLC_ROLE= ./app` is a
//!   single-process run, not an error).
//! - When `DMLC_ROLE` is set, `DMLC_NUM_WORKER`, `DMLC_NUM_SERVER`, `DMLC_PS_ROOT_URI` and
//!   `DMLC_PS_ROOT_PORT` are required, as in ps-lite. Without a role (single process, tests)
//!   they default to 1 worker, 1 server, `127.0.0.1` and no root port.
//! - A value that does not parse, and settings that contradict each other, are a
//!   [`ConfigError`] naming the variable(s), the value and what was expected. Nothing is
//!   silently clamped.
//! - Variables vans does not know (other `DMLC_*`, `BYTEPS_*`, …) are ignored.
//! - `VANS_RANK` (or [`ConfigBuilder::rank`]) asks the scheduler for this worker's or
//!   server's rank within its role; it is announced as a TensorFlow task of the role's job,
//!   so nodes are numbered and recovered by task (see `rank.rs` for the rules: an error on the
//!   scheduler, below the role's count, the same task as `TF_CONFIG`'s when both give one).
//!
//! Nothing else in vans reads the environment: the vans and the cluster take a `Config`.
//!
//! # TensorFlow deployments: `TF_CONFIG` and `.endpoint_map`
//!
//! - When `TF_CONFIG` is set (by the Kubeflow TFJob operator or any TensorFlow launcher), it
//!   supplies `DMLC_ROLE`, `DMLC_NUM_WORKER`, `DMLC_NUM_SERVER`, `DMLC_PS_ROOT_URI`,
//!   `DMLC_PS_ROOT_PORT`, `DMLC_NODE_HOST` and `DMLC_ENABLE_RDMA` as described in
//!   [`crate::tf_config`]. **Explicit `DMLC_*` variables override `TF_CONFIG`**: it is only
//!   consulted for those that are unset (and `DMLC_NODE_HOST` is not derived when
//!   `DMLC_INTERFACE` is set). The process of `chief:0` (or `worker:0` without a chief)
//!   gets [`Config::hosts_scheduler`]: it runs the scheduler on the root address in addition
//!   to its own role, unless `DMLC_PS_ROOT_URI` or `DMLC_PS_ROOT_PORT` is set explicitly
//!   (which points at a scheduler run elsewhere) or `DMLC_ROLE=scheduler`.
//! - [`Config::endpoint_map`] is read from the file named by `VANS_ENDPOINT_MAP`; without
//!   it, [`Config::from_env`] (not [`Config::from_vars`]) reads `./.endpoint_map` when that
//!   file exists, as the TensorFlow Seastar and StarServer deployments do. A missing or
//!   invalid file is an error naming the variable (or the default path) and the line.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use van_core::config::{Config, RdmaMode};
//! use van_core::Role;
//!
//! // Tests pass variables explicitly; a real node calls `Config::from_env()`.
//! let config = Config::from_vars([
//!     ("DMLC_ROLE", "worker"),
//!     ("DMLC_NUM_WORKER", "2"),
//!     ("DMLC_NUM_SERVER", "1"),
//!     ("DMLC_PS_ROOT_URI", "10.0.0.2"),
//!     ("DMLC_PS_ROOT_PORT", "8123"),
//!     ("DMLC_ENABLE_RDMA", "1"),
//!     ("PS_HEARTBEAT_INTERVAL", "5"),
//! ])?;
//! assert_eq!(config.role, Some(Role::Worker));
//! assert_eq!(config.enable_rdma, RdmaMode::Ibverbs);
//! assert_eq!(config.heartbeat_interval, Some(Duration::from_secs(5)));
//!
//! // Errors name the variable and say what was expected.
//! let err = Config::from_vars([("DMLC_ENABLE_RDMA", "yes")]).unwrap_err();
//! assert!(err.to_string().contains("DMLC_ENABLE_RDMA"));
//!
//! // In code: the same validation.
//! let config = Config::builder().num_workers(4).verbose(1).build()?;
//! assert_eq!(config.num_workers, 4);
//! # Ok::<(), van_core::ConfigError>(())
//! ```

// One file per part of the configuration, importing each other in one direction: `error`,
// `rdma` and `variables` import nothing from here, `collective` only `error`; this file
// (`Config`) imports `error`, `rdma` and `collective`; `reader` imports `variables`; `rank`
// imports this file; `builder` and the parsers (`env`, `tensorflow`, `van_knobs`) import this
// file and `reader` (and `rank`, `collective`).
mod auth; // `AuthOptions::from_config`
mod builder; // `ConfigBuilder`: every field set in code
mod collective; // `CollectiveSettings`: the `collective` crate's `VANS_COLLECTIVE_*`
mod engine; // roles from Slurm, Open MPI, PMI and PyTorch-style launchers
mod env; // `Config::from_env` / `from_vars`: which variable sets which field
mod error; // `ConfigError`
mod rank; // `VANS_RANK`: a node's rank within its role, announced as a task of its job
pub(crate) mod rdma; // `RdmaMode`, `RdmaFallback`, `RdmaSettings` (also read by `tf_config`)
mod reader; // `Vars`: the variables given, and typed reads of one of them
mod tensorflow; // `TF_CONFIG` and the endpoint map
mod tf_server; // `VANS_TF_SERVER`: where vans listens beside a TensorFlow server
mod van_knobs; // the variables that tune the vans: IPC, polling, io_uring, RDMA
mod variables; // `VARIABLES`: every variable, its default and effect

pub use builder::ConfigBuilder;
pub use collective::{
    CollectiveAlgorithm, CollectiveAlgorithms, CollectiveKind, CollectiveSettings,
    DEFAULT_COLLECTIVE_DIRECT_BYTES, DEFAULT_COLLECTIVE_SETTLE_WINDOW,
    DEFAULT_COLLECTIVE_SLICE_BYTES, DEFAULT_COLLECTIVE_SPIN, DEFAULT_COLLECTIVE_TIMEOUT,
};
pub use error::ConfigError;
pub use rdma::{
    RdmaFallback, RdmaMode, RdmaSettings, DEFAULT_RDMA_MAX_HANDSHAKES, DEFAULT_RDMA_POOL_BYTES,
    DEFAULT_RDMA_RX_DEPTH, DEFAULT_RDMA_START_DEPTH,
};
pub use tensorflow::DEFAULT_ENDPOINT_MAP;
pub use variables::{EnvVar, VARIABLES};

use std::time::Duration;

use crate::endpoint_map::EndpointMap;
use crate::message::{Role, VanKind};
use crate::wire::Limits;

/// Default bound on opening one connection (`VANS_CONNECT_TIMEOUT_MS`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default shared memory per IPC van for zero-copy buffers (`VANS_IPC_ARENA_BYTES`).
pub const DEFAULT_IPC_ARENA_BYTES: usize = 64 << 20;

/// Default smallest batch the io_uring van sends zero-copy to a remote peer
/// (`VANS_URING_ZC_BYTES`).
pub const DEFAULT_URING_ZC_BYTES: usize = 64 << 10;

/// Default bound on joining the cluster (`VANS_BOOTSTRAP_TIMEOUT_SECS`).
pub const DEFAULT_BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest `DMLC_NUM_WORKER` / `DMLC_NUM_SERVER`: keeps every ps-lite node id
/// (`8 + 2 × rank`, an `i32`) far from overflow.
pub const MAX_NODES_PER_ROLE: u32 = 1 << 20;

/// The configuration of one node, built once by [`Config::from_env`], [`Config::from_vars`]
/// or [`Config::builder`], and valid by construction (fields are public for reading; after
/// changing one, [`Config::validate`] checks it again).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `DMLC_ROLE`: this node's role; `None` for a single-process run.
    pub role: Option<Role>,
    /// `DMLC_NUM_WORKER`: number of workers in the cluster.
    pub num_workers: u32,
    /// `DMLC_NUM_SERVER`: number of servers in the cluster.
    pub num_servers: u32,
    /// `DMLC_PS_ROOT_URI`: host of the scheduler.
    pub root_uri: String,
    /// `DMLC_PS_ROOT_PORT`: port of the scheduler; 0 only without a role (no scheduler).
    pub root_port: u16,
    /// `DMLC_INTERFACE`: interface whose address to announce, when `node_host` is unset.
    pub interface: Option<String>,
    /// `DMLC_NODE_HOST`: address to announce; wins over `interface`.
    pub node_host: Option<String>,
    /// `DMLC_PORT` (or legacy `PORT`): port to listen on; 0: ephemeral.
    pub port: u16,
    /// `DMLC_ENABLE_RDMA`: whether remote peers use RDMA.
    pub enable_rdma: RdmaMode,
    /// `PS_VERBOSE`: 0, 1 or 2.
    pub verbose: u8,
    /// `PS_HEARTBEAT_INTERVAL`: how often to send heartbeats; `None`: never.
    pub heartbeat_interval: Option<Duration>,
    /// `PS_HEARTBEAT_TIMEOUT`: silence after which a node is dead; `None`: never.
    pub heartbeat_timeout: Option<Duration>,
    /// `VANS_STREAM_VAN`: the van for remote peers when RDMA is off (`Tcp`, `Uring` or
    /// `InProcess`).
    pub stream_van: VanKind,
    /// `VANS_MAX_FRAME_BYTES`, `VANS_MAX_SEGMENTS`, `VANS_MAX_META_BYTES`: wire limits.
    pub limits: Limits,
    /// `VANS_CONNECT_TIMEOUT_MS`: bound on opening one connection.
    pub connect_timeout: Duration,
    /// `VANS_BOOTSTRAP_TIMEOUT_SECS`: bound on joining the cluster.
    pub bootstrap_timeout: Duration,
    /// `VANS_REPLACEMENT_GRACE_SECS`: how long `finalize`'s barrier waits for a new process
    /// in a dead member's place (zero: it fails at once).
    pub replacement_grace: Duration,
    /// From `TF_CONFIG`: this process also runs the scheduler, listening on `root_port`, in
    /// addition to its own role (`chief:0`, or `worker:0` without a chief). False unless
    /// `TF_CONFIG` says so or the builder sets it; requires a worker or server role.
    pub hosts_scheduler: bool,
    /// From `TF_CONFIG`: this process's TensorFlow task (`task.type` and `task.index`), when
    /// its type is one of the parameter server's (`ps`, `chief`, `master`, `worker`) and
    /// `TF_CONFIG` chose the role (`DMLC_ROLE` is not set). From `VANS_RANK=N`
    /// ([`ConfigBuilder::rank`]): `worker:N` for a worker, `ps:N` for a server (when both
    /// give one they must agree). The node announces it, so the scheduler numbers nodes in
    /// task order, a new process announcing it takes its place, and the rendezvous finds
    /// `/job:chief/…` and `/job:worker/task:N` where they run.
    pub tf_task: Option<crate::message::TfTask>,
    /// `VANS_ENDPOINT_MAP` (or `./.endpoint_map` with [`Config::from_env`]): control address
    /// → data address, as in the TensorFlow Seastar and StarServer deployments.
    pub endpoint_map: Option<EndpointMap>,
    /// `DMLC_ENABLE_IPC` / `BYTEPS_ENABLE_IPC`: peers on this host use shared memory when the
    /// IPC van is compiled in (true by default).
    pub enable_ipc: bool,
    /// `VANS_BUSY_POLLING` / `PS_ENABLE_POLLING` / `WORKER_ENABLE_POLLING`: spin instead of
    /// sleeping where a van can.
    pub busy_polling: bool,
    /// `VANS_HOST_ID`: the host identity to announce instead of boot id + host name.
    pub host_id: Option<String>,
    /// `VANS_IPC_ARENA_BYTES`: shared memory per IPC van for zero-copy buffers (0: none).
    pub ipc_arena_bytes: usize,
    /// `VANS_IPC_NAMED`: the IPC van listens through an accept queue in `/dev/shm`.
    pub ipc_named: bool,
    /// `VANS_EAGER_CONNECT`: connect to every peer when the node table arrives.
    pub eager_connect: bool,
    /// `VANS_RDMA_*` / `BYTEPS_RDMA_*`: the RDMA van's settings.
    pub rdma: RdmaSettings,
    /// `VANS_URING_THREADS` (or, by role, `NETWORK_PS_CORE_NUMBER` /
    /// `NETWORK_WORKER_CORE_NUMBER`, then `SEASTAR_CORE_NUMBER`): I/O threads of the io_uring
    /// van; `None`: its default (1).
    pub io_threads: Option<u32>,
    /// `VANS_PIN_CORES` (or, by role, `PS_DISABLE_PIN_CORES` / `WORKER_DISABLE_PIN_CORES`,
    /// inverted): pin I/O threads to cores.
    pub pin_io_threads: bool,
    /// `VANS_URING_ZC_BYTES`: smallest send batch the io_uring van sends with SENDMSG_ZC to a
    /// peer not on loopback; `None`: never.
    pub uring_zc_bytes: Option<usize>,
    /// `VANS_FRAME_POOL_BYTES`: idle bytes of large received-frame buffers a stream van keeps
    /// for reuse ([`FramePool`](crate::FramePool)); 0: none kept.
    pub frame_pool_bytes: usize,
    /// `VANS_PEER_BUDGET_BYTES`: bytes of large frames one peer's send queue may hold before a
    /// send waits ([`ByteBudget`](crate::budget::ByteBudget)); 0: no limit.
    pub peer_budget_bytes: usize,
    /// `VANS_CLUSTER_SECRET` / `VANS_CLUSTER_SECRET_FILE`: the secret every connection must
    /// prove it knows ([`auth`](crate::auth)); `None`: connections are not authenticated.
    pub cluster_secret: Option<crate::auth::ClusterSecret>,
    /// `VANS_HANDSHAKE_TIMEOUT_MS`: how long a new connection may take to authenticate.
    pub handshake_timeout: Duration,
    /// `VANS_MAX_PENDING_PER_ADDRESS`: connections one address may have authenticating at
    /// once; more are refused at once.
    pub max_pending_per_address: usize,
    /// `VANS_MAX_CONNECTIONS`: accepted connections a van keeps open at once, in all; more
    /// are closed at once.
    pub max_connections: usize,
    /// `VANS_MAX_CONNECTIONS_PER_ADDRESS`: accepted connections a van keeps open at once from
    /// one address; more are closed at once.
    pub max_connections_per_address: usize,
    /// `PS_RESEND` / `PS_RESEND_TIMEOUT` (ms, default 1000): resend a message its recipient
    /// has not acknowledged within this time, and drop copies already received, so that
    /// delivery is exactly once across broken connections; `None`: off (a broken connection
    /// fails the peer at once).
    pub resend_timeout: Option<Duration>,
    /// `VANS_COLLECTIVE_*`: the defaults of the collectives among the cluster's workers
    /// (`collective::CommOptions`).
    pub collective: CollectiveSettings,
    /// `VANS_UNPUSHED_KEYS`: how a summing server (ps-lite's default handler) answers a pull
    /// of a key no one has pushed.
    pub unpushed_keys: UnpushedKeys,
}

/// How a summing server answers a pull of a key no one has pushed (`VANS_UNPUSHED_KEYS`).
/// Never with fewer values than asked for: a caller that indexes the answer by position
/// would put values on the wrong keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnpushedKeys {
    /// Zeros, as many as the pull expects of the key (ps-lite's behaviour); a pull that does
    /// not say how many (no output buffer) fails naming the key.
    #[default]
    Zeros,
    /// The pull fails naming the key.
    Error,
}

impl std::str::FromStr for UnpushedKeys {
    type Err = ();

    /// `zeros` or `error`, in any case.
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.to_ascii_lowercase().as_str() {
            "zeros" => Ok(UnpushedKeys::Zeros),
            "error" => Ok(UnpushedKeys::Error),
            _ => Err(()),
        }
    }
}

impl Default for Config {
    /// A single-process configuration: no role, 1 worker, 1 server, scheduler host
    /// `127.0.0.1`, ephemeral port, TCP, no RDMA, no heartbeats, default limits and timeouts,
    /// no hosted scheduler, no endpoint map.
    fn default() -> Config {
        Config {
            role: None,
            num_workers: 1,
            num_servers: 1,
            root_uri: "127.0.0.1".to_owned(),
            root_port: 0,
            interface: None,
            node_host: None,
            port: 0,
            enable_rdma: RdmaMode::Off,
            verbose: 0,
            heartbeat_interval: None,
            heartbeat_timeout: None,
            stream_van: VanKind::Tcp,
            limits: Limits::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            bootstrap_timeout: DEFAULT_BOOTSTRAP_TIMEOUT,
            replacement_grace: Duration::ZERO,
            hosts_scheduler: false,
            tf_task: None,
            endpoint_map: None,
            enable_ipc: true,
            busy_polling: false,
            host_id: None,
            ipc_arena_bytes: DEFAULT_IPC_ARENA_BYTES,
            ipc_named: false,
            eager_connect: false,
            rdma: RdmaSettings::default(),
            io_threads: None,
            pin_io_threads: false,
            uring_zc_bytes: Some(DEFAULT_URING_ZC_BYTES),
            frame_pool_bytes: crate::pool::DEFAULT_POOL_BYTES,
            peer_budget_bytes: crate::budget::DEFAULT_BUDGET_BYTES,
            cluster_secret: None,
            handshake_timeout: crate::auth::DEFAULT_HANDSHAKE_TIMEOUT,
            max_pending_per_address: crate::auth::DEFAULT_MAX_PENDING_PER_ADDRESS,
            max_connections: crate::auth::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: crate::auth::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            resend_timeout: None,
            collective: CollectiveSettings::default(),
            unpushed_keys: UnpushedKeys::Zeros,
        }
    }
}

/// ps-lite's default `PS_RESEND_TIMEOUT`.
pub const DEFAULT_RESEND_TIMEOUT: Duration = Duration::from_millis(1000);

const PORT_EXPECTED: &str = "a port number in 0..=65535 (0: ephemeral)";
const POSITIVE_EXPECTED: &str = "a whole number of at least 1";
const SECONDS_EXPECTED: &str = "a whole number of seconds (0: off)";
const RX_DEPTH_EXPECTED: &str = "a whole number from 4 to 32768";
const START_DEPTH_EXPECTED: &str = "a whole number from 1 to 4096";
const STREAM_VAN_EXPECTED: &str = "`tcp`, `uring` or `inproc` (RDMA is chosen with \
     DMLC_ENABLE_RDMA=1; IPC is chosen per same-host peer, not here)";

impl Config {
    /// The address this node announces (`DMLC_NODE_HOST`), if set; otherwise the caller
    /// resolves [`Config::interface`] or picks an address itself.
    pub fn host(&self) -> Option<&str> {
        self.node_host.as_deref()
    }

    /// Checks ranges and contradictions; [`ConfigBuilder::build`] and the parsers call it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |var, value: &dyn ToString, expected| ConfigError::Invalid {
            var,
            value: value.to_string(),
            expected,
        };
        let contradiction = |vars, reason| Err(ConfigError::Contradiction { vars, reason });
        if self.role.is_some() {
            if self.root_uri.trim().is_empty() {
                return Err(ConfigError::Missing {
                    var: "DMLC_PS_ROOT_URI",
                });
            }
            if self.root_port == 0 {
                return Err(invalid(
                    "DMLC_PS_ROOT_PORT",
                    &0,
                    "the scheduler's port, 1..=65535",
                ));
            }
        }
        for (var, count) in [
            ("DMLC_NUM_WORKER", self.num_workers),
            ("DMLC_NUM_SERVER", self.num_servers),
        ] {
            if count > MAX_NODES_PER_ROLE {
                return Err(invalid(var, &count, "at most 1048576 (MAX_NODES_PER_ROLE)"));
            }
        }
        if self.verbose > 2 {
            return Err(invalid("PS_VERBOSE", &self.verbose, "0, 1 or 2"));
        }
        if !matches!(
            self.stream_van,
            VanKind::Tcp | VanKind::Uring | VanKind::InProcess
        ) {
            return Err(invalid(
                "VANS_STREAM_VAN",
                &self.stream_van,
                STREAM_VAN_EXPECTED,
            ));
        }
        let limits = &self.limits;
        for (var, value) in [
            ("VANS_MAX_FRAME_BYTES", limits.max_frame),
            ("VANS_MAX_SEGMENTS", u64::from(limits.max_segments)),
            ("VANS_MAX_META_BYTES", u64::from(limits.max_meta)),
            ("VANS_CONNECT_TIMEOUT_MS", millis(self.connect_timeout)),
            (
                "VANS_BOOTSTRAP_TIMEOUT_SECS",
                self.bootstrap_timeout.as_secs(),
            ),
        ] {
            if value == 0 {
                return Err(invalid(var, &0, POSITIVE_EXPECTED));
            }
        }
        match self.role {
            // Workers alone (DMLC_NUM_SERVER=0) run collectives; their key-value workers
            // refuse to start (ps's KvWorker::new).
            Some(Role::Server) if self.num_servers == 0 => {
                return contradiction(
                    &["DMLC_ROLE", "DMLC_NUM_SERVER"],
                    "a server is counted in DMLC_NUM_SERVER, which must be at least 1",
                );
            }
            Some(Role::Worker) if self.num_workers == 0 => {
                return contradiction(
                    &["DMLC_ROLE", "DMLC_NUM_WORKER"],
                    "a worker is counted in DMLC_NUM_WORKER, which must be at least 1",
                );
            }
            _ => {}
        }
        if !(4..=32768).contains(&self.rdma.rx_depth) {
            return Err(invalid(
                "VANS_RDMA_RX_DEPTH",
                &self.rdma.rx_depth,
                RX_DEPTH_EXPECTED,
            ));
        }
        if !(1..=4096).contains(&self.rdma.start_depth) {
            return Err(invalid(
                "VANS_RDMA_START_DEPTH",
                &self.rdma.start_depth,
                START_DEPTH_EXPECTED,
            ));
        }
        if let (Some(interval), Some(timeout)) = (self.heartbeat_interval, self.heartbeat_timeout) {
            if timeout <= interval {
                return contradiction(
                    &["PS_HEARTBEAT_TIMEOUT", "PS_HEARTBEAT_INTERVAL"],
                    "the timeout must be longer than the interval, or every node is declared \
                     dead between two heartbeats; a few intervals is usual",
                );
            }
        }
        if self.hosts_scheduler {
            if !matches!(self.role, Some(Role::Worker | Role::Server)) {
                return contradiction(
                    &["DMLC_ROLE", "TF_CONFIG"],
                    "only a worker or server process can host the scheduler in addition to \
                     its own role (TF_CONFIG's chief:0, or worker:0 without a chief)",
                );
            }
            if self.port == self.root_port {
                return contradiction(
                    &["DMLC_PORT", "DMLC_PS_ROOT_PORT"],
                    "this process hosts the scheduler on DMLC_PS_ROOT_PORT, so its own role \
                     must listen on another port (0: ephemeral)",
                );
            }
        }
        self.collective.validate()
    }
}

fn non_zero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    // ps-lite's environment of a worker, and two helpers on it: the parsers' tests in the
    // other files of this module use them too.
    pub(super) const PS_LITE_WORKER: [(&str, &str); 7] = [
        ("DMLC_ENABLE_RDMA", "1"),
        ("DMLC_NUM_WORKER", "2"),
        ("DMLC_NUM_SERVER", "2"),
        ("DMLC_PS_ROOT_URI", "10.0.0.2"),
        ("DMLC_PS_ROOT_PORT", "8123"),
        ("DMLC_INTERFACE", "eth5"),
        ("DMLC_ROLE", "worker"),
    ];

    pub(super) fn with(
        extra: &[(&'static str, &'static str)],
    ) -> Vec<(&'static str, &'static str)> {
        PS_LITE_WORKER.iter().chain(extra).copied().collect()
    }

    pub(super) fn err(vars: &[(&str, &str)]) -> String {
        Config::from_vars(vars.iter().copied())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn empty_environment_is_the_default() {
        let none: [(&str, &str); 0] = [];
        assert_eq!(Config::from_vars(none).unwrap(), Config::default());
        assert_eq!(Config::builder().build().unwrap(), Config::default());
        let c = Config::default();
        assert_eq!((c.role, c.num_workers, c.num_servers), (None, 1, 1));
        assert_eq!(
            (c.root_uri.as_str(), c.port, c.stream_van),
            ("127.0.0.1", 0, VanKind::Tcp)
        );
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.connect_timeout, Duration::from_secs(10));
        assert_eq!(c.bootstrap_timeout, Duration::from_secs(120));
    }

    #[test]
    fn contradictions_name_both_variables() {
        type Pairs = &'static [(&'static str, &'static str)];
        let cases: [(Pairs, [&str; 2]); 4] = [
            (
                &[("DMLC_ROLE", "worker"), ("DMLC_NUM_WORKER", "0")],
                ["DMLC_ROLE", "DMLC_NUM_WORKER"],
            ),
            (
                &[("DMLC_ROLE", "server"), ("DMLC_NUM_SERVER", "0")],
                ["DMLC_ROLE", "DMLC_NUM_SERVER"],
            ),
            (
                &[("DMLC_NUM_WORKER", "0")],
                ["DMLC_ROLE", "DMLC_NUM_WORKER"],
            ),
            (
                &[
                    ("PS_HEARTBEAT_INTERVAL", "10"),
                    ("PS_HEARTBEAT_TIMEOUT", "10"),
                ],
                ["PS_HEARTBEAT_TIMEOUT", "PS_HEARTBEAT_INTERVAL"],
            ),
        ];
        for (extra, vars) in cases {
            let e = Config::from_vars(with(extra)).unwrap_err();
            assert!(matches!(e, ConfigError::Contradiction { .. }), "{e:?}");
            let message = e.to_string();
            assert!(vars.iter().all(|v| message.contains(v)), "{message}");
        }
        // A scheduler and workers may count zero servers (collectives only); a server may
        // count zero workers.
        for role in ["scheduler", "worker"] {
            Config::from_vars(with(&[("DMLC_ROLE", role), ("DMLC_NUM_SERVER", "0")])).unwrap();
        }
        Config::from_vars(with(&[("DMLC_ROLE", "server"), ("DMLC_NUM_WORKER", "0")])).unwrap();
        // Heartbeats: 0 is off; a timeout alone (the scheduler's side) is fine.
        let c = Config::from_vars(with(&[
            ("PS_HEARTBEAT_INTERVAL", "0"),
            ("PS_HEARTBEAT_TIMEOUT", "3"),
        ]))
        .unwrap();
        assert_eq!(c.heartbeat_interval, None);
        assert_eq!(c.heartbeat_timeout, Some(Duration::from_secs(3)));
    }
}
