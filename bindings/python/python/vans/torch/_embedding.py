"""Embedding tables sharded over vans table servers (``vans.Server(optimizer=..., dim=...)``),
for models: each forward pass pulls the rows of the batch's distinct ids, each backward pass
pushes their gradients, and the servers apply the table's optimizer.

- **Ids** are 64-bit (int64 tensors, any values: they are keys, not indices), so a table needs
  no vocabulary size; a row starts from the table's seeded initializer on first touch.
- **One copy.** The distinct ids of a batch (sorted) are pulled straight into one array; the
  model reads them through a leaf tensor over that array and gathers with the batch's
  inverse indices, so autograd sums the gradient of a repeated id before it is pushed.
- **Modes.** ``"async"``: each backward pass pushes its gradients and the servers apply them
  at once (Downpour-style). ``"sync"``: gradients are accumulated on the servers
  (``ACCUMULATE_CMD``), scaled by ``1 / num_workers``; :meth:`step` then meets the other
  workers, applies every accumulated sum once (``APPLY_CMD``) and meets them again, so every
  worker's next forward pass sees the same rows a single process with the whole batch would.
"""

import numpy as np
import torch
import torch.nn.functional as F

import vans

from ._backend import vans_node

__all__ = ["ShardedEmbedding", "ShardedEmbeddingBag"]

_MODES = ("sync", "async")


class _Table(torch.nn.Module):
    """What both modules share: the worker, the pull of a batch's rows, the pushes."""

    def __init__(self, dim, app_id, mode, node, grad_scale, timeout):
        super().__init__()
        if mode not in _MODES:
            raise ValueError(f"mode={mode!r}: one of {', '.join(_MODES)}")
        if int(dim) < 1:
            raise ValueError(f"dim={dim}: a positive number of values per row")
        node = node if node is not None else vans_node()
        if node.num_servers == 0:
            raise ValueError(
                f"vans.torch.{type(self).__name__} needs vans servers holding application "
                f"{app_id}'s table: under torchrun set VANS_TORCH_SERVERS=colocated and pass "
                f"tables={{{app_id}: spec}} to vans.torch.init_process_group, or start servers "
                "with vans-launch -s N")
        self.dim = int(dim)
        self.mode = mode
        self.app_id = app_id
        self.timeout = timeout
        self._node = node
        self._worker = vans.Worker(node, dtype="float32", app_id=app_id)
        if grad_scale is None:
            grad_scale = 1.0 / node.num_workers if mode == "sync" else 1.0
        self.grad_scale = float(grad_scale)
        # Pushes in flight (with the arrays they read), and in sync mode the keys they
        # accumulated since the last step.
        self._pushes = []
        self._accumulated = []

    def _rows(self, ids):
        """The distinct keys of ``ids`` (sorted), the batch as indices into them, and their
        rows: a tensor over the pulled array, a leaf that pushes its gradient when training."""
        if not isinstance(ids, torch.Tensor):
            ids = torch.as_tensor(ids)
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids are {ids.dtype}; pass int64 (or int32) ids")
        flat = ids.detach().reshape(-1).to(device="cpu", dtype=torch.int64).contiguous()
        keys, inverse = np.unique(flat.numpy().view(np.uint64), return_inverse=True)
        values = np.empty(len(keys) * self.dim, dtype=np.float32)
        if len(keys):
            self._worker.pull(keys, out=values, timeout=self.timeout)
        rows = torch.from_numpy(values).view(len(keys), self.dim)
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_(True)
            rows.register_hook(lambda grad: self._push(keys, grad))
        index = torch.from_numpy(inverse.astype(np.int64, copy=False)).view(ids.shape)
        return rows, index

    def _push(self, keys, grad):
        # A copy (scaled or not): autograd may reuse its gradient's memory while the push,
        # which sends the array without copying it, is in flight.
        grad = grad.detach().to(torch.float32) * self.grad_scale
        grads = grad.contiguous().numpy().reshape(-1)
        cmd = vans.ACCUMULATE_CMD if self.mode == "sync" else 0
        self._pushes.append((self._worker.push_async(keys, grads, cmd=cmd), grads))
        if self.mode == "sync":
            self._accumulated.append(keys)

    def step(self):
        """Completes this step's pushes. In sync mode, also meets the other workers, applies
        every accumulated gradient sum once and meets them again (every worker must call it
        once per step, after its backward pass)."""
        pushes, self._pushes = self._pushes, []
        for request, _ in pushes:
            request.wait(timeout=self.timeout)
        if self.mode != "sync":
            return
        touched, self._accumulated = self._accumulated, []
        self._node.barrier("workers", timeout=self.timeout)
        if touched:
            keys = np.unique(np.concatenate(touched))
            self._worker.pull(keys, cmd=vans.APPLY_CMD, timeout=self.timeout)
        self._node.barrier("workers", timeout=self.timeout)

    def rows(self, ids):
        """The current rows of ``ids`` (int64), as a ``(len(ids), dim)`` tensor, without
        recording anything for autograd."""
        with torch.no_grad():
            rows, index = self._rows(torch.as_tensor(ids).reshape(-1))
            return rows[index]

    def extra_repr(self):
        """The settings, for ``repr``."""
        return f"dim={self.dim}, app_id={self.app_id}, mode={self.mode!r}"


class ShardedEmbedding(_Table):
    """``torch.nn.Embedding`` whose table lives on vans table servers (application
    ``app_id``; start them with ``vans.Server(optimizer=..., dim=dim, app_id=app_id)`` or
    :func:`vans.torch.init_process_group`'s ``tables=``). ``forward(ids)`` takes int64 ids
    of any shape and values and returns ``ids.shape + (dim,)``. The servers' optimizer trains
    the rows: call :meth:`step` after each backward pass.

    ``node``: the vans worker node (default: the ``"vans"`` process group's,
    :func:`vans.torch.vans_node`); a node holds one table per application id.
    ``grad_scale``: multiplies the gradients pushed (default ``1 / num_workers`` in sync
    mode, the mean of the workers' gradients; 1 in async mode).
    """

    def __init__(self, dim, app_id=1, mode="sync", node=None, grad_scale=None, timeout=300.0):
        super().__init__(dim, app_id, mode, node, grad_scale, timeout)

    def forward(self, ids):
        """The rows of ``ids`` (int64, any shape): ``ids.shape + (dim,)``."""
        rows, index = self._rows(ids)
        return F.embedding(index, rows)


class ShardedEmbeddingBag(_Table):
    """``torch.nn.EmbeddingBag`` over vans table servers (see :class:`ShardedEmbedding`):
    ``forward(ids, offsets=None, per_sample_weights=None)`` reduces each bag's rows with
    ``mode_bag`` (``"sum"``, ``"mean"`` or ``"max"``), as ``torch.nn.EmbeddingBag`` does."""

    def __init__(self, dim, app_id=1, mode="sync", mode_bag="mean", node=None, grad_scale=None,
                 timeout=300.0):
        super().__init__(dim, app_id, mode, node, grad_scale, timeout)
        self.mode_bag = mode_bag

    def forward(self, ids, offsets=None, per_sample_weights=None):
        """Each bag's rows reduced, as ``torch.nn.EmbeddingBag.forward``."""
        rows, index = self._rows(ids)
        return F.embedding_bag(index, rows, offsets, mode=self.mode_bag,
                               per_sample_weights=per_sample_weights)

    def extra_repr(self):
        return super().extra_repr() + f", mode_bag={self.mode_bag!r}"
