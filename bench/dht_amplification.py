"""Reflection amplification: reply/request size for requests from a never-seen address.

One node holding a 1000-byte mutable item, an immutable item, 60 announcements under a topic
and 40 contacts; a raw UDP socket (as a spoofer would aim it) sends each request once in the
node's own framing and records the reply size. "after a round trip" repeats a request with the
write token the first reply carried (what the node's own client does), which proves the
address. Runs against any tree that has ``dht.DHTNode`` (``PYTHONPATH=<tree>``), so the same
script measures the code before and after a change.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import sys
from pathlib import Path

sys.path.insert(0, __import__("os").environ.get("DHT_TREE") or str(Path(__file__).resolve().parent.parent))

import umsgpack  # noqa: E402
from kademlia.node import Node  # noqa: E402

from dht import Announcement, DHTNode, MutableItem  # noqa: E402
from identity import PeerKey  # noqa: E402

TOPIC = b"swarm-members"


def _request(name: str, args: list) -> bytes:
    return b"\x00" + hashlib.sha1(name.encode() + repr(args).encode()).digest() + \
        umsgpack.packb([name, [b"x" * 20, *args]])


async def _exchange(sock: socket.socket, addr, datagram: bytes, timeout: float = 2.0) -> bytes:
    loop = asyncio.get_running_loop()
    sock.sendto(datagram, addr)
    reply = b"\x00"
    while reply[:1] == b"\x00":  # the node's own requests (challenge pings): not answered
        reply = await asyncio.wait_for(loop.sock_recv(sock, 65536), timeout)
    return reply


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


async def measure() -> list[tuple[str, int, int, int | None]]:
    """(request, request bytes, first reply bytes, reply bytes after a round trip or None)."""
    node = DHTNode(rpc_timeout=0.5)
    await node.listen()
    socks: list[socket.socket] = []
    try:
        now = node.clock()
        for i in range(40):
            nid = hashlib.sha1(b"contact%d" % i).digest()
            node.protocol.router.add_contact(Node(nid, "127.0.0.1", 20000 + i))
        key = PeerKey.generate()
        item = MutableItem.create(key, b"v" * 990, 1, b"s")
        node.store.put_mutable(item, None, now)
        immutable = node.store.put_immutable(b"800:" + b"i" * 800, now)
        for _ in range(60):
            k = PeerKey.generate()
            node.store.announce(TOPIC, Announcement.create(k, k.peer_id, TOPIC, b"r" * 64,
                                                           now + 600), now)
        rows = []
        for name, args in [("ping", []), ("find_node", [hashlib.sha1(b"t").digest()]),
                           ("get", [item.target]), ("get", [immutable]),
                           ("get_peers", [TOPIC, b""])]:
            sock = _socket()  # a never-seen address for each request
            socks.append(sock)
            req = _request(name, args)
            reply = await _exchange(sock, node.address, req)
            data = umsgpack.unpackb(reply[21:])
            again = None
            if isinstance(data, dict) and isinstance(data.get("retry"), bytes):
                req2 = _request(name, [*args, data["retry"]])
                again = len(await _exchange(sock, node.address, req2))
            label = name + (" (mutable)" if args and args[0] == item.target else
                            " (immutable)" if args and args[0] == immutable else "")
            rows.append((label, len(req), len(reply), again))
        return rows
    finally:
        for sock in socks:
            sock.close()
        await node.stop()


def print_table(rows) -> None:
    head = f"{'request':<18}{'request B':>10}{'reply B':>9}{'ratio':>8}{'after round trip B':>20}"
    print(head)
    print("-" * len(head))
    for name, req, rep, again in rows:
        print(f"{name:<18}{req:>10}{rep:>9}{rep / req:>8.1f}{again if again else '-':>20}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    measured = asyncio.run(measure())
    if "--json" in sys.argv[1:]:
        import json

        print(json.dumps([{"request": n, "request_bytes": q, "reply_bytes": r,
                           "ratio": round(r / q, 1), "after_round_trip_bytes": a}
                          for n, q, r, a in measured]))
    else:
        print_table(measured)
