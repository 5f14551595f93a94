"""Type stubs of the native module behind ``vans`` (see the package docstring)."""

from collections.abc import Generator, Mapping, Sequence
from os import PathLike
from typing import Any, Callable, Union

import numpy as np
import numpy.typing as npt

__version__: str

# The ``cmd`` of a synchronous round push-pull (BytePS's server): the built-in sum server adds
# the values into the key's round accumulator (not its ps-lite store), and once every worker
# has pushed the key, answers each of them with the round's sum; then the key starts a fresh
# round. One key per request, one push per worker per round, the same length from every
# worker. ``0x524F554E`` ("ROUN"), far from the small cmds applications use.
ROUND_CMD: int
# A table server's two-phase step: a push with ACCUMULATE_CMD adds each row's gradient to its
# pending sum; a pull with APPLY_CMD applies the pending sums with the table's optimizer, then
# answers the rows.
ACCUMULATE_CMD: int
APPLY_CMD: int

# Anything exporting the buffer protocol (numpy, bytes, memoryview) or ``__dlpack__``.
ArrayLike = Any
DType = Union[str, np.dtype, type]  # noqa: UP007 (a runtime alias: 3.9 has no `X | Y`)

class Node:
    """A node of a vans cluster; joins on creation (blocking, without the GIL)."""

    def __init__(
        self,
        *,
        role: str | None = None,
        num_servers: int | None = None,
        num_workers: int | None = None,
        root_uri: str | None = None,
        root_port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None: ...
    @property
    def role(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def num_servers(self) -> int: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def stopped(self) -> bool: ...
    @property
    def is_recovery(self) -> bool: ...
    def barrier(self, group: str | int | None = None, timeout: float | None = None) -> None: ...
    def finalize(self, timeout: float | None = None) -> None: ...
    def stop(self) -> None: ...

class Request:
    """A request in flight."""

    def wait(self, timeout: float | None = None) -> Any: ...
    def done(self) -> bool: ...
    def add_done_callback(self, callback: Callable[[Any, BaseException | None], None]) -> None: ...
    def __await__(self) -> Generator[Any, None, Any]: ...

class Worker:
    """Pushes and pulls values of one dtype (ps-lite's KVWorker)."""

    def __init__(
        self,
        node: Node | None = None,
        dtype: DType | None = None,
        app_id: int = 0,
        customer_id: int = 0,
        **config: Any,
    ) -> None: ...
    @property
    def dtype(self) -> str: ...
    @property
    def node(self) -> Node: ...
    @property
    def copied_pull_bytes(self) -> int: ...
    def _tf_handle(self) -> int: ...
    def push(
        self,
        keys: ArrayLike,
        vals: ArrayLike,
        lens: ArrayLike | None = None,
        cmd: int = 0,
        timeout: float | None = None,
    ) -> None: ...
    def pull(
        self,
        keys: ArrayLike,
        out: ArrayLike | None = None,
        cmd: int = 0,
        return_lens: bool = False,
        timeout: float | None = None,
    ) -> npt.NDArray[Any] | tuple[npt.NDArray[Any], npt.NDArray[np.int32] | None]: ...
    def push_pull(
        self,
        keys: ArrayLike,
        vals: ArrayLike,
        out: ArrayLike | None = None,
        lens: ArrayLike | None = None,
        cmd: int = 0,
        return_lens: bool = False,
        timeout: float | None = None,
    ) -> npt.NDArray[Any] | tuple[npt.NDArray[Any], npt.NDArray[np.int32] | None]: ...
    def push_async(
        self, keys: ArrayLike, vals: ArrayLike, lens: ArrayLike | None = None, cmd: int = 0
    ) -> Request: ...
    def pull_async(
        self, keys: ArrayLike, out: ArrayLike | None = None, cmd: int = 0, return_lens: bool = False
    ) -> Request: ...
    def push_pull_async(
        self,
        keys: ArrayLike,
        vals: ArrayLike,
        out: ArrayLike | None = None,
        lens: ArrayLike | None = None,
        cmd: int = 0,
        return_lens: bool = False,
    ) -> Request: ...

class Server:
    """Answers pushes and pulls: ps-lite's sum, an embedding table with a server-side
    optimizer (``table=`` or ``optimizer=``/``dim=`` and the other table settings among the
    keyword arguments), or a Python handler."""

    def __init__(
        self,
        node: Node | None = None,
        dtype: DType | None = None,
        handler: Callable[[dict], Any] | None = None,
        app_id: int = 0,
        customer_id: int = 0,
        shards: int = 1,
        table: str | None = None,
        restore: bytes | None = None,
        **config: Any,
    ) -> None: ...
    @property
    def dtype(self) -> str: ...
    @property
    def node(self) -> Node: ...
    def serve(self, timeout: float | None = None) -> None: ...
    def snapshot(self, timeout: float | None = None) -> bytes: ...
    def restore(self, snapshot: bytes, timeout: float | None = None) -> None: ...

class Rendezvous:
    """TensorFlow-style step-scoped send / receive of arrays."""

    def __init__(self, node: Node, protocol: str = "pull") -> None: ...
    @property
    def protocol(self) -> str: ...
    def send(
        self, step: int, key: str, value: ArrayLike, is_dead: bool = False, copy: bool = True
    ) -> None: ...
    def recv(
        self,
        step: int,
        key: str,
        dtype: str = "uint8",
        out: ArrayLike | None = None,
        timeout: float | None = None,
        return_dead: bool = False,
    ) -> Any: ...
    def cleanup(self, step: int) -> None: ...

class Collective:
    """Collectives among the workers (elastic generations); every worker makes one."""

    def __init__(self, node: Node, timeout: float | None = None) -> None: ...
    def allreduce(
        self, array: ArrayLike, op: str = "sum", timeout: float | None = None
    ) -> None: ...
    def broadcast(self, array: ArrayLike, root: int = 0, timeout: float | None = None) -> None: ...
    def barrier(self, timeout: float | None = None) -> None: ...
    def settle(self, timeout: float = 60.0) -> tuple[int, list]: ...
    @property
    def generation(self) -> tuple[int, list]: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def size(self) -> int: ...
    # For framework adapters (vans.torch): a collective on memory lent by address, completed
    # by done(error) on a vans I/O thread. The caller keeps the memory alive and untouched
    # until done has run.
    def _start(
        self,
        kind: str,
        dtype: str,
        tensor: tuple[int, int],
        done: Callable[[BaseException | None], None],
        keep: Any,
        output: tuple[int, int] | None = None,
        op: str = "sum",
        peer: int = 0,
        tag: int = 0,
        send_counts: Sequence[int] | None = None,
        recv_counts: Sequence[int] | None = None,
    ) -> None: ...
    def _barrier(self, done: Callable[[BaseException | None], None]) -> None: ...

class RustBench:
    """The Rust reference loop of ``vans.bench``."""

    def __init__(self, node: Node, app_id: int) -> None: ...
    def run(self, mode: str, keys: Sequence[int], size: int, window: int, iters: int) -> float: ...
    def run_sparse(
        self, mode: str, key_sets: Sequence[Sequence[int]], floats: int, window: int, iters: int
    ) -> float: ...

def create_key(
    src_device: str, dst_device: str, name: str, incarnation: int = 1, frame: int = 0, iter: int = 0
) -> str: ...
def cpu_device(node_id: int) -> str: ...
def table_spec(table: str | None = None, **settings: Any) -> str: ...
def table_initial_rows(spec: str, keys: ArrayLike) -> np.ndarray: ...
def node_role() -> str | None:
    """The role this process's environment gives it as a node (``"scheduler"``,
    ``"server"`` or ``"worker"``): ``DMLC_ROLE``, else ``TF_CONFIG``'s task, else the rank a
    launcher gave (Slurm, MPI, PMI, torchrun); ``None`` for a plain ``python script.py``."""
    ...
def free_port() -> int:
    """A free port on 127.0.0.1 below Linux's ephemeral range, for a scheduler's
    ``DMLC_PS_ROOT_PORT``: unlike ``bind(("127.0.0.1", 0))``, no outgoing connection of
    another process can take it before the scheduler binds it."""
    ...

def launch(
    num_servers: int,
    num_workers: int,
    program: str | PathLike,
    args: Sequence[str] = ...,
    env: Mapping[str, str] | None = None,
    root_uri: str | None = None,
    root_port: int = 0,
    timeout: float | None = None,
) -> list: ...
