"""KRPC codec, BEP 42 ids and KRPC answers from one node (no libtorrent needed)."""

from __future__ import annotations

import os
import random

import pytest
from kademlia.node import Node

from dht import DHTNode, MutableItem, krpc
from dht.addresses import ExternalAddress, bep42_id, bep42_valid, source_key
from dht.bencode import bdecode, bencode
from identity import PeerKey


@pytest.mark.parametrize(("ip", "r", "prefix"), [
    ("124.31.75.21", 1, "5fbfbf"), ("21.75.31.124", 86, "5a3ce9"),
    ("65.23.51.170", 22, "a5d432"), ("84.124.73.14", 65, "1b0321"),
    ("43.213.53.83", 90, "e56f6c")])
def test_bep42_vectors(ip, r, prefix):
    nid = bep42_id(ip, r)
    want = bytes.fromhex(prefix)
    assert nid[:2] == want[:2] and nid[2] & 0xF8 == want[2] & 0xF8 and nid[19] == r
    assert bep42_valid(ip, nid) and not bep42_valid("1.2.3.4", nid)
    assert bep42_valid("127.0.0.1", os.urandom(20))  # local addresses are exempt


def test_source_keys():
    assert source_key(("8.8.8.8", 1)) == source_key(("8.8.8.8", 2)) == "8.8.8.8"
    assert source_key(("127.0.0.1", 1)) != source_key(("127.0.0.1", 2))
    assert source_key(("2a00:1450::1", 1)) == source_key(("2a00:1450::2", 9))


def test_compact_nodes_and_peers_round_trip():
    nodes = [Node(os.urandom(20), f"10.0.0.{i}", 6881 + i) for i in range(5)]
    back = krpc.unpack_nodes(krpc.pack_nodes(nodes))
    assert [(n.id, n.ip, n.port) for n in back] == [(n.id, n.ip, n.port) for n in nodes]
    assert krpc.unpack_nodes(b"x" * 25) == [] and krpc.unpack_nodes(None) == []
    assert krpc.unpack_values([krpc.pack_peer(("1.2.3.4", 80)), b"bad", 7]) == [("1.2.3.4", 80)]


def test_decode_refuses_garbage_with_krpc_error():
    rng = random.Random(5)
    good = krpc.query(b"aa", "ping", {b"id": b"i" * 20})
    for _ in range(2000):
        blob = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        try:
            krpc.decode(bytes(blob))
        except krpc.KrpcError:
            pass
    for bad in [b"de", b"d1:ti1ee", bencode({b"t": b"x", b"y": b"q"}), b"d" * 5000,
                bencode({b"t": b"x", b"y": b"e", b"e": [b"no"]})]:
        with pytest.raises(krpc.KrpcError):
            krpc.decode(bad)
    msg = krpc.decode(krpc.response(b"tt", {b"id": b"i" * 20}, ("1.2.3.4", 5)))
    assert msg.y == b"r" and msg.ip == ("1.2.3.4", 5)


async def test_a_node_answers_krpc_queries_with_bep44_rules():
    node = DHTNode(rpc_timeout=0.5)
    await node.listen()
    proto = node.protocol
    asker = ("127.0.0.1", 40001)
    proto.round_trips.note(asker)  # answers in full (amplification is tested elsewhere)

    def ask(q: str, **a) -> dict:
        a = {k.encode(): v for k, v in a.items()}
        a.setdefault(b"id", b"q" * 20)
        out = proto._krpc_answer(krpc.decode(krpc.query(b"t1", q, a)), asker, 200)
        return bdecode(out)

    try:
        assert ask("ping")[b"r"][b"id"] == node.node_id
        assert ask("ping", id=b"short")[b"e"][0] == 203
        assert ask("frobnicate")[b"e"][0] == 204
        key = PeerKey.generate()
        item = MutableItem.create(key, b"hello", 3, b"salt")
        token = ask("get", target=item.target)[b"r"][b"token"]
        put = dict(token=token, k=item.pubkey, seq=3, sig=item.signature, v=b"hello",
                   salt=b"salt")
        assert b"r" in ask("put", **put)
        got = ask("get", target=item.target)[b"r"]
        assert (got[b"v"], got[b"seq"], got[b"k"]) == (b"hello", 3, key.public_bytes)
        assert b"v" not in ask("get", target=item.target, seq=3)[b"r"]  # asker is current
        assert ask("put", **{**put, "sig": b"x" * 64})[b"e"][0] == 206
        assert ask("put", **{**put, "token": b"bad"})[b"e"][0] == 203
        newer = MutableItem.create(key, b"newer", 4, b"salt")
        assert ask("put", **{**put, "seq": 4, "sig": newer.signature, "v": b"newer",
                             "cas": 2})[b"e"][0] == 301
        assert ask("put", **{**put, "v": b"x" * 1001})[b"e"][0] == 205
        itoken = ask("get", target=os.urandom(20))[b"r"][b"token"]  # wrong target
        assert ask("put", token=itoken, v=b"immutable")[b"e"][0] == 203
        info_hash = os.urandom(20)
        tok = ask("get_peers", info_hash=info_hash)[b"r"][b"token"]
        assert b"r" in ask("announce_peer", info_hash=info_hash, port=7000, token=tok)
        assert b"r" in ask("announce_peer", info_hash=info_hash, port=0, implied_port=1,
                           token=tok)
        values = ask("get_peers", info_hash=info_hash)[b"r"][b"values"]
        assert sorted(krpc.unpack_values(values)) == [("127.0.0.1", 7000), ("127.0.0.1", 40001)]
    finally:
        await node.stop()


async def test_krpc_answers_to_an_unproven_address_are_trimmed():
    import asyncio
    import socket

    node = DHTNode(rpc_timeout=0.5)
    await node.listen()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        for i in range(30):
            node.protocol.router.add_contact(Node(os.urandom(20), "127.0.0.1", 30000 + i))
        item = MutableItem.create(PeerKey.generate(), b"v" * 990, 1)
        node.store.put_mutable(item, None, node.clock())
        for q, a in [("get", {b"target": item.target}), ("find_node", {b"target": item.target}),
                     ("get_peers", {b"info_hash": item.target}), ("frobnicate", {})]:
            req = krpc.query(b"zz", q, {b"id": b"q" * 20, **a})
            sock.sendto(req, node.address)
            reply = b"d1:ad"  # skip the node's own challenge pings
            while reply.startswith(b"d1:ad"):
                reply = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 4096),
                                               5)
            assert len(reply) <= 3 * len(req), (q, len(req), len(reply))
    finally:
        sock.close()
        await node.stop()


async def test_require_bep42_refuses_ids_not_bound_to_a_public_address():
    from dht.lookup import Lookup

    node = DHTNode(rpc_timeout=0.5, require_bep42=True)
    await node.listen()
    try:
        bad = Node(bytes(bep42_id("8.8.4.4"))[:19] + b"\x00", "8.8.8.8", 6881)  # another IP's
        good = Node(bep42_id("8.8.4.4"), "8.8.4.4", 6881)
        local = Node(os.urandom(20), "127.0.0.1", 7000)  # exempt, as BEP 42 says
        for n in (bad, good, local):
            node.protocol.router.add_contact(n)
        assert {c.ip for c in node.protocol.router.contacts()} == {"8.8.4.4", "127.0.0.1"}
        m = Lookup(os.urandom(20), [bad, good, local], k=8, alpha=3, admit=DHTNode._admit)
        assert set(m.known) == {good.id, local.id}
    finally:
        await node.stop()


def test_bep42_exempts_what_libtorrent_exempts():
    # Python's is_private also covers documentation ranges; libtorrent checks ids there
    assert not bep42_valid("203.0.113.10", bytes(20))
    assert bep42_valid("10.1.2.3", bytes(20)) and bep42_valid("192.168.1.1", bytes(20))


def test_the_external_address_is_what_most_distinct_sources_report():
    ext = ExternalAddress(window=16, quorum=3)
    for port in range(10):  # one host with many ports is one vote
        assert ext.note(("44.0.0.1", port), "203.0.113.9") is None
    assert ext.note(("44.0.0.2", 1), "203.0.113.9") is None
    assert ext.note(("44.0.0.3", 1), "203.0.113.9") == "203.0.113.9"
    for i in (4, 5):  # a minority cannot move it
        assert ext.note((f"44.0.0.{i}", 1), "192.0.2.1") is None
    assert ext.current == "203.0.113.9"
    assert ext.note(("44.0.0.6", 1), "not an address") is None


async def test_a_node_takes_a_bep42_id_for_the_address_others_see():
    node = DHTNode()
    await node.listen()
    try:
        contacts = [Node(os.urandom(20), "127.0.0.1", 7000 + i) for i in range(5)]
        for c in contacts:
            node.protocol.router.add_contact(c)
        old = node.node_id
        for i in (1, 2):
            node.note_external((f"44.0.0.{i}", 6881), "203.0.113.10")
        assert node.node_id == old  # two sources are not a quorum
        node.note_external(("44.0.0.3", 6881), "203.0.113.10")
        assert node.node_id != old and bep42_valid("203.0.113.10", node.node_id)
        assert node.protocol.core.own_id == node.protocol.source_node.id == node.node_id
        assert {c.id for c in node.protocol.router.contacts()} == {c.id for c in contacts}
        node.note_external(("44.0.0.4", 6881), "127.0.0.1")  # loopback: kept as is
        assert bep42_valid("203.0.113.10", node.node_id)
    finally:
        await node.stop()
