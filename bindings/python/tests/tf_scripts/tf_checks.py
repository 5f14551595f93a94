"""vans.tensorflow against table server processes (run by test_tensorflow.py in a pytest
process of its own): the ops (built against the installed TensorFlow and loaded with
tf.load_op_library) pull the seeded rows of unsorted and negative ids, push and push-pull
apply the optimizer, inside tf.function too; the Keras layer's gradient pushes each distinct
id's summed gradient (async) or accumulates it until step() (sync); model.fit trains through
it; bad input is named, and a crafted worker attribute is an error."""

import numpy as np
import pytest
import vans

tf = pytest.importorskip("tensorflow")
import vans.tensorflow as vtf  # noqa: E402  (needs TensorFlow)

DIM = 3
LR = 0.5
SPEC = vans.table_spec(optimizer="sgd", lr=LR, dim=DIM, init="normal", std=1.0, seed=9)
TABLE_SERVER = f"""
import vans
vans.Server(table={SPEC!r}).serve()
"""


def initial(ids):
    """The rows the servers start ``ids`` (int64, any order) with, in that order."""
    keys = np.asarray(ids, dtype=np.int64).view(np.uint64)
    order = np.argsort(keys)
    rows = vans.table_initial_rows(SPEC, keys[order]).reshape(-1, DIM)
    out = np.empty_like(rows)
    out[order] = rows
    return out


@pytest.fixture
def node(cluster):
    c = cluster(num_servers=2, server_code=TABLE_SERVER)
    n = vans.Node(**c.config())
    yield n
    n.finalize()
    c.join()


def test_ops_pull_push_and_push_pull_rows_in_any_key_order(node):
    w = vans.Worker(node, dtype="float32")
    ids = tf.constant([2**62, -5, 7, 3], dtype=tf.int64)  # unsorted, a negative id
    rows = vtf.pull(w, ids, DIM)
    assert rows.shape == (4, DIM)
    np.testing.assert_allclose(rows.numpy(), initial(ids.numpy()))
    grads = tf.reshape(tf.range(12, dtype=tf.float32), (4, DIM))
    vtf.push(w, ids, grads)
    np.testing.assert_allclose(vtf.pull(w, ids, DIM).numpy(),
                               initial(ids.numpy()) - LR * grads.numpy(), rtol=1e-6)
    after = vtf.push_pull(w, ids[:2], tf.ones((2, DIM)))
    np.testing.assert_allclose(after.numpy(),
                               initial(ids.numpy()[:2]) - LR * (grads.numpy()[:2] + 1),
                               rtol=1e-6)

    @tf.function
    def pulled(keys):
        return vtf.pull(w, keys, DIM) * 2.0

    np.testing.assert_allclose(pulled(tf.constant([7], tf.int64)).numpy(),
                               2 * (initial([7]) - LR * grads.numpy()[2]), rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="unique"):
        vtf.pull(w, tf.constant([1, 1], tf.int64), DIM)
    with pytest.raises(tf.errors.InvalidArgumentError, match="9 values for 2 keys of dim 3"):
        vtf.push(w, tf.constant([1, 2], tf.int64), tf.ones((3, DIM)))
    # Rows of another width than the table's: the servers' answer does not fit, and says so.
    with pytest.raises(tf.errors.UnavailableError, match="per key"):
        vtf.pull(w, tf.constant([1], tf.int64), DIM + 1)
    # On a vans I/O thread (a request's callback) a blocking op is refused, not run: its
    # wait would return at once and leave the pull writing into a freed tensor.
    import threading
    seen, done = [], threading.Event()

    def callback(value, error):
        try:
            vtf.pull(w, tf.constant([1], tf.int64), DIM)
        except Exception as e:  # noqa: BLE001 - the test checks which
            seen.append(e)
        done.set()

    w.pull_async(np.array([1], dtype=np.uint64)).add_done_callback(callback)
    assert done.wait(30)
    assert isinstance(seen[0], tf.errors.UnavailableError), seen
    assert "async runtime thread" in str(seen[0])

    # A graph built by hand names its worker by a handle that vans checks: a made-up one, or
    # an address (what the op once took), is an error naming it, never a memory access.
    ops = vtf.load_ops()
    for crafted in (123456789, id(w)):
        with pytest.raises(tf.errors.OpError, match=f"no vans worker has handle {crafted}"):
            ops.vans_pull(tf.constant([1], tf.int64), worker=crafted, dim=DIM)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no worker"):
        ops.vans_pull(tf.constant([1], tf.int64), worker=0, dim=DIM)
    # A worker dropped while a graph still names it: an error, not freed memory.
    gone = vans.Worker(node, dtype="float32", customer_id=1)
    handle = gone._tf_handle()
    assert handle != w._tf_handle() and gone._tf_handle() == handle
    del gone
    with pytest.raises(tf.errors.OpError, match=f"handle {handle} is gone"):
        ops.vans_pull(tf.constant([1], tf.int64), worker=handle, dim=DIM)


def test_layer_pushes_summed_gradients_async_and_sync(node):
    layer = vtf.ShardedEmbedding(DIM, node, app_id=0, mode="async")
    ids = tf.constant([[4, 8, 4], [8, 15, 4]], dtype=tf.int64)
    weights = tf.reshape(tf.range(6, dtype=tf.float32), (2, 3, 1))
    with tf.GradientTape() as tape:
        out = layer(ids)
        loss = tf.reduce_sum(out * weights)
    assert out.shape == (2, 3, DIM)
    np.testing.assert_allclose(out.numpy().reshape(-1, DIM),
                               initial(ids.numpy().reshape(-1)), rtol=1e-6)
    (trigger,) = tape.gradient(loss, layer.trainable_weights)
    assert float(trigger) == 0.0
    # SGD on the servers: id 4 appears with weights 0, 2 and 5, id 8 with 1 and 3, 15 with 4.
    moved = {4: 7.0, 8: 4.0, 15: 4.0}
    start = initial(list(moved))
    got = vtf.pull(layer._worker, tf.constant(list(moved), tf.int64), DIM).numpy()
    np.testing.assert_allclose(got, start - LR * np.array(list(moved.values()))[:, None],
                               rtol=1e-6)

    # Inside tf.function, in sync mode: accumulated until step().
    # One worker of app 0 per node: the second layer shares the first's.
    sync = vtf.ShardedEmbedding(DIM, worker=layer._worker, mode="sync", combiner="sum")
    bags = tf.constant([[20, 21], [21, 22]], dtype=tf.int64)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sync(bags))
        return tape.gradient(loss, sync.trainable_weights)

    before = vtf.pull(layer._worker, tf.constant([20, 21, 22], tf.int64), DIM).numpy()
    train_step()
    np.testing.assert_allclose(
        vtf.pull(layer._worker, tf.constant([20, 21, 22], tf.int64), DIM).numpy(), before)
    sync.step()
    expect = before - LR * np.array([[1.0], [2.0], [1.0]])  # one worker: scale 1
    np.testing.assert_allclose(
        vtf.pull(layer._worker, tf.constant([20, 21, 22], tf.int64), DIM).numpy(), expect,
        rtol=1e-6)
    with pytest.raises(ValueError, match="mode='sometimes'"):
        vtf.ShardedEmbedding(DIM, worker=layer._worker, mode="sometimes")
    with pytest.raises(ValueError, match="one of node= or worker="):
        vtf.ShardedEmbedding(DIM)


def test_keras_fit_trains_through_the_layer(node):
    layer = vtf.ShardedEmbedding(DIM, node, app_id=0, mode="sync", combiner="mean")
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(layer(ids)))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, size=(256, 2))
    y = (x % 7 == 0).sum(axis=1, keepdims=True).astype(np.float32)
    before = vtf.pull(layer._worker, tf.constant(np.unique(x), tf.int64), DIM).numpy()
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0,
                        callbacks=[vtf.SyncCallback(layer)])
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    after = vtf.pull(layer._worker, tf.constant(np.unique(x), tf.int64), DIM).numpy()
    assert not np.allclose(after, before)  # the servers trained the rows
