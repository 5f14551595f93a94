"""Requests in flight: asyncio awaitables, completion callbacks, polling, timeouts, and the
GIL released while a wait blocks."""

import asyncio
import threading
import time

import numpy as np
import pytest
import vans
from vans import errors

KEYS = np.array([2, 4, 2**50], dtype=np.uint64)

# A server whose handler sleeps on pulls for the tests that need a slow answer: a sum
# otherwise (one shard: a Python handler runs with the GIL).
SLOW_SERVER = """
import time, numpy as np, vans
store = {}
def handle(req):
    keys = req["keys"]
    if req["push"]:
        for k, v in zip(keys.tolist(), req["vals"].tolist()):
            store[k] = store.get(k, 0.0) + v
    if req["pull"]:
        time.sleep(0.5)
        return np.array([store.get(k, 0.0) for k in keys.tolist()], dtype=np.float32)
vans.Server(handler=handle).serve()
"""


def test_asyncio_awaits_many_requests(cluster):
    c = cluster(num_servers=2)
    w = vans.Worker(**c.config())

    async def main():
        ones = np.ones(3, dtype=np.float32)
        await asyncio.gather(*(w.push_async(KEYS, ones) for _ in range(50)))
        pulled = await w.pull_async(KEYS)
        # Other coroutines keep running while requests are in flight.
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.ensure_future(tick())
        both = await asyncio.gather(w.pull_async(KEYS), w.push_pull_async(KEYS, ones))
        ticker.cancel()
        return pulled, both, ticks

    pulled, (again, updated), ticks = asyncio.run(main())
    np.testing.assert_array_equal(pulled, [50, 50, 50])
    np.testing.assert_array_equal(updated, [51, 51, 51])
    assert again.tolist() in ([50, 50, 50], [51, 51, 51])
    assert ticks > 0
    w.node.finalize()
    c.join()


def test_asyncio_raises_the_named_error(cluster):
    c = cluster()
    w = vans.Worker(**c.config())

    async def bad():
        await w.push_async(KEYS, np.ones(2, dtype=np.float32))

    with pytest.raises(ValueError, match="do not divide evenly"):
        asyncio.run(bad())
    w.node.finalize()
    c.join()


def test_callbacks_and_polling(cluster):
    c = cluster()
    w = vans.Worker(**c.config())
    results = []
    done = threading.Event()

    def callback(value, error):
        results.append((value, error))
        if len(results) == 2:
            done.set()

    w.push_async(KEYS, np.full(3, 2, dtype=np.float32)).wait()
    w.pull_async(KEYS).add_done_callback(callback)
    w.pull_async(KEYS, out=np.zeros(2, dtype=np.float32)).add_done_callback(callback)
    assert done.wait(30)
    by_kind = sorted(results, key=lambda r: r[1] is None)
    value, error = by_kind[0]
    assert value is None and isinstance(error, ValueError)
    assert "8 bytes does not hold the same whole number of 4-byte values for each of 3 keys" \
        in str(error)
    value, error = by_kind[1]
    assert error is None
    np.testing.assert_array_equal(value, [2, 2, 2])

    request = w.pull_async(KEYS)
    deadline = time.monotonic() + 30
    while not request.done():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    np.testing.assert_array_equal(request.wait(), [2, 2, 2])
    with pytest.raises(ValueError, match="already waited"):
        request.wait()
    w.node.finalize()
    c.join()


def test_wait_releases_the_gil_and_times_out(cluster):
    c = cluster(server_code=SLOW_SERVER)
    w = vans.Worker(**c.config())
    w.push(KEYS, np.ones(3, dtype=np.float32))
    # While this thread waits 0.5 s for the slow pull, another Python thread runs.
    counted = 0
    stop = threading.Event()

    def count():
        nonlocal counted
        while not stop.is_set():
            counted += 1

    counter = threading.Thread(target=count)
    counter.start()
    started = time.monotonic()
    np.testing.assert_array_equal(w.pull(KEYS), [1, 1, 1])
    waited = time.monotonic() - started
    stop.set()
    counter.join()
    assert waited >= 0.4
    assert counted > 10_000, f"the other thread ran only {counted} times in {waited:.2f} s"

    # A timeout ends the wait with a TimeoutError (also the builtin one); the request goes
    # on and can be waited for again.
    request = w.pull_async(KEYS)
    with pytest.raises(errors.TimeoutError):
        request.wait(timeout=0.05)
    with pytest.raises(TimeoutError):
        request.wait(timeout=0.05)
    np.testing.assert_array_equal(request.wait(timeout=30), [1, 1, 1])
    w.node.finalize()
    c.join()


INTERRUPTED_WORKER = """
import signal, sys, vans
# A shell that starts a job in the background ignores SIGINT for it, children included, and
# Python then keeps SIGINT ignored: restore Python's own handler, as an interactive run has.
signal.signal(signal.SIGINT, signal.default_int_handler)
node = vans.Node()
print("waiting", flush=True)
try:
    node.barrier("workers+servers")  # the servers never come: waits until interrupted
except KeyboardInterrupt:
    print("interrupted", flush=True)
    node.stop()
    sys.exit(0)
sys.exit(1)
"""


def test_ctrl_c_interrupts_a_blocking_wait(cluster):
    import signal
    import subprocess

    c = cluster()
    worker = c.start("worker", INTERRUPTED_WORKER, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "waiting"
    time.sleep(0.3)
    worker.send_signal(signal.SIGINT)
    out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0 and "interrupted" in out
    c.kill()
