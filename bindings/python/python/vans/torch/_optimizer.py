"""A BytePS-style distributed optimizer over vans servers: gradients are push-pulled through
the parameter servers (one synchronous round per step: the servers sum, every worker gets the
sum and applies it), cut into partitions and sent in priority order while the backward pass
is still running.

- **Partitions.** Each gradient is cut into partitions of ``partition_bytes`` (default
  ``VANS_TORCH_PARTITION_BYTES``, 4 MiB); each partition is one key, spread over the servers
  by a multiplicative hash of its number, so large layers load every server.
- **Priority.** A partition of parameter ``i`` (in the model's declaration order) goes before
  those of later parameters: the next forward pass needs the first layers first, and the
  backward pass produces them last. Ready partitions wait in a heap; at most ``credit_bytes``
  (default ``VANS_TORCH_CREDIT_BYTES``, 16 MiB) are in flight during the backward pass, so a
  late, urgent partition is not queued behind megabytes of less urgent ones; once
  :meth:`~DistributedOptimizer.step` waits, everything left goes at once (a round needs every
  worker's push, and workers finish their backward passes in different orders).
- **Overlap.** A hook on each parameter (``register_post_accumulate_grad_hook``) queues its
  partitions as soon as its gradient is complete; :meth:`DistributedOptimizer.step` waits for
  the rest and then runs the wrapped optimizer.
"""

import heapq
import io
import os
import threading

import numpy
import torch
import torch.distributed as dist

import vans

from ._backend import vans_node

__all__ = ["DistributedOptimizer", "broadcast_optimizer_state", "broadcast_parameters"]

# Multiplier spreading partition numbers over the 64-bit key space (odd, so a bijection).
_SPREAD = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
# Optimizers made in this process so far (each takes its own range of keys).
_instances = 0
# The servers sum float32 (vans.Server's default): other gradients travel as float32.
_WIRE = torch.float32


def _env_bytes(name, default):
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise vans.errors.ConfigError(f"{name}={text!r} is not a whole number of bytes") from None
    if value < 4096:
        raise vans.errors.ConfigError(f"{name}={value} is below 4096 bytes")
    return value


class _Partition:
    __slots__ = ("param", "index", "start", "stop", "key", "wire")

    def __init__(self, param, index, start, stop, key):
        self.param, self.index, self.start, self.stop, self.key = param, index, start, stop, key
        self.wire = None


class DistributedOptimizer:
    """Wraps ``optimizer`` (any ``torch.optim.Optimizer``) so that :meth:`step` applies the
    sum of every worker's gradients (their mean when ``average``), push-pulled through the
    vans servers of the default process group's cluster (see the module docs).

    ``named_parameters`` (default: the optimizer's parameters, in order) sets the priority
    order: pass ``model.named_parameters()``. ``backward_passes_per_step`` > 1 accumulates
    that many backward passes locally before one exchange. The process group must be
    ``"vans"`` with servers: ``VANS_TORCH_SERVERS=colocated`` under torchrun, or server
    processes under ``vans-launch``. Other attributes (``param_groups``, ``state``,
    ``zero_grad`` ...) are the wrapped optimizer's.
    """

    def __init__(self, optimizer, named_parameters=None, partition_bytes=None,
                 credit_bytes=None, average=True, backward_passes_per_step=1, timeout=300.0,
                 group=None):
        self._optimizer = optimizer
        node = vans_node(group)
        if node.num_servers == 0:
            raise ValueError(
                "vans.torch.DistributedOptimizer needs vans servers: set "
                "VANS_TORCH_SERVERS=colocated before init_process_group (a server in every "
                "rank), or start servers with vans-launch -s N")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be 1 or more")
        self._node = node
        # The servers' sum (app 0, customer 0): requests go to the customer of their ids.
        self._worker = vans.Worker(node, dtype="float32")
        self._size = node.num_workers
        self._average = average
        self._timeout = timeout
        self._passes = backward_passes_per_step
        self._partition_bytes = partition_bytes or _env_bytes(
            "VANS_TORCH_PARTITION_BYTES", 4 << 20)
        self._credit = credit_bytes or _env_bytes("VANS_TORCH_CREDIT_BYTES", 16 << 20)
        if named_parameters is not None:
            params = [p for _, p in named_parameters]
        else:
            params = [p for g in optimizer.param_groups for p in g["params"]]
        known = {id(p) for g in optimizer.param_groups for p in g["params"]}
        params = [p for p in params if p.requires_grad and id(p) in known]
        self._partitions = {}
        # Every optimizer of the process has keys of its own (a GAN's two optimizers may
        # exchange in the same step): the instance's number in the high bits.
        global _instances
        number = _instances << 40
        _instances += 1
        for index, p in enumerate(params):
            parts = []
            per = max(1, self._partition_bytes // p.element_size())
            for start in range(0, max(p.numel(), 1), per):
                key = ((number + 1) * _SPREAD) & _MASK
                parts.append(_Partition(p, index, start, min(start + per, p.numel()), key))
                number += 1
            self._partitions[p] = parts
        self._lock = threading.Condition()
        self._ready = []        # heap of (param index, partition start, sequence, partition)
        self._sequence = 0
        self._in_flight = 0     # bytes
        self._outstanding = 0   # partitions queued or in flight
        self._error = None
        self._flushing = False  # step() waits: send whatever is ready, credit or not
        self._queued = set()    # params whose partitions were queued this step
        self._passes_done = {p: 0 for p in params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]

    def __getattr__(self, name):
        return getattr(self._optimizer, name)

    # -- the exchange -------------------------------------------------------------------

    def _grad_ready(self, p):
        if p in self._queued:
            # Its exchange is under way in this very memory: another backward pass before
            # step() would be sent half-added (Horovod refuses this too).
            raise RuntimeError(
                "vans.torch.DistributedOptimizer: a gradient was computed again before step(); "
                "call step() after every backward pass, or set backward_passes_per_step")
        self._passes_done[p] += 1
        if self._passes_done[p] % self._passes == 0:
            self._queue(p)

    def _queue(self, p):
        with self._lock:
            if p in self._queued:
                return
            self._queued.add(p)
            for part in self._partitions[p]:
                heapq.heappush(self._ready, (part.index, part.start, self._sequence, part))
                self._sequence += 1
                self._outstanding += 1
            self._dispatch()

    def _dispatch(self):
        """Sends ready partitions, most urgent first, while the credit lasts (lock held)."""
        while self._ready and (self._flushing or self._in_flight < self._credit
                               or self._in_flight == 0):
            _, _, _, part = heapq.heappop(self._ready)
            try:
                self._send(part)
            except Exception as e:  # noqa: BLE001 - handed to step()
                self._error = self._error or e
                self._outstanding -= 1
                self._lock.notify_all()

    def _send(self, part):
        p = part.param
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad.detach()
        if not grad.is_contiguous():
            p.grad = grad = grad.contiguous()
        flat = grad.view(-1)[part.start:part.stop]
        wire = flat if flat.dtype == _WIRE else flat.to(_WIRE)
        part.wire = wire
        nbytes = wire.numel() * wire.element_size()
        keys = numpy.array([part.key], dtype=numpy.uint64)
        request = self._worker.push_pull_async(
            keys, wire.numpy(), out=wire.numpy(), cmd=vans.ROUND_CMD)
        self._in_flight += nbytes

        def done(_value, error, part=part, nbytes=nbytes):
            with self._lock:
                self._in_flight -= nbytes
                self._outstanding -= 1
                if error is not None:
                    self._error = self._error or error
                elif part.wire is not flat:
                    flat.copy_(part.wire)
                part.wire = None
                self._dispatch()
                self._lock.notify_all()

        request.add_done_callback(done)

    def synchronize(self):
        """Waits for every gradient's exchange of this step (queuing those whose hooks did
        not fire, e.g. parameters unused in this pass); raises the first error."""
        with self._lock:
            # Everything goes now, whatever the credit: a round completes only once every
            # worker has pushed its key, and the workers' backward passes finish in different
            # orders, so holding partitions back here could leave two workers each waiting
            # for rounds the other has not joined.
            self._flushing = True
            self._dispatch()
        for p in self._partitions:
            if p not in self._queued:
                self._queue(p)
        with self._lock:
            if not self._lock.wait_for(lambda: self._outstanding == 0, self._timeout):
                self._flushing = False
                raise vans.errors.TimeoutError(
                    f"gradient exchange not done within {self._timeout} s "
                    f"({self._outstanding} partitions outstanding)")
            error, self._error = self._error, None
            self._queued.clear()
            self._flushing = False
            for p in self._passes_done:
                self._passes_done[p] = 0
        if error is not None:
            raise error
        if self._average and self._size > 1:
            with torch.no_grad():
                for p in self._partitions:
                    p.grad.div_(self._size)

    def step(self, closure=None):
        """Exchanges the gradients (every ``backward_passes_per_step`` calls) and runs the
        wrapped optimizer's step."""
        self.synchronize()
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none=True):
        """The wrapped optimizer's ``zero_grad``."""
        return self._optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        """The wrapped optimizer's state."""
        return self._optimizer.state_dict()

    def load_state_dict(self, state):
        """Loads the wrapped optimizer's state."""
        return self._optimizer.load_state_dict(state)

    def close(self):
        """Removes the gradient hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


def broadcast_parameters(params, root_rank=0, group=None):
    """Copies ``root_rank``'s parameters (``model.state_dict()``, ``named_parameters()`` or
    a list of tensors) into every rank's, in place."""
    if isinstance(params, dict):
        tensors = list(params.values())
    else:
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    with torch.no_grad():
        for t in tensors:
            if t.is_contiguous():
                dist.broadcast(t.data, src=root_rank, group=group)
            else:
                copy = t.data.contiguous()
                dist.broadcast(copy, src=root_rank, group=group)
                t.data.copy_(copy)


def broadcast_optimizer_state(optimizer, root_rank=0, group=None):
    """Gives every rank ``root_rank``'s optimizer state (step counts, moments, learning
    rates), so a job that resumes from a checkpoint on one rank starts in step everywhere."""
    inner = getattr(optimizer, "_optimizer", optimizer)
    payload = [None]
    if dist.get_rank(group) == root_rank:
        buffer = io.BytesIO()
        torch.save(inner.state_dict(), buffer)
        payload = [buffer.getvalue()]
    dist.broadcast_object_list(payload, src=root_rank, group=group)
    if dist.get_rank(group) != root_rank:
        inner.load_state_dict(torch.load(io.BytesIO(payload[0]), weights_only=False))
