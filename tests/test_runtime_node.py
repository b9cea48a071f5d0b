"""Node hooks the control plane uses, on loopback in one process (real DHT and TLS)."""

from __future__ import annotations

import asyncio

import pytest

from identity.keys import PeerKey
from swarm import wire
from swarm.control.charter import validators
from swarm.errors import AuthenticationError
from swarm.members import swarm_id
from swarm.node import Node, NodeConfig


@wire.message("test.hello")
class Hello(wire.Message):
    """A control-plane message stand-in."""

    text: str
    """Payload."""


@pytest.fixture
async def two_nodes(tmp_path):
    sid = swarm_id(PeerKey.generate().public_bytes)
    a = Node(NodeConfig(tmp_path / "a", sid, validators=validators(), roles=("requester",), listen=True,
                        dht_rpc_timeout=1.0))
    await a.start()
    b = Node(NodeConfig(tmp_path / "b", sid, validators=validators(), roles=("worker",), backend="numpy", threads=1,
                        bootstrap=(a.dht.address,), bench_sizes=(64,), dht_rpc_timeout=1.0))
    await b.start()
    try:
        yield a, b
    finally:
        await b.stop(graceful=False)
        await a.stop(graceful=False)


async def test_members_control_messages_and_accept_hook(two_nodes):
    a, b = two_nodes
    members = {m.peer_id: m for m in await a.members()}
    assert set(members) == {a.peer_id, b.peer_id}
    assert members[b.peer_id].roles == ("worker",) and members[b.peer_id].links
    assert members[b.peer_id].tflops > 0

    got: asyncio.Queue = asyncio.Queue()
    b.on_control(Hello, lambda link, msg: got.put_nowait((link.remote, msg.text)))
    await a.send_control(b.peer_id, Hello("hi"))
    assert await asyncio.wait_for(got.get(), 10) == (a.peer_id, "hi")

    # b refuses a from now on (kicked): a new link from a is refused at the handshake
    b.accept_peer = lambda peer: peer != a.peer_id
    await a.requester.close()
    with pytest.raises(AuthenticationError, match="refused"):
        await a.send_control(b.peer_id, Hello("again"))
    # and a requester's own accept hook keeps b out of its worker list
    a.accept_peer = lambda peer: peer != b.peer_id
    assert b.peer_id not in await a.connect_workers()


async def test_lying_peer_callbacks(two_nodes):
    a, _ = two_nodes
    seen = []
    a.on_lying_peer(lambda peer, why: seen.append((peer, why)))
    a.report_lying_peer(a.peer_id, "test")
    assert seen == [(a.peer_id, "test")]


def _report_wrong_result(a: Node, b: Node):
    """``a`` rejects a liar's signed wrong result and reports it, the DHT naming ``b`` as the
    coordinator; returns the evidence package sent."""
    from swarm.runtime.requester import evidence_for
    from tests.test_runtime_evidence import job, signed

    liar = PeerKey.generate()
    call, reply = signed(liar, a.key, *job())
    package = evidence_for(a.peer_id, liar.peer_id, call, reply, "failed check")

    async def b_by_the_dht():
        return b.peer_id

    a.find_coordinator = b_by_the_dht
    a.report_lying_peer(liar.peer_id, "failed check", package)
    return package


async def test_evidence_refused_by_a_peer_not_coordinating_is_sent_again(two_nodes):
    """A stale DHT state can name a peer that does not coordinate (its claim timed out, or
    it is handing off): it answers so, and the evidence goes again until one takes it."""
    from swarm.runtime.protocol import EvidenceAck, EvidenceMsg

    a, b = two_nodes
    got: list[bytes] = []
    taken = asyncio.Event()

    async def coordinator_later(link, msg: EvidenceMsg) -> None:
        got.append(msg.evidence)
        await link.send(EvidenceAck(package.evidence.key, len(got) >= 3))
        if len(got) >= 3:
            taken.set()

    b.on_control(EvidenceMsg, coordinator_later)
    package = _report_wrong_result(a, b)
    await asyncio.wait_for(taken.wait(), 20)
    await asyncio.wait_for(asyncio.gather(*a._deliveries), 10)  # done once taken
    assert got == [package.evidence.encode()] * 3


async def test_evidence_goes_again_when_unanswered(monkeypatch, two_nodes):  # patch outlives nodes
    """Evidence that no one acknowledges (a receiver that died or an old peer) is retried."""
    from swarm import node as node_module
    from swarm.runtime.protocol import EvidenceMsg

    monkeypatch.setattr(node_module, "EVIDENCE_ACK_WAIT", 0.2)
    monkeypatch.setattr(node_module, "EVIDENCE_WAIT", 1.0)  # stop() would wait 15 s for acks
    a, b = two_nodes
    twice = asyncio.Event()
    got: list[bytes] = []

    def silent(link, msg: EvidenceMsg) -> None:
        got.append(msg.evidence)
        if len(got) == 2:
            twice.set()

    b.on_control(EvidenceMsg, silent)
    _report_wrong_result(a, b)
    await asyncio.wait_for(twice.wait(), 20)


async def test_a_new_coordinator_also_gets_the_evidence_its_predecessor_had(two_nodes, tmp_path):
    """A block takes two pieces of evidence at one coordinator, and a coordinator keeps its
    count in memory: in `swarm demo` the first piece went to the coordinator of term 2, the
    next to that of term 3 after a handoff, and the liar stayed unblocked for another job
    (15-30 s). Evidence delivered to a new coordinator now brings the earlier pieces against
    the same worker that it has not had."""
    from swarm.runtime.evidence import Evidence
    from swarm.runtime.protocol import EvidenceAck, EvidenceMsg
    from swarm.runtime.requester import evidence_for
    from tests.test_runtime_evidence import job, signed

    a, b = two_nodes
    c = Node(NodeConfig(tmp_path / "c", a.config.swarm_id, validators=validators(),
                        roles=("worker",), backend="numpy", threads=1,
                        bootstrap=(a.dht.address,), bench_sizes=(64,), dht_rpc_timeout=1.0))
    await c.start()
    try:
        got: dict[str, list[bytes]] = {"b": [], "c": []}

        def coordinator(name: str):
            async def take(link, msg: EvidenceMsg) -> None:
                got[name].append(msg.evidence)
                await link.send(EvidenceAck(Evidence.decode(msg.evidence).key, True))
            return take

        b.on_control(EvidenceMsg, coordinator("b"))
        c.on_control(EvidenceMsg, coordinator("c"))
        liar, other = PeerKey.generate(), PeerKey.generate()

        tasks = iter(range(1, 100))

        def report(worker: PeerKey):
            task = next(tasks)  # a distinct receipt each: a piece counts once
            call, reply = signed(worker, a.key, *job(seed=task), task=task)
            package = evidence_for(a.peer_id, worker.peer_id, call, reply, "failed check")
            a.report_lying_peer(worker.peer_id, "failed check", package)
            return package.evidence.encode()

        async def delivered():
            while a._deliveries:
                await asyncio.wait_for(asyncio.gather(*a._deliveries), 20)

        coord = b

        async def by_the_dht():
            return coord.peer_id

        a.find_coordinator = by_the_dht
        first, elsewhere = report(liar), report(other)
        await delivered()
        coord = c  # failover or handoff: c coordinates now
        second = report(liar)
        await delivered()
        assert sorted(got["b"]) == sorted([first, elsewhere])
        assert sorted(got["c"]) == sorted([first, second])  # not the other worker's
        third = report(liar)
        await delivered()
        assert sorted(got["c"]) == sorted([first, second, third])  # each piece once
    finally:
        await c.stop(graceful=False)


async def test_node_backoff_reads_its_injected_clock(tmp_path):
    """A worker marked unreachable until ``t`` on the node's ``clock`` is not dialled before
    ``t`` on that clock: the node's timers are injectable (issue 36), not time.monotonic()
    read behind the clock a test or simulator set."""
    from types import SimpleNamespace

    sid = swarm_id(PeerKey.generate().public_bytes)
    node = Node(NodeConfig(tmp_path / "a", sid, validators=validators(), roles=("requester",),
                           listen=False))
    node.clock = lambda: 0.0
    worker = PeerKey.generate().peer_id
    node.unreachable[worker] = (5.0, "backed off")
    dialled = []

    async def no_dial(r, why):
        dialled.append(r.peer_id)
        return None
    node._dial_direct = node._dial_indirect = no_dial
    record = SimpleNamespace(roles=("worker",), links=("x",), peer_id=worker, via=None)
    assert await node.connect_workers([record]) == []
    assert dialled == []


async def test_node_background_tasks_are_supervised(tmp_path, caplog):
    """A node task that fails is logged, not dropped as 'exception never retrieved', and
    stop cancels what is still running (issue 36: no unsupervised task)."""
    sid = swarm_id(PeerKey.generate().public_bytes)
    node = Node(NodeConfig(tmp_path / "a", sid, validators=validators(), roles=("requester",),
                           listen=False))

    async def broken() -> None:
        raise RuntimeError("boom")
    forever = asyncio.Event()
    node._spawn(broken())
    node._spawn(forever.wait())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert "node task failed: RuntimeError('boom')" in caplog.text
    assert len(node._tasks) == 1
    node._tasks.cancel()
    await asyncio.wait_for(node._tasks.settle(), 5)
    assert len(node._tasks) == 0
