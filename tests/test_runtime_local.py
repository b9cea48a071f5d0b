"""The runtime end to end through swarm.local: real worker processes, DHT, TLS links.

One local swarm per module where possible (start-up is ~1 s); faults use their own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

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


def test_work_is_spread_and_verified(even_rates):
    client = even_rates
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
    with swarm.local(workers=1, threads=1, chaos="delay=1500") as c:
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


@contextlib.contextmanager
def _worker_stopped_mid_job(hold, sig: int, seed: int):
    """A job on two workers; worker 0 holds a shard (computed, unanswered: ``hold=``) when
    it gets ``sig``; the job's result checked. Yields (client, worker 0's id)."""
    from tests.conftest import wait_held

    with swarm.local(workers=2, threads=1, chaos=[f"hold={hold}", None]) as c:
        rng = np.random.default_rng(seed)
        a, b = rand(rng, 400, 200), rand(rng, 200, 300)
        ref = c.matmul.remote(a, b)
        wait_held(hold, 1)
        c.processes[0].send_signal(sig)
        np.testing.assert_allclose(swarm.get(ref, timeout=60), a @ b, rtol=1e-4, atol=1e-3)
        yield c, c.worker_ids[0]


@pytest.mark.slow
def test_worker_killed_mid_job_and_job_still_correct(tmp_path):
    with _worker_stopped_mid_job(tmp_path, signal.SIGKILL, 4) as (c, victim):
        assert c.last_report.peers[str(victim)].verified == 0
        assert c.processes[0].wait(10) == -signal.SIGKILL


@pytest.mark.slow
def test_lying_worker_is_caught_and_its_shards_redone():
    # The honest worker answers 300 ms late, so the liar's answers arrive first and are
    # checked within the job: a copy that beat it would be judged only after the job (its
    # answer is waited for apart from it), and this test reads the job's own report.
    with swarm.local(workers=2, threads=1, chaos=["corrupt=1", "delay=300"]) as c:
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
        # its signed wrong result is re-checked here: no more work for it from this node
        deadline = time.monotonic() + 30
        while liar not in c.node.proven_liars and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.node.proven_liars == {liar}
        assert liar not in c.workers()
        # forgiven, to show that an actor hosted by the liar is checked too: its wrong answer
        # is caught, reported and redone here
        c.node.proven_liars.clear()
        reported.clear()
        h = c.actor("matmul", peer=liar)
        np.testing.assert_allclose(swarm.get(h.matmul.remote(a, b), timeout=30), a @ b,
                                   rtol=1e-4, atol=1e-3)
        assert reported == [liar]


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


SAXPY = """
struct Params { alpha: f32, count: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < params.count) { y[gid.x] = params.alpha * x[gid.x] + y[gid.x]; }
}
"""


@pytest.mark.slow
def test_wgsl_kernel_replicated_on_two_peers(client):
    pytest.importorskip("wgpu")
    x = np.arange(100, dtype=np.float32)
    y = np.ones(100, np.float32)
    p = np.array([np.float32(2.0).view(np.uint32), 100], np.uint32)
    out = client.kernel(x, y, p, wgsl=SAXPY, inputs=["x", "y", "params"],
                        outputs=[("y", (100,), "float32")], dispatch=(2, 1, 1), timeout=60)
    np.testing.assert_array_equal(out, 2 * x + 1)
    ran = {peer for peer, r in client.last_report.peers.items() if r.shards}
    assert ran == {str(w) for w in client.worker_ids}          # both peers ran it
    assert all(r.verified == r.shards for r in client.last_report.peers.values())


@pytest.mark.slow
def test_actor_kernel_is_checked_against_a_second_peer(client):
    pytest.importorskip("wgpu")
    h = client.actor("matmul")
    x = np.arange(64, dtype=np.float32)
    p = np.array([np.float32(3.0).view(np.uint32), 64], np.uint32)
    ref = h.kernel.remote(x, np.zeros(64, np.float32), p, wgsl=SAXPY,
                          inputs=["x", "y", "params"], outputs=[("y", (64,), "float32")],
                          dispatch=(1, 1, 1))
    np.testing.assert_array_equal(swarm.get(ref, timeout=60), 3 * x)
    with pytest.raises(ValueError, match="Freivalds"):
        h.kernel.remote(x, wgsl=SAXPY, inputs=["x"], outputs=[("y", (2,), "float32")],
                        dispatch=(1, 1, 1), verify="freivalds")


def test_kernel_misuse(client):
    with pytest.raises(ValueError, match="replicate"):
        client.kernel(np.ones(2, np.float32), wgsl=SAXPY, inputs=["x"],
                      outputs=[("y", (2,), "float32")], dispatch=(1, 1, 1), verify="freivalds")
    with pytest.raises(ValueError, match="dispatch"):
        client.kernel(np.ones(2, np.float32), wgsl=SAXPY, inputs=["x"],
                      outputs=[("y", (2,), "float32")], dispatch=(0, 1, 1))
    with pytest.raises(ValueError, match="name each"):
        client.kernel(np.ones(2, np.float32), wgsl=SAXPY, inputs=[],
                      outputs=[("y", (2,), "float32")], dispatch=(1, 1, 1))


def test_matmul_replicate_and_reduced_precision(client):
    rng = np.random.default_rng(7)
    a, b = rand(rng, 64, 48), rand(rng, 48, 32)
    np.testing.assert_allclose(client.matmul(a, b, verify="replicate", timeout=30), a @ b,
                               rtol=1e-4, atol=1e-3)
    peers = client.last_report.peers
    assert {p for p, r in peers.items() if r.shards} == {str(w) for w in client.worker_ids}
    assert sum(r.shards for r in peers.values()) == 2 * client.last_report.shards  # twins
    assert all(r.verified == r.shards for r in peers.values())
    for precision, tol in (("f16", 2e-2), ("bf16", 1e-1)):
        c = client.matmul(a, b, precision=precision, timeout=30)
        assert np.abs(c - a @ b).max() < tol * np.abs(a @ b).max()
        assert all(r.rejected == 0 for r in client.last_report.peers.values())


def test_accept_peer_hook_keeps_shards_off_a_peer(client):
    banned = client.worker_ids[0]
    client.node.accept_peer = lambda peer: peer != banned
    try:
        rng = np.random.default_rng(8)
        a, b = rand(rng, 256, 128), rand(rng, 128, 128)
        np.testing.assert_allclose(client.matmul(a, b, timeout=30), a @ b, rtol=1e-4, atol=1e-3)
        assert str(banned) not in client.last_report.peers
    finally:
        client.node.accept_peer = lambda peer: True


def test_solo_mode_without_workers():
    with swarm.local(workers=0) as c:
        a = np.ones((3, 4), np.float32)
        np.testing.assert_allclose(c.matmul(a, a.T), a @ a.T)
        assert set(c.last_report.peers) == {"local"}


@pytest.mark.slow
def test_graceful_stop_finishes_or_hands_back_its_shards(tmp_path):
    with _worker_stopped_mid_job(tmp_path, signal.SIGTERM, 6) as (c, leaving):
        assert c.processes[0].wait(30) == 0          # it left cleanly, not killed
        assert c.last_report.peers[str(leaving)].rejected == 0


async def test_refs_are_awaitable_from_asyncio(client):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = await client.matmul.remote(a, a.T.copy())
    np.testing.assert_allclose(out, a @ a.T)


def test_worker_processes_leave_with_a_killed_client(tmp_path):
    import subprocess
    import sys
    import time

    from tests.conftest import read_line, subprocess_env

    script = ("import swarm, sys\n"
              "c = swarm.local(workers=1, threads=1)\n"
              "print(c.processes[0].pid, flush=True)\n"
              "sys.stdin.read()\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE, env=subprocess_env(), text=True)
    try:
        worker = int(read_line(parent, 60))
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)   # polling another process's exit: there is no event to wait on
        else:
            os.kill(worker, signal.SIGKILL)
            raise AssertionError("the worker outlived its killed client")
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.slow
def test_straggler_is_re_executed_elsewhere(tmp_path):
    with swarm.local(workers=2, threads=1, chaos=[f"hold={tmp_path}", None]) as c:
        slow = c.worker_ids[0]
        rng = np.random.default_rng(10)
        a, b = rand(rng, 300, 200), rand(rng, 200, 200)
        # the slow worker holds its shards until it is stopped; the job ends without them
        np.testing.assert_allclose(c.matmul(a, b, timeout=15), a @ b, rtol=1e-4, atol=1e-3)
        report = c.last_report
        assert report.peers.get(str(slow)) is None or report.peers[str(slow)].shards == 0
        fast = report.peers[str(c.worker_ids[1])]
        assert fast.shards == report.shards and fast.verified == report.shards
        assert list(tmp_path.glob("held-*")), "the slow worker was dealt nothing to redo"


def test_closing_the_client_cancels_pending_refs(tmp_path):
    import concurrent.futures as cf

    from tests.conftest import wait_held

    c = swarm.local(workers=1, threads=1, chaos=f"hold={tmp_path}")
    try:
        x = np.ones((2, 2), np.float32)
        ref = c.matmul.remote(x, x)
        wait_held(tmp_path, 1)         # at the worker, unanswered until it is stopped
    finally:
        c.close()
    with pytest.raises(cf.CancelledError):
        swarm.get(ref, timeout=10)
    with pytest.raises(RuntimeError, match="closed"):
        c.matmul.remote(x, x)


def test_workers_run_this_tree_whatever_the_directory_they_start_in(tmp_path):
    """``python -m`` puts the working directory first on sys.path, before the PYTHONPATH
    that names this tree: started from a directory holding another ``swarm`` (an older
    checkout, say), the workers ran that code beside this requester."""
    import subprocess
    import sys
    from pathlib import Path

    decoy = tmp_path / "elsewhere" / "swarm"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('a decoy swarm package ran')\n")
    script = tmp_path / "one_job.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(swarm.__file__).resolve().parent.parent)!r})\n"
        "import numpy as np, swarm\n"
        "with swarm.local(workers=1, threads=1, timeout=60) as c:\n"
        "    x = np.eye(3, dtype=np.float32)\n"
        "    assert (c.matmul(x, x) == x).all()\n"
        "print('ok')\n")
    run = subprocess.run([sys.executable, str(script)], cwd=decoy.parent, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
