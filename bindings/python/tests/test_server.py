"""Servers from Python: a handler written in Python, a dead server named in the worker's
exception, and ``serve()`` going on through a worker's death and replacement."""

import subprocess

import numpy as np
import pytest
import vans
from conftest import LASTING_SCHEDULER
from vans import errors

KEYS = np.array([1, 2, 3], dtype=np.uint64)

# Keeps the maximum of everything pushed, instead of the sum.
MAX_SERVER = """
import numpy as np, vans
store = {}
def handle(req):
    assert req["cmd"] in (0, 7), req["cmd"]
    if req["cmd"] == 7:
        raise RuntimeError("command 7 is not served here")
    keys = req["keys"].tolist()
    if req["push"]:
        for k, v in zip(keys, req["vals"].tolist()):
            store[k] = max(store.get(k, v), v)
    if req["pull"]:
        return np.array([store.get(k, 0) for k in keys], dtype=np.int64)
vans.Server(dtype="int64", handler=handle).serve()
"""


def test_a_python_handler_serves_requests(cluster):
    c = cluster(num_servers=2, server_code=MAX_SERVER)
    w = vans.Worker(dtype="int64", **c.config())
    keys = np.array([1, 2**63 + 5], dtype=np.uint64)  # one on each server
    for vals in ([3, -9], [1, 4], [2, 0]):
        w.push(keys, np.array(vals, dtype=np.int64))
    np.testing.assert_array_equal(w.pull(keys), [3, 4])
    # The handler's exception reaches the worker with its text, naming the server (alive).
    with pytest.raises(errors.HandlerFailedError, match="command 7 is not served here") as e:
        w.pull(keys, cmd=7)
    assert e.value.server in (8, 10)
    assert not isinstance(e.value, errors.NodeFailedError)
    w.node.finalize()
    c.join()


def test_a_killed_server_is_named_in_the_error(cluster):
    c = cluster(num_servers=1, env={"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "3"},
                scheduler_code=LASTING_SCHEDULER)
    w = vans.Worker(**c.config())
    w.push(KEYS, np.ones(3, dtype=np.float32))
    c.servers[0].kill()
    c.servers[0].wait()
    with pytest.raises(errors.NodeFailedError) as failure:
        for _ in range(100):  # until the loss is seen: at once, or by the heartbeat timeout
            w.pull(KEYS, timeout=30)
    assert failure.value.node == 8
    assert failure.value.role == "server"
    assert "node 8 (server)" in str(failure.value)
    w.node.stop()
    c.kill()


# A worker that adds 1 to key 3 once; the first process waits to be killed, its replacement
# (a new process in the dead one's place) finalizes.
ADDING_WORKER = """
import time, numpy as np, vans
node = vans.Node()
w = vans.Worker(node, dtype="float32")
w.push(np.array([3], dtype=np.uint64), np.ones(1, dtype=np.float32))
print("recovery" if node.is_recovery else "first", flush=True)
if node.is_recovery:
    node.finalize()
else:
    time.sleep(600)
"""


def test_serve_goes_on_through_a_worker_s_death_and_replacement(cluster):
    # The server's `serve()` and the scheduler's `finalize()` wait at the final barrier from
    # the start; with a replacement grace, a worker killed meanwhile must not end them (they
    # wait for its replacement), and once every worker finalizes, everyone exits 0.
    c = cluster(num_servers=1, num_workers=2,
                env={"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "3",
                     "VANS_REPLACEMENT_GRACE_SECS": "60"})
    first = c.start("worker", ADDING_WORKER, stdout=subprocess.PIPE, text=True)
    w = vans.Worker(**c.config())
    assert first.stdout.readline().strip() == "first"
    first.kill()
    first.wait()
    second = c.start("worker", ADDING_WORKER, stdout=subprocess.PIPE, text=True)
    c.procs.append(second)
    assert second.stdout.readline().strip() == "recovery"
    # Both processes' adds landed, and the server still serves.
    np.testing.assert_array_equal(w.pull(np.array([3], dtype=np.uint64), timeout=30), [2.0])
    w.node.finalize()
    assert c.join() == [0, 0, 0]
