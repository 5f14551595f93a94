"""One task of a TensorFlow parameter-server job, as users write them: a
``tf.distribute.Server`` with the protocol under test and a ``tf.compat.v1`` graph whose
variables live on ``/job:ps``. Used by test_tf_runtime.py (and run by hand the same way).

Every task but ``worker:0`` only serves (``server.join()``, until it is killed). ``worker:0``
is the client: it builds the model with one tower per worker task (in-graph replication, so
each step is deterministic and the same under every protocol), trains ``--steps`` steps and
writes the losses and the final variables to ``--out`` (``.npz``).

    python tf_job.py --cluster '{"ps": [...], "worker": [...]}' --job worker --task 0 \
        --protocol grpc+vans --model dense --steps 5 --out result.npz

Without ``--cluster``, ``--job`` and ``--task`` the task comes from ``TF_CONFIG``, as a
launcher sets it (``vans-launch --tensorflow``, a TFJob).
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf
import vans.tensorflow  # noqa: F401  (registers the vans protocols)

DIM, HIDDEN = 32, 16
VOCAB, EMBED, IDS = 1000, 8, 64


def dense_tower(weights, rng):
    """A two-layer regression on this worker's batch; its loss."""
    w0, w1 = weights
    x = tf.constant(rng.standard_normal((8, DIM)).astype(np.float32))
    y = tf.constant(rng.standard_normal((8, 1)).astype(np.float32))
    pred = tf.matmul(tf.tanh(tf.matmul(x, w0)), w1)
    return tf.reduce_mean(tf.square(pred - y))


def build(model, num_ps, num_workers, lr):
    """The loss (summed over the towers), the training op and the variables."""
    tf.compat.v1.set_random_seed(7)
    rng = np.random.default_rng(11)
    init = tf.compat.v1.random_normal_initializer(stddev=0.3, seed=3)
    if model == "dense":
        with tf.device("/job:ps/task:0"):
            w0 = tf.compat.v1.get_variable("w0", [DIM, HIDDEN], initializer=init)
        with tf.device(f"/job:ps/task:{num_ps - 1}"):
            w1 = tf.compat.v1.get_variable("w1", [HIDDEN, 1], initializer=init)
        weights = [w0, w1]
    else:
        setter = tf.compat.v1.train.replica_device_setter(ps_tasks=num_ps, ps_device="/job:ps")
        with tf.compat.v1.device(setter):
            table = tf.compat.v1.get_variable(
                "table", [VOCAB, EMBED], initializer=init,
                partitioner=tf.compat.v1.fixed_size_partitioner(num_ps))
        weights = list(table)
    losses = []
    for i in range(num_workers):
        with tf.device(f"/job:worker/task:{i}"):
            if model == "dense":
                losses.append(dense_tower(weights, rng))
            else:
                ids = tf.constant(rng.integers(0, VOCAB, IDS), dtype=tf.int64)
                target = tf.constant(rng.standard_normal((IDS, EMBED)).astype(np.float32))
                rows = tf.nn.embedding_lookup(table, ids)
                losses.append(tf.reduce_mean(tf.square(rows - target)))
    with tf.device("/job:worker/task:0"):
        loss = tf.add_n(losses)
        train = tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(
            loss, colocate_gradients_with_ops=True)
    return loss, train, weights


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", help="the cluster spec, as JSON (default: TF_CONFIG's)")
    parser.add_argument("--job", help="default: TF_CONFIG's task type")
    parser.add_argument("--task", type=int, help="default: TF_CONFIG's task index")
    parser.add_argument("--protocol", required=True)
    parser.add_argument("--model", choices=["dense", "sparse"], default="dense")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", help="where worker:0 writes its results (.npz)")
    parser.add_argument("--recover", action="store_true",
                        help="train in a MonitoredTrainingSession, which recreates the session "
                             "(variables initialised again) when a task fails and comes back")
    args = parser.parse_args()
    if args.cluster is None:
        config = json.loads(os.environ["TF_CONFIG"])
        args.cluster = json.dumps(config["cluster"])
        args.job, args.task = config["task"]["type"], int(config["task"]["index"])
    cluster = tf.train.ClusterSpec(json.loads(args.cluster))
    server = tf.distribute.Server(cluster, job_name=args.job, task_index=args.task,
                                  protocol=args.protocol, start=True)
    print(f"{args.job}:{args.task} serving {args.protocol}", flush=True)
    if (args.job, args.task) != ("worker", 0):
        server.join()
        return
    tf.compat.v1.disable_eager_execution()
    num_ps, num_workers = cluster.num_tasks("ps"), cluster.num_tasks("worker")
    loss, train, weights = build(args.model, num_ps, num_workers, lr=0.1)
    if args.recover:
        losses, final = train_recovering(server, loss, train, weights, args.steps)
        save(args.out, losses, final)
        return
    losses = []
    with tf.compat.v1.Session(server.target) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(args.steps):
            try:
                value, _ = sess.run([loss, train])
            except tf.errors.OpError as e:
                # At once: closing the session would wait for the tasks that are gone.
                print(f"step {step} failed: {type(e).__name__}: {e.message}", flush=True)
                os._exit(3)
            losses.append(value)
            print(f"step {step}: loss {value:.6f}", flush=True)
        final = sess.run(weights)
    save(args.out, losses, final)


def train_recovering(server, loss, train, weights, steps):
    """``steps`` steps in a ``MonitoredTrainingSession`` as users run one (no checkpoint): a
    step that fails with ``UnavailableError``/``AbortedError`` (a task died) is retried in a
    new session once the task is back, its variables initialised again."""
    losses = []
    with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=True, save_checkpoint_secs=None,
            save_summaries_steps=None, log_step_count_steps=None) as sess:
        for step in range(steps):
            value, _ = sess.run([loss, train])
            losses.append(value)
            print(f"step {step}: loss {value:.6f}", flush=True)
        final = sess.run(weights)
    return losses, final


def save(out, losses, final):
    """Writes the losses, the final variables and what vans received to ``out``."""
    stats = vans.tensorflow.runtime_stats()
    print(f"vans: {stats}", flush=True)
    np.savez(out, losses=np.array(losses), received=stats["received"],
             **{f"v{i}": v for i, v in enumerate(final)})
    print("done", flush=True)


if __name__ == "__main__":
    main()
