"""Data-parallel SGD of sparse logistic regression on the vans parameter server, ps-lite's
flagship use, from Python: 2 servers x 2 workers as processes, asynchronous (ps-lite's
default) and synchronous (a barrier per step), beside a single-process numpy baseline that
takes the same steps on the same data.

    python bindings/python/examples/sparse_lr.py                  # full run, writes sparse_lr.png
    python bindings/python/examples/sparse_lr.py --small          # a few seconds

The data is synthetic and fixed by ``--seed``: each example has ``--nnz`` binary features
whose ids follow a Zipf law (exponent 0.8) over ``--vocab`` ids, spread over the 64-bit key
space by a multiplicative hash (so both servers hold a share); labels come from a hidden
weight vector. The default run has 120,000 training examples touching about 1.1 million
distinct keys, and 12,000 held-out examples.

Each step, every worker takes its half of the next global minibatch, pulls the weights of
its features, computes the log-loss gradient, and pushes ``-lr * gradient`` (the servers
sum it into the weights). In synchronous mode a barrier follows the pulls and another the
pushes, so every step reads the same weights on both workers and applies both halves
before anyone reads again: the same update as the baseline's step on the whole minibatch.
Worker 0 evaluates the training loss and the held-out loss and accuracy at the end of every
epoch.

Without ``DMLC_ROLE`` the script launches the clusters (``vans.launch``), runs the baseline,
prints a table and writes the PNG; with ``DMLC_ROLE`` it is one node of such a cluster.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import vans

HASH = np.uint64(0x9E3779B97F4A7C15)  # odd: key = id * HASH mod 2**64 is a bijection
ZIPF_EXPONENT = 0.8


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=120_000, help="training examples")
    p.add_argument("--held-out", type=int, default=12_000, help="held-out examples")
    p.add_argument("--vocab", type=int, default=1 << 21, help="feature ids")
    p.add_argument("--nnz", type=int, default=32, help="features per example")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=1000, help="global minibatch (all workers)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--modes", default="sync,async", help="sync, async or both")
    p.add_argument("--plot", default="sparse_lr.png", help="PNG to write ('' for none)")
    p.add_argument("--json", default="", help="also write the figures as JSON here")
    p.add_argument("--small", action="store_true",
                   help="a small configuration: 20k examples, 65k ids, 3 epochs")
    # Internal: what a launched node does.
    p.add_argument("--mode", default="sync", help=argparse.SUPPRESS)
    p.add_argument("--metrics", default="", help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    if o.small:
        o.examples, o.held_out, o.vocab, o.epochs = 20_000, 4_000, 1 << 16, 3
    return o


def make_data(o):
    """(train_ids, train_labels, test_ids, test_labels): ids are (examples, nnz) feature ids,
    id 0 (the bias) in every example."""
    rng = np.random.default_rng(o.seed)
    n = o.examples + o.held_out
    ids = 1 + np.floor((o.vocab - 1) * rng.random((n, o.nnz)) ** (1 / (1 - ZIPF_EXPONENT)))
    ids = np.minimum(ids.astype(np.int64), o.vocab - 1)
    ids[:, 0] = 0
    # The hidden weights fade with rarity (as in click logs: the head carries the signal).
    ranks = np.arange(o.vocab)
    hidden = rng.normal(0.0, 1.0, o.vocab) * (1 + ranks / 64.0) ** -0.5
    hidden[0] = -0.5
    logits = hidden[ids].sum(axis=1)
    labels = (rng.random(n) < sigmoid(logits)).astype(np.float32)
    return ids[: o.examples], labels[: o.examples], ids[o.examples:], labels[o.examples:]


def keys_of(ids):
    """Feature ids as parameter-server keys (uint64, spread over every server's range)."""
    return ids.astype(np.uint64) * HASH


def sigmoid(z):
    return 1 / (1 + np.exp(-np.clip(z, -30, 30)))


def logloss(p, y):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def gradient_step(ids, labels, weights_of, batch_total, lr):
    """The update of one minibatch part: (sorted unique keys, -lr * gradient as float32)
    given ``weights_of(keys) -> float32 weights``."""
    keys, inverse = np.unique(keys_of(ids), return_inverse=True)
    w = weights_of(keys)
    p = sigmoid(w[inverse.reshape(ids.shape)].sum(axis=1))
    residual = np.repeat(p - labels, ids.shape[1])
    grad = np.bincount(inverse.ravel(), weights=residual, minlength=len(keys)) / batch_total
    return keys, (-lr * grad).astype(np.float32)


def evaluate(weights_of, train, test):
    """Training log-loss, held-out log-loss and held-out accuracy."""
    figures = []
    for ids, labels in (train, test):
        keys, inverse = np.unique(keys_of(ids), return_inverse=True)
        w = weights_of(keys)
        p = sigmoid(w[inverse.reshape(ids.shape)].sum(axis=1))
        figures.append((logloss(p, labels), float(np.mean((p > 0.5) == (labels > 0.5)))))
    return {"train_loss": figures[0][0], "test_loss": figures[1][0], "test_acc": figures[1][1]}


def part_of(o, step, rank, n_workers):
    """The examples of worker ``rank``'s part of global minibatch ``step``."""
    part = o.batch // n_workers
    start = step * o.batch + rank * part
    return slice(start, start + part)


def worker_main(o):
    """One worker: trains its half of every minibatch; worker 0 evaluates each epoch."""

    def main(worker):
        node = worker.node
        train_ids, train_y, test_ids, test_y = make_data(o)
        all_keys = np.unique(keys_of(np.arange(o.vocab)))
        if node.rank == 0:  # every weight starts at 0, so every pull finds its key
            worker.push(all_keys, np.zeros(len(all_keys), dtype=np.float32))
        node.barrier()
        def weights_of(keys):
            weights = worker.pull(keys)
            if o.mode == "sync":
                # Every worker has read this step's weights before anyone writes.
                node.barrier()
            return weights

        metrics, started = [], time.monotonic()

        def report(epoch):
            figures = evaluate(worker.pull, (train_ids, train_y), (test_ids, test_y))
            figures.update(epoch=epoch, seconds=time.monotonic() - started)
            metrics.append(figures)
            print(f"{o.mode} epoch {epoch}/{o.epochs}: train loss "
                  f"{figures['train_loss']:.4f}, held-out loss {figures['test_loss']:.4f}, "
                  f"accuracy {figures['test_acc']:.4f} ({figures['seconds']:.1f} s)", flush=True)

        if node.rank == 0:
            report(0)
        node.barrier()
        steps = o.examples // o.batch
        for epoch in range(o.epochs):
            for step in range(steps):
                part = part_of(o, step, node.rank, node.num_workers)
                keys, update = gradient_step(train_ids[part], train_y[part], weights_of,
                                             o.batch, o.lr)
                worker.push(keys, update)
                if o.mode == "sync":
                    node.barrier()  # both halves applied before the next step's pulls
            if node.rank == 0:
                report(epoch + 1)
        node.barrier()
        if node.rank == 0 and o.metrics:
            with open(o.metrics, "w") as f:
                json.dump(metrics, f)

    vans.run_node(main)


def baseline(o, data=None):
    """The same steps in one process with numpy: each global minibatch whole."""
    train_ids, train_y, test_ids, test_y = data or make_data(o)
    weights = np.zeros(o.vocab, dtype=np.float32)
    all_keys = keys_of(np.arange(o.vocab))
    order = np.argsort(all_keys)
    sorted_keys = all_keys[order]

    def weights_of(keys):
        return weights[order[np.searchsorted(sorted_keys, keys)]]

    metrics, started = [], time.monotonic()

    def report(epoch):
        figures = evaluate(weights_of, (train_ids, train_y), (test_ids, test_y))
        figures.update(epoch=epoch, seconds=time.monotonic() - started)
        metrics.append(figures)
        print(f"baseline epoch {epoch}/{o.epochs}: train loss {figures['train_loss']:.4f}, "
              f"held-out loss {figures['test_loss']:.4f}, accuracy {figures['test_acc']:.4f}",
              flush=True)

    report(0)
    steps = o.examples // o.batch
    for epoch in range(o.epochs):
        for step in range(steps):
            # The workers' halves, applied one after the other as the servers do.
            parts = [part_of(o, step, rank, 2) for rank in range(2)]
            updates = [gradient_step(train_ids[p], train_y[p], weights_of, o.batch, o.lr)
                       for p in parts]
            for keys, update in updates:
                weights[order[np.searchsorted(sorted_keys, keys)]] += update
        report(epoch + 1)
    return metrics


def run_cluster(o, mode, metrics_path):
    """Launches 2 servers x 2 workers of this script in ``mode``; worker 0's metrics."""
    # The nodes get this run's arguments without --modes (in either spelling, with its value).
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--modes":
            skip = True
        elif not a.startswith("--modes="):
            args.append(a)
    args += ["--mode", mode, "--metrics", metrics_path]
    vans.launch(2, 2, script=os.path.abspath(__file__), args=args, timeout=3600)
    with open(metrics_path) as f:
        return json.load(f)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"baseline": ("k", "--"), "sync": ("tab:blue", "-"), "async": ("tab:orange", "-")}
    for name, metrics in results.items():
        epochs = [m["epoch"] for m in metrics]
        color, line = styles.get(name, (None, "-"))
        label = {"baseline": "single-process numpy", "sync": "vans sync (2x2)",
                 "async": "vans async (2x2)"}.get(name, name)
        # The baseline hollow and larger: synchronous training lies exactly under it.
        marker = dict(marker="o", markersize=9, markerfacecolor="none") \
            if name == "baseline" else dict(marker="o")
        loss_ax.plot(epochs, [m["train_loss"] for m in metrics], line, color=color,
                     label=label, **marker)
        acc_ax.plot(epochs, [m["test_acc"] for m in metrics], line, color=color, label=label,
                    **marker)
    loss_ax.set(xlabel="epoch", ylabel="training log-loss", title="Training loss")
    acc_ax.set(xlabel="epoch", ylabel="held-out accuracy", title="Held-out accuracy")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Sparse logistic regression on vans: 2 servers x 2 workers vs one process")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    o = options()
    if vans.node_role():
        worker_main(o)
        return
    import tempfile

    modes = [m for m in o.modes.split(",") if m]
    for m in modes:
        if m not in ("sync", "async"):
            sys.exit(f"sparse_lr: unknown mode {m!r}; use sync, async or both")
    # The optional dependency is checked before a minute of training, not after it.
    if o.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit("sparse_lr: the plot needs matplotlib: pip install './bindings/python[plot]' "
                     "(or pass --plot '' to skip it)")
    data = make_data(o)
    distinct = len(np.unique(data[0]))
    print(f"data: {o.examples} training and {o.held_out} held-out examples, {o.nnz} features "
          f"each, {distinct} distinct keys (Zipf {ZIPF_EXPONENT} over {o.vocab} ids), "
          f"seed {o.seed}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            print(f"== {mode}: 2 servers x 2 workers", flush=True)
            results[mode] = run_cluster(o, mode, os.path.join(tmp, f"{mode}.json"))
    print("== baseline: one process", flush=True)
    results["baseline"] = baseline(o, data)
    print(f"\n{'run':<10}" + "".join(f"{'epoch ' + str(m['epoch']):>22}"
                                     for m in results["baseline"]))
    for name, metrics in results.items():
        print(f"{name:<10}" + "".join(
            f"{m['train_loss']:>12.4f} / {m['test_acc']:.3f}" for m in metrics))
    print("(training log-loss / held-out accuracy at the end of each epoch)")
    if "sync" in results:
        gap = results["sync"][-1]["train_loss"] / results["baseline"][-1]["train_loss"] - 1
        print(f"sync final loss vs baseline: {gap * 100:+.3f}%")
    if o.json:
        with open(o.json, "w") as f:
            json.dump({"distinct_keys": distinct, "results": results}, f, indent=1)
    if o.plot:
        plot(results, o.plot)
        print(f"wrote {o.plot}")


if __name__ == "__main__":
    main()
