"""Embedding tables with server-side optimizers from Python (``vans.Server(optimizer=...)``):
each optimizer against its reference (torch.optim's, FTRL-Proximal's formulas), rows touched
at different rates, over two real server processes; the two-phase synchronous step; the
settings' errors."""

import numpy as np
import pytest
import vans

torch = pytest.importorskip("torch")

DIM = 4
# Two keys on each of the two servers.
KEYS = np.array([3, 17, 2**63 + 5, 2**64 - 9], dtype=np.uint64)
# The keys each step pushes: rows are touched at different rates (Adam's per-row step count).
STEPS = [[0, 1, 2, 3], [0, 2], [0, 1, 2, 3], [1, 3], [3], [0, 1, 2, 3]]

TABLE_SERVER = """
import os, vans
vans.Server(table=os.environ["TEST_TABLE"]).serve()
"""


def gradient(step, key_index):
    rng = np.random.default_rng(1000 * step + key_index)
    return rng.normal(size=DIM).astype(np.float32)


def torch_reference(make_optimizer, rows):
    """Each row its own parameter, so that a row not pushed at a step is not stepped."""
    params = [torch.nn.Parameter(torch.tensor(row)) for row in rows]
    optimizer = make_optimizer(params)
    for step, touched in enumerate(STEPS):
        for i, p in enumerate(params):
            p.grad = torch.tensor(gradient(step, i)) if i in touched else None
        optimizer.step()
    return np.stack([p.detach().numpy() for p in params])


def ftrl_reference(rows, lr, beta, l1, l2):
    """FTRL-Proximal (McMahan et al. 2013), per coordinate, as ps::optim documents it."""
    w = np.array(rows, dtype=np.float64)
    z = np.zeros_like(w)
    n = np.zeros_like(w)
    for step, touched in enumerate(STEPS):
        for i in touched:
            g = gradient(step, i).astype(np.float64)
            sigma = (np.sqrt(n[i] + g * g) - np.sqrt(n[i])) / lr
            z[i] += g - sigma * w[i]
            n[i] += g * g
            w[i] = np.where(np.abs(z[i]) <= l1, 0.0,
                            -(z[i] - np.sign(z[i]) * l1) / ((beta + np.sqrt(n[i])) / lr + l2))
    return w


CASES = {
    "sgd": ("optimizer=sgd lr=0.1",
            lambda p: torch.optim.SGD(p, lr=0.1)),
    "momentum": ("optimizer=momentum lr=0.05 momentum=0.9",
                 lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "nesterov": ("optimizer=momentum lr=0.05 momentum=0.8 nesterov=true",
                 lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True)),
    "adagrad": ("optimizer=adagrad lr=0.3 initial_accumulator=0.1 eps=1e-10",
                lambda p: torch.optim.Adagrad(p, lr=0.3, initial_accumulator_value=0.1,
                                              eps=1e-10)),
    "adam": ("optimizer=adam lr=0.02 beta1=0.8 beta2=0.99 eps=1e-8",
             lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-8)),
    "ftrl": ("optimizer=ftrl lr=0.5 beta=1 l1=0.05 l2=0.01", None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_optimizer_steps_rows_as_its_reference(cluster, name):
    settings, make_optimizer = CASES[name]
    spec = vans.table_spec(f"{settings} dim={DIM} init=normal std=0.5 seed=7")
    c = cluster(num_servers=2, server_code=TABLE_SERVER, env={"TEST_TABLE": spec})
    w = vans.Worker(dtype="float32", **c.config())
    # First touch: the seeded initializer's rows, the same on any server.
    initial = vans.table_initial_rows(spec, KEYS).reshape(len(KEYS), DIM)
    assert np.abs(initial).max() > 0.1
    out = np.zeros(len(KEYS) * DIM, dtype=np.float32)
    assert w.pull(KEYS, out=out) is out
    np.testing.assert_array_equal(out.reshape(len(KEYS), DIM), initial)
    for step, touched in enumerate(STEPS):
        keys = KEYS[touched]
        grads = np.concatenate([gradient(step, i) for i in touched])
        w.push(keys, grads)
    got = w.pull(KEYS).reshape(len(KEYS), DIM)
    if make_optimizer is None:
        expect = ftrl_reference(initial, lr=0.5, beta=1.0, l1=0.05, l2=0.01)
    else:
        expect = torch_reference(make_optimizer, initial)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
    # Every row moved, and differently from plain SGD unless it is SGD.
    assert not np.allclose(got, initial)
    w.node.finalize()
    c.join()


def test_accumulated_gradients_step_once_with_their_sum(cluster):
    spec = vans.table_spec(optimizer="adam", dim=DIM, lr=0.1, init="zeros")
    c = cluster(num_servers=2, server_code=TABLE_SERVER, env={"TEST_TABLE": spec})
    w = vans.Worker(dtype="float32", **c.config())
    a = np.linspace(-1, 1, len(KEYS) * DIM, dtype=np.float32)
    b = np.linspace(2, -3, len(KEYS) * DIM, dtype=np.float32)
    w.push(KEYS, a, cmd=vans.ACCUMULATE_CMD)
    w.push(KEYS, b, cmd=vans.ACCUMULATE_CMD)
    # Not applied yet: a plain pull sees the initial (zero) rows.
    np.testing.assert_array_equal(w.pull(KEYS), np.zeros(len(KEYS) * DIM))
    got = w.pull(KEYS, cmd=vans.APPLY_CMD)
    params = [torch.nn.Parameter(torch.zeros(DIM)) for _ in KEYS]
    optimizer = torch.optim.Adam(params, lr=0.1)
    for i, p in enumerate(params):
        p.grad = torch.tensor(a[i * DIM:(i + 1) * DIM] + b[i * DIM:(i + 1) * DIM])
    optimizer.step()
    expect = np.concatenate([p.detach().numpy() for p in params])
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-7)
    # A second apply with nothing accumulated changes nothing.
    np.testing.assert_array_equal(w.pull(KEYS, cmd=vans.APPLY_CMD), got)
    # A push of the wrong width is refused by the server, naming the table's dim.
    with pytest.raises(vans.errors.HandlerFailedError, match="dim 4"):
        w.push(KEYS, np.ones(len(KEYS) * 3, dtype=np.float32))
    np.testing.assert_array_equal(w.pull(KEYS), got)
    w.node.finalize()
    c.join()


def test_table_settings_are_checked():
    assert vans.table_spec(optimizer="adam", dim=8, lr=0.01).startswith(
        "optimizer=adam dim=8 lr=0.01 beta1=0.9")
    assert "nesterov=true" in vans.table_spec("optimizer=momentum dim=2", nesterov=True)
    with pytest.raises(ValueError, match="beta1 is not a setting of optimizer sgd"):
        vans.table_spec(dim=4, beta1=0.9)
    with pytest.raises(ValueError, match="bogus is not a table setting"):
        vans.table_spec(dim=4, bogus=1)
    with pytest.raises(ValueError, match="dim=0"):
        vans.table_spec(dim=0)
    with pytest.raises(ValueError, match="needs at least dim"):
        vans.table_spec()
    with pytest.raises(TypeError, match="float32 rows"):
        vans.Server(dtype="int64", optimizer="sgd", dim=4, role="server", num_servers=1,
                    num_workers=1, root_uri="127.0.0.1", root_port=1)


def test_the_sparse_bench_measures_python_beside_rust(tmp_path):
    import json
    import subprocess
    import sys
    out = tmp_path / "sparse.json"
    run = subprocess.run(
        [sys.executable, "-m", "vans.bench", "--servers", "2", "--keys-per-request", "256",
         "--value-floats", "8", "--windows", "2", "--repeat", "1", "--bytes", "2e6",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert [r["mode"] for r in result["rows"]] == ["push", "pull", "pushpull"]
    for r in result["rows"]:
        assert r["keys_per_request"] == 256 and r["python_keys"] > 0 and r["rust_keys"] > 0
    # Pulls into out= arrays: each pulled byte copied once, from its frame into the array.
    assert result["copies_per_pulled_byte"] == 1.0
    assert "python keys/s" in run.stdout
