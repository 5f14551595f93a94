//! `Server`: ps-lite's sum or a request handler written in Python.

use bytes::Bytes;
use ps::handle::KvNode;
use ps::optim::{initial_rows, TableHandler, TableSpec, SETTING_NAMES};
use ps::{KvMeta, KvPairs, RequestHandler, Snapshot};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use van_core::DataType;

use crate::buffer;
use crate::errors::to_py;
use crate::node::{node_or_start, wait, Node};

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
        // Copied, not lent: a handler often answers with a view of its own store, which the
        // next push (run before this response is written) would change under the socket.
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
    inner: ps::handle::Server,
}

#[pymethods]
impl Server {
    /// A server application on `node`: ps-lite's sum with `shards` shards when `handler` is
    /// None, else `handler(request)` (one shard: it runs with the GIL). `request` is a dict
    /// with `cmd`, `push`, `pull`, `sender`, `keys`, `vals` (None for a pull) and `lens`
    /// (per-key value counts, or None; on a pull, what the worker expects of each key when
    /// it pulls into a buffer); the
    /// handler returns the values for a pull (optionally `(vals, lens)`), anything for a push.
    /// An exception fails the worker's request with its text.
    /// Without `node`, starts one from the environment and `config` (role `server` unless
    /// `DMLC_ROLE` or `role=` says otherwise).
    ///
    /// With `table` (a spec such as `"optimizer=adam dim=16 lr=0.01"`) or `optimizer=` /
    /// `dim=` and the other settings of [`table_spec`] as keyword arguments, the server holds
    /// an embedding table of float32 rows instead: rows start from a seeded initializer on
    /// first touch, and each pushed gradient is applied by the optimizer on the server.
    /// `restore` (bytes of `snapshot()`) starts a table server from that checkpoint before
    /// it takes any request: what a server started again after a failure wants.
    #[new]
    #[pyo3(signature = (node=None, dtype=None, handler=None, app_id=0, customer_id=0, shards=1, table=None, restore=None, **config))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        node: Option<Bound<'_, Node>>,
        dtype: Option<&Bound<'_, PyAny>>,
        handler: Option<Py<PyAny>>,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        table: Option<&str>,
        restore: Option<Vec<u8>>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Server> {
        let config = match config {
            Some(c) => c.copy()?,
            None => PyDict::new(py),
        };
        let spec = take_spec(table, &config)?;
        let dtype = match (&spec, dtype) {
            (Some(_), None) => DataType::F32,
            (_, dtype) => buffer::dtype_arg(dtype)?,
        };
        if spec.is_some() && (dtype != DataType::F32 || handler.is_some()) {
            return Err(PyTypeError::new_err(
                "a table server holds float32 rows and answers with its optimizer: \
                 pass neither another dtype nor a handler",
            ));
        }
        let snapshot = match (restore, &spec) {
            (None, _) => None,
            (Some(bytes), Some(_)) => Some(Snapshot::from_bytes(&bytes).map_err(to_py)?),
            (Some(_), None) => {
                return Err(PyTypeError::new_err(
                    "restore= starts a table server from its snapshot: pass table= too",
                ))
            }
        };
        let node_ref = node_or_start(py, node, "server", Some(&config))?;
        let node = node_ref.get();
        let call = match (handler, spec, snapshot) {
            (_, Some(spec), Some(snapshot)) => node.handle.server_restored(
                DataType::F32,
                app_id,
                customer_id,
                shards,
                move |_| TableHandler::new(spec),
                snapshot,
            ),
            (_, Some(spec), None) => node.handle.table_server(spec, app_id, customer_id, shards),
            (None, None, _) => node.handle.sum_server(dtype, app_id, customer_id, shards),
            (Some(handler), None, _) => {
                node.handle
                    .server(dtype, app_id, customer_id, 1, move |_| PyHandler {
                        handler: Python::attach(|py| handler.clone_ref(py)),
                        dtype,
                    })
            }
        };
        let inner = wait(py, call, None)?;
        Ok(Server {
            dtype,
            node: node_ref.unbind(),
            inner,
        })
    }

    /// The values this server holds, as bytes for a checkpoint (a table's rows with their
    /// optimizer state; the sum's values): take it where no request is in flight, after a
    /// barrier of the workers. A Python handler has no snapshot (an error says so).
    #[pyo3(signature = (timeout=None))]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let snapshot = wait(py, self.inner.snapshot(), timeout)?;
        Ok(pyo3::types::PyBytes::new(py, &snapshot.to_bytes()))
    }

    /// Rolls this server back to `snapshot` (bytes of `snapshot()` from a server of the same
    /// key range and shard count), after the requests already queued.
    #[pyo3(signature = (snapshot, timeout=None))]
    fn restore(&self, py: Python<'_>, snapshot: &[u8], timeout: Option<f64>) -> PyResult<()> {
        let snapshot = Snapshot::from_bytes(snapshot).map_err(to_py)?;
        wait(py, self.inner.restore(snapshot), timeout)
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

/// The table spec of `table` and the table settings among `config` (taken out of it), or
/// None when neither names one.
fn take_spec(table: Option<&str>, config: &Bound<'_, PyDict>) -> PyResult<Option<TableSpec>> {
    let mut text = table.unwrap_or_default().to_owned();
    let mut named = table.is_some();
    for name in SETTING_NAMES {
        let Some(value) = config.get_item(name)? else {
            continue;
        };
        config.del_item(name)?;
        named = true;
        // Python's `True` is "True"; a spec says "true".
        let value = match value.extract::<bool>() {
            Ok(b) if value.is_instance_of::<pyo3::types::PyBool>() => b.to_string(),
            _ => value.str()?.to_string(),
        };
        text.push_str(&format!(" {name}={value}"));
    }
    if !named {
        return Ok(None);
    }
    text.trim().parse().map(Some).map_err(to_py)
}

/// The canonical text of a table spec: `table` and/or keyword settings (`optimizer`, `dim`,
/// `lr`, `momentum`, `nesterov`, `initial_accumulator`, `eps`, `beta1`, `beta2`, `beta`,
/// `l1`, `l2`, `init`, `scale`, `std`, `seed`), with every default written out. Raises
/// `ValueError` naming a bad or unknown setting.
#[pyfunction]
#[pyo3(signature = (table=None, **settings))]
pub(crate) fn table_spec(
    py: Python<'_>,
    table: Option<&str>,
    settings: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let settings = match settings {
        Some(s) => s.copy()?,
        None => PyDict::new(py),
    };
    let spec = take_spec(table, &settings)?;
    if let Some(name) = settings.keys().iter().next() {
        return Err(PyValueError::new_err(format!(
            "{name} is not a table setting; settings: {}",
            SETTING_NAMES.join(", ")
        )));
    }
    match spec {
        Some(spec) => Ok(spec.to_string()),
        None => Err(PyValueError::new_err("a table spec needs at least dim=")),
    }
}

/// The rows a table of `spec` starts `keys` (uint64) with, as a float32 array of
/// `len(keys) * dim` values: the same rows a table server creates on first touch.
#[pyfunction]
pub(crate) fn table_initial_rows<'py>(
    py: Python<'py>,
    spec: &str,
    keys: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let spec: TableSpec = spec.parse().map_err(to_py)?;
    let keys = buffer::keys(keys)?;
    let keys = ps::values::view::<u64>(&keys).map_err(to_py)?;
    let rows = initial_rows(&spec, &keys);
    buffer::new_array(py, &ps::values::to_bytes(&rows), DataType::F32)
}
