"""``vans.torch`` on real processes: the ``"vans"`` process group against Gloo on the same
inputs, DDP and the distributed optimizer against one process with the full batch, a rank
killed with SIGKILL, an elastic restart, memory not copied, and the PyTorch chapter's
snippets (docs/src/python/pytorch.md). Every job is started by torchrun
(``python -m torch.distributed.run``) or by ``vans.launch``, on 127.0.0.1."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import vans
from conftest import free_port, mpirun

HERE = pathlib.Path(__file__).resolve().parent
SCRIPTS = HERE / "torch_scripts"
EXAMPLE = HERE.parent / "examples" / "torch_train.py"
TORCH_CHAPTER = HERE.parents[2] / "docs" / "src" / "python" / "pytorch.md"
SPARSE_CHAPTER = HERE.parents[2] / "docs" / "src" / "python" / "sparse.md"


def torchrun(script, nproc, *args, env=None, timeout=300, check=True, extra=()):
    """Runs ``script args`` under torchrun with ``nproc`` ranks; returns its output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), *extra, str(script), *map(str, args)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    if check:
        assert run.returncode == 0, run.stdout + run.stderr
    return run


def tolerance(dtype, reference):
    scale = float(reference.double().abs().max()) if reference.numel() else 1.0
    if dtype in (torch.bfloat16, torch.float16):
        return dict(rtol=2e-2, atol=2e-2 * max(scale, 1.0))
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5 * max(scale, 1.0))
    if dtype == torch.float64:
        return dict(rtol=1e-12, atol=1e-12 * max(scale, 1.0))
    return dict(rtol=0, atol=0)  # integers: exact


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_collective_gives_glous_results(tmp_path, ranks):
    for backend in ("gloo", "vans"):
        run = torchrun(SCRIPTS / "collectives.py", ranks, backend, tmp_path, check=False)
        if run.returncode != 0 and backend == "gloo":
            # Gloo itself sometimes aborts at exit on a loaded machine: run it once more.
            print("gloo failed; again:", run.stderr[-2000:])
            run = torchrun(SCRIPTS / "collectives.py", ranks, backend, tmp_path, check=False)
        assert run.returncode == 0, run.stdout + run.stderr
        if backend == "vans":
            assert run.stdout.count("argument errors ok") == ranks, run.stdout
    compared = 0
    for rank in range(ranks):
        gloo = torch.load(tmp_path / f"gloo-{rank}.pt")
        ours = torch.load(tmp_path / f"vans-{rank}.pt")
        # vans does everything Gloo does, and uneven list all_to_all besides.
        assert set(gloo) <= set(ours), set(gloo) - set(ours)
        assert "all_to_all/list" in ours
        for name, want in gloo.items():
            got = ours[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            torch.testing.assert_close(got, want, **tolerance(want.dtype, want), msg=name)
            compared += 1
    assert compared > 100 * ranks
    # Every rank ends an all-reduce with the same bits, floats included.
    first = torch.load(tmp_path / "vans-0.pt")
    for rank in range(1, ranks):
        other = torch.load(tmp_path / f"vans-{rank}.pt")
        for name in first:
            if name.startswith("all_reduce/"):
                assert torch.equal(first[name], other[name]), f"{name}: rank {rank} differs"


def test_ddp_and_the_distributed_optimizer_train_like_one_process(tmp_path):
    out = tmp_path / "compare.json"
    cmd = [sys.executable, str(EXAMPLE), "--compare", "--workers", "2", "3", "--steps", "30",
           "--batch", "96", "--hidden", "32", "--lr", "0.2", "--json", str(out), "--plot",
           str(tmp_path / "curves.png")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads(out.read_text())
    assert [(r["mode"], r["world"]) for r in results] == [
        ("single", 1), ("gloo", 2), ("vans", 2), ("dopt", 2),
        ("gloo", 3), ("vans", 3), ("dopt", 3)]
    single = results[0]
    assert single["losses"][-1] < 0.9 * single["losses"][0], "the model did not learn"
    for r in results[1:]:
        assert r["max_rel_diff"] < 1e-5, (r["mode"], r["world"], r["max_rel_diff"])
        assert r["param_checksum"] == pytest.approx(single["param_checksum"], rel=1e-5,
                                                    abs=1e-4), r["mode"]
        assert r["param_abs_sum"] == pytest.approx(single["param_abs_sum"], rel=1e-5)
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_the_distributed_optimizer_with_small_partitions_and_credit(tmp_path):
    """Partitions of 4 KiB (the MLP's layers cut in up to 32 keys over 3 co-located servers)
    and 8 KiB in flight: the priority queue and the credit carry every step, and the curve
    is still the single process's."""
    common = ["--steps", "15", "--batch", "96", "--hidden", "64", "--lr", "0.2"]
    single = tmp_path / "single.json"
    subprocess.run([sys.executable, str(EXAMPLE), "--mode", "single", "--json", str(single),
                    *common], check=True, timeout=120)
    out = tmp_path / "dopt.json"
    torchrun(EXAMPLE, 3, "--mode", "dopt", "--json", out, *common,
             env={"VANS_TORCH_PARTITION_BYTES": "4096", "VANS_TORCH_CREDIT_BYTES": "8192"})
    losses = json.loads(out.read_text())["losses"]
    reference = json.loads(single.read_text())["losses"]
    assert max(abs(a - b) / b for a, b in zip(losses, reference)) < 1e-5


def test_the_example_runs_under_vans_launch_with_server_processes(tmp_path):
    """The distributed optimizer with a separate server process (not co-located), and DDP
    over vans, both started by vans' own launcher: same curve as one process."""
    common = ["--steps", "20", "--batch", "64", "--hidden", "32", "--lr", "0.2"]
    single = tmp_path / "single.json"
    subprocess.run([sys.executable, str(EXAMPLE), "--mode", "single", "--json", str(single),
                    *common], check=True, timeout=120)
    reference = json.loads(single.read_text())["losses"]
    for mode, servers in (("dopt", 1), ("vans", 1)):
        out = tmp_path / f"{mode}.json"
        nodes = vans.launch(servers, 2, script=EXAMPLE,
                            args=["--mode", mode, "--json", out, *common], timeout=240)
        assert all(n["code"] == 0 for n in nodes), nodes
        losses = json.loads(out.read_text())["losses"]
        diff = max(abs(a - b) / b for a, b in zip(losses, reference))
        assert diff < 1e-5, (mode, diff)


def test_the_example_runs_under_mpirun(tmp_path):
    """Open MPI's ranks take vans roles by the engine rule (rank 0 the scheduler, 1 the
    server, the rest workers): vans.torch.init_process_group serves on the first two and
    trains on the others, the same curve as one process."""
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun not found: run scripts/setup.sh (Debian: apt-get install openmpi-bin)")
    common = ["--steps", "20", "--batch", "64", "--hidden", "32", "--lr", "0.2"]
    single = tmp_path / "single.json"
    subprocess.run([sys.executable, str(EXAMPLE), "--mode", "single", "--json", str(single),
                    *common], check=True, timeout=120)
    out = tmp_path / "mpi.json"
    run = mpirun(4, [sys.executable, str(EXAMPLE), "--mode", "dopt", "--json", str(out), *common],
                 ["DMLC_NUM_SERVER=1", "DMLC_PS_ROOT_URI=127.0.0.1",
                  f"DMLC_PS_ROOT_PORT={free_port()}", "OMP_NUM_THREADS=1"])
    assert run.returncode == 0, run.stdout + run.stderr
    losses = json.loads(out.read_text())["losses"]
    reference = json.loads(single.read_text())["losses"]
    assert json.loads(out.read_text())["world"] == 2
    assert max(abs(a - b) / b for a, b in zip(losses, reference)) < 1e-5


KILLED = """
import os, sys, time, torch, torch.distributed as dist
import vans.torch
dist.init_process_group("vans")
rank = dist.get_rank()
t = torch.ones(1000)
dist.all_reduce(t)
print(f"rank {rank} ready", flush=True)
if rank == 1:
    time.sleep(120)   # killed by the test
started = time.monotonic()
try:
    for _ in range(100000):
        dist.all_reduce(t)
        time.sleep(0.01)
except vans.errors.CollectiveError as e:  # as the PyTorch chapter says
    print(f"ERROR after {time.monotonic() - started:.1f}s: {type(e).__name__}: {e}", flush=True)
    print(f"CAUGHT dist={isinstance(e, dist.DistBackendError)} rank={e.rank}", flush=True)
    try:
        dist.all_reduce(t)
    except dist.DistBackendError as again:
        print(f"AGAIN {again}", flush=True)
        print(f"AGAIN-RANK {again.rank}", flush=True)
    os._exit(0)
print("no error", flush=True)
os._exit(1)
"""


def start_ranks(script, world, env=None):
    """``world`` processes of a torch job started by hand (torchrun would stop the others
    when one dies): ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``."""
    port = free_port()
    procs = []
    for rank in range(world):
        e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                 WORLD_SIZE=str(world), LOCAL_RANK=str(rank), **(env or {}))
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def test_a_killed_rank_fails_the_others_naming_it():
    procs = start_ranks(KILLED, 3)
    try:
        victim = procs[1]
        line = victim.stdout.readline()
        assert "rank 1 ready" in line, line
        time.sleep(0.5)
        victim.send_signal(signal.SIGKILL)
        for survivor in (procs[0], procs[2]):
            out, _ = survivor.communicate(timeout=90)
            assert survivor.returncode == 0, out
            error = [line for line in out.splitlines() if line.startswith("ERROR")]
            assert error, out
            assert "rank 1" in error[0], error[0]
            # Both torch's type and vans' documented one, with the failed rank; torch's
            # advice (restart), not the elastic API's (settle).
            assert "CAUGHT dist=True rank=1" in out, out
            assert "settle()" not in out and "restart the job" in error[0], error[0]
            again = [line for line in out.splitlines() if line.startswith("AGAIN")]
            assert again and "failed earlier" in again[0] and "rank 1" in again[0], out
            assert "AGAIN-RANK 1" in out, out
            print(error[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


MISMATCHED = """
import os, torch, torch.distributed as dist
import vans.torch
dist.init_process_group("vans")
rank = dist.get_rank()
t = torch.ones(4 + rank, dtype=torch.float64 if rank == 1 else torch.float32)
for attempt in ("FIRST", "AGAIN"):
    try:
        dist.all_reduce(t)
        print(f"{attempt} no error", flush=True)
    except vans.errors.CollectiveError as e:
        print(f"{attempt} {type(e).__name__}: {e}", flush=True)
os._exit(0)
"""


def test_a_mismatch_says_what_differs_and_what_to_do_in_torch_terms():
    procs = start_ranks(MISMATCHED, 2)
    try:
        for rank, p in enumerate(procs):
            out, _ = p.communicate(timeout=90)
            first = [line for line in out.splitlines() if line.startswith("FIRST")]
            again = [line for line in out.splitlines() if line.startswith("AGAIN")]
            assert first and again, out
            # The other rank's side in the user's terms, then torch's advice.
            assert "BackendError" in first[0] and "mismatch with rank" in first[0], out
            assert ("f64" if rank == 0 else "f32") in first[0], first[0]
            assert "settle()" not in out and "restart the job" in first[0], out
            # The group runs no more collectives, and says so at once.
            assert "failed earlier" in again[0] and "restart the job" in again[0], out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


ELASTIC = """
import os, time, torch, torch.distributed as dist
import vans.torch
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("vans")
rank, n = dist.get_rank(), dist.get_world_size()
for step in range(30):
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert t[0].item() == n * (n + 1) / 2, t[0]
    if restart == 0 and rank == 1 and step == 10:
        os.kill(os.getpid(), 9)
    time.sleep(0.02)
print(f"attempt {restart} rank {rank} finished 30 steps", flush=True)
dist.destroy_process_group()
"""


def test_an_elastic_job_forms_again_after_a_rank_is_killed(tmp_path):
    script = tmp_path / "elastic.py"
    script.write_text(ELASTIC)
    run = torchrun(script, 2, extra=["--max-restarts", "1", "--monitor-interval", "0.5"],
                   timeout=300)
    for rank in (0, 1):
        assert f"attempt 1 rank {rank} finished 30 steps" in run.stdout, run.stdout + run.stderr


MEMORY = """
import json, torch, torch.distributed as dist
import vans.torch

def peak_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

dist.init_process_group("vans")
# A first all-reduce of the same size: connections, send buffers and (over shared memory) the
# arena's pages are in place afterwards, so what the second one adds is its own doing.
warm = torch.ones((256 << 20) // 4)
dist.all_reduce(warm)
t = torch.ones((256 << 20) // 4)           # 256 MiB, touched
reset_peak()
before = peak_kib()
dist.all_reduce(t)
after = peak_kib()
assert t[0].item() == dist.get_world_size() and t[-1].item() == dist.get_world_size()
copied = t.clone()
after_copy = peak_kib()
print("RSS " + json.dumps({"all_reduce_kib": after - before, "copy_kib": after_copy - after}),
      flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("ipc", ["0", "1"])
def test_a_256_mib_all_reduce_is_not_copied(tmp_path, ipc):
    script = tmp_path / "memory.py"
    script.write_text(MEMORY)
    run = torchrun(script, 2, timeout=300, env={"DMLC_ENABLE_IPC": ipc})
    # Each rank prints one "RSS {...}"; torchrun may join the two ranks' lines into one.
    seen = [json.loads(m) for m in re.findall(r"RSS (\{[^{}]*\})", run.stdout)]
    assert len(seen) == 2, run.stdout
    print("peak RSS rise (KiB):", seen)
    for s in seen:
        assert s["copy_kib"] >= 200 * 1024, s      # a copy shows up (256 MiB, less any reuse)
        assert s["all_reduce_kib"] < 48 * 1024, s


def readme_snippets():
    """The ```python blocks of the book's PyTorch chapter."""
    text = TORCH_CHAPTER.read_text()
    assert text.startswith("# Use from PyTorch\n"), f"{TORCH_CHAPTER} is not the PyTorch chapter"
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_section_has_snippets():
    assert len(readme_snippets()) >= 2


@pytest.mark.parametrize("index", range(len(readme_snippets())))
def test_readme_snippet_runs_under_torchrun(tmp_path, index):
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(readme_snippets()[index])
    run = torchrun(script, 2, timeout=300)
    assert "rank 0" in run.stdout, run.stdout


def sparse_snippets():
    """The ```python blocks of the book's sparse chapter (its PyTorch part)."""
    text = SPARSE_CHAPTER.read_text()
    assert text.startswith("# Sparse models"), f"{SPARSE_CHAPTER} is not the sparse chapter"
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("index", range(len(sparse_snippets())))
def test_sparse_chapter_snippet_runs_under_torchrun(tmp_path, index):
    script = tmp_path / f"sparse_{index}.py"
    script.write_text(sparse_snippets()[index])
    env = {k: v for k, v in os.environ.items() if k != "VANS_TORCH_SERVERS"}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(script)],
        capture_output=True, text=True, timeout=300, env=dict(env, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "rank 0: 3 sparse steps done" in run.stdout, run.stdout
    assert "rank 1: 3 sparse steps done" in run.stdout, run.stdout


def test_tables_or_embeddings_without_servers_say_to_set_vans_torch_servers(
        monkeypatch, cluster):
    import vans.torch

    for var in ("VANS_TORCH_SERVERS", "DMLC_ROLE", "DMLC_NUM_SERVER"):
        monkeypatch.delenv(var, raising=False)
    # Refused before any process group forms: nothing to wait for.
    with pytest.raises(vans.errors.ConfigError, match="VANS_TORCH_SERVERS=colocated"):
        vans.torch.init_process_group(tables={1: "optimizer=sgd dim=4"})
    # A worker of a cluster with no servers.
    c = cluster(num_servers=0)
    node = vans.Node(**c.config())
    try:
        with pytest.raises(ValueError, match="VANS_TORCH_SERVERS=colocated"):
            vans.torch.ShardedEmbedding(4, app_id=1, node=node)
    finally:
        node.finalize()
        c.join()
