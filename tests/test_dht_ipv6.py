"""BEP 32 (IPv6 KRPC): ``nodes6``, 18-byte peers and ``ip``, ``want``; and swarm nodes with
six libtorrent sessions on ::1 only. Skipped only when the kernel has no IPv6 (said in the
skip reason); without libtorrent, as in tests/libtorrent_support.py."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest
import pytest_asyncio
from kademlia.node import Node

from dht import DHTNode, krpc
from tests.libtorrent_support import alert as _alert
from tests.libtorrent_support import lt, session


def _no_ipv6() -> str | None:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        return f"this kernel has no IPv6 loopback: {exc}"
    return None


pytestmark = [pytest.mark.skipif(_no_ipv6() is not None, reason=str(_no_ipv6())),
              pytest.mark.timeout(180)]


def test_bep32_compact_forms_round_trip():
    v6 = [Node(os.urandom(20), f"2001:db8::{i + 1}", 6881 + i) for i in range(3)]
    v4 = [Node(os.urandom(20), "10.0.0.1", 6881)]
    fields = krpc.node_fields(v6 + v4, {b"n4", b"n6"})
    assert len(fields[b"nodes6"]) == 3 * krpc.COMPACT_NODE6
    assert len(fields[b"nodes"]) == krpc.COMPACT_NODE
    back = krpc.answer_nodes(fields)
    assert {(n.ip, n.port) for n in back} == {(n.ip, n.port) for n in v6 + v4}
    assert krpc.unpack_values([krpc.pack_peer(("::1", 80)), krpc.pack_peer(("1.2.3.4", 9))]) \
        == [("::1", 80), ("1.2.3.4", 9)]
    assert krpc.wants({}, ("::1", 1)) == {b"n6"} and krpc.wants({}, ("1.2.3.4", 1)) == {b"n4"}
    assert krpc.wants({b"want": [b"n4", b"n6", b"x"]}, ("::1", 1)) == {b"n4", b"n6"}
    msg = krpc.decode(krpc.response(b"tt", {b"id": b"i" * 20}, ("::1", 5)))
    assert msg.ip == ("::1", 5)


@pytest_asyncio.fixture
async def v6net():
    sessions = [session(listen_interfaces="[::1]:0") for _ in range(6)]
    ports = [s.listen_port() for s in sessions]
    for s in sessions:
        for p in ports:
            if p != s.listen_port():
                s.add_dht_node(("::1", p))
    node = DHTNode(rpc_timeout=1.0)
    try:
        await node.listen(0, "::1")
        yield sessions, node
    finally:
        await node.stop()
        del sessions


@pytest.mark.asyncio
async def test_swarm_and_libtorrent_over_ipv6_only(v6net):
    sessions, node = v6net
    await node.bootstrap([("::1", sessions[0].listen_port())])
    assert node.krpc  # a mainline bootstrap node
    end = time.monotonic() + 20  # libtorrent answers with nodes6: the others become contacts
    while len(node.protocol.router.contacts()) < 4 and time.monotonic() < end:
        await node.bootstrap([("::1", sessions[0].listen_port())])
        await asyncio.sleep(0.2)
    assert all(c.ip == "::1" for c in node.protocol.router.contacts())
    assert len(node.protocol.router.contacts()) >= 4

    sessions[2].pop_alerts()
    target = sessions[2].dht_put_immutable_item(b"put by libtorrent over IPv6")
    await _alert(sessions[2], lt.dht_put_alert)
    assert await node.get_immutable(bytes.fromhex(str(target))) == \
        b"put by libtorrent over IPv6"

    mine = await node.put_immutable(b"put by swarm over IPv6")
    sessions[4].pop_alerts()
    sessions[4].dht_get_immutable_item(lt.sha1_hash(mine))
    got = await _alert(sessions[4], lt.dht_immutable_item_alert,
                       lambda a: bytes.fromhex(str(a.target)) == mine)
    assert got.item == b"put by swarm over IPv6"

    info_hash = os.urandom(20)
    assert await node.announce_peer(info_hash, 4242) >= 1
    sessions[5].pop_alerts()
    sessions[5].dht_get_peers(lt.sha1_hash(info_hash))
    reply = await _alert(sessions[5], lt.dht_get_peers_reply_alert,
                         lambda a: bytes.fromhex(str(a.info_hash)) == info_hash)
    assert ("::1", 4242) in [tuple(p) for p in reply.peers()]
