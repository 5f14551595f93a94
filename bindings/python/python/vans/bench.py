"""``python -m vans.bench``: ps-bench's cases driven from Python, beside the same cases driven
by Rust on the same node, in the same run.

Without ``DMLC_ROLE`` it launches a local cluster of itself (1 scheduler, ``--servers``
servers, 1 worker, as processes on 127.0.0.1) and the worker prints the table. Every server
runs two summing applications: app 0 answers the Python loop (``vans.Worker``), app 1 the
Rust loop (``ps::KvWorker<f32>`` on the same node, exactly ps-bench's loop). Each case is
one key per request (``--keys`` keys spread over the servers), ``window`` requests in
flight; Python and Rust alternate for ``--repeat`` rounds and each keeps its best round.

    python -m vans.bench                          # the default cases
    python -m vans.bench --sizes 8,4194304 --windows 1,64 --json bench.json

Pulls write into preallocated arrays (``pull(keys, out=...)``, ps-lite's ZPull); pushes send
the caller's array without copying it.

Sparse mode (``--keys-per-request N``): each request carries N unique Zipf-distributed ids
(``--zipf``, over ``--vocab`` ids) of ``--value-floats`` floats each, the servers hold
embedding tables (``--table``, applied to every push), and the table gives keys/s and the
user-space copies per pulled byte (``Worker.copied_pull_bytes``: each server's answer is
copied once, into the ``out`` array)::

    python -m vans.bench --servers 4 --keys-per-request 4096 --value-floats 64
"""

import argparse
import collections
import json
import sys
import time

import numpy as np

import vans

MODES = ("push", "pull", "pushpull")
U64_MAX = 2**64 - 1


def options(argv=None):
    p = argparse.ArgumentParser(prog="python -m vans.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="push,pull,pushpull")
    p.add_argument("--sizes", default="8,65536,4194304", help="value bytes per request")
    p.add_argument("--windows", default="1,64", help="requests in flight")
    p.add_argument("--keys", type=int, default=16)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--bytes", type=float, default=256e6,
                   help="bytes each round moves per case (sets the request count)")
    p.add_argument("--max-iters", type=int, default=20_000, help="most requests per round")
    p.add_argument("--repeat", type=int, default=2, help="rounds of each loop per case")
    p.add_argument("--json", default="", help="write the results as JSON here too")
    p.add_argument("--keys-per-request", type=int, default=1,
                   help="sparse mode above 1: unique Zipf ids per request")
    p.add_argument("--value-floats", type=int, default=64, help="sparse mode: floats per id")
    p.add_argument("--zipf", type=float, default=1.1, help="sparse mode: Zipf exponent")
    p.add_argument("--vocab", type=int, default=10_000_000, help="sparse mode: distinct ids")
    p.add_argument("--table", default="optimizer=adagrad lr=0.01 init=normal std=0.01",
                   help="sparse mode: the servers' table settings (dim: --value-floats)")
    o = p.parse_args(argv)
    if o.keys_per_request > 1:
        if o.value_floats <= 0 or o.keys_per_request > o.vocab // 2 or o.zipf < 0:
            p.error("sparse mode: --value-floats positive, --keys-per-request at most half "
                    "of --vocab, --zipf at least 0")
        try:
            o.table = vans.table_spec(f"{o.table} dim={o.value_floats}")
        except ValueError as e:
            p.error(f"--table: {e}")
    o.modes = [m for m in o.modes.split(",") if m]
    o.sizes = [int(s) for s in o.sizes.split(",") if s]
    o.windows = [int(w) for w in o.windows.split(",") if w]
    for m in o.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; use {', '.join(MODES)}")
    if any(s <= 0 or s % 4 for s in o.sizes) or any(w <= 0 for w in o.windows):
        p.error("sizes must be positive multiples of 4 (float32 values), windows positive")
    return o


def keys_for(o, size):
    """ps-bench's keys: spread over the servers, offset by the size (one value length per
    key in the summing store)."""
    step = U64_MAX // o.keys
    return [(step * i + size) % 2**64 for i in range(o.keys)]


def python_round(worker, mode, key_arrays, floats, window, iters):
    """The ps-bench loop in Python: each request the next of ``key_arrays`` (sorted uint64)
    with ``floats`` values, pulls into preallocated arrays; seconds taken."""
    vals = np.ones(floats, dtype=np.float32)
    outs = [np.empty(floats, dtype=np.float32) for _ in range(window)]
    push, pull, push_pull = worker.push_async, worker.pull_async, worker.push_pull_async
    in_flight = collections.deque()
    started = time.perf_counter()
    for i in range(iters):
        if len(in_flight) == window:
            in_flight.popleft().wait()
        k = key_arrays[i % len(key_arrays)]
        if mode == "push":
            in_flight.append(push(k, vals))
        elif mode == "pull":
            in_flight.append(pull(k, out=outs[i % window]))
        else:
            in_flight.append(push_pull(k, vals, out=outs[i % window]))
    while in_flight:
        in_flight.popleft().wait()
    return time.perf_counter() - started


def _splitmix(z):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sparse_key_sets(o, sets=32, seed=7):
    """``sets`` requests' keys: ``--keys-per-request`` unique ids each, sorted, from Zipf
    ranks (the continuous power law's inverse CDF over ``--vocab``) spread over the key
    space."""
    rng = np.random.default_rng(seed)
    n, s = o.vocab + 1.0, o.zipf
    out = []
    for _ in range(sets):
        ids = np.empty(0, dtype=np.uint64)
        while len(ids) < o.keys_per_request:
            u = rng.random(2 * o.keys_per_request)
            x = n ** u if abs(s - 1) < 1e-9 else ((n ** (1 - s) - 1) * u + 1) ** (1 / (1 - s))
            ranks = np.minimum(x.astype(np.uint64) - np.uint64(1), np.uint64(o.vocab - 1))
            with np.errstate(over="ignore"):
                ids = np.union1d(ids, _splitmix(ranks))
        out.append(np.sort(rng.choice(ids, o.keys_per_request, replace=False)))
    return out


def run_sparse_worker(o, node):
    py_worker = vans.Worker(node, dtype="float32", app_id=0)
    rust = vans._native.RustBench(node, 1)
    key_sets = sparse_key_sets(o)
    rust_sets = [k.tolist() for k in key_sets]
    n, floats = o.keys_per_request, o.value_floats
    size = n * floats * 4
    rows = []
    pulled = 0
    for mode in o.modes:
        for window in o.windows:
            iters = int(max(window * 4, min(o.max_iters, o.bytes / size)))
            py_best = rust_best = float("inf")
            for _ in range(o.repeat):
                py_best = min(py_best, python_round(py_worker, mode, key_sets, n * floats,
                                                    window, iters))
                rust_best = min(rust_best, rust.run_sparse(mode, rust_sets, floats, window,
                                                           iters))
            if mode != "push":
                pulled += o.repeat * iters * size
            row = {"mode": mode, "size": size, "window": window, "iters": iters,
                   "keys_per_request": n, "value_floats": floats,
                   "python_ops": iters / py_best, "rust_ops": iters / rust_best}
            row["python_keys"] = row["python_ops"] * n
            row["rust_keys"] = row["rust_ops"] * n
            row["python_gbps"] = row["python_ops"] * size / 1e9
            row["rust_gbps"] = row["rust_ops"] * size / 1e9
            row["ratio"] = row["python_ops"] / row["rust_ops"]
            rows.append(row)
            print(f"  {mode:>8} {n} ids x {floats} floats x{window:<3} python "
                  f"{row['python_keys']:>12,.0f} keys/s  rust {row['rust_keys']:>12,.0f} keys/s"
                  f"  ratio {row['ratio']:.2f}", flush=True)
    copies = py_worker.copied_pull_bytes / pulled if pulled else None
    return rows, copies


def sparse_table(rows, copies):
    lines = [f"{'case':<30}{'python keys/s':>15}{'rust keys/s':>15}{'python GB/s':>13}"
             f"{'rust GB/s':>11}{'py/rust':>9}"]
    for r in rows:
        case = f"{r['mode']} {r['keys_per_request']}x{r['value_floats']} x{r['window']}"
        lines.append(f"{case:<30}{r['python_keys']:>15,.0f}{r['rust_keys']:>15,.0f}"
                     f"{r['python_gbps']:>13.3f}{r['rust_gbps']:>11.3f}{r['ratio']:>9.2f}")
    if copies is not None:
        lines.append(f"user-space copies per pulled byte (Python worker): {copies:.3f}")
    return "\n".join(lines)


def run_worker(o, node):
    py_worker = vans.Worker(node, dtype="float32", app_id=0)
    rust = vans._native.RustBench(node, 1)
    rows = []
    for size in o.sizes:
        keys = keys_for(o, size)
        key_arrays = [np.array([k], dtype=np.uint64) for k in keys]
        # Every key holds a value of this size before anything is pulled.
        for one in key_arrays:
            py_worker.push(one, np.zeros(size // 4, dtype=np.float32))
        rust.run("push", keys, size, 1, len(keys))
        for mode in o.modes:
            for window in o.windows:
                iters = int(max(window * 4, min(o.max_iters, o.bytes / size)))
                py_best = rust_best = float("inf")
                for _ in range(o.repeat):
                    py_best = min(py_best, python_round(py_worker, mode, key_arrays, size // 4,
                                                        window, iters))
                    rust_best = min(rust_best, rust.run(mode, keys, size, window, iters))
                row = {
                    "mode": mode, "size": size, "window": window, "iters": iters,
                    "python_ops": iters / py_best, "rust_ops": iters / rust_best,
                }
                row["python_gbps"] = row["python_ops"] * size / 1e9
                row["rust_gbps"] = row["rust_ops"] * size / 1e9
                row["ratio"] = row["python_ops"] / row["rust_ops"]
                rows.append(row)
                print(f"  {mode:>8} {human(size):>8} x{window:<3} "
                      f"python {row['python_ops']:>10.0f} ops/s  "
                      f"rust {row['rust_ops']:>10.0f} ops/s  ratio {row['ratio']:.2f}",
                      flush=True)
    return rows


def human(size):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def table(rows):
    lines = [f"{'case':<24}{'python ops/s':>14}{'rust ops/s':>14}{'python GB/s':>13}"
             f"{'rust GB/s':>11}{'py/rust':>9}"]
    for r in rows:
        case = f"{r['mode']} {human(r['size'])} x{r['window']}"
        lines.append(f"{case:<24}{r['python_ops']:>14,.0f}{r['rust_ops']:>14,.0f}"
                     f"{r['python_gbps']:>13.3f}{r['rust_gbps']:>11.3f}{r['ratio']:>9.2f}")
    return "\n".join(lines)


def node_main(o):
    node = vans.Node()
    sparse = o.keys_per_request > 1
    if node.role == "server":
        serving = dict(table=o.table) if sparse else dict(dtype="float32")
        vans.Server(node, app_id=0, **serving)
        vans.Server(node, app_id=1, **serving).serve()
    elif node.role == "worker":
        print(f"vans.bench: worker on {node.num_servers} server(s); each case: python, then "
              f"rust, {o.repeat} rounds, best of each", flush=True)
        if sparse:
            rows, copies = run_sparse_worker(o, node)
            print("\n" + sparse_table(rows, copies), flush=True)
            result = {"rows": rows, "copies_per_pulled_byte": copies}
        else:
            rows = run_worker(o, node)
            print("\n" + table(rows), flush=True)
            result = rows
        if o.json:
            with open(o.json, "w") as f:
                json.dump(result, f, indent=1)
        node.finalize()
    else:
        node.finalize()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    o = options(argv)
    if vans.node_role():
        node_main(o)
        return 0
    vans.launch(o.servers, 1, program=sys.executable, args=["-m", "vans.bench", *argv],
                timeout=3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
