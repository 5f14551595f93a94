"""Trains a small MLP classifier on synthetic data (fixed seed, no download) with PyTorch, four
ways that must give the same loss curve:

- ``single``: one process, the full batch;
- ``gloo``: DistributedDataParallel over Gloo, the batch split among the ranks;
- ``vans``: DistributedDataParallel over vans (``dist.init_process_group("vans")``);
- ``dopt``: :class:`vans.torch.DistributedOptimizer` (gradients push-pulled through vans
  servers co-located with the ranks, BytePS-style), no DDP.

One run (under torchrun for the distributed modes)::

    torchrun --nproc-per-node 4 torch_train.py --mode vans --json vans.json

Every mode at once, with a PNG of the curves and each mode's step time::

    python torch_train.py --compare --workers 2 4 --plot curves.png

Under ``vans-launch`` the same script runs with ``--mode vans`` or ``--mode dopt``:
:func:`vans.torch.init_process_group` joins the cluster vans' environment describes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

MODES = ("single", "gloo", "vans", "dopt")


def make_data(n, features, classes, seed):
    """Inputs and labels from a fixed random teacher network."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(n, classes, generator=g)).argmax(dim=1)
    return x, y


def make_model(features, hidden, classes, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes),
    )


def train(args):
    """Trains in this process (one rank of a job, or the single process); returns the
    full-batch loss of every step and the mean step time after the first five."""
    torch.set_num_threads(1)
    distributed = args.mode != "single"
    if args.mode == "gloo":
        dist.init_process_group("gloo")
    elif args.mode in ("vans", "dopt"):
        if args.mode == "dopt":
            os.environ.setdefault("VANS_TORCH_SERVERS", "colocated")
        import vans.torch
        vans.torch.init_process_group()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split among {world} ranks")
    x, y = make_data(args.batch * args.batches, args.features, args.classes, args.seed)
    model = make_model(args.features, args.hidden, args.classes, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.mode in ("gloo", "vans"):
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.mode == "dopt":
        import vans.torch
        vans.torch.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = vans.torch.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters())
    losses, times = [], []
    share = args.batch // world
    for step in range(args.steps):
        b = step % args.batches
        lo = b * args.batch + rank * share
        xb, yb = x[lo:lo + share], y[lo:lo + share]
        started = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
        # The full batch's loss: the mean of the ranks' (equal) shares.
        report = loss.detach().clone()
        if distributed:
            dist.all_reduce(report)
            report /= world
        losses.append(report.item())
        if rank == 0 and args.verbose and (step % 10 == 0 or step == args.steps - 1):
            print(f"[{args.mode} x{world}] step {step:4d} loss {losses[-1]:.6f}", flush=True)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    result = {"mode": args.mode, "world": world, "losses": losses,
              "step_ms": 1e3 * sum(times[5:]) / max(1, len(times[5:])),
              "param_checksum": params.double().sum().item(),
              "param_abs_sum": params.double().abs().sum().item()}
    # Written before the teardown: Gloo sometimes aborts in it (see `run` below).
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if distributed:
        dist.destroy_process_group()
    return result


def compare(args):
    """Runs every mode (the distributed ones under torchrun, for each --workers count) and
    prints how far each curve is from the single process's; optionally plots them."""
    results = []
    common = ["--steps", str(args.steps), "--batch", str(args.batch), "--hidden",
              str(args.hidden), "--seed", str(args.seed), "--lr", str(args.lr),
              "--batches", str(args.batches)]
    with tempfile.TemporaryDirectory() as tmp:
        def run(mode, world):
            out = os.path.join(tmp, f"{mode}-{world}.json")
            if mode == "single":
                cmd = [sys.executable, __file__, "--mode", mode, "--json", out, *common]
            else:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                       str(world), "--master-port", str(_free_port()), __file__,
                       "--mode", mode, "--json", out, *common]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            for _attempt in range(3):
                if os.path.exists(out):
                    os.remove(out)
                done = subprocess.run(cmd, env=env, timeout=args.timeout)
                if done.returncode == 0 or mode != "gloo":
                    break
                # Gloo itself sometimes aborts on a loaded machine ("terminate called without
                # an active exception"), in its teardown or before: the reference keeps what
                # its rank 0 wrote before the teardown, else it runs again (three times in
                # all). Vans' own modes must exit cleanly.
                if os.path.exists(out):
                    print(f"== gloo x{world} aborted in its teardown (exit {done.returncode}) "
                          "after writing its results; keeping them", flush=True)
                    break
                print(f"== gloo x{world} failed (exit {done.returncode}); running it again",
                      flush=True)
            if not (mode == "gloo" and os.path.exists(out)):
                done.check_returncode()
            with open(out) as f:
                results.append(json.load(f))
            print(f"== {mode} x{world}: step {results[-1]['step_ms']:.2f} ms, final loss "
                  f"{results[-1]['losses'][-1]:.6f}", flush=True)

        run("single", 1)
        for world in args.workers:
            for mode in args.modes:
                run(mode, world)
    reference = results[0]["losses"]
    print(f"{'mode':>6} {'ranks':>5} {'step ms':>8} {'final loss':>11} {'max rel diff':>13}")
    for r in results:
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], reference))
        r["max_rel_diff"] = diff
        print(f"{r['mode']:>6} {r['world']:>5} {r['step_ms']:8.2f} {r['losses'][-1]:11.6f} "
              f"{diff:13.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    if args.plot:
        plot(results, args.plot)
    return results


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (curves, times) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        label = f"{r['mode']} x{r['world']}"
        curves.plot(r["losses"], label=label, linewidth=1,
                    linestyle="-" if r["mode"] == "single" else "--")
    curves.set_xlabel("step")
    curves.set_ylabel("full-batch loss")
    curves.set_yscale("log")
    curves.set_title("same loss curve, every backend")
    curves.legend(fontsize=8)
    labels = [f"{r['mode']}\nx{r['world']}" for r in results]
    times.bar(range(len(results)), [r["step_ms"] for r in results])
    times.set_xticks(range(len(results)), labels, fontsize=8)
    times.set_ylabel("ms per step (mean)")
    times.set_title("step time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _free_port():
    import vans
    return vans.free_port()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, default="single")
    p.add_argument("--compare", action="store_true",
                   help="run every mode and compare the curves with the single process's")
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--modes", nargs="+", default=["gloo", "vans", "dopt"],
                   choices=MODES[1:])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=512, help="global batch (split among ranks)")
    p.add_argument("--batches", type=int, default=8, help="distinct batches, cycled")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the result (rank 0) here")
    p.add_argument("--plot", help="with --compare: a PNG of the curves and step times")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.compare:
        return compare(args)
    return train(args)


if __name__ == "__main__":
    main()
