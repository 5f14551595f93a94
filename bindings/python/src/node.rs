//! `Node`, `Worker`, `Server` and `Request`: the parameter server from Python, over
//! [`ps::embed`]. Every wait releases the GIL and wakes every 100 ms to let Python deliver
//! signals (Ctrl-C raises `KeyboardInterrupt` in a long wait).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ps::embed::{Call, NodeHandle, Worker as EmbedWorker};
use ps::{Config, KvMeta, KvPairs, PsError, RequestHandler};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use van_core::DataType;

use crate::buffer::{self, Pinned};
use crate::errors::to_py;

/// How often a wait wakes to let Python handle signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Waits for `call` without the GIL, for at most `timeout` seconds (forever with `None`).
pub(crate) fn wait<T: Send + 'static>(
    py: Python<'_>,
    mut call: Call<T>,
    timeout: Option<f64>,
) -> PyResult<T> {
    let deadline = timeout_deadline(timeout)?;
    loop {
        let slice = match deadline {
            Some(deadline) => deadline
                .saturating_duration_since(Instant::now())
                .min(SIGNAL_CHECK),
            None => SIGNAL_CHECK,
        };
        match py.detach(|| call.wait_timeout(slice)) {
            Err(PsError::Timeout { .. }) if deadline.is_none_or(|d| Instant::now() < d) => {
                py.check_signals()?;
            }
            Err(PsError::Timeout { .. }) => {
                return Err(to_py(PsError::Timeout {
                    waited: Duration::from_secs_f64(timeout.unwrap_or(0.0)),
                }))
            }
            result => {
                buffer::release_pending(py);
                return result.map_err(to_py);
            }
        }
    }
}

fn timeout_deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            Ok(Some(Instant::now() + Duration::from_secs_f64(t)))
        }
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds, not {t}"
        ))),
    }
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
}

/// The call of a request: a push answers nothing, the others answer pairs.
enum Pending {
    Push(Call<()>),
    Pairs(Call<KvPairs>),
}

impl Pending {
    fn wait_timeout(&mut self, timeout: Duration) -> ps::Result<KvPairs> {
        match self {
            Pending::Push(call) => call.wait_timeout(timeout).map(|()| KvPairs::default()),
            Pending::Pairs(call) => call.wait_timeout(timeout),
        }
    }

    fn is_ready(&mut self) -> bool {
        match self {
            Pending::Push(call) => call.is_ready(),
            Pending::Pairs(call) => call.is_ready(),
        }
    }

    fn on_complete(self, done: impl FnOnce(ps::Result<KvPairs>) + Send + 'static) {
        match self {
            Pending::Push(call) => call.on_complete(move |r| done(r.map(|()| KvPairs::default()))),
            Pending::Pairs(call) => call.on_complete(done),
        }
    }
}

/// A request in flight: wait for it (`wait`), poll it (`done`), have a callback run
/// (`add_done_callback`), or `await` it from asyncio.
#[pyclass(module = "vans._native")]
pub(crate) struct Request {
    call: Option<Pending>,
    want: Option<Want>,
}

impl Request {
    fn new(call: Pending, want: Want) -> Request {
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
        Want::Values {
            dtype,
            out,
            with_lens,
        } => {
            let values = match out {
                Some((mut pinned, array)) => {
                    let written = py.detach(|| pinned.write(&pairs.vals));
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
            .take()
            .ok_or_else(|| PyValueError::new_err("this request was already waited for"))?;
        let mut call = call;
        let deadline = timeout_deadline(timeout)?;
        let result = loop {
            let slice = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(SIGNAL_CHECK),
                None => SIGNAL_CHECK,
            };
            match py.detach(|| call.wait_timeout(slice)) {
                Err(PsError::Timeout { .. }) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        self.call = Some(call);
                        return Err(to_py(PsError::Timeout {
                            waited: Duration::from_secs_f64(timeout.unwrap_or(0.0)),
                        }));
                    }
                    if let Err(e) = py.check_signals() {
                        self.call = Some(call);
                        return Err(e);
                    }
                }
                other => break other,
            }
        };
        buffer::release_pending(py);
        let want = self.want.take().unwrap_or(Want::Nothing);
        convert(py, result.map_err(to_py)?, want)
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

/// `node`, or a node started from the environment and `config` (keyword arguments of
/// `Node`), with `role` unless `config` names one.
fn node_or_start<'py>(
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

/// Pushes and pulls values of one dtype (ps-lite's `KVWorker<Val>`).
#[pyclass(module = "vans._native", frozen)]
pub(crate) struct Worker {
    pub(crate) inner: EmbedWorker,
    node: Py<Node>,
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
        let dtype = match dtype {
            Some(d) => buffer::dtype_arg(d)?,
            None => DataType::F32,
        };
        let node = node_or_start(py, node, "worker", config)?;
        let call = node.get().handle.worker(dtype, app_id, customer_id);
        Ok(Worker {
            inner: wait(py, call, None)?,
            node: node.unbind(),
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
        let call = Pending::Push(self.inner.push(pairs, cmd));
        Ok(Request::new(call, Want::Nothing))
    }

    /// Starts a pull of the values of sorted `keys`, into `out` when given.
    #[pyo3(signature = (keys, out=None, cmd=0, return_lens=false))]
    fn pull_async(
        &self,
        keys: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        cmd: i32,
        return_lens: bool,
    ) -> PyResult<Request> {
        buffer::release_pending(keys.py());
        let want = self.want_values(out, return_lens)?;
        let call = Pending::Pairs(self.inner.pull(buffer::keys(keys)?, cmd));
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
        let want = self.want_values(out, return_lens)?;
        Ok(Request::new(
            Pending::Pairs(self.inner.push_pull(pairs, cmd)),
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

/// The Python handler of a server shard: `handler(request) -> values or None`.
struct PyHandler {
    handler: Py<PyAny>,
    dtype: DataType,
}

impl RequestHandler for PyHandler {
    fn handle(&mut self, meta: &KvMeta, request: KvPairs) -> Result<KvPairs, String> {
        Python::attach(|py| self.call(py, meta, request)).map_err(|e| e.to_string())
    }
}

impl PyHandler {
    fn call(&self, py: Python<'_>, meta: &KvMeta, request: KvPairs) -> PyResult<KvPairs> {
        buffer::release_pending(py);
        let req = PyDict::new(py);
        req.set_item("cmd", meta.cmd)?;
        req.set_item("push", meta.push)?;
        req.set_item("pull", meta.pull)?;
        req.set_item("sender", meta.sender)?;
        req.set_item("keys", buffer::new_array(py, &request.keys, DataType::U64)?)?;
        let vals = if meta.push {
            buffer::new_array(py, &request.vals, self.dtype)?.into_any()
        } else {
            py.None().into_bound(py)
        };
        req.set_item("vals", vals)?;
        let lens = match &request.lens {
            Some(lens) => buffer::new_array(py, lens, DataType::I32)?.into_any(),
            None => py.None().into_bound(py),
        };
        req.set_item("lens", lens)?;
        let answer = self.handler.call1(py, (req,))?;
        let answer = answer.bind(py);
        if !meta.pull {
            return Ok(KvPairs::default());
        }
        if answer.is_none() {
            return Err(PyTypeError::new_err(
                "the handler answered a pull with None; return the values",
            ));
        }
        let (vals, lens) = match answer.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>() {
            Ok((vals, lens)) => (vals, Some(lens)),
            Err(_) => (answer.clone(), None),
        };
        Ok(KvPairs {
            keys: request.keys.clone(),
            vals: Bytes::copy_from_slice(buffer::values(&vals, self.dtype)?.as_ref()),
            lens: match lens {
                Some(l) => Some(Bytes::copy_from_slice(buffer::lens(&l)?.as_ref())),
                None => None,
            },
        })
    }
}

/// Answers pushes and pulls for this server's key range: the built-in sum, or `handler`.
#[pyclass(module = "vans._native", frozen)]
pub(crate) struct Server {
    dtype: DataType,
    node: Py<Node>,
}

#[pymethods]
impl Server {
    /// A server application on `node`: ps-lite's sum with `shards` shards when `handler` is
    /// None, else `handler(request)` (one shard: it runs with the GIL). `request` is a dict
    /// with `cmd`, `push`, `pull`, `sender`, `keys`, `vals` (None for a pull) and `lens`; the
    /// handler returns the values for a pull (optionally `(vals, lens)`), anything for a push.
    /// An exception fails the worker's request with its text.
    /// Without `node`, starts one from the environment and `config` (role `server` unless
    /// `DMLC_ROLE` or `role=` says otherwise).
    #[new]
    #[pyo3(signature = (node=None, dtype=None, handler=None, app_id=0, customer_id=0, shards=1, **config))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        node: Option<Bound<'_, Node>>,
        dtype: Option<&Bound<'_, PyAny>>,
        handler: Option<Py<PyAny>>,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Server> {
        let dtype = match dtype {
            Some(d) => buffer::dtype_arg(d)?,
            None => DataType::F32,
        };
        let node_ref = node_or_start(py, node, "server", config)?;
        let node = node_ref.get();
        let call = match handler {
            None => node.handle.sum_server(dtype, app_id, customer_id, shards),
            Some(handler) => {
                node.handle
                    .server(dtype, app_id, customer_id, 1, move |_| PyHandler {
                        handler: Python::attach(|py| handler.clone_ref(py)),
                        dtype,
                    })
            }
        };
        wait(py, call, None)?;
        Ok(Server {
            dtype,
            node: node_ref.unbind(),
        })
    }

    /// The node this server runs on.
    #[getter]
    fn node(&self, py: Python<'_>) -> Py<Node> {
        self.node.clone_ref(py)
    }

    /// Serves until every node finalizes (`node.finalize()`), then returns.
    #[pyo3(signature = (timeout=None))]
    fn serve(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        wait(py, self.node.get().handle.finalize(), timeout)
    }

    /// The numpy dtype name of the values.
    #[getter]
    fn dtype(&self) -> &'static str {
        buffer::dtype_name(self.dtype)
    }
}
