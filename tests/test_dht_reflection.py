"""Mainline-mode reflection (issue 34): one KRPC node's get_peers answer names up to 200
unsigned addresses; a swarm reader listing the topic asked 64 of them directly, each with a
request padded to ~600 bytes and then a ping, every listing. Here a real KRPC peer on
loopback answers with 200 addresses the attacker chose, and we count what the reader sends
them against what the attacker sent."""

from __future__ import annotations

import asyncio
import os

from dht import DHTNode, krpc, topic_target
from dht.bencode import bencode

TOPIC = b"swarm/reflection-test"
VICTIMS = [(f"127.0.{i // 250}.{2 + i % 250}", 9) for i in range(200)]  # discard port


class _Attacker(asyncio.DatagramProtocol):
    """A mainline node that answers every get_peers with 200 victims' addresses."""

    def __init__(self) -> None:
        self.id = os.urandom(20)
        self.sent = 0
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        try:
            msg = krpc.decode(data)
        except krpc.KrpcError:
            return  # the swarm framing: a mainline node drops it
        if msg.y != b"q":
            return
        body = {b"id": self.id}
        if msg.q in (b"find_node", b"get_peers", b"get"):
            body[b"nodes"] = b""
            body[b"token"] = b"tok"
        if msg.q == b"get_peers":
            body[b"values"] = [krpc.pack_peer(v) for v in VICTIMS]
        out = bencode({b"t": msg.t, b"y": b"r", b"r": body})
        self.sent += len(out)
        self.transport.sendto(out, addr)


async def test_one_krpc_answer_cannot_make_a_reader_flood_addresses_it_names():
    loop = asyncio.get_running_loop()
    attacker = _Attacker()
    transport, _ = await loop.create_datagram_endpoint(lambda: attacker,
                                                       local_addr=("127.0.0.1", 0))
    reader = DHTNode(krpc=True, rpc_timeout=0.3)
    await reader.listen()
    to_victims = 0
    victims = set(VICTIMS)
    real = reader.protocol.transport.sendto

    def counting(data, addr=None):
        nonlocal to_victims
        if addr is not None and (addr[0], addr[1]) in victims:
            to_victims += len(data)
        return real(data, addr)

    reader.protocol.transport.sendto = counting
    try:
        await reader.bootstrap([transport.get_extra_info("sockname")[:2]])
        assert reader.protocol.router.contacts()
        await reader.get_peers(TOPIC)
        first, answered = to_victims, attacker.sent
        print(f"to victims {first} B for {answered} B answered")
        assert first <= answered, (first, answered)  # no amplification at all
        for _ in range(3):                     # listed again and again: silent ones skipped
            await reader.get_peers(TOPIC)
        assert to_victims == first
        assert topic_target(TOPIC)            # (the topic's info-hash was what it asked)
    finally:
        await reader.stop()
        transport.close()
