"""Rendezvous from Python: a server task echoes arrays back to the worker task, step by step,
in pull and push mode."""

import numpy as np
import pytest
import vans

ECHO_SERVER = """
import os, numpy as np, vans
node = vans.Node()
rdv = vans.Rendezvous(node, protocol=os.environ["TEST_PROTOCOL"])
me, peer = vans.cpu_device(node.id), vans.cpu_device(9)
for step in range(5):
    x = rdv.recv(step, vans.create_key(peer, me, "x", iter=step), dtype="float32")
    rdv.send(step, vans.create_key(me, peer, "y", iter=step), x * 2)
node.finalize()
"""


@pytest.mark.parametrize("protocol", ["pull", "push"])
def test_send_and_receive_arrays(cluster, protocol):
    c = cluster(server_code=ECHO_SERVER, env={"TEST_PROTOCOL": protocol})
    node = vans.Node(**c.config())
    rdv = vans.Rendezvous(node, protocol=protocol)
    assert rdv.protocol == protocol
    me, server = vans.cpu_device(node.id), vans.cpu_device(8)
    assert server == "/job:ps/replica:0/task:0/device:CPU:0"
    # No TensorFlow tasks in this cluster: the manager names nodes by rank too.
    assert (rdv.device(node.id), rdv.device(8)) == (me, server)
    with pytest.raises(ValueError, match="not a node id"):
        rdv.device(4)
    for step in range(5):
        x = np.arange(1000 * step + 1, dtype=np.float32)
        if step % 2:
            rdv.send(step, vans.create_key(me, server, "x", iter=step), x, copy=False)
        else:
            # Copied: the caller's buffer may be reused at once without changing what is sent.
            reused = x.copy()
            rdv.send(step, vans.create_key(me, server, "x", iter=step), reused)
            reused[:] = -1
        if step % 2:
            out = np.empty_like(x)
            y = rdv.recv(step, vans.create_key(server, me, "y", iter=step), out=out)
            assert y is out
        else:
            y, dead = rdv.recv(step, vans.create_key(server, me, "y", iter=step),
                               dtype="float32", return_dead=True)
            assert not dead
        np.testing.assert_array_equal(y, x * 2)
        rdv.cleanup(step)
    with pytest.raises(ValueError, match="key"):
        rdv.send(9, "not a key", b"x")
    node.finalize()
    c.join()
