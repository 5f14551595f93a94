"""vans.tensorflow's checks (tf_scripts/tf_checks.py: the ops against table server
processes, the Keras layer eagerly, in tf.function and in model.fit), run by a pytest process
of their own: TensorFlow and torch's compiler stack (triton, which torch.optim loads) abort
when both are loaded into one process, and this suite's process loads torch."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="TensorFlow is not installed")
def test_tensorflow_checks_pass_in_a_process_of_their_own():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(HERE / "tf_scripts" / "tf_checks.py")],
        cwd=HERE, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "3 passed" in run.stdout, run.stdout[-3000:]
