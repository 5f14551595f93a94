//! `Collective`: all-reduce, broadcast and barrier among the workers, on numpy arrays in
//! place, with the elastic generations of the `collective` crate.

use std::time::Duration;

use collective::handle::CommHandle;
use collective::{Element, Generation, ReduceOp};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use van_core::DataType;

use crate::buffer::Pinned;
use crate::errors::collective_to_py as to_py;
use crate::node::{wait, Node};

fn generation_tuple(g: &Generation) -> (u64, Vec<i32>) {
    (g.number, g.members.clone())
}

/// The collectives of a worker node. Every worker of the job creates one; the first
/// generation holds those that did within the settle window.
#[pyclass(module = "vans._native", frozen)]
pub(crate) struct Collective {
    inner: CommHandle,
}

impl Collective {
    /// Runs `f` on a copy of `array`'s elements as `T` and writes the result back.
    fn in_place<T: Element>(
        &self,
        py: Python<'_>,
        pinned: &mut Pinned,
        timeout: Option<f64>,
        f: impl FnOnce(&CommHandle, Vec<T>) -> node::handle::Call<collective::Result<Vec<T>>>,
    ) -> PyResult<()> {
        let bytes = pinned.as_ref();
        let mut values = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
        bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(bytes);
        let out = wait(py, f(&self.inner, values), timeout)?.map_err(to_py)?;
        let written = py.detach(|| pinned.write(bytemuck::cast_slice(&out)));
        written.map_err(PyValueError::new_err)
    }

    fn dispatch(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        op: ReduceOp,
        root: Option<usize>,
    ) -> PyResult<()> {
        let mut pinned = Pinned::new(array, "array", true)?;
        macro_rules! run {
            ($t:ty) => {
                self.in_place::<$t>(py, &mut pinned, timeout, |comm, values| match root {
                    Some(root) => comm.broadcast(values, root).call(),
                    None => comm.allreduce(values, op).call(),
                })
            };
        }
        let result = match pinned.data_type() {
            Some(DataType::F32) => run!(f32),
            Some(DataType::F64) => run!(f64),
            Some(DataType::I32) => run!(i32),
            Some(DataType::I64) => run!(i64),
            _ => Err(PyTypeError::new_err(format!(
                "collectives take float32, float64, int32 or int64 arrays, not {}",
                pinned.format()
            ))),
        };
        drop(pinned);
        crate::buffer::release_pending(py);
        result
    }
}

#[pymethods]
impl Collective {
    /// Joins the collectives of worker `node` and waits for the first generation.
    #[new]
    #[pyo3(signature = (node, timeout=None))]
    fn new(py: Python<'_>, node: &Node, timeout: Option<f64>) -> PyResult<Collective> {
        let inner = wait(py, CommHandle::start(&node.handle), timeout)?.map_err(to_py)?;
        Ok(Collective { inner })
    }

    /// Reduces `array` (a writable, C-contiguous float32, float64, int32 or int64 array)
    /// across the workers in place: `op` is "sum", "mean", "min" or "max". Raises
    /// `vans.errors.CollectiveError` when a member failed or the membership changed.
    #[pyo3(signature = (array, op="sum", timeout=None))]
    fn allreduce(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        op: &str,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let op: ReduceOp = op.parse().map_err(PyValueError::new_err)?;
        self.dispatch(py, array, timeout, op, None)
    }

    /// Copies rank `root`'s `array` into every other rank's, in place.
    #[pyo3(signature = (array, root=0, timeout=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        root: usize,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        self.dispatch(py, array, timeout, ReduceOp::Sum, Some(root))
    }

    /// Returns once every rank has called it.
    #[pyo3(signature = (timeout=None))]
    fn barrier(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        wait(py, self.inner.barrier().call(), timeout)?.map_err(to_py)
    }

    /// Starts a collective on memory lent by address, for framework adapters (`vans.torch`):
    /// `kind` is allreduce, broadcast, all_gather, reduce_scatter, all_to_all, send or recv;
    /// `tensor` and `output` are `(address, nbytes)` of contiguous CPU memory holding
    /// `dtype` elements; `peer` is the root (broadcast) or the other rank (send, recv).
    /// Returns at once; `done(error)` runs on a vans I/O thread with the GIL when the
    /// collective is over (`error` is `None` on success), after `keep` is let go.
    ///
    /// The caller must keep the memory alive (through `keep`) and must not read or write it
    /// until `done` has run: the collective works in it without a copy.
    #[pyo3(signature = (kind, dtype, tensor, done, keep, output=None, op="sum", peer=0, tag=0, send_counts=None, recv_counts=None))]
    #[allow(clippy::too_many_arguments)]
    fn _start(
        &self,
        kind: &str,
        dtype: &str,
        tensor: (usize, usize),
        done: Py<PyAny>,
        keep: Py<PyAny>,
        output: Option<(usize, usize)>,
        op: &str,
        peer: usize,
        tag: i32,
        send_counts: Option<Vec<usize>>,
        recv_counts: Option<Vec<usize>>,
    ) -> PyResult<()> {
        let op: ReduceOp = op.parse().map_err(PyValueError::new_err)?;
        let counts = match (send_counts, recv_counts) {
            (Some(send), Some(recv)) => Some((send, recv)),
            (None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "all_to_all needs both send_counts and recv_counts",
                ))
            }
        };
        let request = crate::lent::Request {
            kind,
            first: tensor,
            second: output,
            op,
            peer,
            tag,
            counts,
        };
        crate::lent::start(&self.inner, dtype, request, keep, done)
    }

    /// Starts a barrier; `done(error)` runs when every rank has reached it (see `_start`).
    fn _barrier(&self, py: Python<'_>, done: Py<PyAny>) {
        crate::lent::complete(self.inner.barrier(), py.None(), done);
    }

    /// Waits for the next generation after a failure (or returns the current one when it
    /// is intact): `(number, member node ids)`.
    #[pyo3(signature = (timeout=60.0))]
    fn settle(&self, py: Python<'_>, timeout: f64) -> PyResult<(u64, Vec<i32>)> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout must be a positive number of seconds, not {timeout}"
            )));
        }
        let call = self.inner.settle(Duration::from_secs_f64(timeout));
        let generation = wait(py, call, None)?.map_err(to_py)?;
        Ok(generation_tuple(&generation))
    }

    /// The current generation: `(number, member node ids)`.
    #[getter]
    fn generation(&self) -> (u64, Vec<i32>) {
        generation_tuple(&self.inner.generation())
    }

    /// This worker's rank in the current generation (`None` when not a member).
    #[getter]
    fn rank(&self) -> Option<usize> {
        self.inner.generation().rank_of(self.inner.node().id())
    }

    /// The number of ranks of the current generation.
    #[getter]
    fn size(&self) -> usize {
        self.inner.generation().size()
    }
}
