//! `RustBench`: the ps-bench request loop in Rust on a Python-started node, so `vans.bench`
//! can print the Python figures beside Rust's, measured on the same cluster in the same run.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use ps::{KvPairs, KvWorker, NodeError, Op, PullBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::node::{wait, Node};

/// A Rust `KvWorker<f32>` on a node, running ps-bench's loop: `window` requests in flight.
#[pyclass(module = "vans._native", frozen)]
pub(crate) struct RustBench {
    node: node::handle::NodeHandle,
    worker: KvWorker<f32>,
}

fn op(mode: &str) -> PyResult<Op> {
    mode.parse()
        .map_err(|e: NodeError| PyValueError::new_err(e.to_string()))
}

#[pymethods]
impl RustBench {
    /// A Rust worker on `node` for application `app_id` (a server must serve that app).
    #[new]
    fn new(py: Python<'_>, node: &Node, app_id: i32) -> PyResult<RustBench> {
        let po = node.handle.postoffice().clone();
        let call = node
            .handle
            .spawn(async move { KvWorker::<f32>::new(&po, app_id, 0).await });
        Ok(RustBench {
            node: node.handle.clone(),
            worker: wait(py, call, None)?,
        })
    }

    /// Runs `iters` requests of `mode` (`push`, `pull`, `pushpull`) with `size` value bytes
    /// each over `keys` (one key per request, round robin), `window` in flight; returns the
    /// seconds taken.
    fn run(
        &self,
        py: Python<'_>,
        mode: &str,
        keys: Vec<u64>,
        size: usize,
        window: usize,
        iters: u64,
    ) -> PyResult<f64> {
        let op = op(mode)?;
        if keys.is_empty() || window == 0 || size % 4 != 0 {
            return Err(PyValueError::new_err(
                "keys must be non-empty, window positive, size a multiple of 4",
            ));
        }
        let sets = keys.iter().map(|k| ps::values::to_bytes(&[*k])).collect();
        let vals = ps::values::to_bytes(&vec![1f32; size / 4]);
        self.round(py, op, sets, vals, None, window, iters)
    }

    /// The sparse loop: `iters` requests of `mode`, each the next of `key_sets` (sorted
    /// unique keys) with `floats` values per key, pulls written into a fresh buffer per
    /// request (`zpull_into`), `window` in flight; returns the seconds taken.
    fn run_sparse(
        &self,
        py: Python<'_>,
        mode: &str,
        key_sets: Vec<Vec<u64>>,
        floats: usize,
        window: usize,
        iters: u64,
    ) -> PyResult<f64> {
        let op = op(mode)?;
        let n = key_sets.first().map_or(0, Vec::len);
        if n == 0 || window == 0 || floats == 0 || key_sets.iter().any(|k| k.len() != n) {
            return Err(PyValueError::new_err(
                "key_sets must be non-empty sets of one size, window and floats positive",
            ));
        }
        let Some(bytes) = n.checked_mul(floats).and_then(|v| v.checked_mul(4)) else {
            return Err(PyValueError::new_err(
                "a request of that size does not fit in memory",
            ));
        };
        let sets = key_sets.iter().map(|k| ps::values::to_bytes(k)).collect();
        let vals = ps::values::to_bytes(&vec![1f32; n * floats]);
        self.round(py, op, sets, vals, Some(bytes), window, iters)
    }
}

impl RustBench {
    /// `iters` requests of `op`, each with the next of `sets` (key bytes, round robin) and
    /// `vals`, `window` in flight; pulls into a fresh buffer of `into` bytes when given
    /// (else joined by the worker). The seconds taken.
    #[allow(clippy::too_many_arguments)]
    fn round(
        &self,
        py: Python<'_>,
        op: Op,
        sets: Vec<Bytes>,
        vals: Bytes,
        into: Option<usize>,
        window: usize,
        iters: u64,
    ) -> PyResult<f64> {
        let worker = self.worker.clone();
        let call = self.node.spawn(async move {
            let started = Instant::now();
            let mut in_flight = VecDeque::with_capacity(window);
            let mut next = 0u64;
            while next < iters || !in_flight.is_empty() {
                if next < iters && in_flight.len() < window {
                    let keys = sets[(next % sets.len() as u64) as usize].clone();
                    next += 1;
                    let pairs = KvPairs {
                        keys: keys.clone(),
                        vals: vals.clone(),
                        lens: None,
                    };
                    // A push answers no values: nothing to write into.
                    let out = into
                        .filter(|_| op != Op::Push)
                        .map(|n| Box::new(vec![0u8; n]) as Box<dyn PullBuffer>);
                    let id = worker.request(op, pairs, 0, out).await?;
                    in_flight.push_back(id);
                    continue;
                }
                match in_flight.pop_front() {
                    Some(id) => {
                        worker.wait(id).await?;
                    }
                    None => break,
                }
            }
            Ok::<f64, NodeError>(started.elapsed().as_secs_f64())
        });
        wait(py, call, None)
    }
}
