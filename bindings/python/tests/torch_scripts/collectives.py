"""Runs every collective of the process group on seeded inputs and saves the results (one
file per rank) for the test to compare across backends: ``collectives.py BACKEND OUT_DIR``.
Operations the backend does not support are left out of its file."""

import os
import sys

import torch
import torch.distributed as dist

backend, out_dir = sys.argv[1], sys.argv[2]
if backend == "vans":
    import vans.torch  # noqa: F401 - registers the backend
dist.init_process_group(backend)
rank, n = dist.get_rank(), dist.get_world_size()
results = {}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32,
          torch.int64, torch.uint8]


def data(dtype, count, who=None, salt=0):
    """Rank ``who``'s input (every rank can compute every rank's)."""
    g = torch.Generator().manual_seed(1000 * (rank if who is None else who) + salt)
    if dtype.is_floating_point:
        return (torch.randn(count, generator=g) * 4).to(dtype)
    high = 4 if dtype == torch.uint8 else 100
    return torch.randint(0 if dtype == torch.uint8 else -high, high, (count,), generator=g,
                         dtype=torch.int64).to(dtype)


def attempt(name, fn):
    try:
        results[name] = fn()
    except (RuntimeError, ValueError, NotImplementedError) as e:
        if backend == "vans":
            raise
        print(f"{backend} does not do {name}: {str(e).splitlines()[0]}", flush=True)


# Sizes below and above the direct all-reduce threshold (64 KiB) and the slice (256 KiB).
for dtype in DTYPES:
    for count in (1, 7, 5000, 100_003):
        for op_name in ("SUM", "MIN", "MAX", "PRODUCT", "AVG"):
            if op_name == "PRODUCT" and count > 7:
                continue  # products of thousands of values overflow to inf/0 alike
            if op_name == "AVG" and not dtype.is_floating_point:
                continue

            def allreduce(dtype=dtype, count=count, op_name=op_name):
                t = data(dtype, count)
                if op_name == "AVG" and backend == "gloo":
                    dist.all_reduce(t, op=dist.ReduceOp.SUM)   # Gloo has no AVG
                    return t / n
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op_name))
                return t
            attempt(f"all_reduce/{dtype}/{count}/{op_name}", allreduce)

    def broadcast(dtype=dtype):
        t = data(dtype, 3001)
        dist.broadcast(t, src=n - 1)
        return t
    attempt(f"broadcast/{dtype}", broadcast)

    def all_gather(dtype=dtype):
        outs = [torch.zeros(33, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, data(dtype, 33))
        return torch.stack(outs)
    attempt(f"all_gather/{dtype}", all_gather)

    def all_gather_into_tensor(dtype=dtype):
        out = torch.zeros(n * 70_000, dtype=dtype)
        dist.all_gather_into_tensor(out, data(dtype, 70_000))
        return out
    attempt(f"all_gather_into_tensor/{dtype}", all_gather_into_tensor)

    def reduce_scatter(dtype=dtype):
        out = torch.zeros(17, dtype=dtype)
        dist.reduce_scatter(out, [data(dtype, 17, salt=i) for i in range(n)])
        return out
    attempt(f"reduce_scatter/{dtype}", reduce_scatter)

    def reduce_scatter_tensor(dtype=dtype):
        out = torch.zeros(40_000, dtype=dtype)
        dist.reduce_scatter_tensor(out, data(dtype, n * 40_000))
        return out
    attempt(f"reduce_scatter_tensor/{dtype}", reduce_scatter_tensor)

    def all_to_all_single(dtype=dtype):
        out = torch.zeros(n * 5, dtype=dtype)
        dist.all_to_all_single(out, data(dtype, n * 5))
        return out
    attempt(f"all_to_all_single/{dtype}", all_to_all_single)


def all_to_all_uneven():
    # Rank r sends r + k + 1 rows of 2 to rank k.
    send = [rank + k + 1 for k in range(n)]
    recv = [k + rank + 1 for k in range(n)]
    inp = data(torch.float32, 2 * sum(send)).reshape(-1, 2)
    out = torch.zeros(sum(recv), 2)
    dist.all_to_all_single(out, inp, recv, send)
    return out


attempt("all_to_all_single/uneven", all_to_all_uneven)


def all_to_all_list():
    inputs = [data(torch.int64, rank + k + 1, salt=k) for k in range(n)]
    outputs = [torch.zeros(k + rank + 1, dtype=torch.int64) for k in range(n)]
    dist.all_to_all(outputs, inputs)
    expected = [data(torch.int64, k + rank + 1, who=k, salt=rank) for k in range(n)]
    for k, (got, want) in enumerate(zip(outputs, expected)):
        assert torch.equal(got, want), f"all_to_all block from rank {k}: {got} != {want}"
    return torch.cat(outputs)


attempt("all_to_all/list", all_to_all_list)


def send_recv():
    # A ring: each rank sends to the next and receives from the previous, two tags.
    got = [torch.zeros(1000), torch.zeros(3)]
    works = [dist.isend(data(torch.float32, 1000, salt=7), (rank + 1) % n, tag=0),
             dist.isend(data(torch.float32, 3, salt=8), (rank + 1) % n, tag=5),
             dist.irecv(got[1], (rank - 1) % n, tag=5),
             dist.irecv(got[0], (rank - 1) % n, tag=0)]
    for w in works:
        w.wait()
    return torch.cat(got)


attempt("send_recv", send_recv)


def async_ops():
    ts = [data(torch.float32, 10_000, salt=s) for s in range(5)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    return torch.cat(ts)


attempt("async_all_reduce", async_ops)
dist.barrier()

if backend == "vans":
    # Wrong arguments fail at once, in torch's words, and the group goes on working.
    checks = {
        "non-contiguous": (lambda: dist.all_reduce(torch.ones(4, 4).t()), "contiguous"),
        "int16": (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), "dtype"),
        "bitwise": (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                            op=dist.ReduceOp.BAND), "not supported"),
        "gather size": (lambda: dist.all_gather([torch.zeros(2)] * n, torch.zeros(3)), "size"),
        "root": (lambda: dist.broadcast(torch.zeros(2), src=n + 3), "rank"),
        "any source": (lambda: dist.recv(torch.zeros(2)), "source"),
        "own block": (lambda: dist.all_to_all_single(
            torch.zeros(2 * n), torch.zeros(2 * n), [2] * n, [1] * (n - 1) + [n + 1]),
            "itself"),
    }
    for name, (call, words) in checks.items():
        try:
            call()
        except (ValueError, TypeError, RuntimeError) as e:
            assert words in str(e), f"{name}: {e}"
        else:
            raise AssertionError(f"{name}: no error")
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [n] * 3, t
    # In place: the input is this rank's block of the output (as FSDP gathers).
    out = torch.zeros(n * 4)
    out[rank * 4:(rank + 1) * 4] = rank + 1
    dist.all_gather_into_tensor(out, out[rank * 4:(rank + 1) * 4])
    assert out.tolist() == [float(k + 1) for k in range(n) for _ in range(4)], out
    print("argument errors ok", flush=True)

torch.save(results, os.path.join(out_dir, f"{backend}-{rank}.pt"))
dist.destroy_process_group()
print(f"rank {rank}: {len(results)} results", flush=True)
