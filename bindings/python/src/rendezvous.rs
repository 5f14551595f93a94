//! `Rendezvous`: TensorFlow-style step-scoped send / receive of arrays between tasks.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rendezvous::handle::RendezvousHandle;
use rendezvous::Protocol;

use crate::buffer::{self, Pinned};
use crate::errors::to_py;
use crate::node::{wait, Node};

/// The rendezvous of a node. Every task of the job starts one with the same protocol.
#[pyclass(module = "vans._native", frozen)]
pub(crate) struct Rendezvous {
    inner: RendezvousHandle,
}

fn protocol(name: &str) -> PyResult<Protocol> {
    match name {
        "pull" | "grpc+seastar" | "grpc" => Ok(Protocol::Pull),
        "push" | "star_server" => Ok(Protocol::Push),
        other => Err(PyValueError::new_err(format!(
            "protocol {other:?}: use 'pull' (grpc+seastar) or 'push' (star_server)"
        ))),
    }
}

#[pymethods]
impl Rendezvous {
    /// Starts the rendezvous of `node`: `protocol` is `"pull"` (TensorFlow's grpc+seastar:
    /// the receiver asks) or `"push"` (StarServer: the sender delivers).
    #[new]
    #[pyo3(signature = (node, protocol="pull"))]
    fn new(py: Python<'_>, node: &Node, protocol: &str) -> PyResult<Rendezvous> {
        let protocol = self::protocol(protocol)?;
        let call = RendezvousHandle::start(&node.handle, protocol);
        Ok(Rendezvous {
            inner: wait(py, call, None)?,
        })
    }

    /// Makes `value` (any buffer: a numpy array, bytes, ...) available under `key` in step
    /// `step`; never blocks. The bytes are copied once, so the array may be reused at once
    /// (a pull-mode value waits for its receiver to ask, which can be long); with
    /// `copy=False` they are lent instead, and the array must not change until the step is
    /// cleaned up.
    #[pyo3(signature = (step, key, value, is_dead=false, copy=true))]
    fn send(
        &self,
        py: Python<'_>,
        step: i64,
        key: &str,
        value: &Bound<'_, PyAny>,
        is_dead: bool,
        copy: bool,
    ) -> PyResult<()> {
        buffer::release_pending(py);
        let lent = Pinned::new(value, "value", false)?.into_bytes();
        let bytes = if copy {
            bytes::Bytes::copy_from_slice(&lent)
        } else {
            lent
        };
        self.inner.send(step, key, bytes, is_dead).map_err(to_py)
    }

    /// Receives the value under `key` in step `step`: a new array of `dtype`, or `out`
    /// filled. With `return_dead`, returns `(array, is_dead)`.
    #[pyo3(signature = (step, key, dtype="uint8", out=None, timeout=None, return_dead=false))]
    #[allow(clippy::too_many_arguments)]
    fn recv(
        &self,
        py: Python<'_>,
        step: i64,
        key: &str,
        dtype: &str,
        out: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
        return_dead: bool,
    ) -> PyResult<Py<PyAny>> {
        let dtype = buffer::parse_dtype(dtype)?;
        let mut out = match out {
            Some(array) => {
                let pinned = Pinned::new(array, "out", true)?;
                Some((pinned, array.clone().unbind()))
            }
            None => None,
        };
        let received = wait(py, self.inner.recv(step, key), timeout)?;
        let array = match out.take() {
            Some((mut pinned, array)) => {
                let written = py.detach(|| pinned.write(&received.value));
                drop(pinned);
                buffer::release_pending(py);
                written.map_err(|e| PyValueError::new_err(format!("recv into out: {e}")))?;
                array
            }
            None => buffer::new_array(py, &received.value, dtype)?.unbind(),
        };
        if return_dead {
            Ok((array, received.is_dead)
                .into_pyobject(py)?
                .into_any()
                .unbind())
        } else {
            Ok(array)
        }
    }

    /// Ends step `step`: its pending receives fail, its table goes.
    fn cleanup(&self, step: i64) {
        self.inner.cleanup(step);
    }

    /// The CPU device name of node `node_id` in this cluster: its TensorFlow task's name when
    /// the node runs one (from `TF_CONFIG`), else `cpu_device(node_id)`'s.
    fn device(&self, node_id: i32) -> PyResult<String> {
        self.inner.device(node_id).ok_or_else(|| {
            PyValueError::new_err(format!("{node_id} is not a node id (a group, or negative)"))
        })
    }

    /// `"pull"` or `"push"`.
    #[getter]
    fn protocol(&self) -> &'static str {
        match self.inner.protocol() {
            Protocol::Pull => "pull",
            Protocol::Push => "push",
        }
    }
}

/// TensorFlow's rendezvous key: `src_device;hex(incarnation);dst_device;name;frame:iter`.
#[pyfunction]
#[pyo3(signature = (src_device, dst_device, name, incarnation=1, frame=0, iter=0))]
pub(crate) fn create_key(
    src_device: &str,
    dst_device: &str,
    name: &str,
    incarnation: u64,
    frame: u64,
    iter: u64,
) -> String {
    rendezvous::create_key(src_device, incarnation, dst_device, name, (frame, iter))
}

/// The CPU device name of a task (`/job:ps/replica:0/task:0/device:CPU:0` for node 8).
#[pyfunction]
pub(crate) fn cpu_device(node_id: i32) -> PyResult<String> {
    rendezvous::cpu_device(node_id).ok_or_else(|| {
        PyValueError::new_err(format!("{node_id} is not a node id (a group, or negative)"))
    })
}
