//! `launch`: a local cluster (one scheduler, servers, workers) as processes of a program, with
//! [`launcher`], from Python.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use launcher::{LaunchError, LaunchSpec};
use ps::NodeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::node::wait_for;

fn launch_error(py: Python<'_>, err: &LaunchError) -> PyErr {
    let made = py
        .import("vans.errors")
        .and_then(|m| m.getattr("LaunchError"))
        .and_then(|class| class.call1((err.to_string(),)));
    match made {
        Ok(exception) => PyErr::from_value(exception),
        Err(e) => e,
    }
}

/// Starts `program args...` once per node (the scheduler, then `num_servers` servers and
/// `num_workers` workers), each with its `DMLC_*` environment plus `env`, prints their output
/// prefixed with the node's name, and waits for all of them. Returns one dict per node (`role`,
/// `rank`, `pid`, `code`); raises `vans.errors.LaunchError` when a node fails, when `timeout`
/// seconds pass, or on Ctrl-C (every node is stopped first).
#[pyfunction]
#[pyo3(signature = (num_servers, num_workers, program, args=Vec::new(), env=None, root_uri=None, root_port=0, timeout=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    py: Python<'_>,
    num_servers: u32,
    num_workers: u32,
    program: std::path::PathBuf,
    args: Vec<String>,
    env: Option<HashMap<String, String>>,
    root_uri: Option<String>,
    root_port: u16,
    timeout: Option<f64>,
) -> PyResult<Vec<Py<PyDict>>> {
    let mut spec = LaunchSpec::new(num_servers, num_workers, program);
    spec.args = args;
    spec.env = env.unwrap_or_default().into_iter().collect();
    spec.env.sort();
    if let Some(uri) = root_uri {
        spec.root_uri = uri;
    }
    spec.root_port = root_port;
    spec.timeout = timeout.map(Duration::from_secs_f64);
    // Python keeps its own SIGINT handling: a Ctrl-C is seen below and drops the launch,
    // which kills the nodes.
    spec.handle_signals = false;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
    let mut job = Box::pin(launcher::launch(&spec));
    let report = wait_for(py, None, |slice| {
        // The timer is made inside the runtime (it needs its context).
        runtime
            .block_on(async { tokio::time::timeout(slice, &mut job).await })
            .map_err(|_| NodeError::Timeout { waited: slice })
    })?;
    let report = report.map_err(|e| launch_error(py, &e))?;
    report
        .nodes
        .iter()
        .map(|node| {
            let d = PyDict::new(py);
            d.set_item("role", node.role.to_string())?;
            d.set_item("rank", node.rank)?;
            d.set_item("pid", node.pid)?;
            d.set_item("code", node.status.code())?;
            d.set_item("signal", node.status.signal())?;
            Ok(d.unbind())
        })
        .collect()
}

/// The role this process's environment gives it as a node (`"scheduler"`, `"server"` or
/// `"worker"`), read as a node reads it: `DMLC_ROLE`, else `TF_CONFIG`'s task, else the rank
/// a launcher gave (Slurm, MPI, PMI, torchrun); `None` when it is no node (a plain `python
/// script.py`, which may then `launch` a local cluster of itself). Raises
/// `vans.errors.ConfigError` when the environment contradicts itself.
#[pyfunction]
pub(crate) fn node_role() -> PyResult<Option<&'static str>> {
    let config = van_core::Config::from_env().map_err(|e| crate::errors::to_py(e.into()))?;
    Ok(config.role.map(|role| role.as_str()))
}

/// A free port on 127.0.0.1 for a node that others must be told about before it binds (a
/// scheduler's `DMLC_PS_ROOT_PORT`), picked below Linux's ephemeral range: a port the kernel
/// handed out and took back (`bind(("127.0.0.1", 0))`) can go to any process's outgoing
/// connection before the node binds it; one picked down here only meets another such pick.
#[pyfunction]
pub(crate) fn free_port() -> u16 {
    van_core::link::stream::free_loopback_port()
}
