"""vans for TensorFlow: TensorFlow's own runtime over vans (server protocols), ops that pull
and push embedding rows from vans table servers, and a Keras layer over them.

Importing this module registers the server protocols of :data:`PROTOCOLS` with TensorFlow
(:func:`load_server_plugin`): ``tf.distribute.Server(cluster, job_name=..., task_index=...,
protocol="grpc+vans")`` (or ``rpc_layer="grpc+vans"`` in ``TF_CONFIG`` and the distribution
strategies) is TensorFlow's gRPC server whose steps send their cross-task tensors over vans:
``grpc+vans`` and its alias ``grpc+seastar`` pull them (the consumer asks the producer's
task), ``grpc+vans+push`` and its aliases ``star_server`` and ``star_server_lite`` push them
(the producer delivers into the consumer's step). Each task's process runs one vans node,
whose cluster is the server's (the task of ``chief:0``, else ``worker:0``, also hosts the
scheduler); ``.endpoint_map`` in the launch directory gives vans' addresses as in the
Seastar and StarServer deployments.

The ops (``VansPull``, ``VansPush``, ``VansPushPull``) are C++ kernels built on first use
against the installed TensorFlow (``tf.sysconfig``'s flags, the system C++ compiler) and
loaded with ``tf.load_op_library``, as Horovod builds its ops; the library is cached (in
``VANS_TF_OPS_DIR``, default ``~/.cache/vans/tf-ops``) per TensorFlow version and source. The
kernels call into vans' Rust code directly, on TensorFlow's threads, without Python: a pull
writes each server's answer straight into the op's output tensor.

- :func:`pull`, :func:`push`, :func:`push_pull`: the ops for a :class:`vans.Worker` of a
  table application (keys: unique int64, any order; rows: ``[n, dim]`` float32). The ops
  carry the worker's address as an attribute: a graph using them runs in this process only
  (it cannot be saved and served elsewhere), and must not run on a vans I/O thread;
- :class:`ShardedEmbedding`: a Keras layer whose table lives on the servers. Its forward pass
  pulls the rows of the batch's distinct ids; the gradient of its output pushes them (async
  mode: the servers apply them at once; sync mode: accumulated, and :meth:`step` applies
  every sum once between two barriers of the workers). Usable eagerly, inside
  ``tf.function`` and in ``model.fit`` (:class:`SyncCallback` calls ``step``).
"""

import ctypes
import fcntl
import hashlib
import os
import pathlib
import shlex
import subprocess
import tempfile
import threading

import numpy as np

try:
    import tensorflow as tf
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("vans.tensorflow needs TensorFlow: pip install tensorflow-cpu") from _e

import vans

__all__ = ["PROTOCOLS", "ShardedEmbedding", "SyncCallback", "load_ops", "load_server_plugin",
           "pull", "push", "push_pull", "runtime_stats"]

_HERE = pathlib.Path(__file__).resolve().parent
_lock = threading.Lock()
_ops = None
_server = None

# The server plugin's protocol names (vans_server.cc registers them): the vans rendezvous
# protocol of each. Pull: the consumer asks the producer's task (TensorFlow's RecvTensor,
# Seastar); push: the producer delivers into the consumer's step (StarServer).
PROTOCOLS = {
    "grpc+vans": "pull",
    "grpc+vans+push": "push",
    "grpc+seastar": "pull",
    "star_server": "push",
    "star_server_lite": "push",
}


def _native_library():
    """The vans extension module's file: the C ABI (``vans.h``) the server plugin calls."""
    return pathlib.Path(vans._native.__file__).resolve()


def _build(source, target, extra):
    """Compiles ``source`` into the shared library ``target`` against the installed
    TensorFlow, with ``extra`` flags (atomically: a build at a time wins)."""
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    flags = tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = pathlib.Path(tmp) / target.name
        cmd = [*cxx, "-shared", "-fPIC", "-O2", "-Wno-deprecated-declarations", str(source),
               "-o", str(out), *flags, *extra]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except FileNotFoundError:
            raise RuntimeError(
                f"vans.tensorflow: no C++ compiler ({cxx[0]}) to build {source.name}; install "
                "g++ (apt install g++) or set CXX") from None
        if run.returncode != 0:
            raise RuntimeError(f"vans.tensorflow: building {source.name} failed:\n"
                               f"{' '.join(cmd)}\n{run.stderr[-4000:]}")
        os.replace(out, target)


def _cached(source, extra, inputs=()):
    """The library built from ``source`` for this TensorFlow, these flags and the contents
    of ``source`` and ``inputs``: built on first use, then cached (in ``VANS_TF_OPS_DIR``,
    default ``~/.cache/vans/tf-ops``)."""
    key = hashlib.sha256(source.read_bytes() + tf.__version__.encode()
                         + " ".join(tf.sysconfig.get_compile_flags() + extra).encode())
    for path in inputs:
        key.update(pathlib.Path(path).read_bytes())
    cache = pathlib.Path(os.environ.get("VANS_TF_OPS_DIR")
                         or pathlib.Path.home() / ".cache" / "vans" / "tf-ops")
    target = cache / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # One build at a time across processes (a job's tasks import this at once): the
        # others wait for it, then find the library built.
        with open(cache / f"{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                _build(source, target, extra)
    return target


def load_ops():
    """The op library: built on first use for this TensorFlow and this source, then cached."""
    global _ops
    with _lock:
        if _ops is None:
            # The kernels call the function table the extension module exports.
            native = _native_library()
            extra = [str(native), f"-Wl,-rpath,{native.parent}"]
            _ops = tf.load_op_library(str(_cached(_HERE / "vans_ops.cc", extra)))
        return _ops


def runtime_stats():
    """What this process's TensorFlow servers moved over vans so far: tensors ``sent`` and
    ``received``, ``received_bytes`` (headers included) and ``copied_bytes`` (copied from
    received frames into TensorFlow's tensors: one per byte of a plain tensor), and the
    buffers of received tensors of 1 MiB and more: ``pool_allocated`` (new) and
    ``pool_reused`` (recycled from tensors TensorFlow dropped, already mapped); and the
    chunks of collectives (``MultiWorkerMirroredStrategy``) ``collective_sent`` to and
    ``collective_received`` from other tasks (their copies counted in ``copied_bytes``)."""
    out = (ctypes.c_uint64 * 8)()
    ctypes.CDLL(str(load_server_plugin())).vans_tf_stats(out)
    return dict(zip(("sent", "received", "received_bytes", "copied_bytes",
                     "pool_allocated", "pool_reused", "collective_sent",
                     "collective_received"), out))


def load_server_plugin():
    """Registers the server factories of :data:`PROTOCOLS` with TensorFlow (done when
    ``vans.tensorflow`` is imported): the plugin is built on first use against this
    TensorFlow and this vans, then cached. Its servers are TensorFlow's gRPC servers whose
    cross-task tensors go over vans (see the book's chapter "TensorFlow's runtime over
    vans")."""
    global _server
    with _lock:
        if _server is None:
            native = _native_library()
            lib_dir = pathlib.Path(tf.sysconfig.get_lib())
            header = _HERE / "include" / "vans.h"
            extra = [f"-I{header.parent}", str(native), f"-Wl,-rpath,{native.parent}",
                     str(lib_dir / "libtensorflow_cc.so.2"), f"-Wl,-rpath,{lib_dir}"]
            library = _cached(_HERE / "vans_server.cc", extra,
                              [header, _HERE / "vans_collective.h"])
            tf.load_library(str(library))
            _server = library
        return _server


def _attrs(worker, dim, cmd):
    if worker.dtype != "float32":
        raise TypeError(f"vans.tensorflow: the worker carries {worker.dtype}; tables are float32")
    return dict(worker=worker._tf_handle(), dim=int(dim), cmd=int(cmd))


def pull(worker, keys, dim, cmd=0):
    """Rows ``[n, dim]`` of the unique int64 ``keys`` from the table servers of ``worker``
    (a :class:`vans.Worker` of float32, named in the graph by a handle: once it is gone, the
    op fails)."""
    return load_ops().vans_pull(tf.cast(keys, tf.int64), **_attrs(worker, dim, cmd))


def push(worker, keys, values, cmd=0):
    """Pushes ``values`` (``[n, dim]`` gradients) of the unique int64 ``keys``; returns the
    op (run for its effect)."""
    values = tf.convert_to_tensor(values, tf.float32)
    dim = values.shape[-1]
    return load_ops().vans_push(tf.cast(keys, tf.int64), values, **_attrs(worker, dim, cmd))


def push_pull(worker, keys, values, cmd=0):
    """Pushes ``values`` of the unique int64 ``keys``, then returns their rows after the push
    (``[n, dim]``), in one request per server."""
    values = tf.convert_to_tensor(values, tf.float32)
    dim = values.shape[-1]
    return load_ops().vans_push_pull(tf.cast(keys, tf.int64), values, **_attrs(worker, dim, cmd))


class ShardedEmbedding(tf.keras.layers.Layer):
    """An embedding whose table lives on vans table servers (application ``app_id``):
    ``call(ids)`` takes int64 ids of any shape and values and returns ``ids.shape + (dim,)``,
    or with ``combiner`` (``"sum"`` or ``"mean"``) each row of ``ids`` (a ``[batch, bag]``
    tensor) reduced to one vector.

    The gradient of the output is pushed from the backward pass: the layer holds one scalar
    trainable weight (always zero, with zero gradient) through which the optimizer's
    gradient computation reaches the push. ``mode="async"``: the servers apply each push at
    once. ``mode="sync"``: pushes accumulate (scaled by ``grad_scale``, default
    ``1 / num_workers``) and :meth:`step` applies them; call it after each optimizer step
    (or pass :class:`SyncCallback` to ``model.fit``). ``node``: the vans worker node; a node
    holds one worker per application, so layers sharing a table share one: pass ``worker``
    (a float32 :class:`vans.Worker`) instead of ``node`` and ``app_id``."""

    def __init__(self, dim, node=None, app_id=1, mode="sync", combiner=None, grad_scale=None,
                 worker=None, **kwargs):
        super().__init__(**kwargs)
        if mode not in ("sync", "async"):
            raise ValueError(f"mode={mode!r}: one of sync, async")
        if combiner not in (None, "sum", "mean"):
            raise ValueError(f"combiner={combiner!r}: None, 'sum' or 'mean'")
        self.dim = int(dim)
        self.mode = mode
        self.combiner = combiner
        if (node is None) == (worker is None):
            raise ValueError("pass one of node= or worker=")
        if worker is None:
            worker = vans.Worker(node, dtype="float32", app_id=app_id)
        self._worker = worker
        self._node = node = worker.node
        if grad_scale is None:
            grad_scale = 1.0 / node.num_workers if mode == "sync" else 1.0
        self.grad_scale = float(grad_scale)
        self._push_cmd = vans.ACCUMULATE_CMD if mode == "sync" else 0
        # Keys accumulated since the last step (sync mode), for step()'s apply.
        self._touched = tf.Variable(tf.zeros([0], tf.int64), trainable=False,
                                    shape=tf.TensorShape([None]), name="vans_touched")

    def build(self, input_shape):
        """Adds the zero-valued weight the push's gradient flows through."""
        self._trigger = self.add_weight(name="vans_push", shape=(), initializer="zeros",
                                        trainable=True)
        super().build(input_shape)

    def _lookup(self, keys, trigger):
        """The rows of ``keys``, with a gradient that pushes theirs."""
        layer = self

        @tf.custom_gradient
        def lookup(keys, trigger):
            rows = pull(layer._worker, keys, layer.dim)

            def grad(d_rows):
                d_rows = tf.convert_to_tensor(d_rows)
                pushed = push(layer._worker, keys, d_rows * layer.grad_scale,
                              cmd=layer._push_cmd)
                deps = [pushed]
                if layer.mode == "sync":
                    deps.append(layer._touched.assign(tf.concat([layer._touched, keys], 0)))
                with tf.control_dependencies(deps):
                    return None, tf.zeros_like(trigger)

            return rows, grad

        return lookup(keys, trigger)

    def call(self, ids):
        """The rows of ``ids`` (``ids.shape + (dim,)``), or each bag's reduced with
        ``combiner``."""
        ids = tf.cast(ids, tf.int64)
        keys, index = tf.unique(tf.reshape(ids, [-1]))
        # In vans' key order (unsigned: the sign bit flipped sorts as signed), so the ops put
        # each server's answer straight into their output, moving no row twice.
        order = tf.argsort(tf.bitwise.bitwise_xor(keys, tf.constant(-(2**63), tf.int64)))
        keys = tf.gather(keys, order)
        index = tf.gather(tf.math.invert_permutation(order), index)
        rows = self._lookup(keys, tf.convert_to_tensor(self._trigger))
        if self.combiner is None:
            out = tf.gather(rows, index)
            return tf.reshape(out, tf.concat([tf.shape(ids), [self.dim]], 0))
        bags = tf.reshape(tf.range(tf.size(ids)) // tf.shape(ids)[-1], [-1])
        gathered = tf.gather(rows, index)
        n = tf.shape(ids)[0]
        if self.combiner == "sum":
            return tf.math.unsorted_segment_sum(gathered, bags, n)
        return tf.math.unsorted_segment_mean(gathered, bags, n)

    def step(self):
        """Sync mode: meets the other workers, applies every accumulated gradient sum once
        (``APPLY_CMD``) and meets them again; every worker calls it once per step. Nothing in
        async mode."""
        if self.mode != "sync":
            return
        touched = np.unique(self._touched.numpy().view(np.uint64))
        self._touched.assign(tf.zeros([0], tf.int64))
        self._node.barrier("workers")
        if len(touched):
            self._worker.pull(touched, cmd=vans.APPLY_CMD)
        self._node.barrier("workers")

    def get_config(self):
        """The layer's settings. A layer restored from them needs its ``node`` or
        ``worker`` passed again: the ops hold a live worker, so a model using them cannot be
        saved and loaded elsewhere."""
        config = super().get_config()
        config.update(dim=self.dim, mode=self.mode, combiner=self.combiner,
                      grad_scale=self.grad_scale)
        return config


class SyncCallback(tf.keras.callbacks.Callback):
    """Calls :meth:`ShardedEmbedding.step` of ``layers`` after every training batch."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = layers

    def on_train_batch_end(self, batch, logs=None):
        """Steps every layer (sync mode: barrier, apply, barrier)."""
        for layer in self.layers:
            layer.step()


load_server_plugin()
