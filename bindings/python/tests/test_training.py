"""The training example on a small configuration: synchronous data-parallel SGD on 2 servers
x 2 workers reaches the single-process baseline's final loss within 1%, and both modes learn."""

import json
import os
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "sparse_lr.py"


def test_sync_training_matches_the_baseline(tmp_path):
    figures = tmp_path / "figures.json"
    plot = tmp_path / "loss.png"
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--small", "--json", str(figures), "--plot", str(plot)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "sync epoch 3/3" in run.stdout and "async epoch 3/3" in run.stdout
    results = json.loads(figures.read_text())["results"]
    sync, asynchronous, baseline = results["sync"], results["async"], results["baseline"]
    assert len(sync) == len(baseline) == 4  # epochs 0..3
    final = baseline[-1]["train_loss"]
    assert abs(sync[-1]["train_loss"] / final - 1) < 0.01, (sync[-1], baseline[-1])
    for run_figures in (sync, asynchronous, baseline):
        losses = [m["train_loss"] for m in run_figures]
        assert losses[-1] < 0.5 * losses[0], losses  # it learned
    assert abs(asynchronous[-1]["train_loss"] / final - 1) < 0.1
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_plot_dependency_stops_the_example_before_it_trains(tmp_path):
    # A matplotlib that cannot be imported, first on the path.
    blocked = tmp_path / "matplotlib"
    blocked.mkdir()
    (blocked / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--small", "--plot", str(tmp_path / "loss.png")],
        capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode != 0
    assert "pip install './bindings/python[plot]'" in run.stderr, run.stderr
    assert "epoch" not in run.stdout, run.stdout  # nothing trained
    # Without a plot it needs no matplotlib (a single quick mode to keep the test short).
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--small", "--plot", "", "--modes", "async"],
        capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "async epoch 3/3" in run.stdout
