"""``python -m vans.torch.bench``: ``torch.distributed`` collectives over vans and over Gloo
in the same run, and a DDP training step per backend.

For every rank count (``--ranks``) it starts a torchrun job per backend, one after another:
``gloo``, ``vans-tcp`` (vans with shared memory off: every pair over TCP) and ``vans-ipc``
(vans' default on one host: co-located ranks over shared memory). Each job times
``all_reduce`` (sum), ``all_gather`` (into a tensor) and ``broadcast`` of float32 tensors of
each size (``--sizes``, bytes per rank) and a step of DDP on an MLP (``--ddp-hidden``); the
``vans-ipc`` job also times :class:`vans.torch.DistributedOptimizer`'s step (co-located
servers). Rank 0 reports the median time of a call; bus bandwidth follows nccl-tests
(all-reduce ``2 (n-1)/n · size / t``, all-gather ``(n-1) · size / t``, broadcast
``size / t``). The table gives each vans backend's speed-up over Gloo (Gloo's time / vans'),
measured in the same run.

    python -m vans.torch.bench                                # 2 and 4 ranks, 4 KiB to 64 MiB
    python -m vans.torch.bench --ranks 2 --sizes 4096,1048576 --json out.json --plot out.png
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BACKENDS = {
    "gloo": {},
    "vans-tcp": {"DMLC_ENABLE_IPC": "0"},
    "vans-ipc": {"DMLC_ENABLE_IPC": "1"},
}
COLLECTIVES = ("all_reduce", "all_gather", "broadcast")


def options(argv=None):
    p = argparse.ArgumentParser(prog="python -m vans.torch.bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4", help="rank counts, e.g. 2,4")
    p.add_argument("--sizes", default="4096,65536,1048576,16777216,67108864",
                   help="tensor bytes per rank")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--collectives", default=",".join(COLLECTIVES))
    p.add_argument("--seconds", type=float, default=0.4,
                   help="time each case for about this long (after warm-up)")
    p.add_argument("--ddp-hidden", type=int, default=1024,
                   help="hidden width of the DDP step's MLP (0: no DDP step)")
    p.add_argument("--json", default="", help="write every measurement here too")
    p.add_argument("--plot", default="", help="a PNG of bus bandwidth against size")
    p.add_argument("--timeout", type=float, default=900, help="seconds per torchrun job")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    o.ranks = [int(r) for r in o.ranks.split(",") if r]
    o.sizes = [int(s) for s in o.sizes.split(",") if s]
    o.backends = [b for b in o.backends.split(",") if b]
    o.collectives = [c for c in o.collectives.split(",") if c]
    for b in o.backends:
        if b not in BACKENDS:
            p.error(f"unknown backend {b!r}; use {', '.join(BACKENDS)}")
    for c in o.collectives:
        if c not in COLLECTIVES:
            p.error(f"unknown collective {c!r}; use {', '.join(COLLECTIVES)}")
    if any(s <= 0 or s % 4 for s in o.sizes) or any(r < 2 for r in o.ranks):
        p.error("sizes must be positive multiples of 4 bytes (float32), ranks 2 or more")
    return o


def busbw(collective, size, ranks, seconds):
    if collective == "all_reduce":
        moved = 2 * (ranks - 1) / ranks * size
    elif collective == "all_gather":
        moved = (ranks - 1) * size
    else:
        moved = size
    return moved / seconds / 1e9


# -- one rank of one job ------------------------------------------------------------------

def _agree(dist, value):
    """Rank 0's ``value`` on every rank (so all ranks run the same number of calls)."""
    import torch
    t = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(t, src=0)
    return t.item()


def run_worker(o):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    backend = o.worker
    if backend.startswith("vans"):
        import vans.torch
        vans.torch.init_process_group()
    else:
        dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = []

    def timed(call):
        # Rank 0 decides how many calls fit in the time; everyone makes that many.
        started = time.perf_counter()
        call()
        one = max(_agree(dist, time.perf_counter() - started), 1e-6)
        count = int(max(5, min(2000, o.seconds / one)))
        for _ in range(2):
            call()
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    for size in o.sizes:
        x = torch.ones(size // 4)
        out = torch.empty(n * (size // 4))
        calls = {
            "all_reduce": lambda x=x: dist.all_reduce(x),
            "all_gather": lambda x=x, out=out: dist.all_gather_into_tensor(out, x),
            "broadcast": lambda x=x: dist.broadcast(x, src=0),
        }
        for name in o.collectives:
            dist.barrier()
            seconds = timed(calls[name])
            rows.append({"collective": name, "bytes": size, "ranks": n, "backend": backend,
                         "seconds": seconds, "busbw_gbs": busbw(name, size, n, seconds)})
        if rank == 0:
            print(f"  [{backend} x{n}] {size} bytes done", flush=True)

    def ddp_step_time(make_optimizer, wrap):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, o.ddp_hidden), torch.nn.ReLU(),
            torch.nn.Linear(o.ddp_hidden, o.ddp_hidden), torch.nn.ReLU(),
            torch.nn.Linear(o.ddp_hidden, 10))
        model, optimizer = wrap(model, make_optimizer(model))
        xb, yb = torch.randn(32, 256), torch.randint(0, 10, (32,))

        def step():
            optimizer.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            optimizer.step()

        return timed(step), sum(p.numel() for p in model.parameters())

    if o.ddp_hidden:
        def sgd(model):
            return torch.optim.SGD(model.parameters(), lr=0.01)

        def ddp(model, optimizer):
            return torch.nn.parallel.DistributedDataParallel(model), optimizer

        seconds, params = ddp_step_time(sgd, ddp)
        rows.append({"collective": "ddp_step", "bytes": 4 * params, "ranks": n,
                     "backend": backend, "seconds": seconds})
        if backend == "vans-ipc" and os.environ.get("VANS_TORCH_SERVERS") == "colocated":
            def dopt(model, optimizer):
                return model, vans.torch.DistributedOptimizer(
                    optimizer, named_parameters=model.named_parameters())

            seconds, params = ddp_step_time(sgd, dopt)
            rows.append({"collective": "ddp_step", "bytes": 4 * params, "ranks": n,
                         "backend": "vans-dopt", "seconds": seconds})
    if rank == 0:
        with open(o.json, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


# -- the driver -----------------------------------------------------------------------------

def _free_port():
    import vans
    return vans.free_port()


def run_job(o, backend, ranks, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", **BACKENDS[backend])
    if backend == "vans-ipc" and o.ddp_hidden:
        env["VANS_TORCH_SERVERS"] = "colocated"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--master-port", str(_free_port()), "-m", "vans.torch.bench", "--worker", backend,
           "--json", out, "--sizes", ",".join(map(str, o.sizes)), "--collectives",
           ",".join(o.collectives), "--seconds", str(o.seconds), "--ddp-hidden",
           str(o.ddp_hidden)]
    subprocess.run(cmd, check=True, env=env, timeout=o.timeout)
    with open(out) as f:
        return json.load(f)


def human(size):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def report(rows, o):
    index = {(r["backend"], r["ranks"], r["collective"], r["bytes"]): r for r in rows}
    vans_backends = [b for b in o.backends if b != "gloo"]
    head = f"{'ranks':>5} {'collective':>10} {'size':>8}  {'gloo p50':>10}"
    for b in vans_backends:
        head += f" {b + ' p50':>13} {'x gloo':>7}"
    head += "   busbw GB/s (" + ", ".join(o.backends) + ")"
    print(head)
    for ranks in o.ranks:
        for c in o.collectives:
            for size in o.sizes:
                g = index.get(("gloo", ranks, c, size))
                line = f"{ranks:>5} {c:>10} {human(size):>8}  "
                line += f"{g['seconds'] * 1e6:>8.1f}us" if g else f"{'-':>10}"
                bws = []
                for b in o.backends:
                    r = index.get((b, ranks, c, size))
                    bws.append(f"{r['busbw_gbs']:.2f}" if r else "-")
                    if b == "gloo":
                        continue
                    if r:
                        ratio = g["seconds"] / r["seconds"] if g else float("nan")
                        line += f" {r['seconds'] * 1e6:>11.1f}us {ratio:>6.2f}x"
                    else:
                        line += f" {'-':>13} {'-':>7}"
                print(line + "   " + ", ".join(bws))
        steps = [r for r in rows if r["collective"] == "ddp_step" and r["ranks"] == ranks]
        if steps:
            gloo = next((r["seconds"] for r in steps if r["backend"] == "gloo"), None)
            parts = []
            for r in steps:
                ratio = (f" ({gloo / r['seconds']:.2f}x gloo)"
                         if gloo and r["backend"] != "gloo" else "")
                parts.append(f"{r['backend']} {r['seconds'] * 1e3:.2f} ms{ratio}")
            print(f"{ranks:>5} {'ddp step':>10} {human(steps[0]['bytes']):>8}  " + "; ".join(parts))


def plot(rows, o, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(o.ranks), len(o.collectives),
                             figsize=(4.5 * len(o.collectives), 3.5 * len(o.ranks)),
                             squeeze=False)
    for i, ranks in enumerate(o.ranks):
        for j, c in enumerate(o.collectives):
            ax = axes[i][j]
            for b in o.backends:
                pts = sorted((r["bytes"], r["busbw_gbs"]) for r in rows
                             if r["backend"] == b and r["ranks"] == ranks
                             and r["collective"] == c)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=b)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{c}, {ranks} ranks")
            ax.set_xlabel("bytes per rank")
            ax.set_ylabel("bus bandwidth, GB/s")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv=None):
    o = options(argv)
    if o.worker:
        return run_worker(o)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in o.ranks:
            for backend in o.backends:
                print(f"== {backend}, {ranks} ranks", flush=True)
                rows += run_job(o, backend, ranks, os.path.join(tmp, f"{backend}-{ranks}.json"))
    report(rows, o)
    if o.json:
        with open(o.json, "w") as f:
            json.dump(rows, f, indent=1)
    if o.plot:
        plot(rows, o, o.plot)
    return rows


if __name__ == "__main__":
    main()
