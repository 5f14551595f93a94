"""vans from Python: a ps-lite style parameter server and a TensorFlow-style rendezvous over
TCP, io_uring and shared memory.

A process is one node of a cluster (a scheduler, a server or a worker), configured from the
environment that ps-lite, BytePS and the Kubeflow operators use (``DMLC_ROLE``,
``DMLC_NUM_SERVER``, ``DMLC_NUM_WORKER``, ``DMLC_PS_ROOT_URI``, ``DMLC_PS_ROOT_PORT``, ... or
``TF_CONFIG``), or from keyword arguments::

    import numpy as np
    import vans

    node = vans.Node()                      # joins the cluster DMLC_* describes
    if node.role == "server":
        vans.Server(node).serve()           # ps-lite's sum, until everyone finalizes
    elif node.role == "worker":
        w = vans.Worker(node, dtype=np.float32)
        keys = np.array([1, 3, 5], dtype=np.uint64)
        w.push(keys, np.ones(3, dtype=np.float32))
        print(w.pull(keys))
        node.finalize()
    else:
        node.finalize()

Arrays are borrowed, not copied: anything exporting the buffer protocol (numpy, bytes,
memoryview) or ``__dlpack__`` (torch and JAX CPU tensors). Waits release the GIL; the
``*_async`` methods return a :class:`Request` that can be waited for, polled, given a
callback, or awaited from asyncio. Errors are the exceptions of :mod:`vans.errors`. Log
records of the Rust code go to Python's :mod:`logging` under the logger ``vans``, at the level
``PS_VERBOSE`` asks for or the ``vans`` logger's, whichever is more verbose.
"""

import sys as _sys

from . import _logging, errors
from ._native import (
    ACCUMULATE_CMD,
    APPLY_CMD,
    ROUND_CMD,
    Collective,
    Node,
    Rendezvous,
    Request,
    Server,
    Worker,
    __version__,
    cpu_device,
    create_key,
    free_port,
    node_role,
    table_initial_rows,
    table_spec,
)
from ._native import launch as _launch

_logging.start()

__all__ = [
    "ACCUMULATE_CMD",
    "APPLY_CMD",
    "ROUND_CMD",
    "Collective",
    "Node",
    "Request",
    "Rendezvous",
    "Server",
    "Worker",
    "cpu_device",
    "create_key",
    "errors",
    "free_port",
    "launch",
    "node_role",
    "run_node",
    "table_initial_rows",
    "table_spec",
    "__version__",
]


def launch(num_servers, num_workers, script=None, args=(), program=None, env=None,
           root_uri=None, root_port=0, timeout=None):
    """Starts a local cluster: one scheduler, ``num_servers`` servers and ``num_workers``
    workers, each a process running ``python script args...`` (or ``program args...``) with
    its ``DMLC_*`` environment plus ``env``. Their output is printed prefixed with the node's
    name (``[server 0] ...``). Waits for every node and returns one dict per node (``role``,
    ``rank``, ``pid``, ``code``, ``signal``); raises :class:`vans.errors.LaunchError` when a
    node fails or ``timeout`` seconds pass, and on Ctrl-C stops every node first.

    Inside each node, ``vans.Node()`` (or ``vans.Worker()``/``vans.Server()``) joins the
    cluster from that environment."""
    if (script is None) == (program is None):
        raise ValueError("pass exactly one of script= (a Python file) or program=")
    if script is not None:
        program, args = _sys.executable, [str(script), *map(str, args)]
    return _launch(num_servers, num_workers, str(program), [str(a) for a in args],
                   {str(k): str(v) for k, v in (env or {}).items()}, root_uri, int(root_port),
                   timeout)


def run_node(worker_main, dtype="float32", server_handler=None, shards=1, **config):
    """Runs this process as the node its environment says, ps-lite style: the scheduler
    and servers serve until every node finalizes; a worker runs ``worker_main(worker)`` and
    then finalizes. Returns what ``worker_main`` returned (``None`` on other roles)."""
    node = Node(**config)
    if node.role == "worker":
        worker = Worker(node, dtype=dtype)
        try:
            result = worker_main(worker)
        except BaseException:
            node.stop()
            raise
        node.finalize()
        return result
    if node.role == "server":
        Server(node, dtype=dtype, handler=server_handler, shards=shards).serve()
    else:
        node.finalize()
    return None
