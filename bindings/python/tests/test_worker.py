"""Push, pull and push-pull from Python against real server processes: sums, dtypes, zero-copy
inputs (buffer protocol, DLPack), pull into the caller's array, and errors that name their
cause."""

import numpy as np
import pytest
import vans
from vans import errors

KEYS = np.array([1, 7, 1 << 40, 2**64 - 2], dtype=np.uint64)


def test_push_then_pull_returns_the_sums(cluster):
    c = cluster(num_servers=2)
    w = vans.Worker(dtype=np.float32, **c.config())
    assert (w.node.role, w.node.id, w.node.num_servers) == ("worker", 9, 2)
    w.push(KEYS, np.array([1, 2, 3, 4], dtype=np.float32))
    w.push(KEYS, np.array([10, 20, 30, 40], dtype=np.float32))
    np.testing.assert_array_equal(w.pull(KEYS), [11, 22, 33, 44])
    # Into the caller's array: the same object comes back, filled.
    out = np.zeros(4, dtype=np.float32)
    assert w.pull(KEYS, out=out) is out
    np.testing.assert_array_equal(out, [11, 22, 33, 44])
    # Push-pull: the updated values in one round trip, with per-key lengths.
    vals, lens = w.push_pull(KEYS, np.ones(4, dtype=np.float32), return_lens=True)
    np.testing.assert_array_equal(vals, [12, 23, 34, 45])
    np.testing.assert_array_equal(lens, [1, 1, 1, 1])
    # Several values per key, with explicit lengths.
    keys = np.array([3, 2**63], dtype=np.uint64)
    w.push(keys, np.arange(5, dtype=np.float32), lens=np.array([2, 3], dtype=np.int32))
    vals, lens = w.pull(keys, return_lens=True)
    np.testing.assert_array_equal(vals, np.arange(5))
    np.testing.assert_array_equal(lens, [2, 3])
    w.node.finalize()
    c.join()


@pytest.mark.parametrize("dtype", ["float64", "int32", "int64"])
def test_other_dtypes(cluster, dtype):
    c = cluster(env={"TEST_DTYPE": dtype})
    w = vans.Worker(dtype=np.dtype(dtype), **c.config())
    assert w.dtype == dtype
    vals = np.array([5, -6, 7, 8], dtype=dtype)
    for _ in range(3):
        w.push(KEYS, vals)
    got = w.pull(KEYS)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, vals * 3)
    w.node.finalize()
    c.join()


class OnlyDlpack:
    """A CPU tensor that exports only ``__dlpack__`` (as torch and JAX tensors do)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_buffer_protocol_and_dlpack_inputs(cluster):
    c = cluster()
    w = vans.Worker(**c.config())
    w.push(OnlyDlpack(KEYS), OnlyDlpack(np.full(4, 2, dtype=np.float32)))
    w.push(memoryview(KEYS), memoryview(np.full(4, 3, dtype=np.float32)))
    w.push(KEYS.astype(np.int64), np.full(4, 5, dtype=np.float32))  # int64 keys are fine
    np.testing.assert_array_equal(w.pull(KEYS), [10, 10, 10, 10])
    # A DLPack tensor as the output: written in place, no copy in between.
    target = np.zeros(4, dtype=np.float32)
    w.pull(KEYS, out=OnlyDlpack(target))
    np.testing.assert_array_equal(target, [10, 10, 10, 10])
    w.node.finalize()
    c.join()


def test_bad_input_raises_an_error_naming_it(cluster):
    c = cluster()
    w = vans.Worker(**c.config())
    with pytest.raises(TypeError, match="float64 but this worker carries float32"):
        w.push(KEYS, np.ones(4))
    with pytest.raises(TypeError, match="keys must be uint64"):
        w.push(np.array([1.0, 2.0]), np.ones(2, dtype=np.float32))
    with pytest.raises(ValueError, match="sorted"):
        w.push(KEYS[::-1].copy(), np.ones(4, dtype=np.float32))
    with pytest.raises(ValueError, match="not C-contiguous"):
        w.push(KEYS, np.ones(8, dtype=np.float32)[::2])
    with pytest.raises(ValueError, match="do not divide evenly"):
        w.push(KEYS, np.ones(5, dtype=np.float32))
    with pytest.raises(TypeError, match="neither the buffer protocol nor __dlpack__"):
        w.push(KEYS, [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(TypeError, match="not supported"):
        vans.Worker(w.node, dtype="complex64")
    w.push(KEYS, np.ones(4, dtype=np.float32))
    with pytest.raises(ValueError, match="12 bytes does not hold the same whole number of "
                                         "4-byte values for each of 4 keys"):
        w.pull(KEYS, out=np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros(4, dtype=np.float32)
        ro.flags.writeable = False
        w.pull(KEYS, out=ro)
    with pytest.raises(ValueError, match="barrier group"):
        w.node.barrier("everyone")
    # The worker still works after all of that.
    np.testing.assert_array_equal(w.pull(KEYS), [1, 1, 1, 1])
    w.node.finalize()
    c.join()


def test_a_pull_never_returns_fewer_values_than_keys_and_bad_keys_are_named(cluster):
    # ps-lite's behaviour by default: a key no one pushed pulls as zeros in its place. Two
    # servers: key 999 and key 2**64 - 2 live on different ones.
    c = cluster(num_servers=2)
    w = vans.Worker(**c.config())
    w.push(np.array([1, 5], dtype=np.uint64), np.array([1, 2], dtype=np.float32))
    keys = np.array([1, 5, 999, 2**64 - 2], dtype=np.uint64)
    out = np.full(4, -1, dtype=np.float32)
    np.testing.assert_array_equal(w.pull(keys, out=out), [1, 2, 0, 0])
    # Without out= the length of a key no one pushed is unknown: an error naming the key,
    # not a shorter array (whichever server answers first names its key).
    with pytest.raises(errors.HandlerFailedError,
                       match=f"key (999|{2**64 - 2}) was never pushed"):
        w.pull(keys)
    # A repeated key would be summed twice: refused by name, nothing pushed.
    with pytest.raises(ValueError, match="key 7 is given twice"):
        w.push(np.array([7, 7], dtype=np.uint64), np.ones(2, dtype=np.float32))
    with pytest.raises(ValueError, match="key 5 is given twice"):
        w.pull(np.array([1, 5, 5], dtype=np.uint64))
    # int64 keys are read as uint64 (hashed ids may be negative): a negative key out of that
    # order is named as negative, not as "not sorted".
    with pytest.raises(ValueError,
                       match="key -1 at position 0 is negative: int64 keys are read as uint64"):
        w.pull(np.array([-1, 3], dtype=np.int64))
    with pytest.raises(ValueError, match="keys must be sorted in ascending order: key 1"):
        w.pull(np.array([5, 1], dtype=np.uint64))
    np.testing.assert_array_equal(w.pull(np.array([1, 5], dtype=np.int64)), [1, 2])
    w.node.finalize()
    c.join()


def test_servers_can_refuse_pulls_of_keys_no_one_pushed(cluster):
    c = cluster(env={"VANS_UNPUSHED_KEYS": "error"})
    w = vans.Worker(**c.config())
    w.push(np.array([1], dtype=np.uint64), np.array([3], dtype=np.float32))
    keys = np.array([1, 2], dtype=np.uint64)
    with pytest.raises(errors.HandlerFailedError, match="key 2 was never pushed"):
        w.pull(keys, out=np.zeros(2, dtype=np.float32))
    np.testing.assert_array_equal(w.pull(keys[:1]), [3])
    w.node.finalize()
    c.join()


def test_bad_configuration_is_a_config_error():
    with pytest.raises(errors.ConfigError, match="DMLC_NUM_WORKER"):
        vans.Node(role="worker", num_servers=1, root_uri="127.0.0.1", root_port=9,
                  env={"DMLC_NUM_WORKER": "many"})
    with pytest.raises(errors.ConfigError):
        vans.Node(role="gardener")


def test_bootstrap_deadline(monkeypatch):
    monkeypatch.setenv("VANS_BOOTSTRAP_TIMEOUT_SECS", "1")
    from conftest import free_port

    with pytest.raises(errors.BootstrapError, match="scheduler"):
        vans.Node(role="worker", num_servers=1, num_workers=1, root_uri="127.0.0.1",
                  root_port=free_port())
