"""TensorFlow's own runtime over vans (vans.tensorflow's server protocols): real TensorFlow
servers as processes on 127.0.0.1 (tf_scripts/tf_job.py), each task a process of its own.
Every protocol trains the same graphs to the same bits as plain gRPC; a ps task killed with
SIGKILL, or cut off from the network (its host's link dropping everything, in network
namespaces the test makes), fails the client's step with an error naming it; the seed's
``.endpoint_map``;
bad maps and mixed protocols are errors, not hangs."""

import importlib.util
import json
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import vans

HERE = pathlib.Path(__file__).resolve().parent
JOB = HERE / "tf_scripts" / "tf_job.py"
PSS = HERE / "tf_scripts" / "tf_pss.py"
MWMS = HERE / "tf_scripts" / "tf_mwms.py"
VANS_PROTOCOLS = ["grpc+vans", "grpc+vans+push", "grpc+seastar", "star_server",
                  "star_server_lite"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="TensorFlow is not installed")


@pytest.fixture(scope="module", autouse=True)
def plugin():
    """Builds the server plugin once (every task process would otherwise build it)."""
    run = subprocess.run([sys.executable, "-c", "import vans.tensorflow"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]


def cluster_spec(num_ps, num_workers):
    """Addresses on 127.0.0.1 for ``num_ps`` ps and ``num_workers`` worker tasks."""
    return {"ps": [f"127.0.0.1:{vans.free_port()}" for _ in range(num_ps)],
            "worker": [f"127.0.0.1:{vans.free_port()}" for _ in range(num_workers)]}


class Job:
    """The task processes of one job; ``client`` (default worker:0) trains, the others
    serve. ``wrap`` maps a task to the command it runs under (``ip netns exec NS``)."""

    def __init__(self, tmp_path, protocol, model="dense", steps=5, num_ps=2, num_workers=2,
                 protocols=None, env=None, spec=None, script=JOB, client=None, wrap=None,
                 extra=()):
        self.out = tmp_path / f"{protocol}-{model}.npz"
        self.spec = spec or cluster_spec(num_ps, num_workers)
        self.client_task = client or ("worker", 0)
        model_args = ["--model", model] if script == JOB else ["--loop", model]
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith(("DMLC_", "TF_CONFIG"))}
        environment.update(env or {})
        environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

        def start(job, task):
            p = (protocols or {}).get((job, task), protocol)
            return subprocess.Popen(
                [*(wrap or {}).get((job, task), []),
                 sys.executable, str(script), "--cluster", json.dumps(self.spec),
                 "--job", job, "--task", str(task), "--protocol", p, *model_args,
                 "--steps", str(steps), "--out", str(self.out), *extra],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=environment, cwd=tmp_path)

        self._start = start
        self.procs = {(job, task): start(job, task)
                      for job, addresses in self.spec.items()
                      for task in range(len(addresses))}
        self.replaced = []

    def restart(self, task):
        """Starts ``task`` again, as a fresh process with the same command (its old process,
        which must have exited, is kept in ``replaced`` so ``close`` collects its output)."""
        self.replaced.append(self.procs[task])
        self.procs[task] = self._start(*task)

    def client(self):
        return self.procs[self.client_task]

    def wait(self, timeout=300):
        """The client's exit status and output."""
        try:
            out, _ = self.client().communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.client().kill()
            out, _ = self.client().communicate()
            pytest.fail(f"the client did not finish in {timeout} s:\n{out[-4000:]}")
        return self.client().returncode, out

    def result(self):
        code, out = self.wait()
        assert code == 0, out[-6000:]
        with np.load(self.out) as data:
            return {k: data[k] for k in data.files}

    def close(self):
        """Kills every task still serving; returns the outputs of all."""
        outputs = {}
        for proc in self.replaced:
            proc.communicate(timeout=60)
        for key, proc in self.procs.items():
            if proc.poll() is None:
                proc.kill()
            out, _ = proc.communicate(timeout=60)
            outputs[key] = out or ""
        return outputs


@pytest.fixture
def jobs():
    started = []
    yield started
    for job in started:
        job.close()


def train(jobs, tmp_path, protocol, **kwargs):
    job = Job(tmp_path, protocol, **kwargs)
    jobs.append(job)
    return job.result()


@pytest.mark.parametrize("model", ["dense", "sparse"])
def test_every_protocol_trains_to_the_same_bits_as_grpc(jobs, tmp_path, model):
    expected = train(jobs, tmp_path, "grpc", model=model)
    assert np.all(np.isfinite(expected["losses"]))
    assert expected["losses"][-1] < expected["losses"][0]
    # Plain gRPC moves no tensor over vans; every vans protocol moves the client's.
    assert expected.pop("received") == 0
    for protocol in VANS_PROTOCOLS[:2] if model == "sparse" else VANS_PROTOCOLS:
        got = train(jobs, tmp_path, protocol, model=model)
        assert got.pop("received") > 0, protocol
        assert got.keys() == expected.keys()
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{protocol} {name}")


def vans_launch():
    """The ``vans-launch`` cargo built (the test command builds every binary before pytest)."""
    root = HERE.parents[2]
    for profile in ("debug", "release"):
        path = root / "target" / profile / "vans-launch"
        if path.exists():
            return path
    pytest.fail("no target/debug/vans-launch or target/release/vans-launch: "
                "build it first (cargo build -p jobs --bin vans-launch)")


def test_a_job_under_vans_launch_trains_to_the_same_bits_as_grpc(jobs, tmp_path):
    expected = train(jobs, tmp_path, "grpc", steps=3)
    expected.pop("received")
    # The script as a launcher runs it: its task from TF_CONFIG, no --cluster/--job/--task.
    out = tmp_path / "launched.npz"
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("DMLC_", "TF_CONFIG"))}
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    run = subprocess.run(
        [vans_launch(), "--tensorflow", "-s", "2", "-w", "2", "--timeout", "300", "--",
         sys.executable, str(JOB), "--protocol", "grpc+vans", "--steps", "3", "--out", str(out)],
        capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=400)
    assert run.returncode == 0, run.stderr[-6000:] + run.stdout[-4000:]
    assert "worker 0, the chief, exited 0" in run.stderr, run.stderr[-4000:]
    assert "[worker 0] done" in run.stdout, run.stdout[-4000:]
    with np.load(out) as data:
        got = {k: data[k] for k in data.files}
    assert got.pop("received") > 0
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def wait_for_line(proc, text, timeout=120):
    """Reads ``proc``'s output until it contains ``text``; returns what was read. Fails after
    ``timeout`` seconds even when the process prints nothing more. Reads the pipe's file
    descriptor itself, so no line waits unseen in a Python buffer while ``select`` sleeps."""
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        seen += chunk
    else:
        return seen.decode(errors="replace")
    pytest.fail(f"never saw {text!r}:\n{seen.decode(errors='replace')[-4000:]}")


@pytest.mark.parametrize("protocol", ["grpc", "grpc+vans", "grpc+vans+push"])
def test_a_ps_task_killed_mid_training_fails_the_step_naming_it(jobs, tmp_path, protocol):
    job = Job(tmp_path, protocol, steps=1_000_000)
    jobs.append(job)
    wait_for_line(job.client(), "step 3:")
    killed = time.monotonic()
    job.procs[("ps", 1)].send_signal(signal.SIGKILL)
    code, out = job.wait(timeout=120)
    took = time.monotonic() - killed
    assert code != 0, out[-3000:]
    assert "/job:ps/replica:0/task:1" in out, out[-3000:]
    assert took < 30, f"the step failed {took:.1f} s after the kill:\n{out[-3000:]}"


@pytest.mark.parametrize("protocol", ["grpc", "grpc+vans", "grpc+vans+push"])
def test_a_restarted_ps_task_is_recovered_by_a_monitored_session(jobs, tmp_path, protocol):
    """ps:1 is killed mid-training and started again at once; the client's
    ``MonitoredTrainingSession`` (no checkpoint) recreates its session, initialising the
    variables again, and trains on through the new process, whose vans node takes the old
    one's place. So the losses are grpc's, restarted once at the kill: steps 0 … r-1, then
    steps 0, 1, … again, bit for bit."""
    steps = 40
    reference = Job(tmp_path, "grpc", steps=steps)
    jobs.append(reference)
    expected = reference.result()["losses"]
    reference.close()
    job = Job(tmp_path, protocol, steps=steps, extra=["--recover"])
    jobs.append(job)
    wait_for_line(job.client(), "step 3:")
    job.procs[("ps", 1)].send_signal(signal.SIGKILL)
    job.procs[("ps", 1)].wait(timeout=60)
    killed = time.monotonic()
    job.restart(("ps", 1))
    result = job.result()
    took = time.monotonic() - killed
    losses = result["losses"]
    restart = next((r for r in range(4, steps) if losses[r] == expected[0]), None)
    assert restart is not None, f"no restart after step 3: {losses}"
    np.testing.assert_array_equal(
        losses, np.concatenate([expected[:restart], expected[:steps - restart]]))
    assert (result["received"] > 0) == (protocol != "grpc"), result["received"]
    print(f"{protocol}: restarted at step {restart}; "
          f"the client finished {took:.1f} s after the kill")


class Hosts:
    """Two hosts as network namespaces joined by a veth pair (``eth0`` in each) on a private
    subnet that exists only inside them (``10.217.N.1`` and ``.2``): a process runs on host
    ``h`` under :meth:`wrap`, and :meth:`cut` drops everything in and out of a host's
    ``eth0`` (nftables: silence, no reset), as behind a dead switch port."""

    def __init__(self):
        tag = os.getpid() % 100_000
        self.names = [f"vanstf{tag}{side}" for side in "ab"]
        self.addrs = [f"10.217.{tag % 250}.{h + 1}" for h in range(2)]
        self._run(["ip", "netns", "add", self.names[0]])
        try:
            self._run(["ip", "netns", "add", self.names[1]])
            a, b = self.names
            self._run(["ip", "-n", a, "link", "add", "eth0", "type", "veth",
                       "peer", "name", "eth0", "netns", b])
            for name, addr in zip(self.names, self.addrs):
                self._run(["ip", "-n", name, "addr", "add", f"{addr}/24", "dev", "eth0"])
                self._run(["ip", "-n", name, "link", "set", "eth0", "up"])
                self._run(["ip", "-n", name, "link", "set", "lo", "up"])
        except BaseException:
            self.delete()
            raise

    @staticmethod
    def _run(argv, stdin=None):
        run = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            pytest.fail(f"{' '.join(argv)}: {run.stderr.strip()} "
                        "(Debian: apt-get install iproute2 nftables)")

    def wrap(self, host):
        return ["ip", "netns", "exec", self.names[host]]

    def cut(self, host):
        """Host ``host`` receives and sends nothing from now on (until the hosts go)."""
        self._run(self.wrap(host) + ["nft", "-f", "-"], stdin="""
add table inet cut
add chain inet cut in { type filter hook input priority 0; }
add chain inet cut out { type filter hook output priority 0; }
add rule inet cut in iifname "eth0" drop
add rule inet cut out oifname "eth0" drop
""")

    def delete(self):
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=60)


@pytest.fixture
def hosts():
    """Two namespace hosts; skipped without root (as root, hosts that cannot be made fail
    the test: a machine that should run the suite must not pass it by skipping)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing (Debian: apt-get install iproute2 nftables)")
    made = Hosts()
    yield made
    made.delete()


@pytest.mark.parametrize("protocol", ["grpc+vans", "grpc+vans+push"])
def test_a_ps_task_cut_off_by_a_partition_fails_the_step_naming_it(jobs, tmp_path, hosts,
                                                                      protocol):
    """ps:1 alone on host 1, the other tasks on host 0; host 1 is cut off mid-training. No
    connection resets (plain gRPC has no deadline on a step's calls, and would wait on
    TCP): vans' heartbeats find the silent task, and the step's pending receive fails
    naming it, within the heartbeat timeout and a few seconds."""
    a, b = hosts.addrs
    spec = {"ps": [f"{a}:2222", f"{b}:2222"], "worker": [f"{a}:2223", f"{a}:2224"]}
    wrap = {task: hosts.wrap(0) for task in [("ps", 0), ("worker", 0), ("worker", 1)]}
    wrap[("ps", 1)] = hosts.wrap(1)
    env = {"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "4"}
    job = Job(tmp_path, protocol, steps=1_000_000, spec=spec, wrap=wrap, env=env)
    jobs.append(job)
    wait_for_line(job.client(), "step 3:")
    hosts.cut(1)
    cut = time.monotonic()
    code, out = job.wait(timeout=120)
    took = time.monotonic() - cut
    others = "".join(f"\n---- {name}:{task}\n{text[-2000:]}"
                     for (name, task), text in job.close().items()
                     if (name, task) != ("worker", 0))
    assert code != 0, out[-3000:] + others
    assert "failed:" in out and "/job:ps/replica:0/task:1" in out, out[-3000:] + others
    assert took < 15, f"the step failed {took:.1f} s after the cut (timeout 4 s):\n{out[-3000:]}"


def test_the_seeds_endpoint_map_runs_a_seastar_script_unchanged(jobs, tmp_path):
    """Seed 000: "Use grpc+seastar you have to create .endpoint_map file in launch dir",
    one ``grpc address=seastar address`` line per task. vans listens where it says."""
    spec = cluster_spec(2, 2)
    data = {}
    lines = ["# grpc ports = vans ports, as the seed's example"]
    for addresses in spec.values():
        for address in addresses:
            data[address] = f"127.0.0.1:{vans.free_port()}"
            lines.append(f"{address}={data[address]}")
    (tmp_path / ".endpoint_map").write_text("\n".join(lines) + "\n")
    job = Job(tmp_path, "grpc+seastar", spec=spec)
    jobs.append(job)
    result = job.result()
    assert result["received"] > 0
    # The serving tasks' vans nodes listen on their data ports (worker:0's, the scheduler's,
    # went with its process).
    for address in spec["ps"] + spec["worker"][1:]:
        host, port = data[address].split(":")
        socket.create_connection((host, int(port)), timeout=10).close()


@pytest.mark.parametrize("content, expected", [
    ("{first}=127.0.0.1:1\n", ["has no line for task", ".endpoint_map"]),
    ("{first}=127.0.0.1:1\nnot a mapping\n", ["line 2", ".endpoint_map"]),
])
def test_a_bad_endpoint_map_is_an_error_naming_the_file(jobs, tmp_path, content, expected):
    spec = cluster_spec(1, 1)
    (tmp_path / ".endpoint_map").write_text(content.format(first=spec["worker"][0]))
    job = Job(tmp_path, "grpc+vans", spec=spec)
    jobs.append(job)
    code, out = job.wait(timeout=120)
    assert code != 0
    for text in expected:
        assert text in out, out[-3000:]
    if "task" in expected[0]:
        assert "ps:0" in out and spec["ps"][0] in out, out[-3000:]


def test_tasks_of_a_pull_and_a_push_protocol_fail_with_a_message(jobs, tmp_path):
    job = Job(tmp_path, "grpc+vans", protocols={("ps", 0): "star_server",
                                                 ("ps", 1): "star_server"})
    jobs.append(job)
    code, out = job.wait(timeout=120)
    assert code != 0
    assert "same protocol" in out, out[-3000:]


def test_a_task_without_vans_fails_the_others_start_with_a_message(jobs, tmp_path):
    job = Job(tmp_path, "grpc+vans", protocols={("worker", 0): "grpc"},
              env={"VANS_BOOTSTRAP_TIMEOUT_SECS": "5"})
    jobs.append(job)
    ps = job.procs[("ps", 0)]
    try:
        out, _ = ps.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("ps:0 still waits for the task that runs plain grpc")
    assert ps.returncode != 0
    assert "could not join the vans cluster" in out and "same protocol" in out, out[-3000:]


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_parameter_server_strategy_trains_to_the_same_bits_as_grpc(jobs, tmp_path, loop):
    if loop == "fit" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("model.fit under ParameterServerStrategy needs Keras 2: pip install tf-keras")
    tasks = {"chief": 1, "worker": 1, "ps": 2}
    results = {}
    for protocol in ["grpc", "grpc+vans", "grpc+vans+push"]:
        spec = {job: [f"127.0.0.1:{vans.free_port()}" for _ in range(count)]
                for job, count in tasks.items()}
        job = Job(tmp_path, protocol, model=loop, spec=spec, script=PSS, client=("chief", 0))
        jobs.append(job)
        results[protocol] = job.result()
        job.close()
    expected = results.pop("grpc")
    assert expected.pop("received") == 0
    for protocol, got in results.items():
        assert got.pop("received") > 0, protocol
        assert got.keys() == expected.keys()
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{protocol} {name}")


def run_mwms(out_dir, protocol, workers=2, addresses=None, wrap=None):
    """A ``MultiWorkerMirroredStrategy`` job of ``workers`` task processes over ``protocol``
    (tf_scripts/tf_mwms.py), on ``addresses`` under ``wrap`` (as ``run_workers``); each
    task's results."""
    from vans.tensorflow.collective_bench import run_workers

    out = out_dir / protocol
    codes, outputs = run_workers(
        lambda cluster, i: [sys.executable, str(MWMS), "--cluster", cluster, "--task", str(i),
                            "--protocol", protocol, "--out", str(out)],
        workers, timeout=300, cwd=out_dir, addresses=addresses, wrap=wrap)
    for i, (code, text) in enumerate(zip(codes, outputs)):
        assert code == 0, f"worker {i} over {protocol}:\n{text[-4000:]}"
    results = []
    for i in range(workers):
        with np.load(f"{out}.worker{i}.npz") as data:
            results.append({k: data[k] for k in data.files})
    return results


@pytest.fixture(scope="module")
def mwms_over_grpc(tmp_path_factory):
    return run_mwms(tmp_path_factory.mktemp("mwms-grpc"), "grpc")


@pytest.mark.parametrize("protocol", ["grpc+vans", "grpc+vans+push"])
def test_multi_worker_mirrored_strategy_collectives_go_over_vans_to_the_same_bits(
        tmp_path, mwms_over_grpc, protocol):
    """MultiWorkerMirroredStrategy (ring collectives on CPU, two worker tasks): all-reduce
    and all-gather of 1 KiB to 16 MiB, each run twice from one tf.function, and Keras 2's
    ``model.fit`` give grpc's bits, with every chunk between the tasks carried by vans."""
    results = run_mwms(tmp_path, protocol)
    for worker, (got, expected) in enumerate(zip(results, mwms_over_grpc)):
        expected = dict(expected)
        assert expected.pop("collective_received") == 0
        assert got.pop("collective_received") > 0, f"worker {worker}: vans carried nothing"
        assert got.keys() == expected.keys()
        if importlib.util.find_spec("tf_keras") is not None:
            assert "losses" in got
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name],
                                          err_msg=f"worker {worker}: {name}")
    # Both tasks hold the same sums.
    for name in results[0]:
        if name.startswith("sum_"):
            np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=name)


def test_multi_worker_mirrored_strategy_across_two_hosts_gives_grpcs_bits(
        tmp_path, mwms_over_grpc, hosts):
    """The same MultiWorkerMirroredStrategy job with its two worker tasks on two namespace
    hosts (network namespaces joined by a veth pair, so vans reaches the other task over
    the network, not shared memory): every sum, gather and loss is grpc's on one host, bit
    for bit."""
    addresses = [f"{addr}:2222" for addr in hosts.addrs]
    results = run_mwms(tmp_path, "grpc+vans", addresses=addresses, wrap=hosts.wrap)
    for worker, (got, expected) in enumerate(zip(results, mwms_over_grpc)):
        expected = dict(expected)
        expected.pop("collective_received")
        assert got.pop("collective_received") > 0, f"worker {worker}: vans carried nothing"
        assert got.keys() == expected.keys()
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name],
                                          err_msg=f"worker {worker}: {name}")


def test_a_worker_killed_mid_collective_fails_the_others_call_naming_it(tmp_path):
    """MultiWorkerMirroredStrategy over grpc+vans, all-reducing in a loop; worker 1 is killed
    with SIGKILL: worker 0's collective fails within seconds with an error naming task 1
    (vans declares it dead), not a hang."""
    cluster = json.dumps({"worker": [f"127.0.0.1:{vans.free_port()}" for _ in range(2)]})
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("DMLC_", "TF_CONFIG"))}
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    procs = [subprocess.Popen([sys.executable, "-m", "vans.tensorflow.collective_bench",
                               "--task-of", cluster, "--task", str(i), "--protocol", "grpc+vans",
                               "--sizes", "1KiB", "--steps", "1000000"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=environment, cwd=tmp_path)
             for i in range(2)]
    try:
        wait_for_line(procs[0], "timing 1KiB")
        procs[1].kill()
        killed = time.monotonic()
        try:
            out = procs[0].communicate(timeout=120)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            pytest.fail("worker 0 still waits 120 s after worker 1 was killed")
        took = time.monotonic() - killed
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert procs[0].returncode != 0, out[-3000:]
    assert "/job:worker/replica:0/task:1" in out, out[-3000:]
    assert ("vans: receiving collective chunk" in out
            or "vans: sending collective chunk" in out), out[-3000:]
    assert took < 30, f"worker 0 failed {took:.1f} s after the kill:\n{out[-3000:]}"
    print(f"worker 0 failed {took:.1f} s after worker 1 was killed")
