//! [`ConfigError`]: a configuration that cannot be used, naming the variable(s) to fix.

use crate::endpoint_map::EndpointMapError;
use crate::tf_config::TfConfigError;

/// A configuration that cannot be used. Every message names the variable(s) to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// The rank and size a launch engine gives (Slurm, Open MPI, PMI, PyTorch) cannot make
    /// a role: the message says which variable to set or fix.
    #[error("role from the {engine} launch: {reason}")]
    Engine {
        /// The engine whose variables were read.
        engine: &'static str,
        /// What is missing or inconsistent.
        reason: String,
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
    /// The cluster secret cannot be used (its value is never shown).
    #[error("{var}: {error}")]
    Secret {
        /// The variable.
        var: &'static str,
        /// What is wrong.
        error: crate::auth::SecretError,
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
    /// A TensorFlow server's endpoint map does not map a task of its cluster: add the
    /// task's line (`control address=data address`) to the file.
    #[error(
        "endpoint map {path} has no line for task {task} (its address {address}); with an \
         endpoint map every task's address needs one: add `{address}=host:port`"
    )]
    EndpointMapMissesTask {
        /// The file.
        path: String,
        /// The task, `job:index`.
        task: String,
        /// Its address in the cluster.
        address: String,
    },
    /// No port above the scheduler's task's is free for the scheduler of TensorFlow
    /// servers: give it one in an endpoint map.
    #[error(
        "no port above {address} (task {task}, which hosts the scheduler) is left for the \
         scheduler; write an endpoint map (.endpoint_map) giving each task's data address"
    )]
    NoSchedulerPort {
        /// The task hosting the scheduler, `job:index`.
        task: String,
        /// Its address in the cluster.
        address: String,
    },
}
