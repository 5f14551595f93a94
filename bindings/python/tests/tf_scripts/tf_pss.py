"""One task of a TF2 ``ParameterServerStrategy`` job, as its guide writes them: ps and worker
tasks are ``tf.distribute.Server``s of the protocol under test; the chief is the coordinator,
connected through a cluster resolver whose ``rpc_layer`` is that protocol, and trains with a
``ClusterCoordinator`` (``--loop custom``) or Keras ``model.fit`` (``--loop fit``). One
worker, so the steps run in order and every protocol computes the same bits. Used by
test_tf_runtime.py.

    python tf_pss.py --cluster '{"chief": [...], "worker": [...], "ps": [...]}' \
        --job chief --task 0 --protocol grpc+vans --loop custom --steps 5 --out result.npz
"""

import argparse
import json
import os

import numpy as np

# Keras 3 (tf.keras by default since TensorFlow 2.16) has no ParameterServerStrategy:
# model.fit under it needs Keras 2, the tf_keras package, which this selects.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402
import vans.tensorflow  # noqa: F401  (registers the vans protocols)


def custom(strategy, steps):
    """A linear regression trained by a ClusterCoordinator; its losses and weights."""
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.random.stateless_normal([8, 1], seed=[1, 2]), name="w")
        b = tf.Variable(tf.zeros([1]), name="b")
    x = tf.constant(np.random.default_rng(5).standard_normal((16, 8)).astype(np.float32))
    y = tf.constant(np.random.default_rng(6).standard_normal((16, 1)).astype(np.float32))

    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
            dw, db = tape.gradient(loss, [w, b])
            w.assign_sub(0.1 * dw)
            b.assign_sub(0.1 * db)
            return loss
        return strategy.run(replica)

    losses = []
    for _ in range(steps):
        losses.append(coordinator.schedule(step))
        coordinator.join()
    return [float(loss.fetch()) for loss in losses], [w.numpy(), b.numpy()]


def fit(strategy, steps):
    """A small Keras model trained by ``model.fit``; its losses and weights."""
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((8,)),
            tf.keras.layers.Dense(4, kernel_initializer=tf.keras.initializers.GlorotUniform(1)),
            tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(2)),
        ])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    x = np.random.default_rng(5).standard_normal((16, 8)).astype(np.float32)
    y = np.random.default_rng(6).standard_normal((16, 1)).astype(np.float32)

    def dataset(_):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()

    history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset), epochs=steps,
                        steps_per_epoch=1, verbose=0)
    return history.history["loss"], model.get_weights()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--task", type=int, required=True)
    parser.add_argument("--protocol", required=True)
    parser.add_argument("--loop", choices=["custom", "fit"], default="custom")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    spec = tf.train.ClusterSpec(json.loads(args.cluster))
    if args.job != "chief":
        server = tf.distribute.Server(spec, job_name=args.job, task_index=args.task,
                                      protocol=args.protocol, start=True)
        print(f"{args.job}:{args.task} serving {args.protocol}", flush=True)
        server.join()
        return
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="chief", task_id=0, rpc_layer=args.protocol)
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    losses, weights = (custom if args.loop == "custom" else fit)(strategy, args.steps)
    for step, loss in enumerate(losses):
        print(f"step {step}: loss {loss:.6f}", flush=True)
    # The coordinator receives the steps' results over the protocol too.
    stats = vans.tensorflow.runtime_stats()
    print(f"vans: {stats}", flush=True)
    np.savez(args.out, losses=np.array(losses), received=stats["received"],
             **{f"v{i}": v for i, v in enumerate(weights)})
    print("done", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
