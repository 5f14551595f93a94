"""vans.launch: a local cluster of Python processes (1 scheduler, 2 servers, 2 workers), as
ps-lite's test_kv_app does it, and a failing node reported as a LaunchError."""

import re
import textwrap

import pytest
import vans
from vans import errors

KV_APP = """
import numpy as np, vans

def main(worker):
    keys = np.arange(0, 2**64 - 2**60, 2**59, dtype=np.uint64)  # spread over both servers
    vals = np.arange(len(keys), dtype=np.float32)
    repeat = 5
    for _ in range(repeat):
        worker.push(keys, vals)
    worker.node.barrier()
    expected = vals * repeat * worker.node.num_workers
    np.testing.assert_array_equal(worker.pull(keys), expected)
    print(f"worker {worker.node.rank}: {len(keys)} sums exact", flush=True)

vans.run_node(main)
"""


def test_launch_runs_a_local_cluster(tmp_path, capfd):
    script = tmp_path / "kv_app.py"
    script.write_text(textwrap.dedent(KV_APP))
    nodes = vans.launch(2, 2, script=script, timeout=120)
    assert [(n["role"], n["rank"]) for n in nodes] == [
        ("scheduler", 0), ("server", 0), ("server", 1), ("worker", 0), ("worker", 1)]
    assert all(n["code"] == 0 for n in nodes), nodes
    out = capfd.readouterr().out
    # Each line carries the launcher's prefix, which names the node's rank.
    for rank in (0, 1):
        assert re.search(rf"^\[worker {rank}\] worker {rank}: 30 sums exact$", out, re.M), out


def test_the_launchers_label_is_the_rank_the_node_gets(tmp_path, capfd):
    # Four workers, so that an order of registration (by address) other than the start
    # order shows almost always: the label follows the start order.
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent("""
        import vans
        vans.run_node(lambda worker: print(f"rank {worker.node.rank}", flush=True))
    """))
    vans.launch(1, 4, script=script, timeout=120)
    out = capfd.readouterr().out
    labels = re.findall(r"^\[worker (\d)\] rank (\d)$", out, re.M)
    assert sorted(labels) == [(str(r), str(r)) for r in range(4)], out


def test_a_failing_node_is_a_launch_error(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        sys.exit(3 if os.environ["DMLC_ROLE"] == "worker" else 0)
    """))
    with pytest.raises(errors.LaunchError, match="worker 0 exited with code 3"):
        vans.launch(1, 1, script=script, timeout=120)
    with pytest.raises(ValueError, match="exactly one"):
        vans.launch(1, 1)


FINALIZE_BY_HABIT = """
import numpy as np, vans
from vans import errors

def main(worker):
    keys = np.array([1, 2], dtype=np.uint64)
    worker.push(keys, np.ones(2, dtype=np.float32))
    worker.node.finalize()          # as ps-lite programs do, although run_node finalizes too
    worker.node.finalize()          # and again: idempotent
    for call in (lambda: worker.push(keys, np.ones(2, dtype=np.float32)),
                 lambda: worker.pull(keys),
                 lambda: worker.node.barrier(),
                 lambda: vans.Worker(worker.node, app_id=0, customer_id=1)):
        try:
            call()
        except errors.StoppedError as e:
            print(f"stopped as documented: {e}", flush=True)
        else:
            raise AssertionError("a call on a finalized node did not raise StoppedError")

vans.run_node(main)
"""


def test_after_finalize_calls_raise_stopped_error_and_finalize_is_idempotent(tmp_path, capfd):
    script = tmp_path / "finalize_by_habit.py"
    script.write_text(textwrap.dedent(FINALIZE_BY_HABIT))
    nodes = vans.launch(1, 1, script=script, timeout=120)
    assert all(n["code"] == 0 for n in nodes), nodes
    out = capfd.readouterr().out
    assert out.count("stopped as documented") == 4, out
