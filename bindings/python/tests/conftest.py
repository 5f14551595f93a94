"""A real cluster for each test: the scheduler and the servers are processes of their own
(``python -c ...`` with their ``DMLC_*`` environment, on 127.0.0.1), the test process joins
as the worker (or the test launches workers too)."""

import contextlib
import os
import subprocess
import sys
import textwrap

import pytest

# Every process a test starts must be gone within this many seconds after the test.
PROCESS_DEADLINE = 60


def free_port():
    """A port for a scheduler, below the ephemeral range (vans.free_port): a port from
    ``bind(("127.0.0.1", 0))`` can go to another process's outgoing connection (Open MPI's
    under mpirun, say) before the scheduler binds it."""
    import vans
    return vans.free_port()


def mpirun(np, command, variables=(), timeout=300):
    """Runs ``command`` as ``np`` ranks under Open MPI on loopback only (TCP over ``lo``),
    without this process's ``DMLC_*`` variables; ``variables`` are ``NAME=VALUE`` strings
    exported to every rank (``-x``). Returns the finished process (output captured)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    exported = [arg for v in variables for arg in ("-x", v)]
    return subprocess.run(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
         "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
         "--mca", "oob_tcp_if_include", "lo", "-np", str(np), *exported, *command],
        capture_output=True, text=True, timeout=timeout, env=env)


SCHEDULER = "import vans; vans.Node().finalize()"

# A scheduler that stays up until the test kills it, for tests that kill a member: the plain
# one's final barrier fails when a member dies, and it exits, so the worker could see the
# scheduler's loss before the member's.
LASTING_SCHEDULER = f"import time, vans; node = vans.Node(); time.sleep({PROCESS_DEADLINE})"

SUM_SERVER = """
import os, vans
vans.Server(dtype=os.environ.get("TEST_DTYPE", "float32")).serve()
"""


class Cluster:
    """Processes of one cluster; ``config`` joins the test process as a worker."""

    def __init__(self, num_servers, num_workers, server_code, env, scheduler_code=SCHEDULER):
        self.port = free_port()
        self.num_servers = num_servers
        self.num_workers = num_workers
        self.env = dict(os.environ)
        self.env.update(
            DMLC_NUM_SERVER=str(num_servers),
            DMLC_NUM_WORKER=str(num_workers),
            DMLC_PS_ROOT_URI="127.0.0.1",
            DMLC_PS_ROOT_PORT=str(self.port),
            **(env or {}),
        )
        self.env.pop("DMLC_ROLE", None)
        self.procs = [self.start("scheduler", scheduler_code)]
        self.servers = [self.start("server", server_code) for _ in range(num_servers)]
        self.procs += self.servers

    def start(self, role, code, **popen):
        """Starts ``python -c code`` as a node of ``role`` (``popen``: e.g. ``stdout=PIPE``)."""
        env = dict(self.env, DMLC_ROLE=role)
        return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, **popen)

    def config(self, **extra):
        """Keyword arguments for ``vans.Node`` / ``vans.Worker`` joining as a worker."""
        return dict(role="worker", num_servers=self.num_servers, num_workers=self.num_workers,
                    root_uri="127.0.0.1", root_port=self.port, **extra)

    def join(self, expect_ok=True):
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=PROCESS_DEADLINE))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        if expect_ok:
            assert codes == [0] * len(codes), f"node exit codes {codes}"
        return codes

    def kill(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def cluster():
    """``cluster(num_servers=1, num_workers=1, server_code=SUM_SERVER, env=None,
    scheduler_code=SCHEDULER)``."""
    made = []

    def make(num_servers=1, num_workers=1, server_code=SUM_SERVER, env=None,
             scheduler_code=SCHEDULER):
        c = Cluster(num_servers, num_workers, server_code, env, scheduler_code)
        made.append(c)
        return c

    yield make
    for c in made:
        c.kill()


@contextlib.contextmanager
def environment(**values):
    """Sets environment variables for the duration (the node reads them at start)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
