//! Parameter-server errors as the Python exceptions of `vans.errors`, each naming its cause.

use collective::CollectiveError;
use ps::NodeError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// `err` as an exception of `vans.errors` (or `ValueError` for an invalid argument).
pub(crate) fn to_py(err: NodeError) -> PyErr {
    Python::attach(|py| match convert(py, &err) {
        Ok(converted) => converted,
        // The errors module itself failed to load: still say what happened.
        Err(_) => PyRuntimeError::new_err(err.to_string()),
    })
}

fn convert(py: Python<'_>, err: &NodeError) -> PyResult<PyErr> {
    let message = err.to_string();
    let class = match err {
        NodeError::InvalidArgument(_) => return Ok(PyValueError::new_err(message)),
        NodeError::Config(_) => "ConfigError",
        NodeError::NodeFailed { .. } => "NodeFailedError",
        NodeError::HandlerFailed { .. } => "HandlerFailedError",
        NodeError::BarrierFailed { .. } => "BarrierFailedError",
        NodeError::Bootstrap { .. } => "BootstrapError",
        NodeError::Timeout { .. } => "TimeoutError",
        NodeError::Stopped => "StoppedError",
        NodeError::Rendezvous(_) => "RendezvousError",
        NodeError::Protocol { .. } => "ProtocolError",
        NodeError::UnknownRequest(_) => "VansError",
        NodeError::Van(_) => "TransportError",
    };
    let errors = py.import("vans.errors")?;
    let exception = errors.getattr(class)?.call1((message,))?;
    match err {
        NodeError::NodeFailed { node, role, reason } => {
            exception.setattr("node", *node)?;
            exception.setattr("role", role.as_str())?;
            exception.setattr("reason", reason.as_str())?;
        }
        NodeError::HandlerFailed { server, reason } => {
            exception.setattr("server", *server)?;
            exception.setattr("reason", reason.as_str())?;
        }
        NodeError::BarrierFailed { group, dead } => {
            exception.setattr("group", *group)?;
            exception.setattr("dead", dead.clone())?;
        }
        NodeError::Protocol { from, .. } => exception.setattr("node", *from)?,
        _ => {}
    }
    Ok(PyErr::from_value(exception))
}

/// A collective error as `vans.errors.CollectiveError` (attributes `generation`, and `node`
/// and `rank` when a member failed); call `settle()` and go on.
pub(crate) fn collective_to_py(err: CollectiveError) -> PyErr {
    Python::attach(|py| {
        convert_collective(py, &err).unwrap_or_else(|_| PyRuntimeError::new_err(err.to_string()))
    })
}

fn convert_collective(py: Python<'_>, err: &CollectiveError) -> PyResult<PyErr> {
    let message = err.to_string();
    if let CollectiveError::InvalidArgument(_) = err {
        return Ok(PyValueError::new_err(message));
    }
    let exception = py
        .import("vans.errors")?
        .getattr("CollectiveError")?
        .call1((message,))?;
    match err {
        CollectiveError::RankFailed {
            node,
            rank,
            generation,
            ..
        } => {
            exception.setattr("node", *node)?;
            exception.setattr("rank", *rank)?;
            exception.setattr("generation", *generation)?;
        }
        CollectiveError::MembershipChanged { generation, .. } => {
            exception.setattr("generation", *generation)?;
        }
        CollectiveError::Mismatch { node, rank, .. } => {
            exception.setattr("node", *node)?;
            exception.setattr("rank", *rank)?;
        }
        _ => {}
    }
    Ok(PyErr::from_value(exception))
}
