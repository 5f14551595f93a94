"""The Rust code's log records reach Python's `logging` (logger `vans`): `PS_VERBOSE` works
from Python as it does for the Rust programs, and so does configuring `logging` itself. A
worker with no scheduler is the probe: its bootstrap logs "waiting for the scheduler" at
info level at once, then fails at its (1 s) deadline."""

import os
import subprocess
import sys

import vans

PROBE = """
{setup}
import vans
try:
    vans.Node()
except vans.errors.BootstrapError as e:
    print("bootstrap failed:", e, flush=True)
"""


def run(setup="", **env):
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("DMLC_", "PS_VERBOSE", "RUST_LOG"))}
    base.update(DMLC_ROLE="worker", DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="1",
                DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(vans.free_port()),
                VANS_BOOTSTRAP_TIMEOUT_SECS="1", **env)
    done = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)],
                          capture_output=True, text=True, timeout=60, env=base)
    assert "bootstrap failed" in done.stdout, done.stdout + done.stderr
    return done.stderr


def test_ps_verbose_shows_info_records_on_stderr():
    said = run(PS_VERBOSE="1")
    assert "INFO vans.node.postoffice.join: waiting for the scheduler at 127.0.0.1:" in said, said


def test_pythons_logging_configuration_is_honoured():
    said = run('import logging; logging.basicConfig(level=logging.INFO, '
               'format="%(levelname)s|%(name)s|%(message)s")')
    assert "INFO|vans.node.postoffice.join|waiting for the scheduler" in said, said


def test_the_default_keeps_info_records_back():
    said = run()
    assert "waiting for the scheduler" not in said, said
