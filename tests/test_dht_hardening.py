"""Attacks on one node's store, replay table, routing table and reply sizes (issue 14).

Each test reproduces one cheap attack against a single listening node, fed requests through
its protocol's ``dispatch`` (as the UDP adapter would) or raw datagrams, and checks that an
honest sender is still served.
"""

from __future__ import annotations

import random

import pytest
from kademlia.node import Node

from dht import Announcement, DHTNode, MutableItem
from dht.announce import topic_target
from dht.messages import Envelope, ReplayGuard
from dht.protocol import DHTProtocol
from dht.wire import announcement_to_wire, mutable_to_wire
from identity import PeerKey
from tests.conftest import DEAD_ADDR

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
    node = await _node(max_per_topic=256)  # a full topic, smaller than MAX_PER_TOPIC
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


async def test_crafted_pings_do_not_grow_the_routing_table_without_bound():
    node = await _node()
    rng = random.Random(14)
    try:
        # 8.4k crafted pings from 8.4k sockets: groups of 21 ids sharing a 149-bit prefix
        # (149 % 5 != 0: kademlia's extra-split rule splits down to the prefix each time)
        far = (node.node.long_id >> 159 ^ 1) << 159
        for g in range(400):
            prefix = far | rng.getrandbits(148) << 11
            for j in range(21):
                nid = (prefix | rng.getrandbits(11)).to_bytes(20, "big")
                await node.protocol.dispatch(["ping", [nid]], ("127.0.0.1", 1024 + g * 21 + j))
        router = node.protocol.router
        assert len(router.buckets) <= 160
        assert len(router.contacts()) <= 160 * node.ksize
    finally:
        await node.stop()


class _EclipseProtocol(DHTProtocol):
    """One socket that answers as each of the ids closest to a key, with a stale item."""

    stale: MutableItem
    fakes: list[bytes]

    def _fake_nodes(self) -> list:
        ip, port = self.dht.address
        return [[fid, ip, port] for fid in self.fakes]

    def rpc_find_node(self, sender, nodeid, key):
        return self._fake_nodes()

    def rpc_get(self, sender, nodeid, target):
        return {"token": self.dht.tokens.issue(sender, target, self.dht.clock()),
                "nodes": self._fake_nodes(), "m": mutable_to_wire(self.stale)}

    def rpc_put(self, sender, nodeid, token, kind, item, cas):
        return {"ok": True}


async def test_one_socket_claiming_the_closest_ids_cannot_eclipse_a_key():
    honest = [DHTNode(rpc_timeout=1.0) for _ in range(30)]
    attacker = DHTNode(rpc_timeout=1.0)
    attacker._create_protocol = lambda: _EclipseProtocol(attacker)
    client = DHTNode(rpc_timeout=1.0)
    owner = PeerKey.generate()
    stale = MutableItem.create(owner, b"charter before the revocation", 1, b"charter")
    try:
        for n in honest:
            await n.listen()
        for n in honest[1:]:
            await n.bootstrap([honest[0].address])
        await honest[1].put_mutable(owner, b"charter after the revocation", b"charter", seq=2)
        target = stale.target
        fakes = [target[:19] + bytes([target[19] ^ i]) for i in range(1, 21)]
        attacker.node = Node(fakes[0])  # its real id, next to the key
        await attacker.listen()
        attacker.protocol.stale, attacker.protocol.fakes = stale, fakes
        await attacker.bootstrap([honest[0].address])  # the nodes near the key now list it
        await client.listen()
        await client.bootstrap([honest[0].address])
        for fid in fakes:  # and it claims every other id from the same socket
            await client.protocol.dispatch(["ping", [fid]], attacker.address)
        item = await client.get_mutable(owner.public_bytes, b"charter")
        assert item is not None and item.seq == 2, item
    finally:
        for n in [*honest, attacker, client]:
            await n.stop()


async def test_replies_to_an_unproven_address_are_not_an_amplifier():
    import asyncio
    import hashlib
    import socket

    import umsgpack

    node = await _node()
    socks: list[socket.socket] = []
    loop = asyncio.get_running_loop()

    def fresh() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        socks.append(sock)
        return sock

    async def exchange(sock, name, args):
        req = b"\x00" + hashlib.sha1(repr(args).encode()).digest() + umsgpack.packb(
            [name, [b"x" * 20, *args]])
        sock.sendto(req, node.address)
        reply = b"\x00"
        while reply[:1] == b"\x00":  # the node's challenge pings: left unanswered
            reply = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
        return len(req), len(reply), umsgpack.unpackb(reply[21:])

    try:
        now = node.clock()
        for i in range(40):
            node.protocol.router.add_contact(
                Node(hashlib.sha1(b"%d" % i).digest(), "127.0.0.1", 20000 + i))
        item = MutableItem.create(PeerKey.generate(), b"v" * 990, 1, b"s")
        node.store.put_mutable(item, None, now)
        for _ in range(60):
            k = PeerKey.generate()
            node.store.announce(b"t", Announcement.create(k, k.peer_id, b"t", b"r" * 64,
                                                          now + 600), now)
        for name, args in [("find_node", [item.target]), ("get", [item.target]),
                           ("get_peers", [b"t", b""])]:
            sock = fresh()  # an address the node has never heard from
            req, rep, data = await exchange(sock, name, args)
            assert rep <= 3 * req, (name, req, rep)
            # the token proves the address: the same request again gets everything
            req2, rep2, full = await exchange(sock, name, [*args, data["retry"]])
            assert rep2 > 3 * req2, full
            assert "retry" not in (full if isinstance(full, dict) else {})
        assert full["peers"] and "m" in (await exchange(sock, "get", [item.target]))[2]
        # a swarm client pads its first request instead (QUIC's way): no retry round trip
        req, rep, data = await exchange(fresh(), "get", [item.target, bytes(600)])
        assert "m" in data and rep <= 3 * req
    finally:
        for sock in socks:
            sock.close()
        await node.stop()


async def test_a_spoofed_source_does_not_become_a_contact():
    node = await _node()
    try:
        # a ping "from" an address nobody answers at: challenged, never added
        await node.protocol.dispatch(["ping", [b"s" * 20]], DEAD_ADDR)
        await node.settle()
        assert node.protocol.router.contacts() == []
    finally:
        await node.stop()
