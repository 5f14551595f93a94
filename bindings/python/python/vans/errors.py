"""The exceptions vans raises. Each message names its cause; some carry the details as
attributes. Invalid arguments (unsorted keys, wrong lengths) raise ``ValueError``, values of
the wrong dtype raise ``TypeError``."""


class VansError(Exception):
    """Base of every vans error."""


class ConfigError(VansError, ValueError):
    """The configuration (``DMLC_*``, ``TF_CONFIG`` or keyword arguments) is invalid; the
    message names the variable and what it accepts."""


class BootstrapError(VansError):
    """The cluster did not form before the bootstrap deadline; the message says which roles
    joined and which did not."""


class NodeFailedError(VansError):
    """A node died or its connection broke.

    Attributes: ``node`` (its id: scheduler 1, servers 8, 10, ..., workers 9, 11, ...),
    ``role`` (``"server"``, ``"worker"``, ``"scheduler"``) and ``reason``."""

    node = None
    role = None
    reason = None


class HandlerFailedError(VansError):
    """A live server's request handler refused or failed the request (a Python handler
    raised, or a Rust handler returned an error); the server goes on serving, only this
    request failed. Not a :class:`NodeFailedError`: the server is not dead.

    Attributes: ``server`` (its id: 8, 10, ...) and ``reason`` (the handler's text)."""

    server = None
    reason = None


class BarrierFailedError(VansError):
    """A barrier cannot complete because members died (attributes ``group``, ``dead``).

    When the scheduler itself is lost (it died, or this process is cut off from it), the
    barrier raises :class:`NodeFailedError` naming the scheduler and saying why."""

    group = None
    dead = ()


class TimeoutError(VansError, TimeoutError):  # noqa: A001 - also a builtin TimeoutError
    """A wait with a ``timeout`` ran out; the operation itself goes on."""


class StoppedError(VansError):
    """The node has stopped (finalized, stopped, or lost its scheduler)."""


class RendezvousError(VansError):
    """A rendezvous receive or send failed (aborted step, deadline, remote failure)."""


class ProtocolError(VansError):
    """A peer sent something that does not follow the protocol (attribute ``node``)."""

    node = None


class TransportError(VansError):
    """A van (TCP, io_uring, shared memory, RDMA) failed."""


class LaunchError(VansError):
    """A local launch failed: a node exited with an error, was killed, or the job timed
    out; every node that was started has been stopped."""


class CollectiveError(VansError):
    """A collective (``Collective.allreduce``, ``broadcast``, ``barrier``) failed: a member
    of the generation died (attributes ``node``, ``rank``, ``generation``), the membership is
    changing (a worker joins; ``generation``), or the ranks called different collectives.
    An elastic loop calls ``Collective.settle()`` and redoes the step."""

    node = None
    rank = None
    generation = None
