"""64+ DHT nodes in one process on loopback: items, announcements, messages, attackers, churn.

One module-scoped swarm keeps this quick; the churn test kills nodes, so it has a swarm of
its own (the tests pass in any order).
"""

from __future__ import annotations

import asyncio
import random

import pytest
import pytest_asyncio

from dht import (
    Announcement,
    DHTNode,
    ItemError,
    MessageRefused,
    MessageTooLarge,
    MutableItem,
    PeerUnreachable,
)
from dht.messages import Envelope
from dht.wire import announcement_to_wire, mutable_to_wire
from identity import PeerKey

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]
N = 64
RPC_TIMEOUT = 2.0


def charter_validator(item: MutableItem) -> None:
    if not isinstance(item.value, dict) or item.value.get(b"owner-proof") != b"valid":
        raise ItemError(206, "charter without a valid owner proof")


async def _start_swarm(n: int) -> list[DHTNode]:
    nodes = [DHTNode(rpc_timeout=RPC_TIMEOUT, validators={b"swarm": charter_validator})
             for _ in range(n)]
    try:
        for node in nodes:
            await node.listen()
        for node in nodes[1:]:
            await node.bootstrap([nodes[0].address])
        # a second pass lets early joiners learn of later ones, as bucket refresh would
        await asyncio.gather(*(n.bootstrap([nodes[0].address]) for n in nodes[1:]))
    except BaseException:
        await _stop_swarm(nodes)
        raise
    return nodes


async def _stop_swarm(nodes: list[DHTNode]) -> None:
    for node in nodes:
        await node.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def swarm():
    """The swarm that every test but the churn test shares; no test stops its nodes."""
    nodes = await _start_swarm(N)
    try:
        yield nodes
    finally:
        await _stop_swarm(nodes)


@pytest_asyncio.fixture(loop_scope="module")
async def own_swarm():
    """A swarm of the churn test's own, whose nodes it may kill."""
    nodes = await _start_swarm(N)
    try:
        yield nodes
    finally:
        await _stop_swarm(nodes)


async def _bounded(calls, at_once: int = 8):
    """Await ``calls`` (coroutines), ``at_once`` at a time, results in order: 64 lookups at
    once in one process held its loop for seconds on a loaded machine (CI8, load 10), past
    the nodes' RPC timeout, and the contacts that timed out were dropped."""
    gate = asyncio.Semaphore(at_once)

    async def one(call):
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls))


async def _get_everywhere(nodes, pubkey, salt=b""):
    return await _bounded(n.get_mutable(pubkey, salt) for n in nodes)


async def test_listen_reports_the_real_port(swarm):
    ports = {n.address[1] for n in swarm}
    assert len(ports) == N and 0 not in ports
    assert all(n.address[0] == "127.0.0.1" for n in swarm)


async def test_put_from_one_get_from_every_node(swarm):
    key = PeerKey.generate()
    put = await swarm[5].put_mutable(key, {b"hello": b"world"}, salt=b"greeting")
    assert put.seq == 1
    got = await _get_everywhere(swarm, key.public_bytes, b"greeting")
    assert [g.value if g else None for g in got] == [{b"hello": b"world"}] * N
    # seq=None means one more than the newest found, from any node
    again = await swarm[40].put_mutable(key, b"v2", salt=b"greeting")
    assert again.seq == 2
    got = await _get_everywhere(swarm, key.public_bytes, b"greeting")
    assert {(g.seq, g.value) for g in got} == {(2, b"v2")}


async def test_immutable_put_get_everywhere(swarm):
    target = await swarm[3].put_immutable([b"chunk", 7, {b"k": b"v"}])
    got = await _bounded(n.get_immutable(target) for n in swarm)
    assert got == [[b"chunk", 7, {b"k": b"v"}]] * N
    assert await swarm[9].get_immutable(b"\x00" * 20) is None


async def test_bep44_errors_surface_to_the_writer(swarm):
    key = PeerKey.generate()
    await swarm[1].put_mutable(key, b"one", seq=5)
    with pytest.raises(ItemError) as info:
        await swarm[2].put_mutable(key, b"older", seq=4)
    assert info.value.code == 302
    with pytest.raises(ItemError) as info:
        await swarm[2].put_mutable(key, b"cas", cas=3)
    assert info.value.code == 301
    assert (await swarm[2].put_mutable(key, b"cas", cas=5)).seq == 6
    with pytest.raises(ItemError) as info:
        await swarm[2].put_mutable(key, b"x" * 1000)
    assert info.value.code == 205
    with pytest.raises(ItemError) as info:
        await swarm[2].put_mutable(key, b"x", salt=b"s" * 65)
    assert info.value.code == 207


async def test_attacker_replaying_an_old_seq_never_wins(swarm):
    owner = PeerKey.generate()
    old = await swarm[7].put_mutable(owner, b"old", salt=b"state")
    new = await swarm[8].put_mutable(owner, b"new", salt=b"state")
    attacker = swarm[-1]
    # 1. replay the captured old item to every node that hands out a token
    res = await attacker._lookup(old.target, lambda n: attacker._q_get(n, old.target))
    writes = [(n, "put", (r.token, "m", mutable_to_wire(old), None)) for n, r in res.responses]
    accepted, refusals = await attacker._send_writes(writes)
    # every node holding the item refuses; one that never held it may take the old seq,
    # which then loses to the newer one on every get
    assert len(refusals) >= len(writes) - 2 and {r.code for r in refusals} == {302}
    # 2. a lying node serves the old item from its own store, and another forges a higher seq
    attacker.store._db.execute(
        "INSERT OR REPLACE INTO mutable (target, pubkey, salt, seq, value, sig, expires_at) "
        "VALUES (?,?,?,?,?,?,?)",
        (old.target, old.pubkey, old.salt, old.seq, old.encoded_value, old.signature, 1e12))
    forged = MutableItem(new.pubkey, new.salt, 99, b"forged", new.signature)
    liar = swarm[-2]
    liar.store._db.execute(
        "INSERT OR REPLACE INTO mutable (target, pubkey, salt, seq, value, sig, expires_at) "
        "VALUES (?,?,?,?,?,?,?)",
        (forged.target, forged.pubkey, forged.salt, 99, forged.encoded_value,
         forged.signature, 1e12))
    got = await _get_everywhere(swarm, owner.public_bytes, b"state")
    assert {(g.seq, g.value) for g in got} == {(new.seq, b"new")}
    # 3. a token is bound to the address it was given to
    tok = res.responses[0][1].token
    victim = res.responses[0][0]
    ok, reply = await swarm[0].protocol.request((victim.ip, victim.port), "put", tok, "m",
                                                mutable_to_wire(new), None)
    assert ok and reply["error"][0] == 203


async def test_get_writes_the_newest_back_to_stale_nodes(swarm, monkeypatch):
    owner = PeerKey.generate()
    v1 = await swarm[11].put_mutable(owner, b"v1")
    holders = [n for n in swarm if n.store.get_mutable(v1.target, n.clock())]
    assert len(holders) >= 10
    v2 = MutableItem.create(owner, b"v2", 2)
    # only three nodes hear of v2 directly; the others stay stale
    for holder in holders[:3]:
        holder.store.put_mutable(v2, None, holder.clock())
    reader = next(n for n in swarm if n not in holders)
    lookups = []
    lookup = reader._lookup

    async def watched(*args, **kwargs):
        lookups.append(await lookup(*args, **kwargs))
        return lookups[-1]

    monkeypatch.setattr(reader, "_lookup", watched)
    assert (await reader.get_mutable(owner.public_bytes)).seq == 2
    await reader.settle()
    # every node among the k closest that answered the get was sent v2 and now holds it (a
    # node too slow to answer was not among them, so it is none of this test's business)
    by_id = {n.node_id: n for n in swarm}
    answered = [by_id[n.id] for n, r in lookups[0].responses if r.token]
    stale = [n for n in answered if n not in holders[:3]]
    assert len(stale) >= reader.ksize // 2, "too few stale responders to test anything"
    assert [n.store.get_mutable(v1.target, n.clock()).seq for n in answered] == \
        [2] * len(answered)


async def test_validators_refuse_network_wide_and_filter_gets(swarm):
    owner = PeerKey.generate()
    with pytest.raises(ItemError) as info:
        await swarm[4].put_mutable(owner, {b"owner-proof": b"forged"}, salt=b"swarm")
    assert info.value.code == 206
    # even a writer without the validator cannot get it past the other nodes
    rogue = DHTNode(rpc_timeout=RPC_TIMEOUT)
    await rogue.listen()
    try:
        await rogue.bootstrap([swarm[0].address])
        with pytest.raises(ItemError):
            await rogue.put_mutable(owner, {b"owner-proof": b"forged"}, salt=b"swarm")
        # and a node that stores it anyway never gets it returned by a validating reader
        bad = MutableItem.create(owner, {b"owner-proof": b"forged"}, 1, b"swarm")
        rogue.store.put_mutable(bad, None, rogue.clock())
        assert await swarm[12].get_mutable(owner.public_bytes, b"swarm") is None
        good = await swarm[4].put_mutable(owner, {b"owner-proof": b"valid"}, salt=b"swarm",
                                          seq=2)
        assert (await swarm[20].get_mutable(owner.public_bytes, b"swarm")) == good
    finally:
        await rogue.stop()


async def test_announce_and_get_peers(swarm):
    topic = b"swarm-members"
    records = {}
    for i in (2, 17, 33, 50):
        record = bytes([i]) * 900  # callers put ~900 bytes of msgpack here
        await swarm[i].announce(topic, record, ttl=600)
        records[swarm[i].peer_id] = record
    # re-announcing replaces the peer's own entry
    await swarm[2].announce(topic, b"updated", ttl=600)
    records[swarm[2].peer_id] = b"updated"
    for reader in (swarm[0], swarm[44], swarm[61]):
        peers = await reader.get_peers(topic)
        assert {p.peer_id: p.record for p in peers} == records
        assert [p.peer_id for p in peers] == sorted(records)
    # the requester drops entries that have expired by its own clock
    reader = swarm[45]
    real = reader.clock
    reader.clock = lambda: real() + 601
    try:
        assert await reader.get_peers(topic) == []
    finally:
        reader.clock = real


async def test_many_announcements_page_through(swarm):
    topic = b"big-topic"
    announcers = swarm[:30]
    await _bounded(n.announce(topic, b"m" * 800) for n in announcers)
    peers = await swarm[60].get_peers(topic)
    assert {p.peer_id for p in peers} == {n.peer_id for n in announcers}


async def test_follow_up_pages_come_from_a_few_replicas(swarm):
    """Every replica sends its first page in the lookup; the rest of a big topic is read
    from MAX_PAGE_SOURCES of them, not from all twenty (issue 19), and nothing is missed."""
    from dht.node import MAX_PAGE_SOURCES

    topic = b"paged-topic"
    announcers = swarm[30:50]
    await _bounded(n.announce(topic, b"m" * 800) for n in announcers)
    follow_ups: list[int] = []
    originals = {}
    for node in swarm:
        originals[node] = node.protocol.rpc_get_peers

        def counting(sender, nodeid, t, after, original=originals[node]):
            if t == topic and after:
                follow_ups.append(1)
            return original(sender, nodeid, t, after)

        node.protocol.rpc_get_peers = counting
    try:
        peers = await swarm[61].get_peers(topic)
    finally:
        for node in swarm:
            del node.protocol.rpc_get_peers
    assert {p.peer_id for p in peers} == {n.peer_id for n in announcers}
    pages = -(-20 * 1000 // 7000)  # 20 entries of ~1 kB in 7,000-byte pages
    assert 0 < len(follow_ups) <= MAX_PAGE_SOURCES * pages


async def test_forged_announcements_are_refused_and_dropped(swarm):
    topic = b"forgery"
    victim, forger = swarm[21], swarm[22]
    real = await victim.announce(topic, b"real")
    fake = Announcement(victim.peer_id, b"fake", real.expires_at + 100, real.signature)
    res = await forger._lookup(*_peers_query(forger, topic))
    writes = [(n, "announce", (r.token, topic, announcement_to_wire(fake)))
              for n, r in res.responses]
    accepted, refusals = await forger._send_writes(writes)
    assert accepted == 0 and {r.code for r in refusals} == {206}
    # a lying node returning a forged entry: the reader drops it
    liar = swarm[23]
    original = liar.protocol.rpc_get_peers

    def lying(sender, nodeid, t, after):
        reply = original(sender, nodeid, t, after)
        reply["peers"] = [announcement_to_wire(fake)] + list(reply["peers"])
        return reply

    liar.protocol.rpc_get_peers = lying
    try:
        peers = await swarm[24].get_peers(topic)
    finally:
        del liar.protocol.rpc_get_peers
    assert [(p.peer_id, p.record) for p in peers] == [(victim.peer_id, b"real")]


def _peers_query(node, topic):
    from dht.announce import topic_target

    return topic_target(topic), lambda n: node._q_peers(n, topic)


async def test_message_round_trip(swarm):
    a, b = swarm[30], swarm[31]
    inbox: asyncio.Queue = asyncio.Queue()

    async def on_message(sender, addr, payload):
        await inbox.put((sender, addr, payload))

    b.on_message(on_message)
    payload = bytes(range(256)) * 16  # 4 KiB
    await a.send_message(b.address, payload)
    sender, addr, got = await asyncio.wait_for(inbox.get(), 5)
    assert (sender, addr, got) == (a.peer_id, a.address, payload)
    with pytest.raises(MessageTooLarge):
        await a.send_message(b.address, payload + b"!")


async def test_forged_and_replayed_messages_are_refused(swarm):
    a, b = swarm[32], swarm[33]
    received = []
    b.on_message(lambda sender, addr, payload: received.append(payload))
    env = Envelope.seal(a.key, a.peer_id, b.node_id, b"once", a.clock())
    ok, reply = await a.protocol.request(b.address, "message", env.to_wire())
    assert ok and reply == {"ok": True}
    ok, reply = await a.protocol.request(b.address, "message", env.to_wire())
    assert reply["error"][0] == 203 and "replay" in reply["error"][1]
    forged = Envelope(env.sender, env.recipient, env.sent_at, b"n" * 16, b"evil",
                      env.signature)
    ok, reply = await swarm[34].protocol.request(b.address, "message", forged.to_wire())
    assert reply["error"][0] == 206
    # a message sealed for b is refused by any other node
    ok, reply = await a.protocol.request(swarm[35].address, "message",
                                         Envelope.seal(a.key, a.peer_id, b.node_id, b"x",
                                                       a.clock()).to_wire())
    assert reply["error"][0] == 203
    assert received == [b"once"]


async def test_send_message_to_nobody_raises(swarm):
    ghost = DHTNode(rpc_timeout=0.5)
    port = await ghost.listen()
    await ghost.stop()
    with pytest.raises(PeerUnreachable):
        await swarm[36].send_message(("127.0.0.1", port), b"hello?")


async def test_message_refusal_raises(swarm):
    a = DHTNode(rpc_timeout=RPC_TIMEOUT)
    await a.listen()
    try:
        a.clock = lambda: 0.0  # far outside the receiver's window
        with pytest.raises(MessageRefused) as info:
            await a.send_message(swarm[37].address, b"from the past")
        assert info.value.code == 203
    finally:
        await a.stop()


async def test_kill_30_percent_and_get_again(own_swarm):
    swarm = own_swarm
    keys = [PeerKey.generate() for _ in range(4)]
    for i, key in enumerate(keys):
        await swarm[i * 7].put_mutable(key, b"survives-%d" % i, salt=b"churn")
    target = await swarm[13].put_immutable(b"immutable survives")
    rng = random.Random(44)
    doomed = rng.sample(swarm[1:], int(0.3 * N))
    await asyncio.gather(*(n.stop() for n in doomed))
    alive = [n for n in swarm if n not in doomed]
    for i, key in enumerate(keys):
        got = await _get_everywhere(alive, key.public_bytes, b"churn")
        assert [g.value if g else None for g in got] == [b"survives-%d" % i] * len(alive)
    got = await _bounded(n.get_immutable(target) for n in alive)
    assert got == [b"immutable survives"] * len(alive)
