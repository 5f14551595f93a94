//! `Worker` and `Request`: push, pull and push-pull from Python, over
//! [`ps::handle::Worker`], with requests in flight that can be waited for, polled, given a
//! callback or awaited from asyncio.

use ps::handle::KvNode;
use std::sync::Arc;
use std::time::Duration;

use node::handle::Call;
use ps::handle::Worker as EmbedWorker;
use ps::KvPairs;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use van_core::DataType;

use crate::buffer::{self, Pinned};
use crate::errors::to_py;
use crate::node::{node_or_start, wait, wait_for, Node};

/// Copies into an `out=` array of at least this many bytes run without the GIL; smaller ones
/// cost less than giving it up.
const DETACHED_COPY: usize = 256 << 10;

/// What a request answers, once converted for Python.
enum Want {
    /// A push: `None`.
    Nothing,
    /// Values, as a new array or written into `out`.
    Values {
        dtype: DataType,
        out: Option<(Pinned, Py<PyAny>)>,
        with_lens: bool,
    },
    /// Values written by the pull itself into this `out` array.
    Filled(Py<PyAny>),
}

/// The call of a request: a push answers nothing, the others answer pairs.
enum RequestCall {
    Push(Call<()>),
    Pairs(Call<KvPairs>),
}

impl RequestCall {
    fn wait_timeout(&mut self, timeout: Duration) -> ps::Result<KvPairs> {
        match self {
            RequestCall::Push(call) => call.wait_timeout(timeout).map(|()| KvPairs::default()),
            RequestCall::Pairs(call) => call.wait_timeout(timeout),
        }
    }

    fn is_ready(&mut self) -> bool {
        match self {
            RequestCall::Push(call) => call.is_ready(),
            RequestCall::Pairs(call) => call.is_ready(),
        }
    }

    fn on_complete(self, done: impl FnOnce(ps::Result<KvPairs>) + Send + 'static) {
        match self {
            RequestCall::Push(call) => {
                call.on_complete(move |r| done(r.map(|()| KvPairs::default())))
            }
            RequestCall::Pairs(call) => call.on_complete(done),
        }
    }
}

/// A request in flight: wait for it (`wait`), poll it (`done`), have a callback run
/// (`add_done_callback`), or `await` it from asyncio.
#[pyclass(module = "vans._native")]
pub(crate) struct Request {
    call: Option<RequestCall>,
    want: Option<Want>,
}

impl Request {
    fn new(call: RequestCall, want: Want) -> Request {
        Request {
            call: Some(call),
            want: Some(want),
        }
    }
}

/// Converts a completed request's pairs into what Python asked for.
fn convert(py: Python<'_>, pairs: KvPairs, want: Want) -> PyResult<Py<PyAny>> {
    match want {
        Want::Nothing => Ok(py.None()),
        Want::Filled(array) => {
            drop(pairs);
            buffer::release_pending(py);
            Ok(array)
        }
        Want::Values {
            dtype,
            out,
            with_lens,
        } => {
            let values = match out {
                Some((mut pinned, array)) => {
                    let written = if pairs.vals.len() < DETACHED_COPY {
                        pinned.write(&pairs.vals)
                    } else {
                        py.detach(|| pinned.write(&pairs.vals))
                    };
                    drop(pinned);
                    buffer::release_pending(py);
                    written.map_err(|e| {
                        PyValueError::new_err(format!("pull into out: {e} (one value per key)"))
                    })?;
                    array
                }
                None => buffer::new_array(py, &pairs.vals, dtype)?.unbind(),
            };
            if !with_lens {
                return Ok(values);
            }
            let lens = match &pairs.lens {
                Some(lens) => buffer::new_array(py, lens, DataType::I32)?.unbind(),
                None => py.None(),
            };
            Ok((values, lens).into_pyobject(py)?.into_any().unbind())
        }
    }
}

#[pymethods]
impl Request {
    /// Waits for the answer (without the GIL): `None` for a push, the values for a pull.
    /// Raises `vans.errors.TimeoutError` after `timeout` seconds (the request goes on and can
    /// be waited for again).
    #[pyo3(signature = (timeout=None))]
    fn wait(&mut self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let call = self
            .call
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("this request was already waited for"))?;
        // A timeout or a signal leaves the request pending (it can be waited for again);
        // anything else is its answer.
        let mut answered = false;
        let result = wait_for(py, timeout, |slice| {
            let result = call.wait_timeout(slice);
            answered = !matches!(result, Err(ps::NodeError::Timeout { .. }));
            result
        });
        if !answered {
            return Err(result.err().unwrap_or_else(|| {
                PyValueError::new_err("the request was interrupted before it was answered")
            }));
        }
        self.call = None;
        let want = self.want.take().unwrap_or(Want::Nothing);
        convert(py, result?, want)
    }

    /// Whether the answer is there (`wait` would not block).
    fn done(&mut self) -> bool {
        self.call.as_mut().is_none_or(|c| c.is_ready())
    }

    /// Calls `fn(result, error)` once the request completes, on an I/O thread (with the GIL):
    /// `error` is `None` on success, the exception otherwise. Used by `__await__`. Keep it
    /// short: the node's I/O waits for it.
    fn add_done_callback(&mut self, callback: Py<PyAny>) -> PyResult<()> {
        let call = self
            .call
            .take()
            .ok_or_else(|| PyValueError::new_err("this request was already waited for"))?;
        let want = self.want.take().unwrap_or(Want::Nothing);
        call.on_complete(move |result| {
            Python::attach(|py| {
                buffer::release_pending(py);
                let outcome = result.map_err(to_py).and_then(|p| convert(py, p, want));
                let called = match outcome {
                    Ok(value) => callback.call1(py, (value, py.None())),
                    Err(e) => callback.call1(py, (py.None(), e.into_value(py))),
                };
                if let Err(e) = called {
                    e.write_unraisable(py, None);
                }
            })
        });
        Ok(())
    }

    /// Awaitable from asyncio: `values = await worker.pull_async(keys)`.
    fn __await__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        py.import("vans._aio")?
            .getattr("await_request")?
            .call1((slf,))
    }
}

/// Pushes and pulls values of one dtype (ps-lite's `KVWorker<Val>`).
#[pyclass(module = "vans._native", frozen)]
pub(crate) struct Worker {
    pub(crate) inner: Arc<EmbedWorker>,
    node: Py<Node>,
    /// Its handle for the TensorFlow ops, once asked for.
    tf_handle: std::sync::OnceLock<u64>,
}

impl Worker {
    fn pairs(
        &self,
        keys: &Bound<'_, PyAny>,
        vals: &Bound<'_, PyAny>,
        lens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<KvPairs> {
        buffer::release_pending(keys.py());
        Ok(KvPairs {
            keys: buffer::keys(keys)?,
            vals: buffer::values(vals, self.inner.dtype())?,
            lens: lens.map(buffer::lens).transpose()?,
        })
    }

    fn want_values(&self, out: Option<&Bound<'_, PyAny>>, with_lens: bool) -> PyResult<Want> {
        let dtype = self.inner.dtype();
        let out = match out {
            Some(array) => Some((buffer::output(array, dtype)?, array.clone().unbind())),
            None => None,
        };
        Ok(Want::Values {
            dtype,
            out,
            with_lens,
        })
    }
}

#[pymethods]
impl Worker {
    /// A worker application for values of `dtype` on `node`, or, without a node, on a node
    /// started from the environment and `config` (the keyword arguments of `Node`; role
    /// `worker` unless `DMLC_ROLE` or `role=` says otherwise).
    #[new]
    #[pyo3(signature = (node=None, dtype=None, app_id=0, customer_id=0, **config))]
    fn new(
        py: Python<'_>,
        node: Option<Bound<'_, Node>>,
        dtype: Option<&Bound<'_, PyAny>>,
        app_id: i32,
        customer_id: i32,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Worker> {
        let dtype = buffer::dtype_arg(dtype)?;
        let node = node_or_start(py, node, "worker", config)?;
        let call = node.get().handle.worker(dtype, app_id, customer_id);
        Ok(Worker {
            inner: Arc::new(wait(py, call, None)?),
            node: node.unbind(),
            tf_handle: std::sync::OnceLock::new(),
        })
    }

    /// The node this worker runs on.
    #[getter]
    fn node(&self, py: Python<'_>) -> Py<Node> {
        self.node.clone_ref(py)
    }

    /// The numpy dtype name of the values.
    #[getter]
    fn dtype(&self) -> &'static str {
        buffer::dtype_name(self.inner.dtype())
    }

    /// This worker's handle for the ops of `vans.tensorflow` (their `worker` attribute): a
    /// number, not an address, that ops name it by while this object lives.
    fn _tf_handle(&self) -> u64 {
        *self
            .tf_handle
            .get_or_init(|| crate::tf_api::register(&self.inner))
    }

    /// Value bytes that pulls into `out=` arrays have copied so far: each server's answer
    /// once, from its received frame to its place in the array (the only copy of them).
    #[getter]
    fn copied_pull_bytes(&self) -> u64 {
        self.inner.copied_pull_bytes()
    }

    /// Starts a push of `vals` for sorted `keys` (no copy: do not modify the arrays until the
    /// request completes).
    #[pyo3(signature = (keys, vals, lens=None, cmd=0))]
    fn push_async(
        &self,
        keys: &Bound<'_, PyAny>,
        vals: &Bound<'_, PyAny>,
        lens: Option<&Bound<'_, PyAny>>,
        cmd: i32,
    ) -> PyResult<Request> {
        let pairs = self.pairs(keys, vals, lens)?;
        let call = RequestCall::Push(self.inner.push(pairs, cmd));
        Ok(Request::new(call, Want::Nothing))
    }

    /// Starts a pull of the values of sorted `keys`, into `out` when given: each server's
    /// answer is then written straight to its keys' place in `out` (every key the same number
    /// of values: `out`'s length divided by the key count), from an I/O thread while the
    /// request is in flight, so do not read or reuse `out` until it completes. Keys are
    /// uint64 (or int64, read as uint64), sorted ascending, each once. A key no one pushed
    /// pulls as zeros into `out`; without `out` its length is unknown, and the pull raises
    /// `HandlerFailedError` naming it (`VANS_UNPUSHED_KEYS=error` on the servers: always).
    #[pyo3(signature = (keys, out=None, cmd=0, return_lens=false))]
    fn pull_async(
        &self,
        keys: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        cmd: i32,
        return_lens: bool,
    ) -> PyResult<Request> {
        buffer::release_pending(keys.py());
        let keys = buffer::keys(keys)?;
        if let (Some(array), false) = (out, return_lens) {
            let lent = buffer::Output::new(array, self.inner.dtype())?;
            let call = RequestCall::Pairs(self.inner.pull_into(keys, lent, cmd));
            return Ok(Request::new(call, Want::Filled(array.clone().unbind())));
        }
        let want = self.want_values(out, return_lens)?;
        let call = RequestCall::Pairs(self.inner.pull(keys, cmd));
        Ok(Request::new(call, want))
    }

    /// Starts a push of `vals`, then a pull of the updated values (one round trip).
    #[pyo3(signature = (keys, vals, out=None, lens=None, cmd=0, return_lens=false))]
    #[allow(clippy::too_many_arguments)]
    fn push_pull_async(
        &self,
        keys: &Bound<'_, PyAny>,
        vals: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        lens: Option<&Bound<'_, PyAny>>,
        cmd: i32,
        return_lens: bool,
    ) -> PyResult<Request> {
        let pairs = self.pairs(keys, vals, lens)?;
        if let (Some(array), false) = (out, return_lens) {
            let lent = buffer::Output::new(array, self.inner.dtype())?;
            let call = RequestCall::Pairs(self.inner.push_pull_into(pairs, lent, cmd));
            return Ok(Request::new(call, Want::Filled(array.clone().unbind())));
        }
        let want = self.want_values(out, return_lens)?;
        Ok(Request::new(
            RequestCall::Pairs(self.inner.push_pull(pairs, cmd)),
            want,
        ))
    }

    /// Pushes and waits.
    #[pyo3(signature = (keys, vals, lens=None, cmd=0, timeout=None))]
    fn push(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        vals: &Bound<'_, PyAny>,
        lens: Option<&Bound<'_, PyAny>>,
        cmd: i32,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        self.push_async(keys, vals, lens, cmd)?.wait(py, timeout)
    }

    /// Pulls and waits: a new array, or `out` filled.
    #[pyo3(signature = (keys, out=None, cmd=0, return_lens=false, timeout=None))]
    fn pull(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        cmd: i32,
        return_lens: bool,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        self.pull_async(keys, out, cmd, return_lens)?
            .wait(py, timeout)
    }

    /// Push-pull and wait.
    #[pyo3(signature = (keys, vals, out=None, lens=None, cmd=0, return_lens=false, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn push_pull(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        vals: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        lens: Option<&Bound<'_, PyAny>>,
        cmd: i32,
        return_lens: bool,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        self.push_pull_async(keys, vals, out, lens, cmd, return_lens)?
            .wait(py, timeout)
    }
}
