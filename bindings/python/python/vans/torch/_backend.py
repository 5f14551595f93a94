"""The ``"vans"`` backend of ``torch.distributed``: a process group whose collectives run on
vans' :class:`vans.Collective` in the tensors' own memory, completed from vans' I/O threads.

How the cluster forms:

- under torchrun (or any ``env://`` / store rendezvous), every rank is a vans worker; rank 0
  also hosts the scheduler, on a free port of ``MASTER_ADDR``'s host, and publishes its
  address through torch's store; each worker asks for its torch rank (``VANS_RANK``) so vans'
  ranks are torch's. With ``VANS_TORCH_SERVERS=colocated`` every rank also runs a vans server
  (as BytePS co-locates them), for :class:`vans.torch.DistributedOptimizer`.
- under ``vans-launch``, Slurm or MPI, :func:`init_process_group` joins the cluster vans'
  environment describes; its workers are the process group's ranks.
"""

import atexit
import os
import socket
import sys
import threading

import torch
import torch.distributed as dist

import vans

__all__ = ["BackendError", "ProcessGroupVans", "init_process_group", "vans_node"]

# What a torch user does after a collective failed: the vans process group does not run
# collectives again (its ranks would have to settle into a new generation together).
_RESTART = ("the vans process group runs no collective after a failure: restart the job "
            "(torchrun --max-restarts N restarts every rank), or call "
            "dist.destroy_process_group() and exit")


class BackendError(dist.DistBackendError, vans.errors.CollectiveError):
    """What a failed collective of the ``"vans"`` process group raises: torch's
    ``DistBackendError``, as every backend's failures are, and
    :class:`vans.errors.CollectiveError`, with its ``node``, ``rank`` and ``generation``
    (the rank that failed, when one did). Either ``except`` catches it."""

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
}

_REDUCTIONS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "mean",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.PRODUCT: "product",
}

# How long finalizing the cluster may take when the process group shuts down.
_FINALIZE_SECONDS = 60.0
# Heartbeats of the nodes a torchrun job forms (seconds between them, and of silence before
# the scheduler declares a node dead), when the environment does not set them.
_HEARTBEATS = {"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"}


class _Cluster:
    """The vans nodes of one process group in this process: the worker (always), the
    scheduler (rank 0 under torchrun) and a co-located server (when asked for)."""

    def __init__(self, worker, collective, scheduler=None, server=None):
        self.worker = worker
        self.collective = collective
        self.scheduler = scheduler
        self.server = server
        self._closed = False
        self._lock = threading.Lock()

    def close(self):
        """Finalizes every node of this process at once (each finalize is a barrier of the
        whole cluster, so they must not wait for each other)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        nodes = [n for n in (self.worker, self.server and self.server.node, self.scheduler)
                 if n is not None]
        errors = []

        def finalize(node):
            try:
                if not node.stopped:
                    node.finalize(timeout=_FINALIZE_SECONDS)
            except Exception as e:  # noqa: BLE001 - reported below, the others go on
                errors.append(e)
                try:
                    node.stop()
                except Exception:  # noqa: BLE001
                    pass

        threads = [threading.Thread(target=finalize, args=(n,), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            print(f"vans.torch: finalize: {errors[0]}", file=sys.stderr)


# The cluster the next backend creation takes over (set by init_process_group under
# vans' own launchers), and every live one (for vans_node and atexit).
_pending_worker = None
_clusters = []
# The embedding tables servers started by this process hold ({app id: spec}).
_tables = {}


def vans_node(group=None):
    """The vans worker node under ``group``'s process group (the default group when
    ``None``): for a :class:`vans.Worker` on the same cluster, as
    :class:`vans.torch.DistributedOptimizer` makes."""
    pg = group or dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupVans):
        raise ValueError(
            f"the process group runs {pg.getBackendName()!r}, not 'vans': "
            "dist.init_process_group('vans') first"
        )
    return pg._cluster.worker


def _free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _in_thread(target, *args):
    """Runs ``target(*args)`` in a thread; returns a function that joins it and returns its
    result or raises its exception."""
    box = {}

    def run():
        try:
            box["value"] = target(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised by the joiner
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    return join


def _servers_wanted(world_size):
    mode = os.environ.get("VANS_TORCH_SERVERS", "0").strip().lower()
    if mode == "colocated":
        return world_size
    if mode in ("", "0", "none"):
        return 0
    raise vans.errors.ConfigError(
        f"VANS_TORCH_SERVERS={mode!r}: use 'colocated' (a vans server in every rank, for "
        "vans.torch.DistributedOptimizer) or 0 (none; the default)"
    )


def _serve(node):
    """Starts this server node's applications: the sum (application 0, for
    :class:`vans.torch.DistributedOptimizer`) and the embedding tables of ``tables=``."""
    server = vans.Server(node)
    for app_id, spec in _tables.items():
        vans.Server(node, app_id=app_id, table=spec)
    return server


def _check_tables(tables):
    """``tables`` ({application id: table spec}) checked: ids other than 0 (the sum's), specs
    that parse."""
    checked = {}
    for app_id, spec in (tables or {}).items():
        if not isinstance(app_id, int) or app_id <= 0:
            raise ValueError(
                f"tables: application id {app_id!r}; use positive ints (0 is the servers' sum)")
        checked[app_id] = vans.table_spec(spec) if isinstance(spec, str) \
            else vans.table_spec(**spec)
    return checked


def _form_cluster(store, rank, world_size, timeout):
    """Under torchrun: rank 0 hosts the scheduler; every rank is a worker asking for its
    torch rank, and with co-located servers also a server of the same rank."""
    servers = _servers_wanted(world_size)
    host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    # torchrun keeps its store across restarts of the job: each attempt has its own key, so a
    # restarted rank never dials the scheduler of an attempt that is gone.
    key = f"vans/scheduler/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    # A rank that dies must fail the others' collectives, not leave them waiting: the
    # scheduler declares a node dead after this much silence (unless the job sets its own).
    liveness = {var: os.environ.get(var, default) for var, default in _HEARTBEATS.items()}
    scheduler = None
    if rank == 0:
        port = _free_port(host)
        scheduler = _in_thread(lambda: vans.Node(
            role="scheduler", num_servers=servers, num_workers=world_size,
            root_uri=host, root_port=port, env=liveness))
        store.set(key, f"{host}:{port}")
    address = store.get(key).decode()
    root_uri, _, root_port = address.rpartition(":")
    common = dict(num_servers=servers, num_workers=world_size, root_uri=root_uri,
                  root_port=int(root_port), env={"VANS_RANK": str(rank), **liveness})
    server = _in_thread(lambda: _serve(vans.Node(role="server", **common))) \
        if servers else None
    worker = vans.Node(role="worker", **common)
    server = server() if server else None
    scheduler = scheduler() if scheduler else None
    return worker, scheduler, server


def _create(store, rank, world_size, timeout):
    """The creator ``torch.distributed`` calls for ``init_process_group("vans")``."""
    global _pending_worker
    if _pending_worker is not None:
        worker, _pending_worker = _pending_worker, None
        scheduler = server = None
    else:
        worker, scheduler, server = _form_cluster(store, rank, world_size, timeout)
    collective = vans.Collective(worker)
    cluster = _Cluster(worker, collective, scheduler, server)
    if collective.rank != rank or collective.size != world_size:
        cluster.close()
        raise RuntimeError(
            f"vans: torch rank {rank} of {world_size} is rank {collective.rank} of "
            f"{collective.size} among vans' workers; start every rank with the same "
            "WORLD_SIZE and distinct RANKs"
        )
    _clusters.append(cluster)
    return ProcessGroupVans(cluster, rank, world_size)


def init_process_group(tables=None, **kwargs):
    """``torch.distributed.init_process_group("vans", **kwargs)``, wherever the job was
    started:

    - under ``vans-launch``, Slurm or MPI (vans' environment names this process's role:
      ``DMLC_ROLE``, or an engine rank with ``DMLC_NUM_SERVER``), the scheduler and server
      processes serve until the workers finalize and then exit (``SystemExit(0)``), as
      BytePS's servers do; a worker joins, and its vans rank and worker count are the process
      group's rank and size;
    - otherwise (torchrun, ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``), it is
      ``dist.init_process_group("vans", **kwargs)``.

    ``tables`` ({application id: spec text or dict of settings}, ids from 1) are embedding
    tables every server holds beside its sum, for :class:`vans.torch.ShardedEmbedding`
    (under torchrun, with ``VANS_TORCH_SERVERS=colocated``).
    """
    global _pending_worker, _tables
    checked = _check_tables(tables)
    launched = "DMLC_ROLE" in os.environ or (
        "DMLC_NUM_SERVER" in os.environ
        and any(v in os.environ for v in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))
    )
    if not launched and checked and \
            os.environ.get("VANS_TORCH_SERVERS", "0").strip().lower() != "colocated":
        raise vans.errors.ConfigError(
            "init_process_group(tables=...) under torchrun needs vans servers to hold the "
            "tables: set VANS_TORCH_SERVERS=colocated (a server in every rank) in every "
            "rank's environment, or start the job with vans-launch -s N")
    _tables = checked
    if not launched:
        dist.init_process_group("vans", **kwargs)
        return
    node = vans.Node()
    if node.role == "server":
        _serve(node).serve()
        raise SystemExit(0)
    if node.role == "scheduler":
        node.finalize()
        raise SystemExit(0)
    _pending_worker = node
    kwargs.setdefault("store", dist.HashStore())
    try:
        dist.init_process_group(
            "vans", rank=node.rank, world_size=node.num_workers, **kwargs)
    finally:
        _pending_worker = None


def _close_all():
    while _clusters:
        _clusters.pop().close()


atexit.register(_close_all)


def _dtype_of(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"vans: {what} must be a torch.Tensor, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(
            f"vans: {what} is on {t.device}; the vans backend carries CPU tensors"
        )
    if t.is_sparse:
        raise ValueError(f"vans: {what} is sparse; the vans backend carries dense tensors")
    if not t.is_contiguous():
        raise ValueError(f"Tensors must be contiguous ({what}); pass tensor.contiguous()")
    name = _DTYPES.get(t.dtype)
    if name is None:
        raise TypeError(
            f"vans: {what} has dtype {t.dtype}; the vans backend carries "
            + ", ".join(str(d) for d in _DTYPES)
        )
    return name


def _memory(t):
    return (t.data_ptr(), t.numel() * t.element_size())


def _reduction(op):
    for known, name in _REDUCTIONS.items():
        if op == known:
            return name
    raise ValueError(f"vans: reduction {op} is not supported (sum, avg, min, max, product)")


class _Failure:
    """A collective's error, carried as its future's value: a future completed with
    ``set_exception`` looks successful to torch's C++ side, so failures travel as values
    that :class:`_Work` and :func:`_unwrap` turn into exceptions."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error

    def exception(self):
        if not isinstance(self.error, vans.errors.CollectiveError):
            # A call's own bad arguments (this rank alone; the group goes on).
            e = dist.DistBackendError(f"vans: {self.error}")
            e.__cause__ = self.error
            return e
        return _backend_error("", self.error)


def _backend_error(before, error):
    """A :class:`BackendError` for vans' collective ``error`` (its rank, node and
    generation), ``before`` its text: vans' own advice (settle into the next generation) is
    the elastic API's, and a torch user gets torch's."""
    text = str(error).replace("; call settle() to join the next", "")
    e = BackendError(f"vans: {before}{text}; {_RESTART}")
    for attribute in ("node", "rank", "generation"):
        setattr(e, attribute, getattr(error, attribute, None))
    e.__cause__ = error
    return e


def _unwrap(future):
    value = future.value()
    if isinstance(value, _Failure):
        raise value.exception()
    return value


class _Work(dist._Work):
    """A collective in flight. ``wait()`` raises :class:`BackendError` (a
    ``torch.distributed.DistBackendError`` and a ``vans.errors.CollectiveError``, naming a
    failed rank) for a failed collective; the future ``get_future()`` gives (DDP's reducer
    chains on it) fails the same way."""

    def __init__(self, future):
        super().__init__()
        self._future = future
        self._unwrapped = None

    def wait(self, timeout=None):
        value = self._future.wait()
        if isinstance(value, _Failure):
            raise value.exception()
        return True

    def get_future(self):
        if self._unwrapped is None:
            self._unwrapped = self._future.then(_unwrap)
        return self._unwrapped

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        return self._future.done() and not isinstance(self._future.value(), _Failure)


def _overlap(a, b):
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _one(tensors, what):
    if len(tensors) != 1:
        raise ValueError(f"vans: {what} takes one tensor per call, not {len(tensors)}")
    return tensors[0]


class ProcessGroupVans(dist.ProcessGroup):
    """The process group ``dist.init_process_group("vans")`` makes (see the module docs).
    Every collective returns a ``Work`` at once; vans completes it from its I/O thread."""

    def __init__(self, cluster, rank, world_size):
        super().__init__(rank, world_size)
        self._cluster = cluster
        self._coll = cluster.collective
        self._rank = rank
        self._world_size = world_size
        # The first failure of a collective: later calls fail at once, saying so.
        self._failed = None

    def _check_usable(self):
        if self._failed is not None:
            before = "a collective of this process group failed earlier: "
            raise _backend_error(before, self._failed)

    def _failure(self, error):
        # A call's bad arguments fail that call alone: the group goes on.
        if self._failed is None and isinstance(error, vans.errors.CollectiveError):
            self._failed = error
        return _Failure(error)

    def getBackendName(self):  # noqa: N802 - torch's name
        return "vans"

    def __repr__(self):
        return f"ProcessGroupVans(rank={self._rank}, size={self._world_size})"

    # -- plumbing ------------------------------------------------------------------------

    def _start(self, kind, tensor, result, keep, after=None, **kwargs):
        """Starts ``kind`` on ``tensor``; the returned work's future holds ``result`` (after
        ``after()`` ran, on the I/O thread, when given)."""
        self._check_usable()
        dtype = _dtype_of(tensor, "tensor")
        output = kwargs.pop("output", None)
        if output is not None and _overlap(tensor, output):
            # In place (FSDP gathers into a tensor its input is a view of): the collective
            # reads a copy, since it writes the output while it still reads the input.
            tensor = tensor.clone()
            keep = (keep, tensor)
        if output is not None:
            if _dtype_of(output, "output") != dtype:
                raise TypeError(
                    f"vans: output has dtype {output.dtype} but the input {tensor.dtype}")
            kwargs["output"] = _memory(output)
        future = torch.futures.Future()

        def done(error):
            if error is None and after is not None:
                try:
                    after()
                except Exception as e:  # noqa: BLE001 - handed to the waiter
                    error = e
            future.set_result(result if error is None else self._failure(error))

        self._coll._start(kind, dtype, _memory(tensor), done, keep, **kwargs)
        return future

    @staticmethod
    def _work(future):
        return _Work(future)

    @staticmethod
    def _all(futures, result):
        def first_failure(done):
            failures = [f.value() for f in done.value() if isinstance(f.value(), _Failure)]
            return failures[0] if failures else result

        return torch.futures.collect_all(futures).then(first_failure)

    def _check_rank(self, rank, what):
        if not 0 <= rank < self._world_size:
            raise ValueError(
                f"vans: {what} {rank} is not a rank of this group of {self._world_size}")

    # -- collectives -----------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        tensor = _one(tensors, "allreduce")
        return self._work(self._start("allreduce", tensor, tensors, tensors, op=op))

    def allreduce_coalesced(self, tensors, opts=None):
        op = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        futures = [self._start("allreduce", t, [t], t, op=op) for t in tensors]
        return self._work(self._all(futures, tensors))

    def reduce(self, tensors, opts=None):
        op = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        tensor = _one(tensors, "reduce")
        root = opts.rootRank if opts is not None else 0
        self._check_rank(root, "root")
        if self._rank == root:
            return self._work(self._start("allreduce", tensor, tensors, tensors, op=op))
        # Only the root receives the result: the others reduce a copy.
        scratch = tensor.clone()
        return self._work(self._start("allreduce", scratch, tensors, scratch, op=op))

    def broadcast(self, tensors, opts=None):
        tensor = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        self._check_rank(root, "root")
        return self._work(self._start("broadcast", tensor, tensors, tensors, peer=root))

    def allgather(self, output_tensors, input_tensors, opts=None):
        tensor = _one(input_tensors, "allgather")
        outputs = _one(output_tensors, "allgather")
        if len(outputs) != self._world_size:
            raise ValueError(
                f"vans: allgather needs {self._world_size} output tensors, not {len(outputs)}")
        for o in outputs:
            if o.numel() != tensor.numel() or o.dtype != tensor.dtype:
                raise ValueError(
                    "vans: every allgather output must have the input's size and dtype "
                    f"({tensor.numel()} {tensor.dtype}), not {o.numel()} {o.dtype}")
        flat = torch.empty(self._world_size * tensor.numel(), dtype=tensor.dtype)

        def scatter_out():
            for i, o in enumerate(outputs):
                o.copy_(flat[i * tensor.numel():(i + 1) * tensor.numel()].view_as(o))

        future = self._start("all_gather", tensor, output_tensors, (tensor, flat),
                             after=scatter_out, output=flat)
        return self._work(future)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's name
        if output.numel() != self._world_size * input.numel():
            raise ValueError(
                f"vans: all_gather_into_tensor needs an output of {self._world_size} x "
                f"{input.numel()} elements, not {output.numel()}")
        future = self._start("all_gather", input, [output], (input, output), output=output)
        return self._work(future)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        futures = [self._start("all_gather", i, [o], (i, o), output=o)
                   for o, i in zip(outputs, inputs)]
        return self._work(self._all(futures, outputs))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        output = _one(output_tensors, "reduce_scatter")
        inputs = _one(input_tensors, "reduce_scatter")
        if len(inputs) != self._world_size:
            raise ValueError(
                f"vans: reduce_scatter needs {self._world_size} input tensors, not {len(inputs)}")
        for t in inputs:
            _dtype_of(t, "input")
            if t.numel() != output.numel():
                raise ValueError(
                    "vans: every reduce_scatter input must have the output's size "
                    f"({output.numel()}), not {t.numel()}")
        flat = torch.cat([t.reshape(-1) for t in inputs])
        future = self._start("reduce_scatter", flat, output_tensors, (flat, output),
                             output=output, op=op)
        return self._work(future)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002 - torch's name
        op = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if input.numel() != self._world_size * output.numel():
            raise ValueError(
                f"vans: reduce_scatter_tensor needs an input of {self._world_size} x "
                f"{output.numel()} elements, not {input.numel()}")
        future = self._start("reduce_scatter", input, [output], (input, output),
                             output=output, op=op)
        return self._work(future)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                      opts=None):
        n = self._world_size

        def counts(t, splits, what):
            if not splits:
                rows = t.shape[0] if t.dim() else 0
                if t.dim() == 0 or rows % n:
                    raise ValueError(
                        f"vans: all_to_all_single's {what} of {rows} rows does not split "
                        f"evenly among {n} ranks; give split sizes")
                return [t.numel() // n] * n
            if len(splits) != n or t.dim() == 0:
                raise ValueError(f"vans: all_to_all_single needs {n} {what} split sizes")
            row = t[0].numel() if t.shape[0] else 0
            if sum(splits) != t.shape[0]:
                raise ValueError(
                    f"vans: {what} split sizes {list(splits)} do not add up to "
                    f"{t.shape[0]} rows")
            return [int(s) * row for s in splits]

        send = counts(input, input_split_sizes, "input")
        recv = counts(output, output_split_sizes, "output")
        future = self._start("all_to_all", input, output, (input, output), output=output,
                             send_counts=send, recv_counts=recv)
        return self._work(future)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self._world_size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"vans: all_to_all needs {n} input and {n} output tensors")
        for t in input_tensors:
            _dtype_of(t, "input")
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors),
                               dtype=output_tensors[0].dtype)

        def scatter_out():
            at = 0
            for o in output_tensors:
                o.copy_(flat_out[at:at + o.numel()].view_as(o))
                at += o.numel()

        future = self._start("all_to_all", flat_in, output_tensors, (flat_in, flat_out),
                             after=scatter_out, output=flat_out,
                             send_counts=[t.numel() for t in input_tensors],
                             recv_counts=[t.numel() for t in output_tensors])
        return self._work(future)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        futures = [self._start("reduce_scatter", i, [o], (i, o), output=o, op=op)
                   for o, i in zip(outputs, inputs)]
        return self._work(self._all(futures, outputs))

    # The names torch 2.10 and later call (older releases call the ones above).
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_to_all_single = alltoall_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def barrier(self, opts=None):
        self._check_usable()
        future = torch.futures.Future()

        def done(error):
            future.set_result(None if error is None else self._failure(error))

        self._coll._barrier(done)
        return self._work(future)

    def send(self, tensors, dst, tag=0):
        tensor = _one(tensors, "send")
        self._check_rank(dst, "destination")
        return self._work(self._start("send", tensor, tensors, tensors, peer=dst, tag=tag))

    def recv(self, tensors, src, tag=0):
        tensor = _one(tensors, "recv")
        self._check_rank(src, "source")
        return self._work(self._start("recv", tensor, tensors, tensors, peer=src, tag=tag))

    def recv_anysource(self, tensors, tag=0):
        raise ValueError("vans: recv needs a source rank (receiving from any source is not "
                         "supported)")

    def shutdown(self):
        """Leaves the vans cluster (``destroy_process_group`` calls this)."""
        self._cluster.close()
        if self._cluster in _clusters:
            _clusters.remove(self._cluster)


dist.Backend.register_backend("vans", _create, devices=["cpu"])
