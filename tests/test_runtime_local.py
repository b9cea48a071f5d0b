"""The runtime end to end through swarm.local: real worker processes, DHT, TLS links.

One local swarm per module where possible (start-up is ~1 s); faults use their own.
"""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

import swarm
from swarm.errors import ActorDiedError, GetTimeoutError

pytestmark = [pytest.mark.system]


@pytest.fixture(scope="module")
def client():
    with swarm.local(workers=2, threads=1, timeout=60) as c:
        yield c


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_are_correct(client, seed):
    rng = np.random.default_rng(seed)
    m, k, n = (int(x) for x in rng.integers(1, 300, 3))
    a, b = rand(rng, m, k), rand(rng, k, n)
    c = client.matmul(a, b, timeout=30)
    assert c.shape == (m, n)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)


def test_work_is_spread_and_verified(client):
    rng = np.random.default_rng(9)
    a, b = rand(rng, 256, 256), rand(rng, 256, 256)
    client.matmul(a, b, timeout=30)
    report = client.last_report
    assert len([p for p in report.peers.values() if p.shards]) == 2
    assert all(p.verified == p.shards and p.rejected == 0 for p in report.peers.values())


def _bytes_to_workers(client):
    async def read():
        return {p: link.stats().bytes_sent for p, link in client.node.requester.links.items()}
    return client._loop.run(read())


def test_cached_weights_are_not_sent_twice(client):
    rng = np.random.default_rng(1)
    w = client.put(rand(rng, 256, 512))          # 512 KiB
    a = rand(rng, 64, 256)                        # 64 KiB
    client.matmul.remote(a, w).future().result(30)
    before = _bytes_to_workers(client)
    for _ in range(3):
        np.testing.assert_allclose(swarm.get(client.matmul.remote(a, w), timeout=30),
                                   a @ swarm.get(w), rtol=1e-4, atol=1e-3)
    moved = sum(_bytes_to_workers(client).values()) - sum(before.values())
    assert moved < 3 * (a.nbytes + 32 * 1024), moved   # activations only, never the weight
    assert moved < w.future().result().nbytes


def test_refs_chain_and_wait(client):
    rng = np.random.default_rng(2)
    a, b = rand(rng, 32, 32), rand(rng, 32, 32)
    ab = client.matmul.remote(a, b)
    abb = client.matmul.remote(ab, b)             # a ref as the input of another task
    ready, rest = swarm.wait([ab, abb], num_returns=2, timeout=30)
    assert ready == [ab, abb] and rest == []
    np.testing.assert_allclose(swarm.get(abb), (a @ b) @ b, rtol=1e-3, atol=1e-2)


def test_get_and_wait_time_out_on_a_slow_swarm():
    with swarm.local(workers=1, threads=1, chaos="delay=3000") as c:
        x = np.ones((4, 4), np.float32)
        ref = c.matmul.remote(x, x)
        with pytest.raises(GetTimeoutError):
            swarm.get(ref, timeout=0.2)
        ready, rest = swarm.wait([ref], timeout=0.2)
        assert ready == [] and rest == [ref]
        np.testing.assert_allclose(swarm.get(ref, timeout=30), x @ x)  # it still finishes


def test_actor_calls_in_order_and_misuse(client):
    h = client.actor("matmul", max_task_retries=1)
    rng = np.random.default_rng(3)
    mats = [rand(rng, 8, 8) for _ in range(5)]
    refs = [h.matmul.remote(m, m) for m in mats]
    for m, out in zip(mats, swarm.get(refs, timeout=30), strict=True):
        np.testing.assert_allclose(out, m @ m, rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match="remote"):
        h.matmul(mats[0], mats[0])
    with pytest.raises(AttributeError, match="no method"):
        h.fly.remote()


@pytest.mark.parametrize("call,err,match", [
    (lambda c: c.matmul([[1.0]], np.ones((1, 1))), TypeError, "numpy"),
    (lambda c: c.matmul(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32)), ValueError,
     "columns"),
    (lambda c: c.matmul(np.ones(3), np.ones(3)), ValueError, "2-D"),
    (lambda c: c.matmul(np.ones((2, 2), np.int64), np.ones((2, 2))), ValueError, "dtype"),
    (lambda c: c.matmul(np.ones((2, 2)), np.ones((2, 2)), verify="maybe"), ValueError, "verify"),
    (lambda c: c.matmul(np.ones((2, 2)), np.ones((2, 2)), precision="f8"), ValueError, "f16"),
    (lambda c: c.matmul(np.ones((2, 2)), np.ones((2, 2)), retries=3), TypeError, "unknown"),
    (lambda c: c.actor("matmul", max_restarts=-2), ValueError, "max_restarts"),
    (lambda c: c.actor("matmul", max_restarts="1"), TypeError, "max_restarts"),
    (lambda c: c.actor("gpt"), ValueError, "installed"),
    (lambda c: c.put([1, 2]), TypeError, "numpy"),
])
def test_misuse_fails_before_sending(client, call, err, match):
    sent = []
    client.node.requester.on_task_sent = lambda peer, msg: sent.append(msg)
    try:
        with pytest.raises(err, match=match):
            call(client)
    finally:
        client.node.requester.on_task_sent = None
    assert sent == []


@pytest.mark.slow
def test_worker_killed_mid_job_and_job_still_correct():
    # worker 0 answers 2 s late, so it is certainly holding a shard when it is killed
    with swarm.local(workers=2, threads=1, chaos=["delay=2000", None]) as c:
        victim = c.worker_ids[0]
        got_shard = threading.Event()
        c.node.requester.on_task_sent = lambda peer, msg: (
            got_shard.set() if peer == victim else None)
        rng = np.random.default_rng(4)
        a, b = rand(rng, 400, 200), rand(rng, 200, 300)
        ref = c.matmul.remote(a, b)
        assert got_shard.wait(30)
        os.kill(c.processes[0].pid, signal.SIGKILL)
        np.testing.assert_allclose(swarm.get(ref, timeout=60), a @ b, rtol=1e-4, atol=1e-3)
        report = c.last_report
        assert report.peers[str(victim)].verified == 0
        assert c.processes[0].wait(10) == -signal.SIGKILL


@pytest.mark.slow
def test_lying_worker_is_caught_and_its_shards_redone():
    with swarm.local(workers=2, threads=1, chaos=["corrupt=1", None]) as c:
        liar = c.worker_ids[0]
        reported = []
        c.node.on_lying_peer(lambda peer, why: reported.append(peer))
        rng = np.random.default_rng(5)
        a, b = rand(rng, 300, 200), rand(rng, 200, 100)
        out = c.matmul(a, b, timeout=60)
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)
        assert c.last_report.peers[str(liar)].rejected >= 1
        assert reported and set(reported) == {liar}
        assert c.node.requester.rates.rejected[liar] >= 1


@pytest.mark.slow
def test_actor_dies_without_restarts():
    with swarm.local(workers=1, threads=1, chaos="crash_after=1") as c:
        h = c.actor("matmul")
        x = np.ones((2, 2), np.float32)
        np.testing.assert_allclose(swarm.get(h.matmul.remote(x, x), timeout=30), x @ x)
        with pytest.raises(ActorDiedError):
            swarm.get(h.matmul.remote(x, x), timeout=30)


@pytest.mark.slow
def test_actor_restarts_elsewhere_and_retries_the_call():
    with swarm.local(workers=2, threads=1, chaos=["crash_after=1", None]) as c:
        first, second = c.worker_ids
        h = c.actor("matmul", peer=first, max_restarts=1, max_task_retries=1)
        x = np.arange(4, dtype=np.float32).reshape(2, 2)
        np.testing.assert_allclose(swarm.get(h.matmul.remote(x, x), timeout=30), x @ x)
        # the host crashes on this call: the actor restarts on the other worker, call retried
        np.testing.assert_allclose(swarm.get(h.matmul.remote(x, x), timeout=30), x @ x)
        assert h._peer == second
