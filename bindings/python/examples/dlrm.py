"""A DLRM-style click model (an embedding table for sparse features plus MLPs) on synthetic
click data with Zipf-distributed 64-bit ids (fixed seed, no download), trained three ways
that are compared step by step:

- ``single``: one process, the whole batch, a plain ``torch.nn.EmbeddingBag`` trained by
  ``torch.optim.Adagrad`` (the reference);
- ``sync``: a vans cluster (servers × workers, ``vans.launch``): the table lives on the
  servers as :class:`vans.torch.ShardedEmbeddingBag` with server-side Adagrad, applied once
  per step with every worker's gradients; the MLPs' gradients go through
  :class:`vans.torch.DistributedOptimizer`. Its loss curve must be the reference's;
- ``async``: the same, but each worker's embedding gradients are applied as they arrive;
- ``tf-sync`` and ``tf-async``: the same model in TensorFlow (when installed), the table a
  :class:`vans.tensorflow.ShardedEmbedding` over vans' TensorFlow ops, the MLPs starting from
  the torch model's weights, their gradients averaged through the servers. Its sync curve
  must be the (torch) reference's too.

Compare the three (2 servers × 2 workers), print the largest relative loss difference from
the reference and examples per second, and plot the curves::

    python dlrm.py --compare --plot dlrm.png

One mode alone: ``python dlrm.py --mode single``; ``--mode sync`` launches its own cluster.
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

MODES = ("single", "sync", "async", "tf-sync", "tf-async")
_MASK = (1 << 64) - 1


def spread(ids):
    """Zipf ranks to 64-bit ids (SplitMix64's finalizer): popular ids land all over the key
    space, and so on every server."""
    z = ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def make_batch(args, step):
    """Step ``step``'s global batch: dense features, ids (batch × features × bag, uint64) and
    clicks from a fixed teacher (a per-id effect plus a linear function of the dense part)."""
    rng = np.random.default_rng([args.seed, step % args.batches])
    n = args.batch
    dense = rng.normal(size=(n, args.dense)).astype(np.float32)
    ranks = (rng.zipf(args.zipf, size=(n, args.features, args.bag)) - 1) % args.vocab
    ids = spread(ranks + np.arange(args.features).reshape(1, -1, 1) * args.vocab)
    effect = ((ids >> np.uint64(40)).astype(np.float64) / 2.0**24 - 0.5).sum(axis=(1, 2))
    teacher = np.random.default_rng(args.seed).normal(size=args.dense)
    logit = 6.0 * effect / np.sqrt(args.features * args.bag) + dense @ teacher / 2.0
    clicks = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    return dense, ids, clicks


class Dlrm(torch.nn.Module):
    """Bottom MLP on the dense features, the bags' embeddings beside it, a top MLP."""

    def __init__(self, args, embedding):
        super().__init__()
        torch.manual_seed(args.seed)
        d = args.dim
        self.bottom = torch.nn.Sequential(torch.nn.Linear(args.dense, d), torch.nn.ReLU())
        self.top = torch.nn.Sequential(
            torch.nn.Linear((args.features + 1) * d, args.hidden), torch.nn.ReLU(),
            torch.nn.Linear(args.hidden, 1))
        self.embedding = embedding
        self.features = args.features

    def forward(self, dense, bags):
        """``bags``: ids (batch × features, bag) as int64, one bag per row."""
        n = dense.shape[0]
        pooled = self.embedding(bags).reshape(n, -1)
        z = torch.cat([self.bottom(dense), pooled], dim=1)
        return self.top(z).squeeze(1)


def table_spec(args):
    import vans
    return vans.table_spec(optimizer="adagrad", dim=args.dim, lr=args.emb_lr,
                           initial_accumulator=0.0, eps=1e-10, init="normal", std=0.05,
                           seed=args.seed)


def train_single(args):
    """The reference: a plain EmbeddingBag over the ids this run touches (the same rows as
    the servers start them), trained by torch.optim.Adagrad with sparse gradients."""
    import vans
    torch.set_num_threads(1)
    batches = [make_batch(args, step) for step in range(min(args.steps, args.batches))]
    used = np.unique(np.concatenate([ids.reshape(-1) for _, ids, _ in batches]))
    spec = table_spec(args)
    table = torch.nn.EmbeddingBag(len(used), args.dim, mode="sum", sparse=True)
    with torch.no_grad():
        table.weight.copy_(torch.from_numpy(
            vans.table_initial_rows(spec, used).reshape(len(used), args.dim)))
    model = Dlrm(args, _Remapped(table, used))
    dense_opt = torch.optim.SGD([p for n, p in model.named_parameters()
                                 if not n.startswith("embedding")], lr=args.lr)
    emb_opt = torch.optim.Adagrad(table.parameters(), lr=args.emb_lr, eps=1e-10)
    losses = []
    started = time.perf_counter()
    for step in range(args.steps):
        dense, ids, clicks = batches[step % len(batches)]
        dense_opt.zero_grad()
        emb_opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(
            model(torch.from_numpy(dense), _bags(ids)), torch.from_numpy(clicks))
        loss.backward()
        dense_opt.step()
        emb_opt.step()
        losses.append(loss.item())
        _progress(args, "single", step, losses[-1])
    seconds = time.perf_counter() - started
    return {"mode": "single", "losses": losses, "examples_per_s": args.batch * args.steps / seconds,
            "distinct_ids": int(len(used))}


class _Remapped(torch.nn.Module):
    """The reference's table, indexed by 64-bit ids through the sorted ids it holds."""

    def __init__(self, table, used):
        super().__init__()
        self.table = table
        self.used = used

    def forward(self, bags):
        keys = bags.numpy().view(np.uint64)
        index = np.searchsorted(self.used, keys).astype(np.int64)
        return self.table(torch.from_numpy(index))


def _bags(ids):
    """(batch, features, bag) uint64 ids as (batch × features, bag) int64 bags."""
    n, k, b = ids.shape
    return torch.from_numpy(ids.reshape(n * k, b).view(np.int64))


def train_node(args):
    """One node of a launched cluster (``vans.launch`` runs this script on each)."""
    import torch.distributed as dist
    import vans.torch
    torch.set_num_threads(1)
    vans.torch.init_process_group(tables={1: table_spec(args)})  # servers serve and exit here
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split among {world} workers")
    embedding = vans.torch.ShardedEmbeddingBag(args.dim, app_id=1, mode=args.mode,
                                               mode_bag="sum")
    model = Dlrm(args, embedding)
    dense = [p for n, p in model.named_parameters() if not n.startswith("embedding")]
    vans.torch.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = vans.torch.DistributedOptimizer(
        torch.optim.SGD(dense, lr=args.lr),
        named_parameters=[(n, p) for n, p in model.named_parameters()
                          if not n.startswith("embedding")])
    share = args.batch // world
    losses = []
    started = time.perf_counter()
    for step in range(args.steps):
        x, ids, clicks = make_batch(args, step)
        lo, hi = rank * share, (rank + 1) * share
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(
            model(torch.from_numpy(x[lo:hi]), _bags(ids[lo:hi])),
            torch.from_numpy(clicks[lo:hi]))
        loss.backward()
        optimizer.step()
        embedding.step()
        # The whole batch's loss: the mean of the workers' (equal) shares.
        report = loss.detach().clone()
        dist.all_reduce(report)
        losses.append(report.item() / world)
        if rank == 0:
            _progress(args, args.mode, step, losses[-1])
    result = _worker_result(args, rank, world, losses, started)
    dist.destroy_process_group()
    return result


def train_node_tf(args):
    """One node of a launched cluster, the model in TensorFlow: the table is a
    :class:`vans.tensorflow.ShardedEmbedding` on the servers; the MLPs start from the torch
    model's weights (the same seed) and their gradients are averaged through the servers' sum
    in a synchronous round (``ROUND_CMD``), with the batch loss riding along."""
    import tensorflow as tf
    import vans
    import vans.tensorflow as vtf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    node = vans.Node()
    if node.role == "server":
        vans.Server(node, app_id=1, table=table_spec(args))
        vans.Server(node).serve()
        return None
    if node.role == "scheduler":
        node.finalize()
        return None
    rank, world = node.rank, node.num_workers
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split among {world} workers")
    mode = args.mode.removeprefix("tf-")
    embedding = vtf.ShardedEmbedding(args.dim, node, app_id=1, mode=mode, combiner="sum")
    reference = Dlrm(args, torch.nn.Identity())
    # torch's Linear computes x @ W.T + b: the same weights, transposed.
    weights = [tf.Variable(p.detach().numpy().T if p.dim() == 2 else p.detach().numpy())
               for p in reference.parameters()]
    (w_bottom, b_bottom, w_hidden, b_hidden, w_out, b_out) = weights
    sums = vans.Worker(node, dtype="float32", app_id=0)
    round_key = np.array([12345], dtype=np.uint64)

    def model(dense, bags):
        n = tf.shape(dense)[0]
        pooled = tf.reshape(embedding(bags), [n, -1])
        z = tf.concat([tf.nn.relu(dense @ w_bottom + b_bottom), pooled], axis=1)
        return tf.squeeze(tf.nn.relu(z @ w_hidden + b_hidden) @ w_out + b_out, 1)

    share = args.batch // world
    losses = []
    started = time.perf_counter()
    for step in range(args.steps):
        x, ids, clicks = make_batch(args, step)
        lo, hi = rank * share, (rank + 1) * share
        bags = ids[lo:hi].reshape(-1, args.bag).view(np.int64)
        with tf.GradientTape() as tape:
            logits = model(tf.constant(x[lo:hi]), tf.constant(bags))
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.constant(clicks[lo:hi]), logits=logits))
        grads = tape.gradient(loss, weights + embedding.trainable_weights)[:len(weights)]
        # Every worker's MLP gradients and loss, summed by the servers in one round.
        flat = np.concatenate([g.numpy().reshape(-1) for g in grads] + [[loss.numpy()]])
        total = sums.push_pull(round_key, flat.astype(np.float32), cmd=vans.ROUND_CMD) / world
        at = 0
        for w, g in zip(weights, grads):
            w.assign_sub(args.lr * total[at:at + g.shape.num_elements()].reshape(g.shape))
            at += g.shape.num_elements()
        embedding.step()
        losses.append(float(total[-1]))
        if rank == 0:
            _progress(args, args.mode, step, losses[-1])
    result = _worker_result(args, rank, world, losses, started)
    node.finalize()
    return result


def _worker_result(args, rank, world, losses, started):
    """A worker's figures (rank 0 writes them to ``--json`` for the launching process)."""
    seconds = time.perf_counter() - started
    result = {"mode": args.mode, "losses": losses, "workers": world,
              "examples_per_s": args.batch * args.steps / seconds}
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return result


def launch(args):
    """Runs ``--mode sync|async`` on a local cluster of processes; returns rank 0's result."""
    import vans
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        vans.launch(args.servers, args.workers, script=__file__,
                    args=[*_common(args), "--mode", args.mode, "--json", out, "--node"],
                    env={"OMP_NUM_THREADS": "1"}, timeout=args.timeout)
        with open(out) as f:
            return json.load(f)


def _common(args):
    names = ("steps", "batch", "batches", "dim", "features", "bag", "dense", "hidden",
             "vocab", "zipf", "lr", "emb_lr", "seed")
    return [x for n in names for x in (f"--{n.replace('_', '-')}", str(getattr(args, n)))] \
        + (["--verbose"] if args.verbose else [])


def _progress(args, mode, step, loss):
    if args.verbose and (step % 20 == 0 or step == args.steps - 1):
        print(f"[{mode}] step {step:4d} loss {loss:.6f}", flush=True)


def compare(args):
    results = []
    for mode in args.modes:
        args.mode = mode
        result = train_single(args) if mode == "single" else launch(args)
        results.append(result)
        print(f"== {mode}: final loss {result['losses'][-1]:.6f}, "
              f"{result['examples_per_s']:.0f} examples/s", flush=True)
    reference = results[0]["losses"]
    print(f"{'mode':>6} {'final loss':>11} {'max rel diff':>13} {'examples/s':>11}")
    for r in results:
        r["max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], reference))
        print(f"{r['mode']:>6} {r['losses'][-1]:11.6f} {r['max_rel_diff']:13.2e} "
              f"{r['examples_per_s']:11.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    if args.plot:
        plot(results, args)
    return results


def plot(results, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (curves, speed) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        curves.plot(r["losses"], label=r["mode"], linewidth=1,
                    linestyle="-" if r["mode"] == "single" else "--")
    curves.set_xlabel("step")
    curves.set_ylabel("batch loss (BCE)")
    curves.set_title(f"DLRM-style, Zipf({args.zipf}) ids over {args.features}×{args.vocab:,}")
    curves.legend()
    speed.bar([r["mode"] for r in results], [r["examples_per_s"] for r in results])
    speed.set_ylabel("examples per second")
    speed.set_title(f"{args.servers} servers × {args.workers} workers (sync, async)")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"wrote {args.plot}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, default="single")
    p.add_argument("--compare", action="store_true", help="run every mode and compare")
    p.add_argument("--modes", nargs="+", choices=MODES, default=None,
                   help="default: single sync async, and tf-sync tf-async with TensorFlow")
    p.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=512, help="global batch (split among workers)")
    p.add_argument("--batches", type=int, default=1 << 30, help="distinct batches, cycled")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--features", type=int, default=8, help="sparse features per example")
    p.add_argument("--bag", type=int, default=4, help="ids per feature")
    p.add_argument("--dense", type=int, default=13)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--vocab", type=int, default=10_000_000, help="distinct ids per feature")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--lr", type=float, default=0.5, help="the MLPs' SGD rate")
    p.add_argument("--emb-lr", type=float, default=0.1, help="the table's Adagrad rate")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--json")
    p.add_argument("--plot")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.modes is None:
        import importlib.util
        tf = importlib.util.find_spec("tensorflow") is not None
        args.modes = [m for m in MODES if tf or not m.startswith("tf-")]
    if args.modes[0] != "single" and args.compare:
        p.error("--modes must start with single, the reference")
    if args.compare:
        return compare(args)
    if args.node:
        return train_node_tf(args) if args.mode.startswith("tf-") else train_node(args)
    if args.mode == "single":
        result = train_single(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
        return result
    return launch(args)


if __name__ == "__main__":
    main()
