"""One job script for every way of starting it: the book's first Python snippet ("Use from
Python") runs unchanged as a local cluster of itself (test_readme.py), submitted to
`vans-master` (local backend: every task reads its role), and under `mpirun` (roles from
Open MPI's ranks); each time one node per process and exact sums, never a nested local
cluster. `vans.node_role()` is its guard; its rules are checked here too. The master and
`vans-submit` are the workspace's debug builds (`cargo test --workspace` or `cargo build -p
jobs` makes them)."""

import json
import pathlib
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
import vans
from conftest import mpirun
from test_readme import snippets
from vans import errors

ROOT = pathlib.Path(__file__).resolve().parents[3]
BIN = ROOT / "target" / "debug"


def program(name):
    path = BIN / name
    assert path.exists(), f"{path} is missing: build it with `cargo build -p jobs`"
    return str(path)


def test_the_books_job_script_runs_unchanged_under_vans_master(tmp_path):
    script = tmp_path / "kv_job.py"
    script.write_text(snippets()[0])
    port = vans.free_port()
    master = subprocess.Popen(
        [program("vans-master"), "--port", str(port), "--backend", "local",
         "--jobs-dir", str(tmp_path / "jobs")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/jobs", timeout=1).read()
                break
            except OSError:
                assert master.poll() is None, master.stderr.read()
                assert time.monotonic() < deadline, "vans-master did not listen"
                time.sleep(0.1)
        submit = subprocess.run(
            [program("vans-submit"), "--master", url, "--strategy", "ParameterServer",
             "--ps-num", "2", "--worker-num", "2", "--task", "kv", "--",
             sys.executable, str(script)],
            capture_output=True, text=True, timeout=300)
        said = submit.stdout + submit.stderr
        assert submit.returncode == 0, said
        assert "job 1: succeeded (tasks: 5 succeeded)" in said, said
        for rank in (0, 1):
            log = urllib.request.urlopen(f"{url}/jobs/1/logs/worker-{rank}", timeout=10)
            text = log.read().decode()
            # One node of the master's cluster: no nested launcher, the exact sums (two
            # workers each pushed [1, 2, 3]), and the rank is the task's index.
            assert "[launcher]" not in text, text
            assert f"worker {rank}: [2. 4. 6.]" in text, text
        job = json.loads(urllib.request.urlopen(f"{url}/jobs/1", timeout=10).read())
        assert job["state"] == "succeeded", job
    finally:
        master.kill()
        master.wait()


def test_the_books_job_script_runs_unchanged_under_mpirun(tmp_path):
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun not found: run scripts/setup.sh (Debian: apt-get install openmpi-bin)")
    script = tmp_path / "kv_job.py"
    script.write_text(snippets()[0])
    run = mpirun(5, [sys.executable, str(script)],
                 ["DMLC_NUM_SERVER=2", "DMLC_PS_ROOT_URI=127.0.0.1",
                  f"DMLC_PS_ROOT_PORT={vans.free_port()}"])
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert "[launcher]" not in said, said  # no nested local cluster
    for rank in (0, 1):
        assert f"worker {rank}: [2. 4. 6.]" in run.stdout, said


# The variables that may give a role, cleared before each case.
ROLE_VARS = ["DMLC_ROLE", "TF_CONFIG", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
             "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE",
             "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
             "MASTER_ADDR", "MASTER_PORT", "VANS_RANK"]


@pytest.mark.parametrize("env, role", [
    ({}, None),
    ({"DMLC_ROLE": "server", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1",
      "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000"}, "server"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "DMLC_NUM_SERVER": "1",
      "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000"}, "scheduler"),
    ({"RANK": "3", "WORLD_SIZE": "4", "DMLC_NUM_SERVER": "1", "MASTER_ADDR": "127.0.0.1",
      "MASTER_PORT": "9000"}, "worker"),
    ({"TF_CONFIG": json.dumps({"cluster": {"ps": ["127.0.0.1:9001"],
                                           "worker": ["127.0.0.1:9002"]},
                               "task": {"type": "ps", "index": 0}}),
      "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000"}, "server"),
])
def test_node_role_reads_the_environment_as_a_node_does(monkeypatch, env, role):
    for var in ROLE_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert vans.node_role() == role


def test_node_role_names_a_contradiction(monkeypatch):
    for var in ROLE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")  # no DMLC_NUM_SERVER: which ranks serve?
    with pytest.raises(errors.ConfigError, match="DMLC_NUM_SERVER"):
        vans.node_role()
