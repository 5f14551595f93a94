"""One worker task of a ``MultiWorkerMirroredStrategy`` job, as users write one: the cluster
and the protocol (``rpc_layer``) in ``TF_CONFIG``, ring collectives on CPU. Used by
test_tf_runtime.py (and run by hand the same way, one process per worker).

The task all-reduces and all-gathers tensors of a few sizes, each twice from one
``tf.function`` (the same collective keys again), then trains a small Keras 2 model with
``model.fit`` (when ``tf_keras`` is installed; its variables start as worker 0's, broadcast),
and writes every result,
the losses, the final weights and what vans carried to ``OUT.worker<index>.npz``.

    python tf_mwms.py --cluster '{"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}' \
        --task 0 --protocol grpc+vans --out result

``python -m vans.tensorflow.collective_bench`` times the same strategy's all-reduce.
"""

import argparse
import importlib.util
import json
import os

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", required=True, help="the cluster spec, as JSON")
    parser.add_argument("--task", type=int, required=True, help="this worker's index")
    parser.add_argument("--protocol", required=True)
    parser.add_argument("--out", help="where to write the results (OUT.worker<task>.npz)")
    args = parser.parse_args()
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": json.loads(args.cluster), "task": {"type": "worker", "index": args.task},
        "rpc_layer": args.protocol})
    import tensorflow as tf
    import vans.tensorflow  # noqa: F401  (registers the vans protocols)
    from vans.tensorflow.collective_bench import SIZES, leave_together

    tf.random.set_seed(5)
    ring = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=ring)
    print(f"worker:{args.task} in a cluster of {strategy.num_replicas_in_sync} "
          f"over {args.protocol}", flush=True)

    def values(n, salt):
        """This worker's tensor of `n` floats: different on every worker, exact in float32."""
        rank = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
        return tf.sin(tf.range(n, dtype=tf.float32) * 0.001 + rank * 1.7 + salt)

    def collectives(n, salt):
        @tf.function
        def run():
            def fn():
                ctx = tf.distribute.get_replica_context()
                mine = values(n, salt)
                return (ctx.all_reduce(tf.distribute.ReduceOp.SUM, mine),
                        ctx.all_gather(mine[:64], axis=0))
            return strategy.run(fn)
        return run

    results = {}
    for name, size in SIZES.items():  # bytes of float32
        for repeat in range(2):  # a tf.function run again: the same collective keys
            reduced, gathered = collectives(size // 4, float(repeat))()
            results[f"sum_{name}_{repeat}"] = strategy.experimental_local_results(reduced)[0]
            results[f"gather_{name}_{repeat}"] = strategy.experimental_local_results(gathered)[0]

    if importlib.util.find_spec("tf_keras") is not None:
        import tf_keras as keras

        rng = np.random.default_rng(3)
        x = rng.standard_normal((256, 8)).astype(np.float32)
        y = (x @ rng.standard_normal((8, 1))).astype(np.float32)
        with strategy.scope():
            init = keras.initializers.GlorotUniform(seed=1)
            model = keras.Sequential([keras.Input((8,)),
                                      keras.layers.Dense(16, activation="tanh",
                                                         kernel_initializer=init),
                                      keras.layers.Dense(1, kernel_initializer=init)])
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.DATA
        history = model.fit(data.with_options(options), epochs=3, steps_per_epoch=8, verbose=0)
        results["losses"] = np.array(history.history["loss"])
        for i, weight in enumerate(model.get_weights()):
            results[f"weight{i}"] = weight
    stats = vans.tensorflow.runtime_stats()
    print(f"vans: {stats}", flush=True)
    results["collective_received"] = stats["collective_received"]
    np.savez(f"{args.out}.worker{args.task}.npz", **results)
    print("done", flush=True)
    leave_together(args.task, strategy.num_replicas_in_sync)


if __name__ == "__main__":
    main()
