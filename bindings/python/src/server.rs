//! `Server`: ps-lite's sum or a request handler written in Python.

use bytes::Bytes;
use ps::{KvMeta, KvPairs, RequestHandler};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use van_core::DataType;

use crate::buffer;
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
        let dtype = buffer::dtype_arg(dtype)?;
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
