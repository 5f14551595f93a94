//! `Node`: a node of the cluster from Python, over [`node::handle::NodeHandle`], and the wait
//! every blocking call of the module goes through: without the GIL, waking every 100 ms so
//! Python can deliver signals (Ctrl-C raises `KeyboardInterrupt` in a long wait).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use node::handle::{Call, NodeHandle};
use ps::{Config, NodeError};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::buffer;
use crate::errors::to_py;

/// How often a wait wakes to let Python handle signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Waits without the GIL for `attempt` (called with slices of at most [`SIGNAL_CHECK`]) to
/// answer with anything but [`NodeError::Timeout`], for at most `timeout` seconds (forever
/// with `None`), letting Python handle signals between slices. A timeout raises
/// `vans.errors.TimeoutError`.
pub(crate) fn wait_for<T: Send>(
    py: Python<'_>,
    timeout: Option<f64>,
    mut attempt: impl FnMut(Duration) -> ps::Result<T> + Send,
) -> PyResult<T> {
    let deadline = match timeout {
        None => None,
        Some(t) if t.is_finite() && t >= 0.0 => Some(Instant::now() + Duration::from_secs_f64(t)),
        Some(t) => {
            return Err(PyValueError::new_err(format!(
                "timeout must be a non-negative number of seconds, not {t}"
            )))
        }
    };
    // An answer that is already there (the common case with many requests in flight) is
    // taken without giving up the GIL.
    match attempt(Duration::ZERO) {
        Err(NodeError::Timeout { .. }) => {}
        result => {
            buffer::release_pending(py);
            return result.map_err(to_py);
        }
    }
    loop {
        let slice = deadline.map_or(SIGNAL_CHECK, |d| {
            d.saturating_duration_since(Instant::now())
                .min(SIGNAL_CHECK)
        });
        match py.detach(|| attempt(slice)) {
            Err(NodeError::Timeout { .. }) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(to_py(NodeError::Timeout {
                        waited: Duration::from_secs_f64(timeout.unwrap_or(0.0)),
                    }));
                }
                py.check_signals()?;
            }
            result => {
                buffer::release_pending(py);
                return result.map_err(to_py);
            }
        }
    }
}

/// Waits for `call` (see [`wait_for`]).
pub(crate) fn wait<T: Send + 'static>(
    py: Python<'_>,
    mut call: Call<T>,
    timeout: Option<f64>,
) -> PyResult<T> {
    wait_for(py, timeout, |slice| call.wait_timeout(slice))
}

/// A node of a vans cluster: joins on creation, from the environment (`DMLC_*` or
/// `TF_CONFIG`) overlaid with the keyword arguments.
#[pyclass(module = "vans._native", frozen)]
pub(crate) struct Node {
    pub(crate) handle: NodeHandle,
}

/// The barrier group named `group`.
fn barrier_group(group: &Bound<'_, PyAny>) -> PyResult<i32> {
    if let Ok(n) = group.extract::<i32>() {
        return Ok(n);
    }
    let name: String = group.extract()?;
    let mut mask = 0;
    for part in name.split('+') {
        mask |= match part.trim() {
            "all" => ps::ALL_GROUPS,
            "scheduler" => ps::node_ids::SCHEDULER,
            "servers" => ps::node_ids::SERVER_GROUP,
            "workers" => ps::node_ids::WORKER_GROUP,
            other => {
                return Err(PyValueError::new_err(format!(
                    "barrier group {other:?}: use all, workers, servers, scheduler, or a sum \
                     such as 'workers+servers'"
                )))
            }
        };
    }
    Ok(mask)
}

#[pymethods]
impl Node {
    /// Joins the cluster. Keyword arguments override the environment: `role`
    /// (`DMLC_ROLE`), `num_servers`, `num_workers`, `root_uri`, `root_port`, and `env`, a
    /// dict of any other variables (`DMLC_INTERFACE`, `VANS_STREAM_VAN`, ...). Blocks (without
    /// the GIL) until the node table arrives or the bootstrap timeout passes.
    #[new]
    #[pyo3(signature = (*, role=None, num_servers=None, num_workers=None, root_uri=None, root_port=None, env=None))]
    fn new(
        py: Python<'_>,
        role: Option<String>,
        num_servers: Option<u32>,
        num_workers: Option<u32>,
        root_uri: Option<String>,
        root_port: Option<u16>,
        env: Option<HashMap<String, String>>,
    ) -> PyResult<Node> {
        let mut vars: HashMap<String, String> = std::env::vars().collect();
        let overrides = [
            ("DMLC_ROLE", role),
            ("DMLC_NUM_SERVER", num_servers.map(|n| n.to_string())),
            ("DMLC_NUM_WORKER", num_workers.map(|n| n.to_string())),
            ("DMLC_PS_ROOT_URI", root_uri),
            ("DMLC_PS_ROOT_PORT", root_port.map(|p| p.to_string())),
        ];
        for (var, value) in overrides {
            if let Some(value) = value {
                vars.insert(var.to_owned(), value);
            }
        }
        vars.extend(env.unwrap_or_default());
        let config = Config::from_vars(vars).map_err(|e| to_py(e.into()))?;
        let call = NodeHandle::start_async(config).map_err(to_py)?;
        Ok(Node {
            handle: wait(py, call, None)?,
        })
    }

    /// `"scheduler"`, `"server"` or `"worker"`.
    #[getter]
    fn role(&self) -> String {
        self.handle.role().to_string()
    }

    /// This node's id (scheduler 1, servers 8, 10, ..., workers 9, 11, ...).
    #[getter]
    fn id(&self) -> i32 {
        self.handle.id()
    }

    /// This node's rank within its role.
    #[getter]
    fn rank(&self) -> u32 {
        self.handle.rank()
    }

    /// Number of servers.
    #[getter]
    fn num_servers(&self) -> u32 {
        self.handle.num_servers()
    }

    /// Number of workers.
    #[getter]
    fn num_workers(&self) -> u32 {
        self.handle.num_workers()
    }

    /// Whether the node has stopped.
    #[getter]
    fn stopped(&self) -> bool {
        self.handle.is_stopped()
    }

    /// Whether this node took the place of a dead one (ps-lite's `is_recovery`): a server
    /// then restores its checkpoint, and skips the start barriers the others passed.
    #[getter]
    fn is_recovery(&self) -> bool {
        self.handle.postoffice().is_recovery()
    }

    /// Waits until every node of `group` has called `barrier` with the same group.
    /// `group` is `"workers"` (the default), `"servers"`, `"all"`, a sum such as
    /// `"workers+servers"`, or ps-lite's bitmask.
    #[pyo3(signature = (group=None, timeout=None))]
    fn barrier(
        &self,
        py: Python<'_>,
        group: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let group = match group {
            Some(group) => barrier_group(group)?,
            None => ps::node_ids::WORKER_GROUP,
        };
        wait(py, self.handle.barrier(group), timeout)
    }

    /// Leaves the cluster in order: a barrier of every node, then stop.
    #[pyo3(signature = (timeout=None))]
    fn finalize(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        wait(py, self.handle.finalize(), timeout)
    }

    /// Stops the node without a barrier; pending requests fail.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.handle.stop(), None)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vans.Node {} id={} rank={}>",
            self.handle.role(),
            self.handle.id(),
            self.handle.rank()
        )
    }
}

/// `node`, or a node started from the environment and `config` (keyword arguments of
/// `Node`), with `role` unless `config` names one.
pub(crate) fn node_or_start<'py>(
    py: Python<'py>,
    node: Option<Bound<'py, Node>>,
    role: &str,
    config: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, Node>> {
    if let Some(node) = node {
        if config.is_some_and(|c| !c.is_empty()) {
            return Err(PyTypeError::new_err(
                "pass either a node or node keyword arguments, not both",
            ));
        }
        return Ok(node);
    }
    let kwargs = match config {
        Some(c) => c.copy()?,
        None => PyDict::new(py),
    };
    if !kwargs.contains("role")? && std::env::var_os("DMLC_ROLE").is_none() {
        kwargs.set_item("role", role)?;
    }
    Ok(py
        .get_type::<Node>()
        .call((), Some(&kwargs))?
        .cast_into::<Node>()?)
}
