"""vans.torch.ShardedEmbedding / ShardedEmbeddingBag against a table server process: rows as
the seeded initializer gives them for any 64-bit ids, a repeated id's gradients summed before
the push, async pushes applied at once, sync ones only at step(), and bad input named."""

import time

import numpy as np
import pytest
import vans

torch = pytest.importorskip("torch")
import vans.torch  # noqa: E402  (needs torch)

DIM = 3
SPEC = vans.table_spec(optimizer="sgd", lr=0.5, dim=DIM, init="normal", std=1.0, seed=5)
# Application 1: a table of another width, which a DIM-wide embedding must not read.
TABLE_SERVER = f"""
import vans
server = vans.Server(table={SPEC!r})
vans.Server(server.node, app_id=1, optimizer="sgd", dim={DIM + 2})
server.serve()
"""


def initial(ids):
    keys = np.asarray(ids, dtype=np.int64).reshape(-1).view(np.uint64)
    return torch.from_numpy(vans.table_initial_rows(SPEC, np.sort(keys))), np.sort(keys)


def expected_rows(ids):
    rows, keys = initial(ids)
    keys_of = np.asarray(ids, dtype=np.int64).reshape(-1).view(np.uint64)
    return rows.view(-1, DIM)[np.searchsorted(keys, keys_of)]


@pytest.fixture
def table(cluster):
    c = cluster(num_servers=2, server_code=TABLE_SERVER)
    node = vans.Node(**c.config())
    yield node
    node.finalize()
    c.join()


def test_async_embedding_pulls_rows_and_pushes_summed_gradients(table):
    emb = vans.torch.ShardedEmbedding(DIM, app_id=0, mode="async", node=table)
    ids = torch.tensor([[7, -2, 7], [2**62, 7, 11]])  # repeats, a negative id, a huge one
    out = emb(ids)
    assert out.shape == (2, 3, DIM)
    before = expected_rows(ids.reshape(-1).numpy()).view(2, 3, DIM)
    torch.testing.assert_close(out.detach(), before)
    weights = torch.arange(6, dtype=torch.float32).view(2, 3, 1)
    (out * weights).sum().backward()
    emb.step()
    # SGD: each row moved by lr times the sum of its occurrences' weights (id 7: 0 + 2 + 4).
    moved = {7: 6.0, -2: 1.0, 2**62: 3.0, 11: 5.0}
    after = emb.rows(torch.tensor(list(moved)))
    start = expected_rows(np.array(list(moved)))
    step = torch.tensor(list(moved.values())).view(-1, 1) * 0.5
    torch.testing.assert_close(after, start - step)


def test_an_application_nobody_serves_fails_within_seconds_naming_it(table):
    # The servers serve applications 0 and 1: a lookup in application 2 is refused by the
    # server, naming both sides, not left to the embedding's 300 s timeout.
    emb = vans.torch.ShardedEmbedding(DIM, app_id=2, mode="async", node=table)
    start = time.monotonic()
    served = r"it serves application 0 \(customer 0\), application 1 \(customer 0\)"
    with pytest.raises(vans.errors.HandlerFailedError,
                       match=r"no application 2 \(customer 0\).*" + served):
        emb(torch.tensor([1, 2]))
    assert time.monotonic() - start < 30


def test_sync_bag_applies_only_at_step(table):
    bag = vans.torch.ShardedEmbeddingBag(DIM, app_id=0, mode="sync", mode_bag="mean",
                                         node=table)
    ids = torch.tensor([[1, 2], [2, 3]])
    out = bag(ids)
    rows = expected_rows(np.array([1, 2, 3]))
    torch.testing.assert_close(out.detach(), torch.stack([rows[:2].mean(0), rows[1:].mean(0)]))
    out.sum().backward()
    # Accumulated on the servers, not applied before step().
    torch.testing.assert_close(bag.rows(torch.tensor([1, 2, 3])), rows)
    bag.step()
    # One worker: grad_scale 1; d(sum of means)/d(row) = 0.5 per bag it is in.
    torch.testing.assert_close(bag.rows(torch.tensor([1, 2, 3])),
                               rows - 0.5 * torch.tensor([[0.5], [1.0], [0.5]]))
    # Without autograd (evaluation), nothing is pushed.
    bag.eval()
    with torch.no_grad():
        bag(ids)
    bag.step()
    torch.testing.assert_close(bag.rows(torch.tensor([1])), rows[:1] - 0.25)


def test_bad_arguments_are_named(table):
    with pytest.raises(ValueError, match="mode='sometimes'"):
        vans.torch.ShardedEmbedding(DIM, app_id=0, mode="sometimes", node=table)
    emb = vans.torch.ShardedEmbedding(DIM, app_id=0, mode="async", node=table)
    with pytest.raises(TypeError, match="pass int64"):
        emb(torch.tensor([1.5]))
    # A second worker of the same application in one process is refused.
    with pytest.raises(ValueError, match="app 0 customer 0 is already registered"):
        vans.torch.ShardedEmbedding(DIM, app_id=0, mode="async", node=table)
    # Rows of another width than the embedding's: the pull fails, naming both.
    other = vans.torch.ShardedEmbedding(DIM, app_id=1, mode="async", node=table)
    with pytest.raises(vans.errors.ProtocolError, match="12 bytes per key.*20 value bytes"):
        other(torch.tensor([1]))
