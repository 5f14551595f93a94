"""MultiWorkerMirroredStrategy's all-reduce over gRPC and over vans, in one run: worker tasks
on 127.0.0.1 (one process each, ring collectives on CPU) all-reduce a float32 tensor of each
size again and again under ``grpc`` and each vans protocol; p50/p99 per call and the ratio to
``grpc`` (above 1: faster), medians over interleaved rounds.

    python -m vans.tensorflow.collective_bench                 # 2 workers, 1 KiB to 16 MiB
    python -m vans.tensorflow.collective_bench --workers 3 --steps 50 --rounds 3 --json out.json

A call is one ``strategy.run`` of a ``tf.function`` that all-reduces the worker's tensor,
timed on worker 0 until its result is on the host.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SIZES = {"1KiB": 1 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20}
PROTOCOLS = ["grpc", "grpc+vans", "grpc+vans+push"]


def worker(args):
    """One worker task: all-reduces each size ``--steps`` times after a warm-up, printing a
    ``timing SIZE`` line before each size and a JSON line of its times (ms) at the end."""
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": json.loads(args.cluster), "task": {"type": "worker", "index": args.task},
        "rpc_layer": args.protocol})
    import tensorflow as tf

    import vans.tensorflow  # noqa: F401  (registers the vans protocols)

    ring = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=ring)
    times = {}
    for name in args.sizes.split(","):
        floats = SIZES[name] // 4

        @tf.function
        def step(floats=floats):
            def fn():
                ctx = tf.distribute.get_replica_context()
                mine = tf.fill([floats], tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32))
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, mine)
            return strategy.run(fn)

        for _ in range(args.warmup):
            step()
        print(f"timing {name}", flush=True)
        taken = []
        for _ in range(args.steps):
            start = time.perf_counter()
            out = step()
            first = float(strategy.experimental_local_results(out)[0][0])
            taken.append((time.perf_counter() - start) * 1e3)
        workers = strategy.num_replicas_in_sync
        if first != workers * (workers + 1) / 2:
            raise SystemExit(f"all-reduce of {name} gave {first}, not the sum of 1..{workers}")
        times[name] = taken
    print(json.dumps({"task": args.task, "times_ms": times}), flush=True)
    leave_together(args.task, strategy.num_replicas_in_sync)


def leave_together(task, workers, timeout=120):
    """Ends this worker task's process once every worker task has come this far (each
    leaves a file in the working directory, which the job's tasks share, named after the
    job's first address): a task that left right after its last collective could take a
    chunk another task still needs with it. Leaves at once (``os._exit``): TensorFlow's gRPC
    server cannot be shut down."""
    job = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0].replace(":", "-")
    open(f"done.{job}.{task}", "w").close()
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(f"done.{job}.{i}") for i in range(workers)):
        if time.monotonic() > deadline:
            print(f"worker {task}: the other tasks did not finish within {timeout} s",
                  flush=True)
            os._exit(1)
        time.sleep(0.05)
    os._exit(0)


def run_workers(command, workers, timeout=900, cwd=None, addresses=None, wrap=None):
    """Runs a job of ``workers`` worker tasks, one process each: task ``i`` runs
    ``command(cluster, i)`` (``cluster`` the cluster spec as JSON), prefixed by ``wrap(i)``
    when given (``ip netns exec HOST``), with no ``DMLC_*`` or ``TF_CONFIG`` of this
    process; the tasks listen on ``addresses`` (default: free ports of 127.0.0.1). Waits for
    all; their exit codes and outputs."""
    import vans

    if addresses is None:
        addresses = [f"127.0.0.1:{vans.free_port()}" for _ in range(workers)]
    cluster = json.dumps({"worker": list(addresses)})
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("DMLC_", "TF_CONFIG"))}
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    procs = [subprocess.Popen((wrap(i) if wrap else []) + command(cluster, i),
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=environment, cwd=cwd)
             for i in range(workers)]
    try:
        outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return [proc.returncode for proc in procs], outputs


def run(protocol, workers, sizes, steps, warmup):
    """One job of ``workers`` tasks over ``protocol``; worker 0's times per size."""
    with tempfile.TemporaryDirectory(prefix="vans-collective-bench-") as directory:
        codes, outputs = run_workers(
            lambda cluster, i: [sys.executable, "-m", "vans.tensorflow.collective_bench",
                                "--task-of", cluster, "--task", str(i), "--protocol", protocol,
                                "--sizes", sizes, "--steps", str(steps),
                                "--warmup", str(warmup)],
            workers, cwd=directory)
    for i, (code, text) in enumerate(zip(codes, outputs)):
        if code != 0:
            raise SystemExit(f"worker {i} over {protocol} failed:\n{text[-3000:]}")
    for line in outputs[0].splitlines():
        if line.startswith("{"):
            return json.loads(line)["times_ms"]
    raise SystemExit(f"worker 0 over {protocol} printed no times:\n{outputs[0][-3000:]}")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker tasks (default 2)")
    parser.add_argument("--sizes", default=",".join(SIZES),
                        help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS),
                        help="comma-separated; grpc is the reference")
    parser.add_argument("--steps", type=int, default=30, help="timed calls per size")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of every protocol, interleaved; medians are reported")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--task-of", dest="cluster", help=argparse.SUPPRESS)
    parser.add_argument("--task", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--protocol", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cluster is not None:
        worker(args)
        return
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or args.workers < 2 or args.steps < 1 or args.rounds < 1:
        parser.error(f"sizes must be of {', '.join(SIZES)} (not {unknown}); --workers at "
                     "least 2; --steps and --rounds at least 1")
    protocols = args.protocols.split(",")
    p50 = {p: {s: [] for s in sizes} for p in protocols}
    p99 = {p: {s: [] for s in sizes} for p in protocols}
    for round_ in range(args.rounds):
        for protocol in protocols:
            started = time.monotonic()
            times = run(protocol, args.workers, args.sizes, args.steps, args.warmup)
            for size in sizes:
                p50[protocol][size].append(float(np.percentile(times[size], 50)))
                p99[protocol][size].append(float(np.percentile(times[size], 99)))
            print(f"round {round_ + 1}/{args.rounds}: {protocol} done in "
                  f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for size in sizes:
        row = {"size": size, "workers": args.workers}
        for protocol in protocols:
            row[protocol] = {"p50_ms": float(np.median(p50[protocol][size])),
                             "p99_ms": float(np.median(p99[protocol][size]))}
        rows.append(row)
    header = ["size"] + [f"{p} p50/p99" for p in protocols]
    header += [f"x {p}" for p in protocols if p != "grpc"] if "grpc" in protocols else []
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        cells = [row["size"]]
        cells += [f"{row[p]['p50_ms']:.2f} / {row[p]['p99_ms']:.2f} ms" for p in protocols]
        if "grpc" in protocols:
            cells += [f"{row['grpc']['p50_ms'] / row[p]['p50_ms']:.2f}"
                      for p in protocols if p != "grpc"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
