"""A node reaches workers again after losing a link (a NAT mapping gone, a keepalive
timeout): it redials, on any path, without anybody asking; a link closed on purpose (a
goodbye) is not redialed; a worker with no path is marked unreachable, not dialed forever."""

from __future__ import annotations

import asyncio
import dataclasses

from tests import test_runtime_node
from tests.conftest import DEAD, DEAD_ADDR

nodes = test_runtime_node.two_nodes  # a fixture: requester a (listening), worker b


async def _linked(a, b, timeout=10.0):
    async with asyncio.timeout(timeout):
        while True:
            link = a.requester.links.get(b.peer_id)
            if link is not None and not link.closed:
                return link
            await asyncio.sleep(0.05)


def _watch_redials(node, monkeypatch) -> tuple[asyncio.Event, list]:
    """(set once ``node`` has handled a lost link, the peers it scheduled redials of): a
    redial is decided when the link's close reaches ``node._lost``, so once the event is set
    the answer is final, with no time to wait out."""
    handled, redials = asyncio.Event(), []
    lost, redial = node._lost, node._redial

    def watched_lost(r, link):
        lost(r, link)
        handled.set()

    def watched_redial(r):
        redials.append(r.peer_id)
        return redial(r)

    monkeypatch.setattr(node, "_lost", watched_lost)
    monkeypatch.setattr(node, "_redial", watched_redial)
    return handled, redials


async def test_a_lost_link_is_dialed_again(nodes, monkeypatch):
    a, b = nodes
    assert b.peer_id in await a.wait_for_workers(1, 20)
    handled, redials = _watch_redials(a, monkeypatch)
    first = a.requester.links[b.peer_id]
    first._abort("connection lost: the NAT forgot us")
    second = await _linked(a, b)
    assert second is not first
    assert await second.ping(5) > 0
    assert handled.is_set() and redials == [b.peer_id]  # the redial below did it


async def test_a_goodbye_is_not_redialed(nodes, monkeypatch):
    a, b = nodes
    await a.wait_for_workers(1, 20)
    handled, redials = _watch_redials(a, monkeypatch)
    await b._incoming[a.peer_id].close("leaving")
    await asyncio.wait_for(handled.wait(), 10)  # a has read the goodbye and decided
    assert redials == []
    link = a.requester.links.get(b.peer_id)
    assert link is None or link.closed


async def test_a_lost_link_to_a_refused_peer_is_not_dialed_again(nodes, caplog, monkeypatch):
    """A blocked worker leaves when it learns of its block (its link drops), and a peer
    whose lie was proven is refused: neither is dialed again. `make demo` warned "worker
    <the blocked liar> unreachable" after the liar had rightly gone."""
    a, b = nodes
    await a.wait_for_workers(1, 20)
    a.proven_liars.add(b.peer_id)  # what the runtime does on proof; a block is the same
    caplog.set_level("INFO", logger="swarm.node")
    handled, redials = _watch_redials(a, monkeypatch)
    a.requester.links[b.peer_id]._abort("connection lost: it left")
    await asyncio.wait_for(handled.wait(), 10)
    assert redials == []
    link = a.requester.links.get(b.peer_id)
    assert link is None or link.closed
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()
                or "reached again" in r.getMessage()]


async def test_a_worker_with_no_path_is_marked_unreachable(nodes):
    a, b = nodes
    records = [r for r in await a.members() if r.peer_id == b.peer_id]
    await b.server.close()  # its address stops answering
    gone = [dataclasses.replace(records[0], links=(DEAD_ADDR,))]
    assert await a.connect_workers(gone) == []
    until, why = a.unreachable[b.peer_id]
    assert f"tls {DEAD}" in why
    assert await a.connect_workers(gone) == []  # not dialed again while backing off


def _worker(tmp_path, name: str, sid: bytes, **options):
    """A numpy worker's config (one thread, a tiny benchmark) in swarm ``sid``."""
    from swarm.control.charter import validators
    from swarm.node import NodeConfig

    return NodeConfig(tmp_path / name, sid, roles=("worker",), backend="numpy", threads=1,
                      bench_sizes=(64,), validators=validators(), dht_rpc_timeout=1.0,
                      **options)


async def test_one_round_links_a_member_that_only_a_relay_reaches(tmp_path):
    """Members reached directly are linked before signals go out through them: c (no
    reachable address) is linked over WebRTC signaled through b in the very round that
    dials b. (Before: both dials began together, c's found no relay yet, and c was marked
    unreachable for a whole backoff; a NAT system test failed so.)"""
    from identity.keys import PeerKey
    from swarm.control.charter import validators
    from swarm.members import swarm_id
    from swarm.node import Node, NodeConfig

    sid = swarm_id(PeerKey.generate().public_bytes)
    common = dict(validators=validators(), dht_rpc_timeout=1.0)
    a = Node(NodeConfig(tmp_path / "a", sid, roles=("requester",), listen=False, **common))
    await a.start()
    boot = (a.dht.address,)
    b = Node(_worker(tmp_path, "b", sid, bootstrap=boot))
    c = Node(_worker(tmp_path, "c", sid, bootstrap=boot, relays=1))
    try:
        await b.start()
        await c.start()
        async with asyncio.timeout(30):
            while b.peer_id not in c._relay_links:  # c holds its link to b, as behind a NAT
                await asyncio.sleep(0.05)
            while {b.peer_id, c.peer_id} - {r.peer_id for r in await a.members()}:
                await asyncio.sleep(0.05)
        records = {r.peer_id: r for r in await a.members()}
        hidden = dataclasses.replace(records[c.peer_id], links=(DEAD_ADDR,))
        linked = await asyncio.wait_for(a.connect_workers([hidden, records[b.peer_id]]), 60)
        assert set(linked) == {b.peer_id, c.peer_id}, a.unreachable
        assert a.requester.links[c.peer_id].kind == "webrtc"
    finally:
        for n in (c, b, a):
            await n.stop(graceful=False)


async def test_a_relay_link_that_breaks_is_replaced_at_once(tmp_path):
    """A node behind a NAT is signaled through its relay link; when a flush breaks it, the
    node links a relay again in about RELAY_AGAIN, not at the next RELAY_INTERVAL (10 s),
    which held up every requester re-dialing it (the NAT flush test waited ~8 s)."""
    from identity.keys import PeerKey
    from swarm.members import swarm_id
    from swarm.node import RELAY_INTERVAL, Node

    sid = swarm_id(PeerKey.generate().public_bytes)
    b = Node(_worker(tmp_path, "b", sid))
    await b.start()
    c = Node(_worker(tmp_path, "c", sid, bootstrap=(b.dht.address,), relays=1))
    try:
        await c.start()
        async with asyncio.timeout(30):
            while b.peer_id not in c._relay_links:
                await asyncio.sleep(0.05)
        first = c._relay_links[b.peer_id]
        first._abort("connection lost: the NAT forgot us")
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(RELAY_INTERVAL / 2):
            while c._relay_links[b.peer_id] is first:
                await asyncio.sleep(0.05)
        again = c._relay_links[b.peer_id]
        assert not again.closed and await again.ping(5) > 0
        print(f"relay linked again in {asyncio.get_running_loop().time() - started:.2f} s")
    finally:
        for n in (c, b):
            await n.stop(graceful=False)


async def test_a_failed_redial_says_when_it_tries_again(nodes, caplog):
    """The redial's own schedule (0.5, 2, 5, 10 s), not the member view's 60 s backoff."""
    a, b = nodes
    await a.wait_for_workers(1, 20)
    await b.server.close()  # its address stops answering
    caplog.set_level("WARNING", logger="swarm.node")
    a.requester.links[b.peer_id]._abort("connection lost: the NAT forgot us")
    async with asyncio.timeout(20):
        while not any("unreachable" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.05)
    first = next(r.getMessage() for r in caplog.records if "unreachable" in r.getMessage())
    assert "next try in 2 s" in first, first


async def test_a_worker_still_unreachable_is_warned_about_once(nodes, caplog):
    """`make demo` kills its coordinator on purpose, and each redial printed the whole
    reason again as a WARNING (three or four long lines). The first failure warns; those
    after it, until the worker is reached again, are INFO."""
    a, b = nodes
    records = [r for r in await a.members() if r.peer_id == b.peer_id]
    await b.server.close()  # its address stops answering
    gone = dataclasses.replace(records[0], links=(DEAD_ADDR,))
    caplog.set_level("INFO", logger="swarm.node")
    for _ in range(3):
        assert await a._dial(gone) is None
    told = [r.levelname for r in caplog.records if "unreachable (no direct" in r.getMessage()]
    assert told == ["WARNING", "INFO", "INFO"]
