"""vans.Collective from Python: three worker processes all-reduce, broadcast and barrier numpy
arrays in place; every result is checked exactly, and a bad call is an error."""

import re
import textwrap

import vans

COLLECTIVE_APP = """
import numpy as np, vans

node = vans.Node()
if node.role == "worker":
    coll = vans.Collective(node)
    rank, size = coll.rank, coll.size
    number, members = coll.generation
    assert number >= 1 and node.id in members and size == 3, (number, members)
    # Sizes no rank count divides; every dtype and operator.
    x = np.arange(100_003, dtype=np.int64) + rank
    coll.allreduce(x)
    np.testing.assert_array_equal(x, np.arange(100_003, dtype=np.int64) * size + sum(range(size)))
    y = np.full(1001, rank, dtype=np.float64)
    coll.allreduce(y, op="mean")
    np.testing.assert_array_equal(y, np.full(1001, sum(range(size)) / size))
    z = np.arange(7, dtype=np.float32) * (rank + 1)
    coll.allreduce(z, op="max")
    np.testing.assert_array_equal(z, np.arange(7, dtype=np.float32) * size)
    w = np.full(5, rank, dtype=np.int32)
    coll.allreduce(w, op="min")
    np.testing.assert_array_equal(w, np.zeros(5, dtype=np.int32))
    coll.allreduce(np.empty(0, dtype=np.float32))
    b = np.arange(10, dtype=np.float32) if rank == 2 else np.zeros(10, dtype=np.float32)
    coll.broadcast(b, root=2)
    np.testing.assert_array_equal(b, np.arange(10, dtype=np.float32))
    for bad, error in [(lambda: coll.allreduce(np.zeros(3, dtype=np.uint8)), TypeError),
                       (lambda: coll.allreduce(np.zeros(3), op="avg"), ValueError),
                       (lambda: coll.broadcast(np.zeros(3), root=3), ValueError)]:
        try:
            bad()
        except error:
            pass
        else:
            raise AssertionError("no error")
    coll.barrier()
    print(f"collective ok: rank {rank} of {size}", flush=True)
node.finalize()
"""


def test_collectives_among_three_worker_processes(tmp_path, capfd):
    script = tmp_path / "collective_app.py"
    script.write_text(textwrap.dedent(COLLECTIVE_APP))
    nodes = vans.launch(1, 3, script=script, timeout=120)
    assert all(n["code"] == 0 for n in nodes), nodes
    out = capfd.readouterr().out
    for rank in range(3):
        assert re.search(rf"collective ok: rank {rank} of 3$", out, re.M), out


def test_collective_errors_are_vans_errors():
    assert issubclass(vans.errors.CollectiveError, vans.errors.VansError)
    assert vans.Collective.__doc__
