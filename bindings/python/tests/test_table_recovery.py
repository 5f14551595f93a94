"""A table server with Adam state killed mid-training and started again from its checkpoint:
the servers snapshot their tables at a barrier, server 0 is killed (SIGKILL) and a new
process takes its place (ps-lite's recovery) restoring the snapshot, and training goes on to
exactly the losses and rows of an uninterrupted run (torch.optim.Adam on the same rows)."""

import time

import numpy as np
import pytest
import vans
from conftest import LASTING_SCHEDULER

torch = pytest.importorskip("torch")

DIM = 4
KEYS = np.array([5, 99, 2**63 + 1, 2**64 - 3], dtype=np.uint64)  # two on each server
SPEC = vans.table_spec(optimizer="adam", dim=DIM, lr=0.1, init="normal", std=1.0, seed=3)
STEPS, CHECKPOINT = 12, 5
TARGET = np.linspace(-2, 2, len(KEYS) * DIM).astype(np.float32)

# Checkpoints at the workers' barrier; a process that takes a dead server's place (its
# node `is_recovery`) starts its table from that checkpoint. Servers answer until the test
# kills them (`serve()` would do as well: test_server.py shows it outlasts a replacement).
SERVER = """
import os, pathlib, time, vans
node = vans.Node()
path = pathlib.Path(os.environ["TEST_CHECKPOINTS"]) / f"server-{node.rank}.snapshot"
if node.is_recovery:
    server = vans.Server(node, table=os.environ["TEST_TABLE"], restore=path.read_bytes())
    print(f"server {node.rank}: restored {path.stat().st_size} bytes", flush=True)
else:
    server = vans.Server(node, table=os.environ["TEST_TABLE"])
    node.barrier("workers+servers")
    path.with_suffix(".tmp").write_bytes(server.snapshot())
    path.with_suffix(".tmp").rename(path)
    node.barrier("workers+servers")
time.sleep(60)
"""


def loss_and_grad(rows):
    """Half the squared distance to TARGET, and its gradient."""
    diff = rows - TARGET
    return 0.5 * float(diff @ diff), diff


def reference():
    """The uninterrupted run: every row its own parameter, torch's Adam."""
    start = vans.table_initial_rows(SPEC, KEYS)
    params = [torch.nn.Parameter(torch.tensor(start[i * DIM:(i + 1) * DIM]))
              for i in range(len(KEYS))]
    optimizer = torch.optim.Adam(params, lr=0.1)
    losses = []
    for _ in range(STEPS):
        rows = torch.cat([p.detach() for p in params]).numpy()
        loss, grad = loss_and_grad(rows)
        losses.append(loss)
        for i, p in enumerate(params):
            p.grad = torch.tensor(grad[i * DIM:(i + 1) * DIM])
        optimizer.step()
    return losses, torch.cat([p.detach() for p in params]).numpy()


def pull_until_answered(worker, deadline=60.0):
    """Pulls (which changes nothing) until every server answers: the dead server's place
    taken."""
    end = time.monotonic() + deadline
    while True:
        try:
            return worker.pull(KEYS, timeout=5)
        except (vans.errors.NodeFailedError, vans.errors.TimeoutError,
                vans.errors.TransportError):
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_a_killed_adam_table_server_resumes_from_its_checkpoint(cluster, tmp_path):
    env = {"TEST_TABLE": SPEC, "TEST_CHECKPOINTS": str(tmp_path),
           "PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "3"}
    c = cluster(num_servers=2, server_code=SERVER, env=env, scheduler_code=LASTING_SCHEDULER)
    node = vans.Node(**c.config())
    w = vans.Worker(node, dtype="float32")
    losses = []
    rows = w.pull(KEYS)
    np.testing.assert_array_equal(rows, vans.table_initial_rows(SPEC, KEYS))
    for step in range(STEPS):
        if step == CHECKPOINT:
            node.barrier("workers+servers")  # the servers snapshot their tables
            node.barrier("workers+servers")
            assert sorted(p.name for p in tmp_path.iterdir()) == [
                "server-0.snapshot", "server-1.snapshot"]
            c.servers[0].kill()
            c.servers[0].wait()
            c.procs.append(c.start("server", SERVER))
            rows = pull_until_answered(w)
        loss, grad = loss_and_grad(rows)
        losses.append(loss)
        rows = w.push_pull(KEYS, grad)
    expect_losses, expect_rows = reference()
    np.testing.assert_allclose(losses, expect_losses, rtol=1e-5)
    np.testing.assert_allclose(rows, expect_rows, rtol=1e-5, atol=1e-6)
    # It trained, and across the restart.
    assert losses[-1] < losses[CHECKPOINT] < losses[0]
    node.stop()
