"""Ray's manners on the Python API: put, options, direct-call errors, cancel, kill,
get_actor, refs of running tasks as arguments; and the shared-memory path under
swarm.local (used between co-located peers, not when switched off)."""

from __future__ import annotations

import mmap
import time

import msgpack
import numpy as np
import pytest

import swarm
from swarm import api
from swarm.errors import ActorDiedError, TaskCancelledError
from swarm.runtime import actors
from tests.conftest import wait_held
from tests.links_helpers import mapping_at, memfds
from tests.test_runtime_local import rand

pytestmark = [pytest.mark.system]

SAXPY = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    y[id.x] = 3.0 * x[id.x];
}
"""


@pytest.fixture(scope="module")
def client():
    with swarm.local(workers=2, threads=1, timeout=60) as c:
        yield c


def test_module_put_uses_the_newest_open_client(client, monkeypatch):
    rng = np.random.default_rng(0)
    w = rand(rng, 64, 32)
    ref = swarm.put(w)
    assert ref.owner is client and swarm.get(ref) is not w
    a = rand(rng, 8, 64)
    np.testing.assert_allclose(swarm.get(client.matmul.remote(a, ref), timeout=30), a @ w,
                               rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(api, "_OPEN", [])
    with pytest.raises(RuntimeError, match=r"swarm\.local\(.*\) or swarm\.connect"):
        swarm.put(w)


def test_options_keep_call_options_apart_from_method_parameters(client, monkeypatch):
    rng = np.random.default_rng(1)
    a, b = rand(rng, 16, 16), rand(rng, 16, 16)
    ref = client.matmul.options(verify="none", timeout=30).remote(a, b)
    np.testing.assert_allclose(swarm.get(ref, timeout=30), a @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="verify"):
        client.matmul.options(verify="sometimes")
    with pytest.raises(TypeError, match="unknown option"):
        client.kernel.options(wgsl=SAXPY)
    # a method whose own parameters are called verify and timeout
    spec = actors.MethodSpec("scale", lambda arrays, params: None, "scale(x, verify=, timeout=)")
    fake = type("Fake", (), {"NAME": "fake", "METHODS": {"scale": spec}})
    monkeypatch.setitem(actors.REGISTRY, "fake", fake)
    sent = []
    client.node.requester.on_task_sent = lambda peer, msg: sent.append(msg)
    try:
        h = client.actor("fake")
        ref = h.scale.options(verify="none").remote(a, verify=1, timeout=2.5)
        with pytest.raises(Exception):  # noqa: B017 - the workers have no class "fake"
            swarm.get(ref, timeout=30)
    finally:
        client.node.requester.on_task_sent = None
    assert [msgpack.unpackb(m.params) for m in sent] == [{"verify": 1, "timeout": 2.5}]


def test_remote_calls_called_directly_say_what_to_do(client):
    x = np.ones((2, 2), np.float32)
    with pytest.raises(TypeError, match=r"\.options\(\.\.\.\)\.remote"):
        client.matmul.options(timeout=5)(x, x)
    with pytest.raises(TypeError, match=r"remote"):
        client.actor("matmul").matmul(x, x)
    with pytest.raises(TypeError, match="no Python functions"):
        swarm.remote(lambda: 1)
    with pytest.raises(TypeError, match="two operands"):
        client.matmul.options().remote(x)


def test_cancel_a_running_task(tmp_path):
    hold = tmp_path / "hold"
    hold.mkdir()
    sent = []
    with swarm.local(workers=1, threads=1, chaos=f"hold={hold}") as c:
        real = c.node.requester._cancel

        async def cancel(link, tid):
            sent.append(tid)
            await real(link, tid)

        c.node.requester._cancel = cancel
        try:
            x = np.ones((4, 4), np.float32)
            ref = c.matmul.remote(x, x)
            wait_held(hold, 1)                     # running at the worker, not answered
            queued = c.matmul.remote(2 * x, x)      # behind it
            assert swarm.cancel(ref) is True and swarm.cancel(queued) is True
            for r in (ref, queued):
                with pytest.raises(TaskCancelledError):
                    swarm.get(r, timeout=10)
            deadline = time.monotonic() + 10  # told from the client's loop thread
            while not sent:
                assert time.monotonic() < deadline, "the worker was not told to drop the task"
                time.sleep(0.02)
        finally:
            (hold / "release").touch()
        # the late answer changes nothing, the queued task never ran, the worker serves on
        np.testing.assert_array_equal(swarm.get(c.matmul.remote(x, x), timeout=30), 4 * x)
        with pytest.raises(TaskCancelledError):
            swarm.get(ref, timeout=10)
        assert len(wait_held(hold, 2)) == 2
        done = c.put(x)
        assert swarm.cancel(done) is False  # nothing to cancel
        with pytest.raises(TypeError, match="ObjectRef"):
            swarm.cancel(x)


def test_named_actor_get_and_kill(client):
    h = client.actor("matmul", name="mm")
    assert swarm.get_actor("mm") is h and client.get_actor("mm") is h
    with pytest.raises(ValueError, match="already exists"):
        client.actor("matmul", name="mm")
    x = np.eye(4, dtype=np.float32)
    np.testing.assert_array_equal(swarm.get(h.matmul.remote(x, x), timeout=30), x)
    swarm.kill(h)
    with pytest.raises(ActorDiedError, match="killed"):
        h.matmul.remote(x, x)
    with pytest.raises(ValueError, match="no live actor named 'mm'"):
        swarm.get_actor("mm")
    again = client.actor("matmul", name="mm")  # the name is free again
    assert swarm.get_actor("mm") is again
    with pytest.raises(TypeError, match="ActorHandle"):
        swarm.kill("mm")


def test_kill_cancels_calls_in_flight(tmp_path):
    hold = tmp_path / "hold"
    hold.mkdir()
    with swarm.local(workers=1, threads=1, chaos=f"hold={hold}") as c:
        try:
            h = c.actor("matmul", max_restarts=-1)
            x = np.ones((4, 4), np.float32)
            ref = h.matmul.remote(x, x)
            wait_held(hold, 1)                     # in flight: at the worker, unanswered
            swarm.kill(h)
            with pytest.raises(TaskCancelledError):
                swarm.get(ref, timeout=10)
        finally:
            (hold / "release").touch()
        with pytest.raises(ActorDiedError, match="killed"):
            h.matmul.remote(x, x)                   # no restart, whatever max_restarts said


def test_refs_of_running_tasks_nest_into_kernels_and_actor_calls(tmp_path):
    hold = tmp_path / "hold"
    hold.mkdir()
    rng = np.random.default_rng(4)
    a = rand(rng, 64, 1)
    ones = np.ones((1, 1), np.float32)
    with swarm.local(workers=1, threads=1, chaos=f"hold={hold}") as c:
        try:
            col = c.matmul.remote(a, ones)
            wait_held(hold, 1)
            assert not col.future().done()          # still running when passed on
            flat = c.actor("matmul").matmul.remote(col, ones)
            y = c.kernel.options(verify="none").remote(
                flat, np.zeros((64, 1), np.float32), wgsl=SAXPY, inputs=["x", "y"],
                outputs=[("y", (64,), "float32")], dispatch=(1, 1, 1))
            assert not y.future().done()
        finally:
            (hold / "release").touch()
        np.testing.assert_allclose(swarm.get(y, timeout=60), 3 * a.reshape(-1), rtol=1e-5)


def test_colocated_workers_exchange_arrays_through_shared_memory(even_rates):
    # even rates: a worker whose rate an earlier stall holds down gets a band under the
    # inline budget (25 rows at 1:80), which rightly travels inline, not through a segment
    client = even_rates
    rng = np.random.default_rng(5)
    a, b = rand(rng, 2048, 512), rand(rng, 512, 512)  # every band > 64 KiB (not inline)
    before = {p: link.shm.sent for p, link in client.node.requester.links.items()}
    np.testing.assert_allclose(client.matmul(a, b, timeout=30), a @ b, rtol=1e-3, atol=1e-3)

    async def kinds():
        return {p: (link.shm is not None, link.shm.sent if link.shm else 0, link.shm.received
                    if link.shm else 0) for p, link in client.node.requester.links.items()}

    after = client._loop.run(kinds())
    assert len(after) == 2 and all(used for used, _, _ in after.values())  # both negotiated
    ran = [p for p in after if client.last_report.peers.get(str(p))
           and client.last_report.peers[str(p)].shards]  # the scheduler's choice (answered)
    assert ran and all(after[p][1] > before[p] and after[p][2] > 0 for p in ran), (
        before, after, client.last_report,
        {p: link.shm.waiting for p, link in client.node.requester.links.items()})


def test_a_right_operand_is_written_to_shared_memory_once_for_every_colocated_worker(
        even_rates, monkeypatch):
    from swarm.links import shm

    client = even_rates

    rng = np.random.default_rng(8)
    a, b = rand(rng, 2048, 512), rand(rng, 512, 1536)  # a fresh b: both workers need it
    written: list[int] = []
    real = shm._sealed

    def counted(data):
        written.append(len(memoryview(data).cast("B")))
        return real(data)

    monkeypatch.setattr(shm, "_sealed", counted)
    np.testing.assert_allclose(client.matmul(a, b, timeout=30), a @ b, rtol=1e-3, atol=1e-3)
    report = client.last_report
    # b went to both workers (under load one may answer every band and the other's band be
    # sent again, so count what was sent, not who answered)
    assert len([p for p in report.peers.values() if p.bytes_out >= b.nbytes]) == 2, report
    a_sent = sum(p.bytes_out for p in report.peers.values()) - 2 * b.nbytes
    assert a_sent >= a.nbytes, report
    # b's bytes written once, not once per worker (a's bands are smaller; a band small enough
    # to travel inline is not written at all)
    assert written.count(b.nbytes) == 1, written
    assert sum(written) - b.nbytes <= a_sent, (written, report)


def test_many_small_calls_in_flight_are_one_band_each_and_spread_over_the_workers(even_rates):
    client = even_rates
    rng = np.random.default_rng(10)
    w = client.put(rand(rng, 1024, 1024))  # 4 MiB: each band's check reads all of it
    xs = [rand(rng, 256, 1024) for _ in range(8)]
    swarm.get(client.matmul.remote(xs[0], w), timeout=30)  # w cached on the workers
    sent: list = []
    req = client.node.requester
    req.on_task_sent = lambda peer, msg: sent.append((peer, msg.args[0].array.shape[0]))
    try:
        outs = swarm.get([client.matmul.remote(x, w) for x in xs], timeout=60)
    finally:
        req.on_task_sent = None
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out, x @ swarm.get(w), rtol=1e-3, atol=1e-3)
    assert {rows for _, rows in sent} == {256}, sent  # one band (one check) per call
    base = outs[0]
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)  # that band is the output: received zero-copy, kept
    assert len({peer for peer, _ in sent}) == 2, sent  # and the calls spread over both workers


def test_bands_in_shared_memory_are_mapped_into_the_output_not_copied(even_rates):
    """The output's pages are the workers' sealed segments (copy-on-write), and holding
    outputs holds no descriptors."""
    client = even_rates
    rng = np.random.default_rng(12)
    b = client.put(rand(rng, 1024, 1024))
    client.matmul(rand(rng, 256, 1024), b, timeout=30)  # b cached on the workers
    before = memfds()
    outs = []
    for _ in range(3):
        a = rand(rng, 2048, 1024)
        out = client.matmul(a, b, timeout=30)
        np.testing.assert_allclose(out, a @ swarm.get(b), rtol=1e-3, atol=1e-3)
        assert client.last_report.shards == 2
        starts = [out[0].__array_interface__["data"][0], out[-1].__array_interface__["data"][0]]
        assert all(mapping_at(x).startswith("/memfd:swarm-shm") for x in starts)
        outs.append(out)
    outs[0][0, 0] = 7.0  # an output is the caller's to change (its own copy of that page)
    assert outs[0][0, 0] == 7.0
    assert memfds() <= before, (before, memfds())


def test_no_shared_memory_when_switched_off(monkeypatch):
    monkeypatch.setenv("SWARM_SHM", "0")  # the workers inherit it: "remote" on both sides
    with swarm.local(workers=1, threads=1) as c:
        rng = np.random.default_rng(6)
        a = rand(rng, 300, 300)
        np.testing.assert_allclose(c.matmul(a, a, timeout=30), a @ a, rtol=1e-3, atol=1e-3)
        assert all(link.shm is None for link in c.node.requester.links.values())
        assert c.last_report.shards == 2  # over the network: two bands, transfer overlaps


def test_a_worker_on_shared_memory_gets_its_share_as_one_band(client):
    """Nothing travels to overlap, and every band costs a BLAS packing pass over b."""
    rng = np.random.default_rng(11)
    a, b = rand(rng, 600, 300), rand(rng, 300, 300)  # 300 rows each: room for two bands
    np.testing.assert_allclose(client.matmul(a, b, timeout=30), a @ b, rtol=1e-3, atol=1e-3)
    assert all(link.shm is not None for link in client.node.requester.links.values())
    assert client.last_report.shards <= 2, client.last_report


@pytest.mark.slow
def test_swarm_join_workers_on_the_requesters_host_use_shared_memory(tmp_path):
    """Real `swarm publish` and `swarm join` processes, found through the DHT, dialed at
    their announced addresses: the same shared-memory path as swarm.local's workers."""
    from tests.control_support import Cluster

    cluster = Cluster(tmp_path)
    try:
        cluster.publish()
        cluster.join("w1")
        client = swarm.connect(cluster.uri, data_dir=cluster.root, min_workers=2, timeout=90)
        try:
            rng = np.random.default_rng(7)
            a = rand(rng, 400, 300)
            np.testing.assert_allclose(client.matmul(a, a.T.copy(), timeout=60), a @ a.T,
                                       rtol=1e-3, atol=1e-3)

            async def used():
                return [(link.shm is not None and link.shm.sent > 0 and link.shm.received > 0)
                        for link in client.node.requester.links.values()
                        if str(link.remote) in client.last_report.peers]

            shm_links = client._loop.run(used())
            assert shm_links and all(shm_links)
        finally:
            client.close()
    finally:
        cluster.close()
