//! [`Config`]: everything a node reads from its environment, parsed once into typed fields.
//!
//! Variable names follow ps-lite and BytePS (`DMLC_*`, `PS_*`) so existing launch scripts run
//! unchanged; knobs of our own are `VANS_*`. [`VARIABLES`] lists every variable with its
//! default and effect; the README table and diagnostics print that list.
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

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use crate::endpoint_map::{EndpointMap, EndpointMapError};
use crate::message::Role;
use crate::tf_config::{TfConfig, TfConfigError};
use crate::van::VanKind;
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
/// The endpoint map [`Config::from_env`] reads from the current directory when
/// `VANS_ENDPOINT_MAP` is unset and the file exists.
pub const DEFAULT_ENDPOINT_MAP: &str = ".endpoint_map";

/// One environment variable vans reads: the rows of the README table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvVar {
    /// The variable's name.
    pub name: &'static str,
    /// Its value when unset, as a person would write it.
    pub default: &'static str,
    /// What it does and what it accepts.
    pub effect: &'static str,
}

/// Every variable [`Config::from_env`] reads, in the order it checks them.
pub const VARIABLES: &[EnvVar] = &[
    EnvVar {
        name: "TF_CONFIG",
        default: "unset",
        effect: "TensorFlow cluster JSON (Kubeflow TFJob); supplies each of DMLC_ROLE (`ps`: \
                 server; `chief` (or `master`), `worker`: worker; `evaluator`: error), \
                 DMLC_NUM_WORKER (chief + worker tasks), DMLC_NUM_SERVER (ps tasks), DMLC_PS_ROOT_URI and \
                 DMLC_PS_ROOT_PORT (the address of chief:0, else worker:0, whose process also \
                 hosts the scheduler), DMLC_NODE_HOST (this task's host) and DMLC_ENABLE_RDMA \
                 (`rpc_layer` containing `verbs` or `rdma`: 1; `grpc`, `grpc+seastar`, \
                 `grpc+mpi`, `star_server`, unset: 0) that is not set explicitly; explicit \
                 DMLC_* variables win",
    },
    EnvVar {
        name: "DMLC_ROLE",
        default: "unset",
        effect: "`scheduler`, `server` or `worker` (any case); unset: single process, no cluster",
    },
    EnvVar {
        name: "DMLC_NUM_WORKER",
        default: "1 (required when DMLC_ROLE is set)",
        effect: "number of worker processes; at least 1 when DMLC_ROLE=worker",
    },
    EnvVar {
        name: "DMLC_NUM_SERVER",
        default: "1 (required when DMLC_ROLE is set)",
        effect: "number of server processes; at least 1 when DMLC_ROLE is worker or server",
    },
    EnvVar {
        name: "DMLC_PS_ROOT_URI",
        default: "127.0.0.1 (required when DMLC_ROLE is set)",
        effect: "host or IP address of the scheduler",
    },
    EnvVar {
        name: "DMLC_PS_ROOT_PORT",
        default: "unset (required when DMLC_ROLE is set)",
        effect: "port of the scheduler, 1..=65535",
    },
    EnvVar {
        name: "DMLC_INTERFACE",
        default: "unset",
        effect: "network interface whose address this node announces (e.g. `eth5`); \
                 ignored when DMLC_NODE_HOST is set",
    },
    EnvVar {
        name: "DMLC_NODE_HOST",
        default: "unset",
        effect: "host or IP address this node announces; wins over DMLC_INTERFACE",
    },
    EnvVar {
        name: "DMLC_PORT",
        default: "0",
        effect: "port this node listens on; 0: an ephemeral port",
    },
    EnvVar {
        name: "PORT",
        default: "0",
        effect: "ps-lite's legacy name for DMLC_PORT; ignored when DMLC_PORT is set",
    },
    EnvVar {
        name: "DMLC_ENABLE_RDMA",
        default: "0",
        effect: "`1`, `true` or `ibverbs`: the RDMA van for remote peers; `0` or `false`: \
                 the stream van",
    },
    EnvVar {
        name: "PS_VERBOSE",
        default: "0",
        effect: "logging: 0 quiet, 1 connection setup, 2 every message",
    },
    EnvVar {
        name: "PS_HEARTBEAT_INTERVAL",
        default: "0 (off)",
        effect: "seconds between heartbeats a node sends to the scheduler; 0: none",
    },
    EnvVar {
        name: "PS_HEARTBEAT_TIMEOUT",
        default: "0 (off)",
        effect: "seconds of silence after which the scheduler declares a node dead; 0: never; \
                 must exceed PS_HEARTBEAT_INTERVAL when both are set",
    },
    EnvVar {
        name: "VANS_STREAM_VAN",
        default: "tcp",
        effect: "van for remote peers without RDMA: `tcp`, `uring`, or `inproc` \
                 (single process)",
    },
    EnvVar {
        name: "VANS_MAX_FRAME_BYTES",
        default: "1073741824 (1 GiB)",
        effect: "largest frame sent or accepted, header included; at least 1",
    },
    EnvVar {
        name: "VANS_MAX_SEGMENTS",
        default: "1024",
        effect: "largest number of data segments in one message; at least 1",
    },
    EnvVar {
        name: "VANS_MAX_META_BYTES",
        default: "4194304 (4 MiB)",
        effect: "largest encoded meta (node tables included); at least 1",
    },
    EnvVar {
        name: "VANS_CONNECT_TIMEOUT_MS",
        default: "10000 (10 s)",
        effect: "milliseconds allowed to open one connection; at least 1",
    },
    EnvVar {
        name: "VANS_BOOTSTRAP_TIMEOUT_SECS",
        default: "120",
        effect: "seconds allowed to register with the scheduler and receive the node table; \
                 at least 1",
    },
    EnvVar {
        name: "DMLC_ENABLE_IPC",
        default: "1",
        effect: "`0` or `false`: never use shared memory, even for peers on this host; `1` or \
                 `true`: use it when the IPC van is compiled in",
    },
    EnvVar {
        name: "BYTEPS_ENABLE_IPC",
        default: "1",
        effect: "BytePS's name for DMLC_ENABLE_IPC; when both are set they must agree",
    },
    EnvVar {
        name: "VANS_IPC_ARENA_BYTES",
        default: "67108864 (64 MiB)",
        effect: "bytes of shared memory each IPC van reserves for zero-copy buffers \
                 (`Postoffice::alloc`); `0` turns zero-copy sends off",
    },
    EnvVar {
        name: "VANS_IPC_NAMED",
        default: "0",
        effect: "`1`: the IPC van listens through a mailbox in `/dev/shm` instead of an \
                 abstract Unix socket, for co-located peers in different network namespaces \
                 (no zero-copy buffers then)",
    },
    EnvVar {
        name: "VANS_BUSY_POLLING",
        default: "0",
        effect: "`1`: vans that can poll (shared memory, io_uring) spin instead of sleeping \
                 between messages; lowest latency, one core busy per connection",
    },
    EnvVar {
        name: "PS_ENABLE_POLLING",
        default: "0",
        effect: "StarServer's name for VANS_BUSY_POLLING on servers; any of the three set to 1 \
                 turns polling on",
    },
    EnvVar {
        name: "WORKER_ENABLE_POLLING",
        default: "0",
        effect: "StarServer's name for VANS_BUSY_POLLING on workers",
    },
    EnvVar {
        name: "VANS_URING_THREADS",
        default: "unset (1)",
        effect: "I/O threads of the io_uring van, each with its own ring and connections; \
                 wins over the Seastar/StarServer names below; at least 1",
    },
    EnvVar {
        name: "SEASTAR_CORE_NUMBER",
        default: "unset",
        effect: "TensorFlow Seastar's name for VANS_URING_THREADS (any role)",
    },
    EnvVar {
        name: "NETWORK_PS_CORE_NUMBER",
        default: "unset",
        effect: "StarServer's name for VANS_URING_THREADS on servers; wins over \
                 SEASTAR_CORE_NUMBER there",
    },
    EnvVar {
        name: "NETWORK_WORKER_CORE_NUMBER",
        default: "unset",
        effect: "StarServer's name for VANS_URING_THREADS on workers; wins over \
                 SEASTAR_CORE_NUMBER there",
    },
    EnvVar {
        name: "VANS_PIN_CORES",
        default: "0",
        effect: "`1`: pin each io_uring I/O thread to one core of the process's CPU set \
                 (thread i to the i-th allowed core); wins over the StarServer names below",
    },
    EnvVar {
        name: "PS_DISABLE_PIN_CORES",
        default: "unset",
        effect: "StarServer's switch on servers: `1` turns pinning off, `0` turns it on \
                 (when VANS_PIN_CORES is unset)",
    },
    EnvVar {
        name: "WORKER_DISABLE_PIN_CORES",
        default: "unset",
        effect: "StarServer's switch on workers: `1` turns pinning off, `0` turns it on \
                 (when VANS_PIN_CORES is unset)",
    },
    EnvVar {
        name: "VANS_URING_ZC_BYTES",
        default: "65536",
        effect: "the io_uring van sends batches of at least this many bytes with \
                 SENDMSG_ZC (zero-copy) to peers that are not on loopback, and drops back to \
                 plain sends on a connection whose kernel reports it copied anyway; `0`: never",
    },
    EnvVar {
        name: "VANS_EAGER_CONNECT",
        default: "0",
        effect: "`1`: once the node table arrives, connect to every peer at once (as ps-lite \
                 does) instead of on first use; setup errors then surface at start",
    },
    EnvVar {
        name: "VANS_HOST_ID",
        default: "unset (boot id and host name)",
        effect: "this machine's identity as announced to the cluster: nodes with equal \
                 identities share memory; override only to test selection",
    },
    EnvVar {
        name: "VANS_ENDPOINT_MAP",
        default: "unset (`./.endpoint_map` when that file exists)",
        effect: "file mapping control addresses to data addresses, one \
                 `host:port=host:port` per line, `#` comments, as in the TensorFlow \
                 Seastar and StarServer deployments; a missing or invalid file is an error",
    },
    EnvVar {
        name: "VANS_RDMA_FALLBACK",
        default: "none",
        effect: "what a node does when DMLC_ENABLE_RDMA asks for RDMA and it cannot be used (no \
                 device, no driver, no kernel support, van not compiled in, or a peer without \
                 RDMA): `none`: fail with an error naming the cause; `tcp`: warn and use the \
                 stream van instead",
    },
    EnvVar {
        name: "VANS_RDMA_DEVICE",
        default: "unset (the first device whose port 1 is active)",
        effect: "RDMA device the RDMA van opens, by name as `ibv_devices` lists it (e.g. \
                 `mlx5_0`, `rxe0`)",
    },
    EnvVar {
        name: "VANS_RDMA_GID_INDEX",
        default: "unset (auto: the RoCE v2 IPv4-mapped GID, else the first RoCE v2, else 0)",
        effect: "GID table index of port 1 the RDMA van uses; `vans-doctor` lists them",
    },
    EnvVar {
        name: "VANS_RDMA_RX_DEPTH",
        default: "128",
        effect: "receive buffers each RDMA connection posts (and so the credits a sender has \
                 for small messages); 4..=32768",
    },
    EnvVar {
        name: "BYTEPS_RDMA_RX_DEPTH",
        default: "128",
        effect: "BytePS's name for VANS_RDMA_RX_DEPTH; when both are set they must agree",
    },
    EnvVar {
        name: "VANS_RDMA_START_DEPTH",
        default: "16",
        effect: "large messages (RDMA write rendezvous) each RDMA connection keeps in flight \
                 before later sends wait; 1..=4096",
    },
    EnvVar {
        name: "BYTEPS_RDMA_START_DEPTH",
        default: "16",
        effect: "BytePS's name for VANS_RDMA_START_DEPTH; when both are set they must agree",
    },
    EnvVar {
        name: "VANS_RDMA_POOL_BYTES",
        default: "268435456 (256 MiB)",
        effect: "registered memory each RDMA van keeps for reuse (large receives, staging, \
                 `Postoffice::alloc`); more is registered on demand and released after use; \
                 the memlock limit must allow it",
    },
];

/// Whether remote peers are reached over RDMA (`DMLC_ENABLE_RDMA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RdmaMode {
    /// Remote peers use the stream van (`DMLC_ENABLE_RDMA=0`, `false` or unset).
    #[default]
    Off,
    /// Remote peers use the RDMA verbs van (`DMLC_ENABLE_RDMA=1`, `true` or `ibverbs`).
    Ibverbs,
}

impl RdmaMode {
    /// Whether RDMA is requested.
    pub fn is_enabled(self) -> bool {
        self == RdmaMode::Ibverbs
    }
}

/// What to do when RDMA is asked for and cannot be used (`VANS_RDMA_FALLBACK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RdmaFallback {
    /// Fail with an error naming the cause (`none`, the default).
    #[default]
    None,
    /// Warn and use the stream van (`tcp`).
    Stream,
}

/// Default receive buffers per RDMA connection (`VANS_RDMA_RX_DEPTH`).
pub const DEFAULT_RDMA_RX_DEPTH: u32 = 128;
/// Default large messages in flight per RDMA connection (`VANS_RDMA_START_DEPTH`).
pub const DEFAULT_RDMA_START_DEPTH: u32 = 16;
/// Default registered memory an RDMA van keeps for reuse (`VANS_RDMA_POOL_BYTES`).
pub const DEFAULT_RDMA_POOL_BYTES: usize = 256 << 20;

/// Settings of the RDMA van (`VANS_RDMA_*`, and BytePS's `BYTEPS_RDMA_*` names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaSettings {
    /// `VANS_RDMA_FALLBACK`: what to do when RDMA cannot be used.
    pub fallback: RdmaFallback,
    /// `VANS_RDMA_DEVICE`: the device to open; `None`: the first with an active port.
    pub device: Option<String>,
    /// `VANS_RDMA_GID_INDEX`: the GID index; `None`: chosen automatically.
    pub gid_index: Option<u32>,
    /// `VANS_RDMA_RX_DEPTH` / `BYTEPS_RDMA_RX_DEPTH`: receive buffers per connection.
    pub rx_depth: u32,
    /// `VANS_RDMA_START_DEPTH` / `BYTEPS_RDMA_START_DEPTH`: large messages in flight per
    /// connection.
    pub start_depth: u32,
    /// `VANS_RDMA_POOL_BYTES`: registered memory kept for reuse.
    pub pool_bytes: usize,
}

impl Default for RdmaSettings {
    fn default() -> RdmaSettings {
        RdmaSettings {
            fallback: RdmaFallback::None,
            device: None,
            gid_index: None,
            rx_depth: DEFAULT_RDMA_RX_DEPTH,
            start_depth: DEFAULT_RDMA_START_DEPTH,
            pool_bytes: DEFAULT_RDMA_POOL_BYTES,
        }
    }
}

/// A configuration that cannot be used. Every message names the variable(s) to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A variable that ps-lite requires for a cluster node is unset: set it on every node.
    #[error("{var} is not set; it is required when DMLC_ROLE is set (export it on every node)")]
    Missing {
        /// The variable.
        var: &'static str,
    },
    /// A value does not parse or is out of range: fix the value.
    #[error("invalid value {value:?} for {var}: expected {expected}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// The value found (non-UTF-8 bytes shown as U+FFFD).
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// Values that are each valid but cannot hold together: change one of them.
    #[error("{} contradict each other: {reason}", .vars.join(" and "))]
    Contradiction {
        /// The variables involved.
        vars: &'static [&'static str],
        /// Why, and what to change.
        reason: &'static str,
    },
    /// `TF_CONFIG` does not parse, or cannot supply a variable that is not set explicitly:
    /// fix it, or set that `DMLC_*` variable.
    #[error("{error}; TF_CONFIG={value}")]
    TfConfig {
        /// The value of `TF_CONFIG` (cut after 1000 characters).
        value: String,
        /// What is wrong.
        error: Box<TfConfigError>,
    },
    /// The endpoint map cannot be read or parsed: fix the file or `VANS_ENDPOINT_MAP`.
    #[error("endpoint map {path} ({origin}): {error}")]
    EndpointMap {
        /// Where the path came from: `VANS_ENDPOINT_MAP` or the current directory.
        origin: &'static str,
        /// The file.
        path: String,
        /// What is wrong.
        error: Box<EndpointMapError>,
    },
}

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
    /// From `TF_CONFIG`: this process also runs the scheduler, listening on `root_port`, in
    /// addition to its own role (`chief:0`, or `worker:0` without a chief). False unless
    /// `TF_CONFIG` says so or the builder sets it; requires a worker or server role.
    pub hosts_scheduler: bool,
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
    /// `VANS_IPC_NAMED`: the IPC van listens through a mailbox in `/dev/shm`.
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
            hosts_scheduler: false,
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
        }
    }
}

const PORT_EXPECTED: &str = "a port number in 0..=65535 (0: ephemeral)";
const POSITIVE_EXPECTED: &str = "a whole number of at least 1";
const SECONDS_EXPECTED: &str = "a whole number of seconds (0: off)";
const RX_DEPTH_EXPECTED: &str = "a whole number from 4 to 32768";
const START_DEPTH_EXPECTED: &str = "a whole number from 1 to 4096";
const STREAM_VAN_EXPECTED: &str = "`tcp`, `uring` or `inproc` (RDMA is chosen with \
     DMLC_ENABLE_RDMA=1; IPC is chosen per same-host peer, not here)";

impl Config {
    /// Reads the process environment (see [`VARIABLES`]), and `./.endpoint_map` when
    /// `VANS_ENDPOINT_MAP` is unset and that file exists.
    ///
    /// A variable of [`VARIABLES`] whose value is not UTF-8 is [`ConfigError::Invalid`].
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut config = Config::from_os_vars(std::env::vars_os())?;
        if config.endpoint_map.is_none() {
            config.endpoint_map = default_endpoint_map(Path::new(DEFAULT_ENDPOINT_MAP))?;
        }
        Ok(config)
    }

    /// Parses variables given as name–value pairs, exactly as [`Config::from_env`] would;
    /// tests use it so they never touch the process environment. Later pairs override
    /// earlier ones with the same name; unknown names are ignored. The file system is only
    /// read for `VANS_ENDPOINT_MAP` (no `./.endpoint_map` lookup).
    pub fn from_vars<I, K, V>(vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut map = HashMap::new();
        for (name, value) in vars {
            if let Some(known) = known_name(name.as_ref()) {
                map.insert(known, value.as_ref().trim().to_owned());
            }
        }
        map.retain(|_, value| !value.is_empty());
        let mut vars = Vars { map };
        let hosts_scheduler = vars.apply_tf_config()?;
        vars.parse(hosts_scheduler)
    }

    /// A builder starting from [`Config::default`].
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

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
            Some(Role::Worker | Role::Server) if self.num_servers == 0 => {
                return contradiction(
                    &["DMLC_ROLE", "DMLC_NUM_SERVER"],
                    "workers and servers need at least one server; set DMLC_NUM_SERVER to \
                     the number of server processes",
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
        Ok(())
    }

    fn from_os_vars(
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Config, ConfigError> {
        let mut pairs = Vec::new();
        for (name, value) in vars {
            // A name that is not UTF-8 is not one of ours.
            let Some(name) = name.to_str().and_then(known_name) else {
                continue;
            };
            match value.into_string() {
                Ok(value) => pairs.push((name, value)),
                Err(value) => {
                    return Err(ConfigError::Invalid {
                        var: name,
                        value: value.to_string_lossy().into_owned(),
                        expected: "valid UTF-8",
                    })
                }
            }
        }
        Config::from_vars(pairs)
    }
}

/// Chainable setters for every [`Config`] field; [`build`](ConfigBuilder::build) applies the
/// same validation as the environment parser, and its errors name the matching variables.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    config: Config,
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

    /// Whether the IPC van listens through a mailbox in `/dev/shm` (`VANS_IPC_NAMED`).
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
    /// Sets whether this process also runs the scheduler on the root port (as `TF_CONFIG`'s
    /// `chief:0` does); needs a worker or server role and a port other than the root port.
    pub fn hosts_scheduler(mut self, hosts: bool) -> Self {
        self.config.hosts_scheduler = hosts;
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
    /// The configuration, or the first problem found (see [`Config::validate`]).
    pub fn build(self) -> Result<Config, ConfigError> {
        self.config.validate()?;
        Ok(self.config)
    }
}

/// The variables given, restricted to known names with non-empty, trimmed values.
struct Vars {
    map: HashMap<&'static str, String>,
}

impl Vars {
    fn get(&self, var: &'static str) -> Option<&str> {
        debug_assert!(known_name(var).is_some(), "{var} is missing from VARIABLES");
        self.map.get(var).map(String::as_str)
    }

    fn invalid(&self, var: &'static str, expected: &'static str) -> ConfigError {
        ConfigError::Invalid {
            var,
            value: self.get(var).unwrap_or_default().to_owned(),
            expected,
        }
    }

    fn number<T: std::str::FromStr>(
        &self,
        var: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        self.get(var)
            .map(|value| value.parse().map_err(|_| self.invalid(var, expected)))
            .transpose()
    }

    fn positive(&self, var: &'static str) -> Result<Option<u64>, ConfigError> {
        match self.number::<u64>(var, POSITIVE_EXPECTED)? {
            Some(0) => Err(self.invalid(var, POSITIVE_EXPECTED)),
            other => Ok(other),
        }
    }

    /// Fills the `DMLC_*` variables that `TF_CONFIG` stands for and that are not set
    /// explicitly; returns whether `TF_CONFIG` makes this process host the scheduler.
    fn apply_tf_config(&mut self) -> Result<bool, ConfigError> {
        let Some(json) = self.get("TF_CONFIG") else {
            return Ok(false);
        };
        let wrap = |error| ConfigError::TfConfig {
            value: json.chars().take(1000).collect(),
            error: Box::new(error),
        };
        let tf = TfConfig::parse(json).map_err(wrap)?;
        let derived = tf
            .dmlc_vars_except(|var| self.map.contains_key(var))
            .map_err(wrap)?;
        // An explicit root address points at a scheduler run elsewhere.
        let hosts = tf.hosts_scheduler()
            && self.get("DMLC_PS_ROOT_URI").is_none()
            && self.get("DMLC_PS_ROOT_PORT").is_none();
        for (var, value) in derived {
            if let Some(var) = known_name(var) {
                self.map.insert(var, value);
            }
        }
        Ok(hosts)
    }

    fn parse(&self, hosts_scheduler: bool) -> Result<Config, ConfigError> {
        let mut c = Config {
            role: self.role()?,
            ..Config::default()
        };
        // `DMLC_ROLE=scheduler` with the chief's TF_CONFIG: the process is the scheduler.
        c.hosts_scheduler = hosts_scheduler && matches!(c.role, Some(Role::Worker | Role::Server));
        let required = |var| match (c.role, self.get(var)) {
            (Some(_), None) => Err(ConfigError::Missing { var }),
            _ => Ok(()),
        };
        for var in [
            "DMLC_NUM_WORKER",
            "DMLC_NUM_SERVER",
            "DMLC_PS_ROOT_URI",
            "DMLC_PS_ROOT_PORT",
        ] {
            required(var)?;
        }
        let count = "a whole number of processes";
        if let Some(n) = self.number("DMLC_NUM_WORKER", count)? {
            c.num_workers = n;
        }
        if let Some(n) = self.number("DMLC_NUM_SERVER", count)? {
            c.num_servers = n;
        }
        if let Some(uri) = self.get("DMLC_PS_ROOT_URI") {
            c.root_uri = uri.to_owned();
        }
        let root_expected = "the scheduler's port, 1..=65535";
        match self.number::<u16>("DMLC_PS_ROOT_PORT", root_expected)? {
            Some(0) => return Err(self.invalid("DMLC_PS_ROOT_PORT", root_expected)),
            Some(port) => c.root_port = port,
            None => {}
        }
        c.interface = self.get("DMLC_INTERFACE").map(str::to_owned);
        c.node_host = self.get("DMLC_NODE_HOST").map(str::to_owned);
        // DMLC_PORT wins; the legacy PORT is not even parsed when DMLC_PORT is set.
        let port_var = match self.get("DMLC_PORT") {
            Some(_) => "DMLC_PORT",
            None => "PORT",
        };
        if let Some(port) = self.number(port_var, PORT_EXPECTED)? {
            c.port = port;
        }
        c.enable_rdma = self.rdma()?;
        if let Some(level) = self.get("PS_VERBOSE") {
            c.verbose = match level {
                "0" => 0,
                "1" => 1,
                "2" => 2,
                _ => return Err(self.invalid("PS_VERBOSE", "0, 1 or 2")),
            };
        }
        let seconds = |var| -> Result<_, ConfigError> {
            Ok(self
                .number(var, SECONDS_EXPECTED)?
                .and_then(|s| non_zero(Duration::from_secs(s))))
        };
        c.heartbeat_interval = seconds("PS_HEARTBEAT_INTERVAL")?;
        c.heartbeat_timeout = seconds("PS_HEARTBEAT_TIMEOUT")?;
        if let Some(name) = self.get("VANS_STREAM_VAN") {
            c.stream_van = name
                .parse()
                .map_err(|_| self.invalid("VANS_STREAM_VAN", STREAM_VAN_EXPECTED))?;
        }
        if let Some(n) = self.positive("VANS_MAX_FRAME_BYTES")? {
            c.limits.max_frame = n;
        }
        let u32_expected = "a whole number from 1 to 4294967295";
        if let Some(n) = self.number::<u32>("VANS_MAX_SEGMENTS", u32_expected)? {
            c.limits.max_segments = n;
        }
        if let Some(n) = self.number::<u32>("VANS_MAX_META_BYTES", u32_expected)? {
            c.limits.max_meta = n;
        }
        if let Some(ms) = self.positive("VANS_CONNECT_TIMEOUT_MS")? {
            c.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(s) = self.positive("VANS_BOOTSTRAP_TIMEOUT_SECS")? {
            c.bootstrap_timeout = Duration::from_secs(s);
        }
        if let Some(path) = self.get("VANS_ENDPOINT_MAP") {
            let map =
                EndpointMap::load(Path::new(path)).map_err(|error| ConfigError::EndpointMap {
                    origin: "from VANS_ENDPOINT_MAP",
                    path: path.to_owned(),
                    error: Box::new(error),
                })?;
            c.endpoint_map = Some(map);
        }
        c.enable_ipc = self.ipc()?;
        for var in [
            "VANS_BUSY_POLLING",
            "PS_ENABLE_POLLING",
            "WORKER_ENABLE_POLLING",
        ] {
            if let Some(on) = self.flag(var)? {
                c.busy_polling |= on;
            }
        }
        c.host_id = self.get("VANS_HOST_ID").map(str::to_owned);
        if let Some(n) = self.number::<usize>("VANS_IPC_ARENA_BYTES", "a whole number of bytes")? {
            c.ipc_arena_bytes = n;
        }
        c.eager_connect = self.flag("VANS_EAGER_CONNECT")?.unwrap_or(false);
        self.io_threads(&mut c)?;
        c.ipc_named = self.flag("VANS_IPC_NAMED")?.unwrap_or(false);
        c.rdma = self.rdma_settings()?;
        c.validate()?;
        Ok(c)
    }

    /// The io_uring van's threads, pinning and zero-copy threshold. Every variable is
    /// checked whatever the role; the role picks which StarServer name applies.
    fn io_threads(&self, c: &mut Config) -> Result<(), ConfigError> {
        let mut threads = [None; 4];
        for (slot, var) in threads.iter_mut().zip([
            "VANS_URING_THREADS",
            "NETWORK_PS_CORE_NUMBER",
            "NETWORK_WORKER_CORE_NUMBER",
            "SEASTAR_CORE_NUMBER",
        ]) {
            *slot = self
                .positive(var)?
                .map(|n| u32::try_from(n).map_err(|_| self.invalid(var, "at most 4294967295")))
                .transpose()?;
        }
        let [ours, ps, worker, seastar] = threads;
        let by_role = match c.role {
            Some(Role::Server) => ps,
            Some(Role::Worker) => worker,
            _ => None,
        };
        c.io_threads = ours.or(by_role).or(seastar);
        let ps_off = self.flag("PS_DISABLE_PIN_CORES")?;
        let worker_off = self.flag("WORKER_DISABLE_PIN_CORES")?;
        let off_by_role = match c.role {
            Some(Role::Server) => ps_off,
            Some(Role::Worker) => worker_off,
            _ => None,
        };
        c.pin_io_threads = match (self.flag("VANS_PIN_CORES")?, off_by_role) {
            (Some(on), _) => on,
            (None, Some(off)) => !off,
            (None, None) => false,
        };
        if let Some(n) = self.number::<usize>("VANS_URING_ZC_BYTES", "a whole number of bytes")? {
            c.uring_zc_bytes = (n > 0).then_some(n);
        }
        Ok(())
    }

    /// A boolean variable: `0`/`false` or `1`/`true` (any case).
    fn flag(&self, var: &'static str) -> Result<Option<bool>, ConfigError> {
        let Some(value) = self.get(var) else {
            return Ok(None);
        };
        match value.to_ascii_lowercase().as_str() {
            "0" | "false" => Ok(Some(false)),
            "1" | "true" => Ok(Some(true)),
            _ => Err(self.invalid(var, "`0`, `false`, `1` or `true`")),
        }
    }

    fn ipc(&self) -> Result<bool, ConfigError> {
        match (
            self.flag("DMLC_ENABLE_IPC")?,
            self.flag("BYTEPS_ENABLE_IPC")?,
        ) {
            (Some(a), Some(b)) if a != b => Err(ConfigError::Contradiction {
                vars: &["DMLC_ENABLE_IPC", "BYTEPS_ENABLE_IPC"],
                reason: "one turns shared memory on and the other off; set one of them",
            }),
            (Some(a), _) | (None, Some(a)) => Ok(a),
            (None, None) => Ok(true),
        }
    }

    fn role(&self) -> Result<Option<Role>, ConfigError> {
        let Some(value) = self.get("DMLC_ROLE") else {
            return Ok(None);
        };
        [Role::Scheduler, Role::Server, Role::Worker]
            .into_iter()
            .find(|role| role.as_str().eq_ignore_ascii_case(value))
            .map(Some)
            .ok_or_else(|| self.invalid("DMLC_ROLE", "`scheduler`, `server` or `worker`"))
    }

    fn rdma_settings(&self) -> Result<RdmaSettings, ConfigError> {
        let mut r = RdmaSettings::default();
        if let Some(value) = self.get("VANS_RDMA_FALLBACK") {
            r.fallback = match value.to_ascii_lowercase().as_str() {
                "none" | "0" | "off" => RdmaFallback::None,
                "tcp" | "stream" => RdmaFallback::Stream,
                _ => {
                    return Err(self.invalid(
                        "VANS_RDMA_FALLBACK",
                        "`none` (fail when RDMA cannot be used) or `tcp` (warn and use the \
                         stream van)",
                    ))
                }
            };
        }
        r.device = self.get("VANS_RDMA_DEVICE").map(str::to_owned);
        r.gid_index = self.number("VANS_RDMA_GID_INDEX", "a GID table index, 0 or more")?;
        let rx = &["VANS_RDMA_RX_DEPTH", "BYTEPS_RDMA_RX_DEPTH"];
        if let Some(depth) = self.alias_number(rx, RX_DEPTH_EXPECTED)? {
            r.rx_depth = depth;
        }
        let start = &["VANS_RDMA_START_DEPTH", "BYTEPS_RDMA_START_DEPTH"];
        if let Some(depth) = self.alias_number(start, START_DEPTH_EXPECTED)? {
            r.start_depth = depth;
        }
        if let Some(n) = self.number::<usize>("VANS_RDMA_POOL_BYTES", "a whole number of bytes")? {
            r.pool_bytes = n;
        }
        Ok(r)
    }

    /// A number with two names (ours, then BytePS's): either may be set; both must agree.
    fn alias_number(
        &self,
        names: &'static [&'static str; 2],
        expected: &'static str,
    ) -> Result<Option<u32>, ConfigError> {
        match (
            self.number::<u32>(names[0], expected)?,
            self.number::<u32>(names[1], expected)?,
        ) {
            (Some(a), Some(b)) if a != b => Err(ConfigError::Contradiction {
                vars: names,
                reason: "they set different depths; set one of them",
            }),
            (Some(a), _) | (None, Some(a)) => Ok(Some(a)),
            (None, None) => Ok(None),
        }
    }

    fn rdma(&self) -> Result<RdmaMode, ConfigError> {
        let Some(value) = self.get("DMLC_ENABLE_RDMA") else {
            return Ok(RdmaMode::Off);
        };
        match value.to_ascii_lowercase().as_str() {
            "0" | "false" => Ok(RdmaMode::Off),
            "1" | "true" | "ibverbs" => Ok(RdmaMode::Ibverbs),
            _ => Err(self.invalid(
                "DMLC_ENABLE_RDMA",
                "`0`, `false` (off) or `1`, `true`, `ibverbs` (RDMA verbs)",
            )),
        }
    }
}

/// The endpoint map at `path` if that file exists (`./.endpoint_map` for
/// [`Config::from_env`]).
fn default_endpoint_map(path: &Path) -> Result<Option<EndpointMap>, ConfigError> {
    if !path.exists() {
        return Ok(None);
    }
    EndpointMap::load(path)
        .map(Some)
        .map_err(|error| ConfigError::EndpointMap {
            origin: "found in the current directory; set VANS_ENDPOINT_MAP to use another file",
            path: path.display().to_string(),
            error: Box::new(error),
        })
}

/// The `'static` name of a variable vans reads, or `None`.
fn known_name(name: &str) -> Option<&'static str> {
    VARIABLES.iter().find(|v| v.name == name).map(|v| v.name)
}

fn non_empty(s: String) -> Option<String> {
    (!s.trim().is_empty()).then_some(s)
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

    const PS_LITE_WORKER: [(&str, &str); 7] = [
        ("DMLC_ENABLE_RDMA", "1"),
        ("DMLC_NUM_WORKER", "2"),
        ("DMLC_NUM_SERVER", "2"),
        ("DMLC_PS_ROOT_URI", "10.0.0.2"),
        ("DMLC_PS_ROOT_PORT", "8123"),
        ("DMLC_INTERFACE", "eth5"),
        ("DMLC_ROLE", "worker"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        PS_LITE_WORKER.iter().chain(extra).copied().collect()
    }

    fn err(vars: &[(&str, &str)]) -> String {
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
    fn documented_defaults_match_default_config() {
        // Every default that is a value parses to `Config::default()`.
        let vars: Vec<_> = VARIABLES
            .iter()
            .filter(|v| !v.default.starts_with("unset") && v.name != "VANS_HOST_ID")
            .map(|v| (v.name, v.default.split(' ').next().unwrap()))
            .collect();
        assert_eq!(Config::from_vars(vars).unwrap(), Config::default());
    }

    #[test]
    fn every_listed_variable_is_read() {
        let free_text = [
            "DMLC_PS_ROOT_URI",
            "DMLC_INTERFACE",
            "DMLC_NODE_HOST",
            "VANS_HOST_ID",
            "VANS_RDMA_DEVICE",
        ];
        for var in VARIABLES.iter().map(|v| v.name) {
            if free_text.contains(&var) {
                let c = Config::from_vars([(var, "x")]).unwrap();
                assert!([
                    c.root_uri,
                    c.interface.unwrap_or_default(),
                    c.node_host.unwrap_or_default(),
                    c.host_id.unwrap_or_default(),
                    c.rdma.device.unwrap_or_default()
                ]
                .contains(&"x".to_owned()));
            } else {
                let message = err(&[(var, "bogus")]);
                assert!(
                    message.contains(var) && message.contains("bogus"),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn rdma_settings_with_byteps_names_and_the_fallback() {
        let c = Config::from_vars([
            ("BYTEPS_RDMA_RX_DEPTH", "256"),
            ("BYTEPS_RDMA_START_DEPTH", "8"),
            ("VANS_RDMA_GID_INDEX", "3"),
            ("VANS_RDMA_DEVICE", "rxe0"),
            ("VANS_RDMA_FALLBACK", "tcp"),
            ("VANS_RDMA_POOL_BYTES", "1048576"),
        ])
        .unwrap();
        assert_eq!(
            c.rdma,
            RdmaSettings {
                fallback: RdmaFallback::Stream,
                device: Some("rxe0".into()),
                gid_index: Some(3),
                rx_depth: 256,
                start_depth: 8,
                pool_bytes: 1 << 20,
            }
        );
        // Ours and BytePS's names may both be set when they agree.
        let c = Config::from_vars([("VANS_RDMA_RX_DEPTH", "64"), ("BYTEPS_RDMA_RX_DEPTH", "64")]);
        assert_eq!(c.unwrap().rdma.rx_depth, 64);
        let message = err(&[("VANS_RDMA_RX_DEPTH", "64"), ("BYTEPS_RDMA_RX_DEPTH", "32")]);
        assert!(message.contains("BYTEPS_RDMA_RX_DEPTH"), "{message}");
        let message = err(&[("VANS_RDMA_RX_DEPTH", "2")]);
        assert!(message.contains("from 4 to 32768"), "{message}");
        let message = err(&[("BYTEPS_RDMA_START_DEPTH", "0")]);
        assert!(message.contains("VANS_RDMA_START_DEPTH"), "{message}");
        let message = err(&[("VANS_RDMA_FALLBACK", "udp")]);
        assert!(message.contains("`tcp`"), "{message}");
    }

    #[test]
    fn ipc_and_polling_switches() {
        assert!(Config::from_vars([("DMLC_ENABLE_IPC", "0")])
            .map(|c| !c.enable_ipc)
            .unwrap());
        assert!(Config::from_vars([("BYTEPS_ENABLE_IPC", "false")])
            .map(|c| !c.enable_ipc)
            .unwrap());
        let message = err(&[("DMLC_ENABLE_IPC", "1"), ("BYTEPS_ENABLE_IPC", "0")]);
        assert!(message.contains("DMLC_ENABLE_IPC") && message.contains("BYTEPS_ENABLE_IPC"));
        for var in [
            "VANS_BUSY_POLLING",
            "PS_ENABLE_POLLING",
            "WORKER_ENABLE_POLLING",
        ] {
            assert!(
                Config::from_vars([(var, "1")]).unwrap().busy_polling,
                "{var}"
            );
        }
        assert!(!Config::default().busy_polling && Config::default().enable_ipc);
    }

    #[test]
    fn uring_threads_and_pinning_follow_the_seed_deployments_names_by_role() {
        let server = |extra: &[(&'static str, &'static str)]| {
            let mut vars = with(&[("DMLC_ROLE", "server"), ("DMLC_ENABLE_RDMA", "0")]);
            vars.extend_from_slice(extra);
            Config::from_vars(vars).unwrap()
        };
        let worker = |extra: &[(&'static str, &'static str)]| {
            let mut vars = with(&[("DMLC_ENABLE_RDMA", "0")]);
            vars.extend_from_slice(extra);
            Config::from_vars(vars).unwrap()
        };
        assert_eq!(Config::default().io_threads, None);
        assert!(!Config::default().pin_io_threads);
        let all = [
            ("SEASTAR_CORE_NUMBER", "2"),
            ("NETWORK_PS_CORE_NUMBER", "3"),
            ("NETWORK_WORKER_CORE_NUMBER", "4"),
        ];
        assert_eq!(server(&all).io_threads, Some(3));
        assert_eq!(worker(&all).io_threads, Some(4));
        assert_eq!(server(&all[..1]).io_threads, Some(2));
        let mut ours = all.to_vec();
        ours.push(("VANS_URING_THREADS", "5"));
        assert_eq!(worker(&ours).io_threads, Some(5));
        assert!(err(&[("VANS_URING_THREADS", "0")]).contains("VANS_URING_THREADS"));
        // StarServer pins by default and turns it off per role; ours wins when set.
        assert!(server(&[("PS_DISABLE_PIN_CORES", "0")]).pin_io_threads);
        assert!(!server(&[("PS_DISABLE_PIN_CORES", "1")]).pin_io_threads);
        assert!(!server(&[("WORKER_DISABLE_PIN_CORES", "0")]).pin_io_threads);
        assert!(worker(&[("WORKER_DISABLE_PIN_CORES", "0")]).pin_io_threads);
        assert!(
            !worker(&[("WORKER_DISABLE_PIN_CORES", "0"), ("VANS_PIN_CORES", "0")]).pin_io_threads
        );
        assert!(worker(&[("VANS_PIN_CORES", "1")]).pin_io_threads);
        assert_eq!(
            Config::from_vars([("VANS_URING_ZC_BYTES", "0")])
                .unwrap()
                .uring_zc_bytes,
            None
        );
    }

    #[test]
    fn full_ps_lite_environment() {
        let c = Config::from_vars(with(&[
            ("DMLC_NODE_HOST", "10.0.0.7"),
            ("DMLC_PORT", "9000"),
            ("PS_VERBOSE", "2"),
            ("PS_HEARTBEAT_INTERVAL", "5"),
            ("PS_HEARTBEAT_TIMEOUT", "30"),
            ("VANS_STREAM_VAN", "URING"),
            ("VANS_MAX_FRAME_BYTES", "4096"),
            ("VANS_MAX_SEGMENTS", "8"),
            ("VANS_MAX_META_BYTES", "1024"),
            ("VANS_CONNECT_TIMEOUT_MS", "250"),
            ("VANS_BOOTSTRAP_TIMEOUT_SECS", "30"),
            ("BYTEPS_LOCAL_SIZE", "8"),
        ]))
        .unwrap();
        let expected = Config::builder()
            .role(Role::Worker)
            .num_workers(2)
            .num_servers(2)
            .root_uri("10.0.0.2")
            .root_port(8123)
            .interface("eth5")
            .node_host("10.0.0.7")
            .port(9000)
            .enable_rdma(RdmaMode::Ibverbs)
            .verbose(2)
            .heartbeat_interval(Duration::from_secs(5))
            .heartbeat_timeout(Duration::from_secs(30))
            .stream_van(VanKind::Uring)
            .limits(Limits {
                max_frame: 4096,
                max_segments: 8,
                max_meta: 1024,
            })
            .connect_timeout(Duration::from_millis(250))
            .bootstrap_timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        assert_eq!(c, expected);
        assert_eq!(c.host(), Some("10.0.0.7"));
    }

    #[test]
    fn role_is_case_insensitive_and_empty_is_unset() {
        for (value, role) in [("Scheduler", Role::Scheduler), (" SERVER ", Role::Server)] {
            let c = Config::from_vars(with(&[("DMLC_ROLE", value)])).unwrap();
            assert_eq!(c.role, Some(role));
        }
        let c = Config::from_vars([("DMLC_ROLE", ""), ("DMLC_PORT", "  ")]).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn later_pairs_override_earlier_ones() {
        let c = Config::from_vars(with(&[("DMLC_NUM_WORKER", "5")])).unwrap();
        assert_eq!(c.num_workers, 5);
    }

    #[test]
    fn a_role_requires_the_cluster_variables() {
        for var in [
            "DMLC_NUM_WORKER",
            "DMLC_NUM_SERVER",
            "DMLC_PS_ROOT_URI",
            "DMLC_PS_ROOT_PORT",
        ] {
            let vars: Vec<_> = PS_LITE_WORKER
                .into_iter()
                .filter(|(n, _)| *n != var)
                .collect();
            let e = Config::from_vars(vars).unwrap_err();
            assert_eq!(e, ConfigError::Missing { var });
            assert!(e.to_string().contains(var));
        }
    }

    #[test]
    fn invalid_values_name_variable_value_and_expectation() {
        let cases = [
            ("DMLC_ROLE", "master", "scheduler"),
            ("DMLC_NUM_WORKER", "-1", "whole number"),
            ("DMLC_PS_ROOT_PORT", "0", "1..=65535"),
            ("DMLC_PS_ROOT_PORT", "70000", "1..=65535"),
            ("DMLC_PORT", "http", "0..=65535"),
            ("PS_VERBOSE", "3", "0, 1 or 2"),
            ("PS_HEARTBEAT_INTERVAL", "1.5", "seconds"),
            ("VANS_MAX_FRAME_BYTES", "0", "at least 1"),
            ("VANS_MAX_SEGMENTS", "0", "at least 1"),
            ("VANS_MAX_META_BYTES", "0", "at least 1"),
            ("VANS_CONNECT_TIMEOUT_MS", "0", "at least 1"),
            ("VANS_BOOTSTRAP_TIMEOUT_SECS", "0", "at least 1"),
            ("DMLC_NUM_SERVER", "2000000", "MAX_NODES_PER_ROLE"),
        ];
        for (var, value, expected) in cases {
            let e = Config::from_vars(with(&[(var, value)])).unwrap_err();
            assert!(
                matches!(e, ConfigError::Invalid { var: v, .. } if v == var),
                "{e:?}"
            );
            let message = e.to_string();
            for part in [var, value, expected] {
                assert!(message.contains(part), "{message:?} lacks {part:?}");
            }
        }
    }

    #[test]
    fn rdma_and_ipc_are_not_stream_vans() {
        for value in ["rdma", "ipc"] {
            let message = err(&[("VANS_STREAM_VAN", value)]);
            assert!(message.contains("VANS_STREAM_VAN") && message.contains("DMLC_ENABLE_RDMA"));
        }
        let c = Config::from_vars([("VANS_STREAM_VAN", "inproc")]).unwrap();
        assert_eq!(c.stream_van, VanKind::InProcess);
    }

    #[test]
    fn enable_rdma_variants() {
        for (value, mode) in [
            ("0", RdmaMode::Off),
            ("false", RdmaMode::Off),
            ("FALSE", RdmaMode::Off),
            ("1", RdmaMode::Ibverbs),
            ("true", RdmaMode::Ibverbs),
            ("ibverbs", RdmaMode::Ibverbs),
            ("IBVerbs", RdmaMode::Ibverbs),
        ] {
            let c = Config::from_vars([("DMLC_ENABLE_RDMA", value)]).unwrap();
            assert_eq!(c.enable_rdma, mode, "{value}");
        }
        assert!(RdmaMode::Ibverbs.is_enabled() && !RdmaMode::Off.is_enabled());
        for value in ["2", "yes", "ucx"] {
            let message = err(&[("DMLC_ENABLE_RDMA", value)]);
            assert!(message.contains("DMLC_ENABLE_RDMA") && message.contains("ibverbs"));
        }
    }

    #[test]
    fn dmlc_port_wins_over_legacy_port() {
        let port = |vars: &[(&str, &str)]| Config::from_vars(vars.iter().copied()).unwrap().port;
        assert_eq!(port(&[("PORT", "7000")]), 7000);
        assert_eq!(port(&[("PORT", "7000"), ("DMLC_PORT", "7001")]), 7001);
        // The legacy name is not parsed when DMLC_PORT is set.
        assert_eq!(port(&[("PORT", "web"), ("DMLC_PORT", "7001")]), 7001);
        assert!(err(&[("PORT", "web")]).contains("PORT"));
        assert!(err(&[("PORT", "7000"), ("DMLC_PORT", "x")]).contains("DMLC_PORT"));
    }

    #[test]
    fn contradictions_name_both_variables() {
        type Pairs = &'static [(&'static str, &'static str)];
        let cases: [(Pairs, [&str; 2]); 4] = [
            (
                &[("DMLC_NUM_SERVER", "0")],
                ["DMLC_ROLE", "DMLC_NUM_SERVER"],
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
        // A scheduler may count zero servers; a server may count zero workers.
        Config::from_vars(with(&[
            ("DMLC_ROLE", "scheduler"),
            ("DMLC_NUM_SERVER", "0"),
        ]))
        .unwrap();
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

    #[test]
    fn builder_applies_the_same_validation() {
        let e = Config::builder().role(Role::Worker).build().unwrap_err();
        assert!(e.to_string().contains("DMLC_PS_ROOT_PORT"), "{e}");
        let node = || Config::builder().role(Role::Worker).root_port(8123);
        node().build().unwrap();
        let cases = [
            (node().num_servers(0).build(), "DMLC_NUM_SERVER"),
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

    #[cfg(unix)]
    #[test]
    fn non_utf8_value_is_invalid() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'e', b't', 0xff]);
        let e = Config::from_os_vars([("DMLC_INTERFACE".into(), bad.clone())]).unwrap_err();
        assert!(e.to_string().contains("DMLC_INTERFACE") && e.to_string().contains("UTF-8"));
        // Variables vans does not read may hold anything.
        Config::from_os_vars([("OTHER".into(), bad)]).unwrap();
    }

    const TF_CLUSTER: &str = r#""cluster": {"chief": ["chief-0.ns:2222"],
        "worker": ["worker-0.ns:2222", "worker-1.ns:2222"], "ps": ["ps-0.ns:2222"],
        "evaluator": ["eval-0.ns:2222"]}"#;

    fn tf_config(task_type: &str, index: u32, rest: &str) -> String {
        format!(r#"{{{TF_CLUSTER}, "task": {{"type": "{task_type}", "index": {index}}}{rest}}}"#)
    }

    fn from_tf(json: &str, extra: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut vars = vec![("TF_CONFIG", json)];
        vars.extend_from_slice(extra);
        Config::from_vars(vars)
    }

    #[test]
    fn tf_config_supplies_the_cluster_variables() {
        let c = from_tf(
            &tf_config("worker", 1, r#", "rpc_layer": "grpc+verbs""#),
            &[],
        )
        .unwrap();
        let expected = Config::builder()
            .role(Role::Worker)
            .num_workers(3)
            .num_servers(1)
            .root_uri("chief-0.ns")
            .root_port(2222)
            .node_host("worker-1.ns")
            .enable_rdma(RdmaMode::Ibverbs)
            .build()
            .unwrap();
        assert_eq!(c, expected);
        assert!(!c.hosts_scheduler);

        let c = from_tf(&tf_config("ps", 0, r#", "environment": "cloud""#), &[]).unwrap();
        assert_eq!(c.role, Some(Role::Server));
        assert_eq!(c.node_host.as_deref(), Some("ps-0.ns"));
        assert_eq!(c.enable_rdma, RdmaMode::Off);
        assert!(!c.hosts_scheduler);

        // The chief hosts the scheduler on its own cluster address.
        let c = from_tf(&tf_config("chief", 0, ""), &[]).unwrap();
        assert_eq!(c.role, Some(Role::Worker));
        assert!(c.hosts_scheduler);
        assert_eq!((c.root_uri.as_str(), c.root_port), ("chief-0.ns", 2222));
        assert_eq!(c.host(), Some("chief-0.ns"));
        assert_eq!(c.port, 0);
        // An empty TF_CONFIG is unset.
        assert_eq!(from_tf(" ", &[]).unwrap(), Config::default());
    }

    #[test]
    fn explicit_dmlc_variables_override_tf_config() {
        let c = from_tf(
            &tf_config("worker", 0, r#", "rpc_layer": "grpc+verbs""#),
            &[
                ("DMLC_NUM_SERVER", "4"),
                ("DMLC_NODE_HOST", "10.1.1.1"),
                ("DMLC_ENABLE_RDMA", "0"),
                ("DMLC_ROLE", "server"),
            ],
        )
        .unwrap();
        assert_eq!(c.role, Some(Role::Server));
        assert_eq!((c.num_workers, c.num_servers), (3, 4));
        assert_eq!(c.node_host.as_deref(), Some("10.1.1.1"));
        assert_eq!(c.enable_rdma, RdmaMode::Off);
        assert_eq!(c.root_uri, "chief-0.ns");

        // An explicit root points at a scheduler elsewhere: the chief does not host one.
        for root in [("DMLC_PS_ROOT_URI", "sched"), ("DMLC_PS_ROOT_PORT", "9000")] {
            let c = from_tf(&tf_config("chief", 0, ""), &[root]).unwrap();
            assert!(!c.hosts_scheduler, "{root:?}");
        }
        // A scheduler role does not host a second scheduler.
        let c = from_tf(&tf_config("chief", 0, ""), &[("DMLC_ROLE", "scheduler")]).unwrap();
        assert_eq!((c.role, c.hosts_scheduler), (Some(Role::Scheduler), false));
        // DMLC_INTERFACE keeps TF_CONFIG from setting DMLC_NODE_HOST.
        let c = from_tf(&tf_config("ps", 0, ""), &[("DMLC_INTERFACE", "eth0")]).unwrap();
        assert_eq!((c.interface.as_deref(), c.host()), (Some("eth0"), None));
        // Explicit variables are not even derived: an evaluator with a role joins, and an
        // unknown rpc_layer is ignored when DMLC_ENABLE_RDMA is set.
        let c = from_tf(
            &tf_config("evaluator", 0, r#", "rpc_layer": "grpc+gdr""#),
            &[("DMLC_ROLE", "worker"), ("DMLC_ENABLE_RDMA", "1")],
        )
        .unwrap();
        assert_eq!(c.node_host.as_deref(), Some("eval-0.ns"));
        assert_eq!(c.enable_rdma, RdmaMode::Ibverbs);
        // The chief's own role cannot take the scheduler's port.
        let e = from_tf(&tf_config("chief", 0, ""), &[("DMLC_PORT", "2222")]).unwrap_err();
        assert!(matches!(e, ConfigError::Contradiction { .. }), "{e:?}");
        from_tf(&tf_config("chief", 0, ""), &[("DMLC_PORT", "2223")]).unwrap();
    }

    #[test]
    fn tf_config_errors_name_tf_config() {
        let cases = [
            ("{not json".to_owned(), "not a valid TF_CONFIG"),
            (tf_config("evaluator", 0, ""), "evaluators"),
            (tf_config("worker", 5, ""), "worker:5"),
            (
                tf_config("ps", 0, r#", "rpc_layer": "carrier-pigeon""#),
                "grpc+seastar",
            ),
        ];
        for (json, expected) in cases {
            let e = from_tf(&json, &[]).unwrap_err();
            assert!(matches!(e, ConfigError::TfConfig { .. }), "{e:?}");
            let message = e.to_string();
            assert!(
                message.contains("TF_CONFIG") && message.contains(expected),
                "{message}"
            );
        }
    }

    fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vans-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(DEFAULT_ENDPOINT_MAP);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn endpoint_map_from_variable_and_default_file() {
        let good = temp_file("good", "127.0.0.1:3333=127.0.0.1:5555\n");
        let path = good.to_str().unwrap();
        let c = Config::from_vars([("VANS_ENDPOINT_MAP", path)]).unwrap();
        let map = c.endpoint_map.as_ref().unwrap();
        assert_eq!(map.len(), 1);
        assert_eq!(map.get("127.0.0.1", 3333).map(|d| d.port), Some(5555));
        assert_eq!(
            Config::builder().endpoint_map(map.clone()).build().unwrap(),
            c
        );
        assert_eq!(default_endpoint_map(&good).unwrap().as_ref(), Some(map));
        assert_eq!(
            default_endpoint_map(&good.with_extension("missing")).unwrap(),
            None
        );

        let bad = temp_file("bad", "# header\n127.0.0.1:3333=127.0.0.1\n");
        let bad_path = bad.to_str().unwrap();
        let message = Config::from_vars([("VANS_ENDPOINT_MAP", bad_path)])
            .unwrap_err()
            .to_string();
        for part in ["VANS_ENDPOINT_MAP", bad_path, "line 2", "port is missing"] {
            assert!(message.contains(part), "{message:?} lacks {part:?}");
        }
        let message = default_endpoint_map(&bad).unwrap_err().to_string();
        assert!(message.contains("current directory") && message.contains("line 2"));

        let missing = "/nonexistent/vans/.endpoint_map";
        let e = Config::from_vars([("VANS_ENDPOINT_MAP", missing)]).unwrap_err();
        assert!(
            matches!(&e, ConfigError::EndpointMap { error, .. }
                if matches!(**error, EndpointMapError::Io { .. })),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(message.contains("VANS_ENDPOINT_MAP") && message.contains(missing));
        for file in [good, bad] {
            std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
        }
        // Without the variable, from_vars reads no file.
        let none: [(&str, &str); 0] = [];
        assert_eq!(Config::from_vars(none).unwrap().endpoint_map, None);
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
