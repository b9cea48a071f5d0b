"""Interop with BitTorrent's mainline DHT: libtorrent sessions and swarm nodes on loopback.

Six libtorrent sessions (PyPI ``libtorrent``, in the ``test`` extra) and three swarm nodes in
KRPC mode form one network. libtorrent puts mutable and immutable BEP 44 items that swarm
gets, swarm puts items that libtorrent gets, BEP 5 peers go both ways, and a libtorrent
session that knows only a swarm node still finds items (its lookups route through swarm).
Nothing leaves 127.0.0.1: ``dht_bootstrap_nodes`` is empty and no router is named.
In CI a missing libtorrent is an error, never a skip (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import pytest
import pytest_asyncio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dht import DHTNode, ItemError, topic_target
from dht.items import immutable_target
from tests.libtorrent_support import alert as _alert
from tests.libtorrent_support import lt, network, session

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180),
              pytest.mark.slow]
LT_SESSIONS = 6
SWARM_NODES = 3


def _fresh(*sessions: lt.session) -> None:
    for s in sessions:
        s.pop_alerts()


async def _lt_put_mutable(session: lt.session, secret: bytes, pub: bytes, value: bytes,
                          salt: bytes) -> None:
    _fresh(session)
    session.dht_put_mutable_item(secret, pub, value, salt)
    await _alert(session, lt.dht_put_alert)


def _expanded_secret(seed: bytes) -> bytes:
    """libtorrent's ed25519 secret: SHA-512 of the seed with the scalar clamped."""
    h = bytearray(hashlib.sha512(seed).digest())
    h[0] &= 248
    h[31] &= 63
    h[31] |= 64
    return bytes(h)


def _keypair() -> tuple[Ed25519PrivateKey, bytes, bytes]:
    seed = os.urandom(32)
    key = Ed25519PrivateKey.from_private_bytes(seed)
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw)
    return key, pub, _expanded_secret(seed)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def net():
    sessions = network(LT_SESSIONS)
    nodes = [DHTNode(rpc_timeout=1.0, krpc=True) for _ in range(SWARM_NODES)]
    try:
        ports = [s.listen_port() for s in sessions]
        for n in nodes:
            await n.listen()
            await n.bootstrap([("127.0.0.1", p) for p in ports[:2]])
        for s in sessions:
            for n in nodes:
                s.add_dht_node(n.address)
        # let the sessions ping each other and the swarm nodes (bounded; see the asserts)
        end = time.monotonic() + 20
        while time.monotonic() < end and min(len(n.protocol.router.contacts())
                                             for n in nodes) < LT_SESSIONS:
            await asyncio.sleep(0.1)
        yield sessions, nodes
    finally:
        for n in nodes:
            await n.stop()
        del sessions


async def test_swarm_nodes_join_through_libtorrent_only(net):
    sessions, nodes = net
    lt_ports = {s.listen_port() for s in sessions}
    for n in nodes:
        assert {c.port for c in n.protocol.router.contacts()} & lt_ports


async def test_libtorrent_immutable_item_is_read_by_swarm(net):
    sessions, nodes = net
    _fresh(sessions[0])
    target = sessions[0].dht_put_immutable_item(b"put by libtorrent")
    await _alert(sessions[0], lt.dht_put_alert)
    assert bytes.fromhex(str(target)) == immutable_target(b"put by libtorrent")
    assert await nodes[2].get_immutable(bytes.fromhex(str(target))) == b"put by libtorrent"


async def test_libtorrent_mutable_item_is_read_by_swarm(net):
    sessions, nodes = net
    _, pub, secret = _keypair()
    await _lt_put_mutable(sessions[1], secret, pub, b"mutable from libtorrent", b"swarm/state")
    item = await nodes[0].get_mutable(pub, b"swarm/state")
    assert item is not None and item.value == b"mutable from libtorrent" and item.seq >= 1


async def test_swarm_items_are_read_by_libtorrent(net):
    sessions, nodes = net
    target = await nodes[1].put_immutable(b"put by swarm")
    _fresh(sessions[4])
    sessions[4].dht_get_immutable_item(lt.sha1_hash(target))
    got = await _alert(sessions[4], lt.dht_immutable_item_alert,
                       lambda a: bytes.fromhex(str(a.target)) == target)
    assert got.item == b"put by swarm"

    key, pub, _ = _keypair()
    await nodes[1].put_mutable(key, b"v1", salt=b"charter")
    item = await nodes[2].put_mutable(key, b"v2 from swarm", salt=b"charter")
    _fresh(sessions[5])
    sessions[5].dht_get_mutable_item(pub, b"charter")
    got = await _alert(sessions[5], lt.dht_mutable_item_alert,
                       lambda a: a.authoritative and bytes(a.key) == pub)
    assert got.item == b"v2 from swarm" and got.seq == item.seq == 2


async def test_a_stale_seq_is_refused_by_mainline_nodes(net):
    sessions, nodes = net
    key, pub, secret = _keypair()
    await _lt_put_mutable(sessions[2], secret, pub, b"newer", b"")
    current = await nodes[0].get_mutable(pub)
    with pytest.raises(ItemError) as info:  # same seq, other value
        await nodes[0].put_mutable(key, b"older", seq=current.seq)
    assert info.value.code == 302
    assert (await nodes[1].get_mutable(pub)).value == b"newer"


async def test_bep5_peers_both_ways(net):
    sessions, nodes = net
    info_hash = hashlib.sha1(b"swarm members").digest()
    assert await nodes[0].announce_peer(info_hash, 4242) >= 1
    _fresh(sessions[3])
    sessions[3].dht_get_peers(lt.sha1_hash(info_hash))
    got = await _alert(sessions[3], lt.dht_get_peers_reply_alert,
                       lambda a: bytes.fromhex(str(a.info_hash)) == info_hash)
    assert ("127.0.0.1", 4242) in [tuple(p) for p in got.peers()]

    other = hashlib.sha1(b"announced by libtorrent").digest()
    _fresh(sessions[0])
    sessions[0].dht_announce(lt.sha1_hash(other), 5151)
    end = time.monotonic() + 30
    found: list = []
    while ("127.0.0.1", 5151) not in found and time.monotonic() < end:
        await asyncio.sleep(0.2)
        found = await nodes[2].find_peers(other)
    assert ("127.0.0.1", 5151) in found, (
        [n.store.peers(other, n.clock()) for n in nodes],
        [[c.port for c in n.protocol.router.contacts()] for n in nodes],
        [s.listen_port() for s in sessions])


async def test_libtorrent_lookups_route_through_swarm_nodes(net):
    sessions, nodes = net
    target = await nodes[0].put_immutable(b"found through swarm")
    lonely = session()  # knows only one swarm node
    try:
        lonely.add_dht_node(nodes[1].address)
        # one lookup, once its DHT has met the swarm node (before that it has nobody to ask)
        async with asyncio.timeout(30):
            while not any(c.port == lonely.listen_port()
                          for c in nodes[1].protocol.router.contacts()):
                await asyncio.sleep(0.1)
        lonely.dht_get_immutable_item(lt.sha1_hash(target))
        await _alert(lonely, lt.dht_immutable_item_alert,
                     lambda a: a.item == b"found through swarm", timeout=30)
    finally:
        del lonely


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lt_only():
    """Six libtorrent sessions and no swarm node: the network a swarm finds on mainline."""
    sessions = network(LT_SESSIONS)
    yield sessions
    del sessions


async def test_members_find_each_other_through_libtorrent_only(lt_only):
    sessions = lt_only
    a, b = DHTNode(rpc_timeout=1.0), DHTNode(rpc_timeout=1.0)  # not told they are on mainline
    try:
        for node, s in ((a, sessions[0]), (b, sessions[3])):
            await node.listen()
            await node.bootstrap([("127.0.0.1", s.listen_port())])
            assert node.krpc  # the bootstrap node answered only KRPC
        topic = b"swarm/members/" + os.urandom(20)
        await a.announce(topic, b"record of a", ttl=300)
        await b.announce(topic, b"record of b", ttl=300)
        got = {e.peer_id: e.record for e in await b.get_peers(topic)}
        assert got == {a.peer_id: b"record of a", b.peer_id: b"record of b"}

        # libtorrent holds a's address under the topic's info-hash (BEP 5) ...
        _fresh(sessions[5])
        sessions[5].dht_get_peers(lt.sha1_hash(topic_target(topic)))
        reply = await _alert(sessions[5], lt.dht_get_peers_reply_alert,
                             lambda r: a.address in [tuple(p) for p in r.peers()])
        assert reply is not None
        # ... and a's entry as a's BEP 44 item (salt = the topic), which b reads when a is gone
        _fresh(sessions[4])
        sessions[4].dht_get_mutable_item(a.key.public_bytes, topic)
        await _alert(sessions[4], lt.dht_mutable_item_alert,
                     lambda r: r.authoritative and bytes(r.key) == a.key.public_bytes
                     and bool(r.item))
        # a node that knows only a swarm node finds the mainline nodes, and the entries
        c = DHTNode(rpc_timeout=1.0)
        await c.listen()
        try:
            await c.bootstrap([b.address])
            end = time.monotonic() + 30
            while not (c.krpc and len(await c.get_peers(topic)) == 2):
                assert time.monotonic() < end, "c never found both entries"
                await asyncio.sleep(0.2)  # poll; the KRPC probes run meanwhile
        finally:
            await c.stop()

        await a.stop()
        got = {e.peer_id: e.record for e in await b.get_peers(topic)}
        assert got[a.peer_id] == b"record of a"
    finally:
        await a.stop()
        await b.stop()
