//! Parameter-server errors as the Python exceptions of `vans.errors`, each naming its cause.

use collective::CollectiveError;
use ps::PsError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// `err` as an exception of `vans.errors` (or `ValueError` for an invalid argument).
pub(crate) fn to_py(err: PsError) -> PyErr {
    Python::attach(|py| match convert(py, &err) {
        Ok(converted) => converted,
        // The errors module itself failed to load: still say what happened.
        Err(_) => PyRuntimeError::new_err(err.to_string()),
    })
}

fn convert(py: Python<'_>, err: &PsError) -> PyResult<PyErr> {
    let message = err.to_string();
    let class = match err {
        PsError::InvalidArgument(_) => return Ok(PyValueError::new_err(message)),
        PsError::Config(_) => "ConfigError",
        PsError::NodeFailed { .. } => "NodeFailedError",
        PsError::HandlerFailed { .. } => "HandlerFailedError",
        PsError::BarrierFailed { .. } => "BarrierFailedError",
        PsError::Bootstrap { .. } => "BootstrapError",
        PsError::Timeout { .. } => "TimeoutError",
        PsError::Stopped => "StoppedError",
        PsError::Rendezvous(_) => "RendezvousError",
        PsError::Protocol { .. } => "ProtocolError",
        PsError::UnknownRequest(_) => "VansError",
        PsError::Van(_) => "TransportError",
    };
    let errors = py.import("vans.errors")?;
    let exception = errors.getattr(class)?.call1((message,))?;
    match err {
        PsError::NodeFailed { node, role, reason } => {
            exception.setattr("node", *node)?;
            exception.setattr("role", role.as_str())?;
            exception.setattr("reason", reason.as_str())?;
        }
        PsError::HandlerFailed { server, reason } => {
            exception.setattr("server", *server)?;
            exception.setattr("reason", reason.as_str())?;
        }
        PsError::BarrierFailed { group, dead } => {
            exception.setattr("group", *group)?;
            exception.setattr("dead", dead.clone())?;
        }
        PsError::Protocol { from, .. } => exception.setattr("node", *from)?,
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
