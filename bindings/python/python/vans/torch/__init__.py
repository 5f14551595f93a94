"""vans for PyTorch: a ``torch.distributed`` backend named ``"vans"`` and a BytePS-style
distributed optimizer.

Importing this module registers the backend, so switching a script from Gloo is one line::

    import torch.distributed as dist
    import vans.torch  # registers "vans"

    dist.init_process_group("vans")   # under torchrun: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    model = torch.nn.parallel.DistributedDataParallel(model)

The backend carries CPU tensors (float32, float64, bfloat16, float16, int32, int64, uint8)
through vans' collectives: all_reduce (sum, avg, min, max, product), broadcast,
all_gather (list and into a tensor), reduce_scatter, all_to_all, barrier, send and recv.
Every call returns at once with a ``Work`` that vans completes from its own I/O thread; the
tensors are worked on in place, never copied on the way in.

Under ``vans-launch``, Slurm or MPI, where vans' own environment names each process's role,
call :func:`init_process_group` instead: the scheduler and server processes serve and exit,
the workers return with the process group formed.

:class:`ShardedEmbedding` and :class:`ShardedEmbeddingBag` are embedding tables held by vans
table servers, trained by the servers' optimizer (sync or async), with 64-bit ids.

:class:`DistributedOptimizer` wraps any torch optimizer: each gradient is push-pulled
through vans servers (servers sum, workers apply), partitioned and sent in priority order
while the backward pass runs, as ``byteps.torch.DistributedOptimizer`` does.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "vans.torch needs PyTorch: pip install torch (or pip install 'vans[torch]')"
    ) from _e

from ._backend import BackendError, ProcessGroupVans, init_process_group, vans_node
from ._embedding import ShardedEmbedding, ShardedEmbeddingBag
from ._optimizer import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters

__all__ = [
    "BackendError",
    "DistributedOptimizer",
    "ProcessGroupVans",
    "ShardedEmbedding",
    "ShardedEmbeddingBag",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "init_process_group",
    "vans_node",
]
