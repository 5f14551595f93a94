"""TensorFlow's runtime over gRPC and over vans, in one run: the same graphs on the same
cluster shapes under ``grpc`` and each vans protocol, step time p50/p99 and the ratio to
``grpc``, and the bytes copied per received tensor byte; ``local`` runs the same graph in one
process, the floor no transport can go below.

    python -m vans.tensorflow.bench                       # every workload, both shapes
    python -m vans.tensorflow.bench --workloads small --shapes 1x1 --steps 50 --json out.json
    python -m vans.tensorflow.bench --rounds 3 --plot ratios.png  # interleaved, medians

Each cluster is real: one process per task (ps tasks and worker tasks, on 127.0.0.1), each a
``tf.distribute.Server`` with the protocol under test; ``worker:0`` is the client and builds
one tower per worker task (in-graph replication), so a step moves, per worker:

- ``small``: 200 variables of 1 KiB on the ps tasks, each read by the worker;
- ``16MiB``, ``64MiB``: one variable of that size on ps:0, read by the worker;
- ``sparse``: an embedding lookup of 4,096 ids in a 100,000 x 32 float table partitioned over
  the ps tasks, and its IndexedSlices gradient applied there (SGD).

``--threads N`` gives every task (and the ``local`` process) N inter-op and N intra-op
threads, under every protocol alike, as one would when the tasks outnumber the cores; by
default TensorFlow sizes both pools by the cores, in every task.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

WORKLOADS = ["small", "16MiB", "64MiB", "sparse"]
SHAPES = ["1x1", "2x4"]
PROTOCOLS = ["local", "grpc", "grpc+vans", "grpc+vans+push"]


def build(workload, num_ps, num_workers, local=False):
    """The fetches of one step of ``workload``; ``local``: every op on this process's CPU
    (the same graph with no transport at all)."""
    import tensorflow as tf

    def device(job, task):
        return "/device:CPU:0" if local else f"/job:{job}/task:{task}"

    init = tf.compat.v1.random_normal_initializer(stddev=0.1, seed=1)
    with tf.compat.v1.variable_scope(workload):
        if workload == "small":
            variables = []
            for i in range(200):
                with tf.device(device("ps", i % num_ps)):
                    variables.append(tf.compat.v1.get_variable(f"v{i}", [256],
                                                               initializer=init))
            reads = []
            for w in range(num_workers):
                with tf.device(device("worker", w)):
                    reads.append(tf.add_n([tf.reduce_sum(v) for v in variables]))
            with tf.device(device("worker", 0)):
                return tf.add_n(reads)
        if workload.endswith("MiB"):
            floats = int(workload[:-3]) * (1 << 20) // 4
            with tf.device(device("ps", 0)):
                big = tf.compat.v1.get_variable("big", [floats], initializer=init)
            reads = []
            for w in range(num_workers):
                with tf.device(device("worker", w)):
                    reads.append(tf.reduce_sum(tf.identity(big)))
            with tf.device(device("worker", 0)):
                return tf.add_n(reads)
        setter = (device("ps", 0) if local else
                  tf.compat.v1.train.replica_device_setter(ps_tasks=num_ps, ps_device="/job:ps"))
        with tf.compat.v1.device(setter):
            table = tf.compat.v1.get_variable(
                "table", [100_000, 32], initializer=init,
                partitioner=tf.compat.v1.fixed_size_partitioner(num_ps))
        losses = []
        for w in range(num_workers):
            with tf.device(device("worker", w)):
                ids = tf.random.uniform([4096], 0, 100_000, dtype=tf.int64, seed=w)
                losses.append(tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, ids))))
        with tf.device(device("worker", 0)):
            loss = tf.add_n(losses)
            train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
                loss, colocate_gradients_with_ops=True)
            with tf.control_dependencies([train]):
                return tf.identity(loss)


def session_config(args):
    """The ConfigProto of every task and of the client's session: ``--threads`` for both
    thread pools, or TensorFlow's defaults."""
    import tensorflow as tf

    if not args.threads:
        return None
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=args.threads,
                                    intra_op_parallelism_threads=args.threads)


def client(args, server):
    """worker:0 (or, for the ``local`` reference, the only process): builds the workloads'
    graphs, times ``args.steps`` steps of each, prints one JSON line per workload."""
    import tensorflow as tf

    import vans.tensorflow as vtf

    tf.compat.v1.disable_eager_execution()
    cluster = json.loads(args.cluster)
    num_ps, num_workers = len(cluster["ps"]), len(cluster["worker"])
    local = server is None
    fetches = {w: build(w, num_ps, num_workers, local) for w in args.workloads.split(",")}
    with tf.compat.v1.Session(None if local else server.target,
                              config=session_config(args)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for workload, fetch in fetches.items():
            for _ in range(args.warmup):
                sess.run(fetch)
            before = vtf.runtime_stats()
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                sess.run(fetch)
                times.append(time.perf_counter() - start)
            after = vtf.runtime_stats()
            delta = {k: after[k] - before[k] for k in after}
            print("RESULT " + json.dumps({
                "workload": workload, "protocol": args.protocol,
                "p50_ms": float(np.percentile(times, 50)) * 1e3,
                "p99_ms": float(np.percentile(times, 99)) * 1e3,
                "received": delta["received"], "received_bytes": delta["received_bytes"],
                "copied_bytes": delta["copied_bytes"],
                "pool_allocated": delta["pool_allocated"],
                "pool_reused": delta["pool_reused"]}), flush=True)
    os._exit(0)


def task(args):
    """One task's process: a server; worker:0 also the client."""
    import tensorflow as tf

    import vans.tensorflow  # noqa: F401  (registers the vans protocols)

    if args.protocol == "local":
        client(args, None)
    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(args.cluster)),
                                  job_name=args.job, task_index=args.task,
                                  protocol=args.protocol, config=session_config(args),
                                  start=True)
    if (args.job, args.task) == ("worker", 0):
        client(args, server)
    server.join()


def run_cluster(protocol, shape, workloads, steps, warmup, threads=0):
    """Runs one cluster of ``shape`` (``PSxWORKERS``) under ``protocol``; its result rows."""
    import vans

    num_ps, num_workers = (int(n) for n in shape.split("x"))
    spec = {"ps": [f"127.0.0.1:{vans.free_port()}" for _ in range(num_ps)],
            "worker": [f"127.0.0.1:{vans.free_port()}" for _ in range(num_workers)]}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "TF_CONFIG"))}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    procs = {}
    for job, addresses in spec.items():
        for index in range(len(addresses)):
            if protocol == "local" and (job, index) != ("worker", 0):
                continue
            procs[(job, index)] = subprocess.Popen(
                [sys.executable, "-m", "vans.tensorflow.bench", "--task-of", json.dumps(spec),
                 "--job", job, "--task", str(index), "--protocol", protocol,
                 "--workloads", ",".join(workloads), "--steps", str(steps),
                 "--warmup", str(warmup), "--threads", str(threads)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = procs[("worker", 0)].communicate(timeout=1800)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    rows = [json.loads(line[len("RESULT "):]) for line in out.splitlines()
            if line.startswith("RESULT ")]
    if len(rows) != len(workloads):
        raise RuntimeError(f"the {protocol} cluster {shape} failed:\n{out[-4000:]}")
    for row in rows:
        row["shape"] = shape
    return rows


def summarize(rows):
    """One row per workload, shape and protocol: the medians over rounds of p50 and p99,
    and the bytes copied per received byte over all rounds."""
    groups = {}
    for r in rows:
        groups.setdefault((r["workload"], r["shape"], r["protocol"]), []).append(r)
    out = []
    for (workload, shape, protocol), rs in groups.items():
        received = sum(r["received_bytes"] for r in rs)
        out.append({
            "workload": workload, "shape": shape, "protocol": protocol, "rounds": len(rs),
            "p50_ms": float(np.median([r["p50_ms"] for r in rs])),
            "p99_ms": float(np.median([r["p99_ms"] for r in rs])),
            "received": sum(r["received"] for r in rs), "received_bytes": received,
            "copies_per_byte": (sum(r["copied_bytes"] for r in rs) / received
                                if received else None),
            # Buffers of received tensors of 1 MiB and more: new, and recycled.
            "pool_allocated": sum(r.get("pool_allocated", 0) for r in rs),
            "pool_reused": sum(r.get("pool_reused", 0) for r in rs)})
    return out


def _order(summary):
    return sorted({(r["workload"], r["shape"]) for r in summary},
                  key=lambda k: (WORKLOADS.index(k[0]) if k[0] in WORKLOADS else 99, k[1]))


def table(summary, protocols):
    """The summary as a table a person reads: p50/p99 per protocol, each vans protocol's
    p50 ratio to grpc (above 1: faster than grpc) and bytes copied per received byte;
    ``local`` is the same graph in one process, with no transport."""
    by = {(r["workload"], r["shape"], r["protocol"]): r for r in summary}
    head = f"{'workload':<8} {'shape':<5}"
    for p in protocols:
        head += f" | {p + ' p50/p99 ms':>25}"
        if p not in ("grpc", "local"):
            head += f" {'x grpc':>6} {'copies/B':>8}"
    lines = [head, "-" * len(head)]
    for workload, shape in _order(summary):
        line = f"{workload:<8} {shape:<5}"
        base = by.get((workload, shape, "grpc"))
        for p in protocols:
            r = by.get((workload, shape, p))
            extra = p not in ("grpc", "local")
            if r is None:
                line += f" | {'-':>25}" + (f" {'-':>6} {'-':>8}" if extra else "")
                continue
            line += f" | {r['p50_ms']:>11.2f} / {r['p99_ms']:>9.2f}"
            if extra:
                ratio = base["p50_ms"] / r["p50_ms"] if base else float("nan")
                copies = r["copies_per_byte"]
                line += f" {ratio:>6.2f} {copies if copies is not None else float('nan'):>8.2f}"
        lines.append(line)
    return "\n".join(lines)


def plot(summary, protocols, path):
    """Each vans protocol's speed-up over grpc per workload and shape, as a bar chart."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "--plot needs matplotlib: pip install matplotlib (or vans[plot])") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["workload"], r["shape"], r["protocol"]): r for r in summary}
    keys = _order(summary)
    fig, ax = plt.subplots(figsize=(max(6, len(keys) * 1.2), 4))
    vans_protocols = [p for p in protocols if p not in ("grpc", "local")]
    width = 0.8 / max(1, len(vans_protocols))
    for i, p in enumerate(vans_protocols):
        ratios = [by[(w, s, "grpc")]["p50_ms"] / by[(w, s, p)]["p50_ms"]
                  if (w, s, p) in by and (w, s, "grpc") in by else 0 for w, s in keys]
        ax.bar([k + i * width for k in range(len(keys))], ratios, width, label=p)
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
    ax.set_xticklabels([f"{w}\n{s}" for w, s in keys])
    ax.set_ylabel("step time of grpc / protocol (p50)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    parser = argparse.ArgumentParser(
        prog="python -m vans.tensorflow.bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, of {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help="comma-separated PSxWORKERS cluster shapes (default: 1x1,2x4)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS),
                        help="comma-separated, of local (the same graph in one process, no "
                             "transport), grpc (the reference) and the vans protocols "
                             "(default: local,grpc,grpc+vans,grpc+vans+push)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per workload")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=0,
                        help="inter-op and intra-op threads of every task, every protocol "
                             "alike (default 0: TensorFlow's, by the cores)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="clusters per protocol and shape, interleaved; the table shows "
                             "the medians of their p50 and p99")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--plot", metavar="PNG", help="also plot the ratios (matplotlib)")
    # A task of a cluster this benchmark started (internal).
    parser.add_argument("--task-of", dest="cluster", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--task", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--protocol", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cluster:
        task(args)
        return
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; expected some of {WORKLOADS}")
    if args.threads < 0:
        parser.error(f"--threads {args.threads}: expected 0 (TensorFlow's default) or more")
    protocols = args.protocols.split(",")
    shapes = args.shapes.split(",")
    for shape in shapes:
        parts = shape.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            parser.error(f"shape {shape!r}: expected PSxWORKERS, such as 2x4")
    rows = []
    # Rounds interleave the protocols, so a slow moment of the machine touches all of them.
    for round_ in range(args.rounds):
        for shape in shapes:
            for protocol in protocols:
                print(f"== round {round_ + 1}/{args.rounds}: {protocol}, {shape} "
                      f"(ps x workers): {', '.join(workloads)}", flush=True)
                for row in run_cluster(protocol, shape, workloads, args.steps, args.warmup,
                                       args.threads):
                    row["round"] = round_
                    rows.append(row)
    summary = summarize(rows)
    print("threads per task: " + (f"{args.threads} inter-op, {args.threads} intra-op"
                                  if args.threads else "TensorFlow's default (by the cores)"))
    print(table(summary, protocols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)
    if args.plot:
        plot(summary, protocols, args.plot)

if __name__ == "__main__":
    main()
