"""The iterative lookup over an in-memory network (no sockets), and its helpers."""

from __future__ import annotations

import asyncio
import hashlib
import random

from kademlia.node import Node

from dht.lookup import lookup
from dht.routing import NearestRoutingTable
from dht.rtt import RttEstimator
from identity import PeerKey
from tests.dht_support import loopback_dht

K = 8


def _net(n: int, seed: int = 1) -> list[Node]:
    rng = random.Random(seed)
    return [Node(hashlib.sha1(rng.randbytes(8)).digest(), "127.0.0.1", 1000 + i)
            for i in range(n)]


def _closest(nodes, target, k=K):
    t = int.from_bytes(target, "big")
    return sorted(nodes, key=lambda n: n.long_id ^ t)[:k]


def _query_for(nodes, dead=frozenset(), delay=0.0, finished=None, dead_until=None):
    """A query over ``nodes``; a node in ``dead`` answers nothing, after 0.2 s or, given
    ``dead_until`` (an asyncio.Event), only once it is set."""
    async def query(node):
        if node.id in dead:
            if dead_until is not None:
                await dead_until.wait()
            else:
                await asyncio.sleep(0.2)
            if finished is not None:
                finished.append(node)
            return None
        if delay:
            await asyncio.sleep(delay)
        # each node knows the K closest live-or-dead nodes to the target from a partial view
        return _closest([n for n in nodes if n.id != node.id], query.target, 2 * K), node.port
    return query


async def test_finds_the_k_closest_responders():
    nodes = _net(200)
    target = hashlib.sha1(b"t").digest()
    query = _query_for(nodes)
    query.target = target
    res = await lookup(target, nodes[:3], query, k=K, alpha=3)
    assert [n.id for n, _ in res.responses] == [n.id for n in _closest(nodes, target)]
    assert [reply for _, reply in res.responses] == [n.port for n, _ in res.responses]


async def test_dead_nodes_do_not_hold_the_lookup_open():
    nodes = _net(200, seed=2)
    target = hashlib.sha1(b"churn").digest()
    dead = {n.id for n in _closest(nodes, target, 2 * K)[::2]}  # half of the nearest are gone
    finished: list[Node] = []
    timed_out = asyncio.Event()  # no dead query ends before the lookup has returned
    query = _query_for(nodes, dead, finished=finished, dead_until=timed_out)
    query.target = target
    kept: list[asyncio.Task] = []
    # a lookup that waited for a dead query would never return: the bound says so
    res = await asyncio.wait_for(lookup(target, nodes[:3], query, k=K, alpha=3,
                                        slow_after=0.01, keep=kept.append), 30)
    assert finished == []
    timed_out.set()
    alive = [n for n in nodes if n.id not in dead]
    assert [n.id for n, _ in res.responses] == [n.id for n in _closest(alive, target)]
    await asyncio.gather(*kept)  # the dead ones' queries finish on their own
    assert len(finished) == len(kept) >= 1


async def test_everything_slow_still_gets_k_answers():
    nodes = _net(60, seed=3)
    target = hashlib.sha1(b"slow").digest()
    query = _query_for(nodes, delay=0.02)  # every answer is twice as slow as estimated
    query.target = target
    res = await lookup(target, nodes[:3], query, k=K, alpha=3, slow_after=0.01)
    assert [n.id for n, _ in res.responses] == [n.id for n in _closest(nodes, target)]


async def test_skip_and_own_id_are_never_asked():
    nodes = _net(40, seed=4)
    target = hashlib.sha1(b"x").digest()
    asked = []
    inner = _query_for(nodes)
    inner.target = target

    async def query(node):
        asked.append(node.id)
        return await inner(node)

    res = await lookup(target, nodes[:3], query, k=K, alpha=3, own_id=nodes[0].id,
                       skip={nodes[1].id})
    assert nodes[0].id not in asked and nodes[1].id not in asked
    assert res.rpcs == len(asked)


def test_nearest_routing_table_always_finds_neighbours():
    me = Node(b"\x00" * 20)
    table = NearestRoutingTable(None, 20, me)
    nodes = _net(300, seed=5)
    for n in nodes:
        bucket = table.buckets[table.get_bucket_for(n)]
        if not bucket.add_node(n) and (bucket.has_in_range(me) or bucket.depth() % 5 != 0):
            table.split_bucket(table.get_bucket_for(n))
            table.buckets[table.get_bucket_for(n)].add_node(n)
    contacts = table.contacts()
    for seed in range(50):
        target = Node(hashlib.sha1(bytes([seed])).digest())
        got = table.find_neighbors(target, 20)
        want = sorted(contacts, key=target.distance_to)[:20]
        assert [n.id for n in got] == [n.id for n in want]


def test_rtt_estimator_bounds():
    rtt = RttEstimator(initial=0.25)
    assert rtt.slow_after(0.05, 1.0) == 0.25
    for _ in range(50):
        rtt.sample(0.002)
    assert rtt.slow_after(0.05, 1.0) == 0.05  # floor
    for _ in range(50):
        rtt.sample(3.0)
    assert rtt.slow_after(0.05, 1.0) == 1.0  # ceiling


def test_lookup_machine_with_a_fake_clock():
    """The sans-IO machine alone: answers and time are fed by hand, no loop, no sleeps."""
    from dht.lookup import GRACE, Lookup

    nodes = _net(60, seed=9)
    target = hashlib.sha1(b"machine").digest()
    dead = {n.id for n in _closest(nodes, target, 3)}  # the three closest never answer
    m = Lookup(target, nodes[:3], k=K, alpha=3, slow_after=0.1)
    now = 0.0
    asked = m.step(now)
    while not m.done:
        assert len([n for n in m.in_flight() if m.state[n.id] == "pending"]) <= 3
        for n in asked:
            if n.id not in dead:
                m.answered(n, _closest([x for x in nodes if x.id != n.id], target, 2 * K),
                           n.port)
        wake = m.wake_at(now)
        if wake is not None and all(n.id in dead for n in m.in_flight()):
            now = wake  # only silent nodes left in flight: let time pass
        asked = m.step(now)
    res = m.result()
    live = [n for n in nodes if n.id not in dead]
    assert [n for n, _ in res.responses] == _closest(live, target)
    assert now <= 0.1 + GRACE * 0.1 + 1e-9  # dead nodes cost slow_after + grace, not a timeout
    assert dead <= {n.id for n in res.failed}


async def test_a_peer_noted_gone_is_not_asked_in_lookups():
    """The control plane knows a coordinator is dead before the DHT does: after
    ``note_gone`` its node is out of the routing table and no lookup asks it, even where
    other nodes still list it (each lookup that met it waited out its grace before)."""
    from dht.node import node_id_of

    async with loopback_dht(6, rpc_timeout=2.0) as nodes:
        a, dead = nodes[1], nodes[0]
        addr = dead.address
        assert any((c.ip, c.port) == addr for b in a.protocol.router.buckets
                   for c in b.nodes.values())
        await dead.stop()
        assert a.note_gone(addr, node_id_of(dead.key.public_bytes)) == 1
        assert not any((c.ip, c.port) == addr for b in a.protocol.router.buckets
                       for c in b.nodes.values())
        asked = []
        call = a.protocol.call

        async def spy(node, name, *args):
            asked.append((node.ip, node.port))
            return await call(node, name, *args)

        a.protocol.call = spy
        async with asyncio.timeout(5):
            target = hashlib.sha1(b"somewhere").digest()
            await a._lookup(target, lambda node: a._q_find_node(node, target))
        assert asked and addr not in asked


def test_dead_nodes_expire_on_the_injected_clock():
    """``_recently_failed`` ages out a timed-out node on the node's own ``clock``, not on
    ``time.monotonic()`` behind its back: a test (or a simulator) that moves the clock past
    DEAD_FOR sees the node asked again."""
    from dht.node import DEAD_FOR, DHTNode

    node = DHTNode()
    now = [1000.0]
    node.clock = lambda: now[0]
    dead = Node(b"\x01" * 20, "127.0.0.1", 9)
    node.note_failed(dead)
    assert node._recently_failed() == {dead.id}
    now[0] += DEAD_FOR + 1
    assert node._recently_failed() == set()
    node.note_gone(("127.0.0.1", 9), b"\x02" * 20)
    assert node._dead[b"\x02" * 20] == now[0]


async def test_bucket_head_ping_runs_under_the_nodes_supervisor():
    """A full bucket's liveness ping is a task of the node (its ``spawn``: logged on failure,
    awaited by ``settle``, cancelled by ``stop``), not a bare future nothing holds."""
    pinged, spawned = [], []

    async def call_ping(node):
        pinged.append(node.id)

    protocol = type("P", (), {})()
    protocol.call_ping = call_ping
    protocol.dht = type("H", (), {"spawn": lambda self, coro: spawned.append(coro)})()
    me = Node(b"\x00" * 20)
    table = NearestRoutingTable(protocol, 1, me)
    table.buckets[0].nodes[b"\xff" * 20] = Node(b"\xff" * 20, "10.0.0.1", 1)
    table._check_head(table.buckets[0])
    assert len(spawned) == 1 and table._checking
    await spawned[0]
    assert pinged == [b"\xff" * 20] and not table._checking


async def test_a_node_that_dies_after_the_lookup_does_not_hold_the_write():
    """A node answered the lookup, then left (a CLI's short-lived node, a crash) before the
    write reached it: the write returns once the others took it, not after the dead one's
    RPC timeout. A coordinator's blocklist page waited out that timeout (5 s) and held every
    heartbeat behind it, so each member took it for dead and a failover followed
    (test_term_inflation_through_the_cli, the blocked peer won it)."""
    key = PeerKey.generate()
    async with loopback_dht(5, rpc_timeout=30.0) as nodes:
        writer, doomed = nodes[1], nodes[2]
        for name in ("_write_immutable", "_write_mutable"):
            write = getattr(writer, name)

            async def after_a_death(*args, write=write):
                await doomed.stop()  # answered the lookup; gone before the write
                return await write(*args)

            setattr(writer, name, after_a_death)
        async with asyncio.timeout(10):  # 30 s on main: the write waited for the dead node
            target = await writer.put_immutable(b"a blocklist page")
            await writer.put_mutable(key, b"a state item", salt=b"s")
        reader = nodes[3]
        assert await reader.get_immutable(target) == b"a blocklist page"
        assert (await reader.get_mutable(key.public_bytes, b"s")).value == b"a state item"
