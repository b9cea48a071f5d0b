"""Attacks on one node's store, replay table, routing table and reply sizes (issue 14).

Each test reproduces one cheap attack against a single listening node, fed requests through
its protocol's ``dispatch`` (as the UDP adapter would) or raw datagrams, and checks that an
honest sender is still served.
"""

from __future__ import annotations

import pytest

from dht import Announcement, DHTNode, MutableItem
from dht.announce import topic_target
from dht.messages import Envelope, ReplayGuard
from dht.wire import announcement_to_wire, mutable_to_wire
from identity import PeerKey

pytestmark = pytest.mark.timeout(120)
T0 = 1_000_000.0
ATTACKER = "127.0.0.1"


async def _node(**kw) -> DHTNode:
    node = DHTNode(rpc_timeout=0.5, **kw)
    await node.listen()
    return node


async def _announce(node: DHTNode, addr, topic: bytes, key: PeerKey | None = None):
    key = key or PeerKey.generate()
    now = node.clock()
    ann = Announcement.create(key, key.peer_id, topic, b"record", now + 600)
    token = node.tokens.issue(addr, topic_target(topic), now)
    return await node.protocol.dispatch(
        ["announce", [b"a" * 20, token, topic, announcement_to_wire(ann)]], addr)


async def _put_immutable(node: DHTNode, addr, value: bytes):
    import hashlib
    token = node.tokens.issue(addr, hashlib.sha1(value).digest(), node.clock())
    return await node.protocol.dispatch(["put", [b"a" * 20, token, "i", value, None]], addr)


async def _put_mutable(node: DHTNode, addr, item: MutableItem):
    token = node.tokens.issue(addr, item.target, node.clock())
    return await node.protocol.dispatch(
        ["put", [b"a" * 20, token, "m", mutable_to_wire(item), None]], addr)


async def test_sybil_announcements_do_not_lock_honest_peers_out_of_a_topic():
    node = await _node()
    try:
        # 256 validly signed entries from fresh keys, sent from 16 sockets
        for i in range(256):
            await _announce(node, (ATTACKER, 40000 + i % 16), b"members")
        honest = await _announce(node, ("127.0.0.1", 50000), b"members")
        assert honest == {"ok": True}, honest
        assert len(node.store.get_peers(b"members", node.clock())) <= 256
    finally:
        await node.stop()


async def test_announcements_count_against_the_store_cap():
    node = await _node(max_items=100)
    try:
        for i in range(200):
            reply = await _announce(node, (ATTACKER, 41000 + i % 20), b"topic-%d" % i)
            assert reply == {"ok": True} or reply["error"][0] == 202, reply
        counts = node.store.counts()
        assert counts["mutable"] + counts["immutable"] + counts["announcements"] <= 100
    finally:
        await node.stop()


async def test_one_source_cannot_fill_the_store_for_everyone():
    node = await _node(max_items=200)
    try:
        for i in range(300):
            await _put_immutable(node, (ATTACKER, 42000), b"i%de" % i)
        assert await _put_immutable(node, ("127.0.0.1", 50001), b"5:hello") == {"ok": True}
        # even when the flood comes from many sockets, a newcomer evicts the biggest holder
        for i in range(400):
            await _put_immutable(node, (ATTACKER, 43000 + i % 40), b"i%de" % (1000 + i))
        assert await _put_immutable(node, ("127.0.0.1", 50002), b"5:world") == {"ok": True}
        counts = node.store.counts()
        assert counts["mutable"] + counts["immutable"] + counts["announcements"] <= 200
    finally:
        await node.stop()


async def test_one_key_cannot_hold_unbounded_mutable_items():
    node = await _node()
    node.store.max_per_key = 32
    key = PeerKey.generate()
    try:
        for i in range(64):
            item = MutableItem.create(key, b"v", 1, b"salt-%d" % i)
            await _put_mutable(node, ("127.0.0.1", 44000 + i), item)
        assert node.store.counts()["mutable"] <= 32
        other = MutableItem.create(PeerKey.generate(), b"v", 1, b"s")
        assert await _put_mutable(node, ("127.0.0.1", 44999), other) == {"ok": True}
    finally:
        await node.stop()


def test_one_flooding_key_does_not_lock_other_senders_out_of_messages():
    guard = ReplayGuard(window_s=60, max_entries=1000)
    me = b"n" * 20
    flooder, honest = PeerKey.generate(), PeerKey.generate()
    first = Envelope.seal(flooder, flooder.peer_id, me, b"0", T0)
    guard.admit(first, me, T0)
    for i in range(1, 2000):  # ~850 messages/s for over 2 s
        guard.admit(Envelope.seal(flooder, flooder.peer_id, me, b"%d" % i, T0 + i / 850),
                    me, T0 + i / 850)
    ok = Envelope.seal(honest, honest.peer_id, me, b"heartbeat", T0 + 3)
    assert guard.admit(ok, me, T0 + 3) == honest.peer_id
    assert len(guard) <= 1000
    # the flooder's forgotten nonces still cannot be replayed
    with pytest.raises(Exception, match="replay"):
        guard.admit(first, me, T0 + 3)


def test_a_flood_of_fresh_keys_does_not_lock_out_a_current_sender():
    guard = ReplayGuard(window_s=60, max_entries=500)
    me = b"n" * 20
    for i in range(2000):
        k = PeerKey.generate()
        guard.admit(Envelope.seal(k, k.peer_id, me, b"x", T0 + i / 1000), me, T0 + i / 1000)
    honest = PeerKey.generate()
    env = Envelope.seal(honest, honest.peer_id, me, b"owner command", T0 + 2.5)
    assert guard.admit(env, me, T0 + 2.5) == honest.peer_id
    assert len(guard) <= 500
