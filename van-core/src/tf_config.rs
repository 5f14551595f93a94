//! [`TfConfig`]: the `TF_CONFIG` JSON that TensorFlow job launchers (the Kubeflow TFJob
//! operator, ElasticDL, hand-written scripts) set on every task, and how it maps onto a
//! ps-lite cluster.
//!
//! ```json
//! {"cluster": {"chief": ["chief-0:2222"],
//!              "worker": ["worker-0:2222", "worker-1:2222"],
//!              "ps": ["ps-0:2222"]},
//!  "task": {"type": "worker", "index": 1},
//!  "rpc_layer": "grpc",
//!  "environment": "cloud"}
//! ```
//!
//! `rpc_layer` is optional; `environment` and any other key are ignored. `task.index`
//! defaults to 0 and may be a number or a numeric string.
//!
//! # Mapping to the parameter server
//!
//! | TF_CONFIG | ps-lite |
//! | --- | --- |
//! | `ps` tasks | servers: `DMLC_NUM_SERVER` = their count |
//! | `chief` (or legacy `master`) and `worker` tasks | workers: `DMLC_NUM_WORKER` = their count |
//! | `task.type` | `DMLC_ROLE`: `ps` → server; `chief`, `master`, `worker` → worker; `evaluator` and anything else → an error (evaluators do not join the parameter server) |
//! | this task's entry `cluster[type][index]` | `DMLC_NODE_HOST` = its host |
//! | `chief:0`, or `worker:0` without a chief | hosts the scheduler **in addition to** its own role, listening on its cluster address: `DMLC_PS_ROOT_URI`/`DMLC_PS_ROOT_PORT` = that address ([`TfConfig::hosts_scheduler`]) |
//! | `rpc_layer` containing `verbs` or `rdma` | `DMLC_ENABLE_RDMA=1` |
//! | `rpc_layer` `grpc`, `grpc+vans`, `grpc+vans+push`, `grpc+seastar`, `grpc+mpi`, `star_server`, `star_server_lite` or absent | `DMLC_ENABLE_RDMA=0` (the stream van, TCP by default) |
//!
//! Any other `rpc_layer` is an error listing the accepted values. [`TfConfig::dmlc_vars`]
//! gives the whole `DMLC_*` set; [`Config`](crate::Config) uses `TF_CONFIG` only for the
//! `DMLC_*` variables that are not set explicitly (explicit `DMLC_*` override `TF_CONFIG`).
//!
//! # Example
//!
//! ```
//! use van_core::tf_config::TfConfig;
//! use van_core::Role;
//!
//! let tf = TfConfig::parse(r#"{
//!     "cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]},
//!     "task": {"type": "chief", "index": 0}
//! }"#)?;
//! assert_eq!(tf.role()?, Role::Worker);
//! assert_eq!((tf.num_workers(), tf.num_servers()), (3, 1));
//! assert!(tf.hosts_scheduler());
//! assert_eq!(tf.scheduler_address()?.to_string(), "c0:2222");
//! let vars = tf.dmlc_vars()?;
//! assert!(vars.contains(&("DMLC_PS_ROOT_URI", "c0".to_owned())));
//! # Ok::<(), van_core::tf_config::TfConfigError>(())
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::rdma::RdmaMode;
use crate::endpoint_map::{AddressError, HostPort};
use crate::message::Role;

/// Task types whose tasks are servers.
const SERVER_TYPES: &[&str] = &["ps"];
/// Task types whose tasks are workers, the scheduler's host first.
const WORKER_TYPES: &[&str] = &["chief", "master", "worker"];
/// `rpc_layer` values that keep the stream van.
const STREAM_RPC_LAYERS: &[&str] = &[
    "grpc",
    "grpc+vans",
    "grpc+vans+push",
    "grpc+seastar",
    "grpc+mpi",
    "star_server",
    "star_server_lite",
];
const RPC_LAYER_EXPECTED: &str = "`grpc`, `grpc+vans`, `grpc+vans+push`, `grpc+seastar`, \
     `grpc+mpi`, `star_server`, \
     `star_server_lite` (the stream van) or a value containing `verbs` or `rdma` such as \
     `grpc+verbs` (the RDMA van)";

/// A parsed `TF_CONFIG`: the cluster spec, this task and the RPC layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfConfig {
    /// Task type (`chief`, `worker`, `ps`, `evaluator`, …) → the tasks' `host:port`
    /// addresses, in index order.
    pub cluster: BTreeMap<String, Vec<String>>,
    /// Task types the cluster spec lists sparsely, as TensorFlow's `ClusterSpec` allows and
    /// Kubeflow's dynamic workers use (`{"worker": {"1": "host:port"}}`: only some tasks,
    /// by index); such a type says nothing about how many tasks it has.
    pub sparse: BTreeMap<String, BTreeMap<u32, String>>,
    /// `task.type`: this task's type.
    pub task_type: String,
    /// `task.index`: this task's index within its type.
    pub task_index: u32,
    /// `rpc_layer`, if given and non-empty.
    pub rpc_layer: Option<String>,
}

/// A `TF_CONFIG` that cannot be parsed or mapped onto a parameter-server cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TfConfigError {
    /// Not JSON, or not of the expected shape.
    #[error(
        "not a valid TF_CONFIG: {message}; expected JSON like {{\"cluster\": {{\"worker\": \
         [\"host:port\", ...], \"ps\": [...]}}, \"task\": {{\"type\": \"worker\", \"index\": 0}}}}"
    )]
    Json {
        /// The JSON parser's message.
        message: String,
    },
    /// `task.index` is neither a number nor a numeric string.
    #[error("TF_CONFIG task index {value} is not a whole number from 0 to 4294967295")]
    InvalidIndex {
        /// The value found, as JSON.
        value: String,
    },
    /// A job of the cluster spec lists its tasks sparsely, so the number of its tasks (a
    /// `DMLC_*` count) or the scheduler's task is unknown: set that variable.
    #[error(
        "TF_CONFIG lists the `{task_type}` tasks sparsely ({listed} of them, by index), so it \
         does not say {what}; set {var}"
    )]
    Sparse {
        /// The task type listed sparsely.
        task_type: String,
        /// How many tasks it lists.
        listed: usize,
        /// What cannot be derived.
        what: &'static str,
        /// The variable to set.
        var: &'static str,
    },
    /// An address of the cluster spec is not `host:port`.
    #[error("TF_CONFIG cluster address {task_type}:{index} {address:?} is invalid: {error}")]
    InvalidAddress {
        /// The task type.
        task_type: String,
        /// The task's index.
        index: usize,
        /// The address found.
        address: String,
        /// What is wrong with it.
        error: AddressError,
    },
    /// The task type has no role in the parameter server.
    #[error(
        "TF_CONFIG task type `{task_type}` has no parameter-server role: `ps` tasks are servers, \
         `chief`, `master` and `worker` tasks are workers; evaluators (and other task types) \
         do not join the parameter server"
    )]
    NotAParameterServerTask {
        /// The task type found.
        task_type: String,
    },
    /// This task's own entry is missing from the cluster spec.
    #[error(
        "TF_CONFIG task {task_type}:{index} is not in the cluster spec, which lists {count} \
         `{task_type}` task(s); expected an index below {count}"
    )]
    TaskNotInCluster {
        /// The task type.
        task_type: String,
        /// The task's index.
        index: u32,
        /// How many tasks of that type the cluster lists.
        count: usize,
    },
    /// No task can host the scheduler.
    #[error(
        "TF_CONFIG cluster has no `chief` or `worker` task; expected at least one, since \
         chief:0 (or worker:0 without a chief) hosts the scheduler"
    )]
    NoSchedulerHost,
    /// The cluster has no `ps` task.
    #[error(
        "TF_CONFIG cluster has no `ps` task; expected at least one parameter server (a job \
         without `ps` tasks is not a parameter-server job)"
    )]
    NoParameterServers,
    /// `rpc_layer` is not one vans knows.
    #[error("unknown TF_CONFIG rpc_layer {value:?}: expected {expected}")]
    UnknownRpcLayer {
        /// The value found.
        value: String,
        /// The accepted values.
        expected: &'static str,
    },
}

#[derive(Deserialize)]
struct RawConfig {
    cluster: BTreeMap<String, serde_json::Value>,
    task: RawTask,
    #[serde(default)]
    rpc_layer: Option<String>,
}

#[derive(Deserialize)]
struct RawTask {
    #[serde(rename = "type")]
    task_type: String,
    #[serde(default)]
    index: Option<serde_json::Value>,
}

/// Whether `json` is a `TF_CONFIG` that declares no cluster: `{}`, or an object whose
/// `cluster` is missing, `null` or lists no task. TensorFlow then runs on one machine, so
/// such a `TF_CONFIG` stands for nothing (it is what some launchers set when there is no
/// cluster), rather than being an error.
pub fn declares_no_cluster(json: &str) -> bool {
    let Ok(serde_json::Value::Object(config)) = serde_json::from_str::<serde_json::Value>(json)
    else {
        return false;
    };
    match config.get("cluster") {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::Object(jobs)) => jobs.values().all(|tasks| match tasks {
            serde_json::Value::Array(tasks) => tasks.is_empty(),
            serde_json::Value::Object(tasks) => tasks.is_empty(),
            serde_json::Value::Null => true,
            _ => false,
        }),
        Some(_) => false,
    }
}

impl TfConfig {
    /// Parses `TF_CONFIG`: JSON shape, task index and every cluster address. Whether this
    /// task can join a parameter server is checked by the mapping methods ([`role`],
    /// [`dmlc_vars`], …), so an evaluator's `TF_CONFIG` parses.
    ///
    /// [`role`]: TfConfig::role
    /// [`dmlc_vars`]: TfConfig::dmlc_vars
    pub fn parse(json: &str) -> Result<TfConfig, TfConfigError> {
        let raw: RawConfig = serde_json::from_str(json).map_err(|e| TfConfigError::Json {
            message: e.to_string(),
        })?;
        let task_index = match raw.task.index {
            None | Some(serde_json::Value::Null) => 0,
            Some(value) => {
                let number = match &value {
                    serde_json::Value::Number(n) => n.as_u64(),
                    serde_json::Value::String(s) => s.trim().parse().ok(),
                    _ => None,
                };
                number.and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                    TfConfigError::InvalidIndex {
                        value: value.to_string(),
                    }
                })?
            }
        };
        let (cluster, sparse) = split_cluster(raw.cluster)?;
        let listed = cluster
            .iter()
            .flat_map(|(t, tasks)| tasks.iter().enumerate().map(move |(i, a)| (t, i, a)))
            .chain(sparse.iter().flat_map(|(t, tasks)| {
                tasks
                    .iter()
                    .map(move |(i, a)| (t, usize::try_from(*i).unwrap_or(usize::MAX), a))
            }));
        for (task_type, index, address) in listed {
            if let Err(error) = address.parse::<HostPort>() {
                return Err(TfConfigError::InvalidAddress {
                    task_type: task_type.clone(),
                    index,
                    address: address.clone(),
                    error,
                });
            }
        }
        Ok(TfConfig {
            cluster,
            sparse,
            task_type: raw.task.task_type.trim().to_owned(),
            task_index,
            rpc_layer: raw
                .rpc_layer
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
        })
    }

    /// This task's role: `ps` → server; `chief`, `master`, `worker` → worker; anything else
    /// (`evaluator` included) → [`TfConfigError::NotAParameterServerTask`].
    pub fn role(&self) -> Result<Role, TfConfigError> {
        let t = self.task_type.as_str();
        if SERVER_TYPES.contains(&t) {
            Ok(Role::Server)
        } else if WORKER_TYPES.contains(&t) {
            Ok(Role::Worker)
        } else {
            Err(TfConfigError::NotAParameterServerTask {
                task_type: self.task_type.clone(),
            })
        }
    }

    /// Number of `chief`, `master` and `worker` tasks (`DMLC_NUM_WORKER`).
    pub fn num_workers(&self) -> u32 {
        self.count(WORKER_TYPES)
    }

    /// Number of `ps` tasks (`DMLC_NUM_SERVER`).
    pub fn num_servers(&self) -> u32 {
        self.count(SERVER_TYPES)
    }

    /// The task that hosts the scheduler: `chief:0` (or legacy `master:0`), else `worker:0`.
    /// A type listed sparsely without its task 0 cannot tell:
    /// [`TfConfigError::Sparse`], naming `DMLC_PS_ROOT_URI`.
    pub fn scheduler_task(&self) -> Result<(&str, u32), TfConfigError> {
        for t in WORKER_TYPES {
            if self.cluster.get(*t).is_some_and(|tasks| !tasks.is_empty()) {
                return Ok((t, 0));
            }
            if let Some(tasks) = self.sparse.get(*t).filter(|tasks| !tasks.is_empty()) {
                if tasks.contains_key(&0) {
                    return Ok((t, 0));
                }
                return Err(TfConfigError::Sparse {
                    task_type: (*t).to_owned(),
                    listed: tasks.len(),
                    what: "where task 0, which hosts the scheduler, listens",
                    var: "DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT",
                });
            }
        }
        Err(TfConfigError::NoSchedulerHost)
    }

    /// Where the scheduler listens (`DMLC_PS_ROOT_URI`, `DMLC_PS_ROOT_PORT`): the cluster
    /// address of [`scheduler_task`](TfConfig::scheduler_task).
    pub fn scheduler_address(&self) -> Result<HostPort, TfConfigError> {
        let (task_type, index) = self.scheduler_task()?;
        self.address_of(task_type, index)
    }

    /// Whether this task's process hosts the scheduler, in addition to its own role.
    pub fn hosts_scheduler(&self) -> bool {
        self.scheduler_task()
            .is_ok_and(|task| task == (self.task_type.as_str(), self.task_index))
    }

    /// This task's own cluster address, `cluster[task_type][task_index]`; its host is
    /// `DMLC_NODE_HOST`.
    pub fn address(&self) -> Result<HostPort, TfConfigError> {
        self.address_of(&self.task_type, self.task_index)
    }

    /// The parsed address of task `task_type:index`.
    pub fn address_of(&self, task_type: &str, index: u32) -> Result<HostPort, TfConfigError> {
        let tasks = self.cluster.get(task_type).map_or(&[][..], Vec::as_slice);
        let sparse = self.sparse.get(task_type);
        let address = usize::try_from(index)
            .ok()
            .and_then(|i| tasks.get(i))
            .or_else(|| sparse.and_then(|tasks| tasks.get(&index)))
            .ok_or_else(|| TfConfigError::TaskNotInCluster {
                task_type: task_type.to_owned(),
                index,
                count: tasks.len() + sparse.map_or(0, BTreeMap::len),
            })?;
        address
            .parse()
            .map_err(|error| TfConfigError::InvalidAddress {
                task_type: task_type.to_owned(),
                index: usize::try_from(index).unwrap_or(usize::MAX),
                address: address.clone(),
                error,
            })
    }

    /// The van `rpc_layer` asks for: values containing `verbs` or `rdma` →
    /// [`RdmaMode::Ibverbs`]; `grpc`, `grpc+seastar`, `grpc+mpi`, `star_server`,
    /// `star_server_lite` or none → [`RdmaMode::Off`] (the stream van); anything else →
    /// [`TfConfigError::UnknownRpcLayer`]. Case is ignored.
    pub fn enable_rdma(&self) -> Result<RdmaMode, TfConfigError> {
        let Some(layer) = &self.rpc_layer else {
            return Ok(RdmaMode::Off);
        };
        let lower = layer.to_ascii_lowercase();
        if lower.contains("verbs") || lower.contains("rdma") {
            Ok(RdmaMode::Ibverbs)
        } else if STREAM_RPC_LAYERS.contains(&lower.as_str()) {
            Ok(RdmaMode::Off)
        } else {
            Err(TfConfigError::UnknownRpcLayer {
                value: layer.clone(),
                expected: RPC_LAYER_EXPECTED,
            })
        }
    }

    /// The `DMLC_*` variables this `TF_CONFIG` stands for: `DMLC_ROLE`, `DMLC_NUM_WORKER`,
    /// `DMLC_NUM_SERVER`, `DMLC_PS_ROOT_URI`, `DMLC_PS_ROOT_PORT`, `DMLC_NODE_HOST` and
    /// `DMLC_ENABLE_RDMA`, in that order.
    pub fn dmlc_vars(&self) -> Result<Vec<(&'static str, String)>, TfConfigError> {
        self.dmlc_vars_except(|_| false)
    }

    /// Like [`dmlc_vars`](TfConfig::dmlc_vars), but leaves out (and does not even derive,
    /// so cannot fail on) every variable for which `is_set` returns true. `DMLC_NODE_HOST`
    /// is also left out when `DMLC_INTERFACE` is set, since it would override the interface.
    pub fn dmlc_vars_except(
        &self,
        is_set: impl Fn(&str) -> bool,
    ) -> Result<Vec<(&'static str, String)>, TfConfigError> {
        let mut vars = Vec::new();
        let mut emit = |var: &'static str, value: &dyn Fn() -> Result<String, TfConfigError>| {
            if !is_set(var) {
                vars.push((var, value()?));
            }
            Ok::<(), TfConfigError>(())
        };
        emit("DMLC_ROLE", &|| Ok(self.role()?.as_str().to_owned()))?;
        emit("DMLC_NUM_WORKER", &|| {
            self.dense(
                WORKER_TYPES,
                "how many worker tasks there are",
                "DMLC_NUM_WORKER",
            )?;
            Ok(self.num_workers().to_string())
        })?;
        emit("DMLC_NUM_SERVER", &|| {
            self.dense(
                SERVER_TYPES,
                "how many ps tasks there are",
                "DMLC_NUM_SERVER",
            )?;
            match self.num_servers() {
                0 => Err(TfConfigError::NoParameterServers),
                n => Ok(n.to_string()),
            }
        })?;
        emit("DMLC_PS_ROOT_URI", &|| Ok(self.scheduler_address()?.host))?;
        emit("DMLC_PS_ROOT_PORT", &|| {
            Ok(self.scheduler_address()?.port.to_string())
        })?;
        if !is_set("DMLC_INTERFACE") {
            emit("DMLC_NODE_HOST", &|| Ok(self.address()?.host))?;
        }
        emit("DMLC_ENABLE_RDMA", &|| {
            Ok(if self.enable_rdma()?.is_enabled() {
                "1"
            } else {
                "0"
            }
            .to_owned())
        })?;
        Ok(vars)
    }

    /// Inserts [`dmlc_vars`](TfConfig::dmlc_vars) into `vars`, keeping every variable that
    /// `vars` already holds with a non-empty value (explicit `DMLC_*` override `TF_CONFIG`).
    pub fn apply(&self, vars: &mut BTreeMap<String, String>) -> Result<(), TfConfigError> {
        let derived = self
            .dmlc_vars_except(|var| vars.get(var).is_some_and(|value| !value.trim().is_empty()))?;
        for (var, value) in derived {
            vars.insert(var.to_owned(), value);
        }
        Ok(())
    }

    /// Tasks listed of `types` (a type listed sparsely counts the tasks it lists).
    fn count(&self, types: &[&str]) -> u32 {
        let dense: usize = types
            .iter()
            .filter_map(|t| self.cluster.get(*t))
            .map(Vec::len)
            .sum();
        let sparse: usize = types
            .iter()
            .filter_map(|t| self.sparse.get(*t))
            .map(BTreeMap::len)
            .sum();
        u32::try_from(dense + sparse).unwrap_or(u32::MAX)
    }

    /// Fails when one of `types` is listed sparsely, so `what` cannot be derived.
    fn dense(
        &self,
        types: &[&str],
        what: &'static str,
        var: &'static str,
    ) -> Result<(), TfConfigError> {
        match types.iter().find_map(|t| Some((*t, self.sparse.get(*t)?))) {
            Some((task_type, tasks)) => Err(TfConfigError::Sparse {
                task_type: task_type.to_owned(),
                listed: tasks.len(),
                what,
                var,
            }),
            None => Ok(()),
        }
    }
}

/// The cluster spec's jobs, each a list of addresses (dense) or an object from task index to
/// address (sparse), as TensorFlow's `ClusterSpec` accepts them.
#[allow(clippy::type_complexity)]
fn split_cluster(
    jobs: BTreeMap<String, serde_json::Value>,
) -> Result<
    (
        BTreeMap<String, Vec<String>>,
        BTreeMap<String, BTreeMap<u32, String>>,
    ),
    TfConfigError,
> {
    let shape = |task_type: &str, detail: String| TfConfigError::Json {
        message: format!(
            "cluster job `{task_type}`: {detail}; expected a list of \"host:port\" strings or \
             an object from task index to \"host:port\" (a sparse job)"
        ),
    };
    let mut dense = BTreeMap::new();
    let mut sparse = BTreeMap::new();
    for (task_type, tasks) in jobs {
        match tasks {
            serde_json::Value::Null => {
                dense.insert(task_type, Vec::new());
            }
            serde_json::Value::Array(items) => {
                let mut addresses = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    match item {
                        serde_json::Value::String(a) => addresses.push(a),
                        other => return Err(shape(&task_type, format!("task {i} is {other}"))),
                    }
                }
                dense.insert(task_type, addresses);
            }
            serde_json::Value::Object(items) => {
                let mut tasks = BTreeMap::new();
                for (index, item) in items {
                    let i = index.trim().parse::<u32>().map_err(|_| {
                        shape(
                            &task_type,
                            format!("task index {index:?} is not a whole number"),
                        )
                    })?;
                    match item {
                        serde_json::Value::String(a) => {
                            tasks.insert(i, a);
                        }
                        other => return Err(shape(&task_type, format!("task {i} is {other}"))),
                    }
                }
                sparse.insert(task_type, tasks);
            }
            other => return Err(shape(&task_type, format!("found {other}"))),
        }
    }
    Ok((dense, sparse))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = r#""cluster": {
        "chief": ["chief-0.ns.svc:2222"],
        "worker": ["worker-0.ns.svc:2222", "worker-1.ns.svc:2223"],
        "ps": ["ps-0.ns.svc:2222", "ps-1.ns.svc:2222"],
        "evaluator": ["eval-0.ns.svc:2222"]
    }"#;

    fn tf(task_type: &str, index: u32, rest: &str) -> Result<TfConfig, TfConfigError> {
        TfConfig::parse(&format!(
            r#"{{{CLUSTER}, "task": {{"type": "{task_type}", "index": {index}}}{rest}}}"#
        ))
    }

    fn vars(tf: &TfConfig) -> BTreeMap<&'static str, String> {
        tf.dmlc_vars().unwrap().into_iter().collect()
    }

    #[test]
    fn worker() {
        let tf = tf(
            "worker",
            1,
            r#", "rpc_layer": "grpc", "environment": "cloud""#,
        )
        .unwrap();
        assert_eq!(tf.task_type, "worker");
        assert_eq!(tf.task_index, 1);
        assert_eq!(tf.rpc_layer.as_deref(), Some("grpc"));
        assert_eq!(tf.cluster["ps"].len(), 2);
        assert_eq!(tf.role().unwrap(), Role::Worker);
        assert!(!tf.hosts_scheduler());
        let v = vars(&tf);
        let expected: BTreeMap<_, _> = [
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_WORKER", "3"),
            ("DMLC_NUM_SERVER", "2"),
            ("DMLC_PS_ROOT_URI", "chief-0.ns.svc"),
            ("DMLC_PS_ROOT_PORT", "2222"),
            ("DMLC_NODE_HOST", "worker-1.ns.svc"),
            ("DMLC_ENABLE_RDMA", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        assert_eq!(v, expected);
        assert_eq!(
            tf.address().unwrap(),
            HostPort::new("worker-1.ns.svc", 2223)
        );
    }

    #[test]
    fn ps() {
        let tf = tf("ps", 1, "").unwrap();
        assert_eq!(tf.rpc_layer, None);
        assert_eq!(tf.role().unwrap(), Role::Server);
        assert!(!tf.hosts_scheduler());
        let v = vars(&tf);
        assert_eq!(v["DMLC_ROLE"], "server");
        assert_eq!(v["DMLC_NODE_HOST"], "ps-1.ns.svc");
        assert_eq!(v["DMLC_PS_ROOT_URI"], "chief-0.ns.svc");
    }

    #[test]
    fn chief_hosts_the_scheduler() {
        let tf = tf("chief", 0, "").unwrap();
        assert_eq!(tf.role().unwrap(), Role::Worker);
        assert!(tf.hosts_scheduler());
        assert_eq!(tf.scheduler_task().unwrap(), ("chief", 0));
        let v = vars(&tf);
        assert_eq!(v["DMLC_NODE_HOST"], v["DMLC_PS_ROOT_URI"]);
        // worker:0 does not when there is a chief.
        assert!(!tf_worker0_hosts(CLUSTER));
    }

    fn tf_worker0_hosts(cluster: &str) -> bool {
        TfConfig::parse(&format!(
            r#"{{{cluster}, "task": {{"type": "worker", "index": 0}}}}"#
        ))
        .unwrap()
        .hosts_scheduler()
    }

    #[test]
    fn worker0_hosts_the_scheduler_without_a_chief() {
        let cluster =
            r#""cluster": {"worker": ["[::1]:2000", "[::1]:2001"], "ps": ["[::1]:3000"]}"#;
        assert!(tf_worker0_hosts(cluster));
        let tf = TfConfig::parse(&format!(
            r#"{{{cluster}, "task": {{"type": "worker", "index": 0}}}}"#
        ))
        .unwrap();
        let v = vars(&tf);
        assert_eq!(v["DMLC_PS_ROOT_URI"], "::1");
        assert_eq!(v["DMLC_PS_ROOT_PORT"], "2000");
        assert_eq!(v["DMLC_NUM_WORKER"], "2");
        // Legacy `master` counts as the chief.
        let master = r#""cluster": {"master": ["m:1"], "worker": ["w:1"], "ps": ["p:1"]}"#;
        assert!(!tf_worker0_hosts(master));
    }

    #[test]
    fn evaluator_and_unknown_types_do_not_join() {
        for task_type in ["evaluator", "tpu_worker", ""] {
            let tf = tf(task_type, 0, "").unwrap();
            let e = tf.role().unwrap_err();
            assert_eq!(
                e,
                TfConfigError::NotAParameterServerTask {
                    task_type: task_type.to_owned()
                }
            );
            assert_eq!(tf.dmlc_vars().unwrap_err(), e);
            let message = e.to_string();
            assert!(message.contains(&format!("`{task_type}`")) && message.contains("evaluators"));
        }
    }

    #[test]
    fn bad_json_and_shapes() {
        for json in [
            "bogus",
            "{",
            "[]",
            r#"{"task": {"type": "worker", "index": 0}}"#,
            r#"{"cluster": {}, "task": {"index": 0}}"#,
            r#"{"cluster": {"worker": "w:1"}, "task": {"type": "worker"}}"#,
        ] {
            let e = TfConfig::parse(json).unwrap_err();
            assert!(matches!(e, TfConfigError::Json { .. }), "{json}: {e:?}");
            assert!(e.to_string().contains("expected JSON like"), "{e}");
        }
        for index in ["-1", "1.5", "\"x\"", "true", "4294967296"] {
            let json =
                format!(r#"{{"cluster": {{}}, "task": {{"type": "ps", "index": {index}}}}}"#);
            let e = TfConfig::parse(&json).unwrap_err();
            assert!(
                matches!(e, TfConfigError::InvalidIndex { .. }),
                "{index}: {e:?}"
            );
            assert!(e.to_string().contains(index), "{e}");
        }
        // A numeric string and a missing index are accepted.
        let json = r#"{"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": "0"}}"#;
        assert_eq!(TfConfig::parse(json).unwrap().task_index, 0);
        let json = r#"{"cluster": {"ps": ["p:1"]}, "task": {"type": "ps"}, "x": [1]}"#;
        assert_eq!(TfConfig::parse(json).unwrap().task_index, 0);
        // Every cluster address is checked.
        let json = r#"{"cluster": {"ps": ["p:1", "p"]}, "task": {"type": "ps"}}"#;
        let e = TfConfig::parse(json).unwrap_err();
        assert!(
            matches!(e, TfConfigError::InvalidAddress { index: 1, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("ps:1"), "{e}");
    }

    #[test]
    fn index_out_of_range() {
        let tf = tf("worker", 2, "").unwrap();
        let e = tf.address().unwrap_err();
        assert_eq!(
            e,
            TfConfigError::TaskNotInCluster {
                task_type: "worker".into(),
                index: 2,
                count: 2
            }
        );
        assert!(e.to_string().contains("worker:2"), "{e}");
        assert_eq!(tf.dmlc_vars().unwrap_err(), e);
        // A type missing from the cluster entirely.
        let json = r#"{"cluster": {"worker": ["w:1"], "ps": ["p:1"]}, "task": {"type": "chief"}}"#;
        let e = TfConfig::parse(json).unwrap().dmlc_vars().unwrap_err();
        assert!(
            matches!(e, TfConfigError::TaskNotInCluster { count: 0, .. }),
            "{e:?}"
        );
    }

    #[test]
    fn cluster_without_ps_or_scheduler_host() {
        let json = r#"{"cluster": {"worker": ["w:1"]}, "task": {"type": "worker"}}"#;
        let tf = TfConfig::parse(json).unwrap();
        assert_eq!(
            tf.dmlc_vars().unwrap_err(),
            TfConfigError::NoParameterServers
        );
        let json = r#"{"cluster": {"ps": ["p:1"]}, "task": {"type": "ps"}}"#;
        let tf = TfConfig::parse(json).unwrap();
        assert!(!tf.hosts_scheduler());
        assert_eq!(tf.dmlc_vars().unwrap_err(), TfConfigError::NoSchedulerHost);
    }

    #[test]
    fn kubeflow_sparse_cluster_specs() {
        // Kubeflow's dynamic workers: each worker sees the chief, the ps tasks and itself.
        let json = r#"{"cluster": {"chief": ["chief-0:2222"], "ps": ["ps-0:2222"],
                       "worker": {"1": "worker-1:2223"}},
                       "task": {"type": "worker", "index": 1}}"#;
        let tf = TfConfig::parse(json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            tf.address().map(|a| (a.host, a.port)),
            Ok(("worker-1".into(), 2223))
        );
        let e = tf
            .dmlc_vars()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("lists the `worker` tasks sparsely (1 of them, by index)")
                && e.contains("set DMLC_NUM_WORKER"),
            "{e}"
        );
        let vars: BTreeMap<_, _> = tf
            .dmlc_vars_except(|v| v == "DMLC_NUM_WORKER")
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .collect();
        assert_eq!(vars["DMLC_ROLE"], "worker");
        assert_eq!(vars["DMLC_PS_ROOT_URI"], "chief-0");
        assert_eq!(vars["DMLC_NODE_HOST"], "worker-1");
        // Without a chief, a sparse worker job must list task 0, the scheduler's host.
        let json = r#"{"cluster": {"ps": ["ps-0:2222"], "worker": {"3": "w3:1"}},
                       "task": {"type": "ps", "index": 0}}"#;
        let tf = TfConfig::parse(json).unwrap_or_else(|e| panic!("{e}"));
        let e = tf
            .scheduler_task()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("DMLC_PS_ROOT_URI"), "{e}");
        for bad in [
            r#"{"cluster": {"worker": {"one": "w:1"}}, "task": {"type": "worker"}}"#,
            r#"{"cluster": {"worker": {"0": 7}}, "task": {"type": "worker"}}"#,
            r#"{"cluster": {"worker": "w:1"}, "task": {"type": "worker"}}"#,
            r#"{"cluster": {"worker": [7]}, "task": {"type": "worker"}}"#,
        ] {
            let e = TfConfig::parse(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("cluster job `worker`"), "{bad}: {e}");
        }
    }

    #[test]
    fn rpc_layer_mapping() {
        for (layer, mode) in [
            ("grpc", RdmaMode::Off),
            ("grpc+seastar", RdmaMode::Off),
            ("grpc+mpi", RdmaMode::Off),
            ("star_server", RdmaMode::Off),
            ("STAR_SERVER_LITE", RdmaMode::Off),
            ("", RdmaMode::Off),
            ("grpc+verbs", RdmaMode::Ibverbs),
            ("rdma", RdmaMode::Ibverbs),
            ("GRPC+RDMA", RdmaMode::Ibverbs),
        ] {
            let tf = tf("ps", 0, &format!(r#", "rpc_layer": "{layer}""#)).unwrap();
            assert_eq!(tf.enable_rdma().unwrap(), mode, "{layer}");
        }
        let tf = tf("ps", 0, r#", "rpc_layer": null"#).unwrap();
        assert_eq!(tf.enable_rdma().unwrap(), RdmaMode::Off);
        let tf = self::tf("ps", 0, r#", "rpc_layer": "grpc+gdr""#).unwrap();
        let e = tf.enable_rdma().unwrap_err();
        let message = e.to_string();
        assert!(
            message.contains("grpc+gdr") && message.contains("grpc+seastar"),
            "{message}"
        );
        assert!(message.contains("verbs"), "{message}");
        assert_eq!(tf.dmlc_vars().unwrap_err(), e);
    }

    #[test]
    fn explicit_variables_are_neither_derived_nor_checked() {
        // An evaluator with an explicit role and host maps the rest.
        let tf = tf("evaluator", 0, r#", "rpc_layer": "weird""#).unwrap();
        let set = ["DMLC_ROLE", "DMLC_ENABLE_RDMA"];
        let v = tf.dmlc_vars_except(|var| set.contains(&var)).unwrap();
        let names: Vec<_> = v.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            [
                "DMLC_NUM_WORKER",
                "DMLC_NUM_SERVER",
                "DMLC_PS_ROOT_URI",
                "DMLC_PS_ROOT_PORT",
                "DMLC_NODE_HOST"
            ]
        );
        let mut map: BTreeMap<String, String> = [
            ("DMLC_NUM_SERVER", "7"),
            ("DMLC_INTERFACE", "eth0"),
            ("DMLC_ROLE", " "),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let tf = self::tf("worker", 0, "").unwrap();
        tf.apply(&mut map).unwrap();
        assert_eq!(map["DMLC_NUM_SERVER"], "7");
        assert_eq!(map["DMLC_ROLE"], "worker");
        assert!(!map.contains_key("DMLC_NODE_HOST"));
        assert_eq!(map["DMLC_PS_ROOT_URI"], "chief-0.ns.svc");
    }
}
