"""KRPC, BitTorrent's mainline DHT wire (BEP 5, BEP 44, BEP 42): a pure codec.

A KRPC message is one bencoded dict (so its first byte is ``d``; the swarm framing starts
with 0x00 or 0x01, so one UDP socket carries both): ``t`` a transaction id, ``y`` one of
``q`` (query: ``q`` the method, ``a`` its arguments), ``r`` (response: ``r``) or ``e``
(error: ``e`` = [code, message]). Contacts travel as compact node info (20-byte id + 4-byte
IPv4 + 2-byte port), peers as compact peer info (6 bytes); BEP 32 adds IPv6: ``nodes6``
(20 + 16 + 2 bytes each), 18-byte peers and ``ip``, and ``want`` (``n4``/``n6``) to ask for
either family. Nothing here does I/O; decoding never raises anything but :class:`KrpcError`
on untrusted bytes.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Any

from kademlia.node import Node

from dht.bencode import bdecode, bencode
from dht.errors import BencodeError, DHTError

MAX_DATAGRAM = 1500 * 2  # larger KRPC datagrams are not ones a mainline node sends
CLIENT = b"SW\x00\x01"
"""BEP 5's ``v`` (client and version) on every KRPC message a swarm node sends: a node
that sees it knows the sender also speaks the swarm framing (announcements, messages)."""
METHOD_UNKNOWN = 204
COMPACT_NODE = 26
COMPACT_PEER = 6
COMPACT_NODE6 = 38
COMPACT_PEER6 = 18


class KrpcError(DHTError):
    """Bytes that are not a well-formed KRPC message."""


@dataclass
class KrpcMessage:
    """One decoded KRPC message."""

    t: bytes
    """Transaction id, echoed in the answer."""
    y: bytes
    """b"q", b"r" or b"e"."""
    q: bytes = b""
    """The method of a query."""
    body: dict[bytes, Any] = field(default_factory=dict)
    """``a`` of a query or ``r`` of a response."""
    error: tuple[int, str] | None = None
    """(code, message) of an error."""
    ip: tuple[str, int] | None = None
    """BEP 42: the address the sender saw us at, when it said."""
    v: bytes = b""
    """BEP 5's client version of the sender (:data:`CLIENT` for a swarm node)."""
    ro: bool = False
    """BEP 43: a query from a read-only node (top-level ``ro`` = 1), which answers no
    queries itself and so is never added to a routing table."""

    @property
    def from_swarm(self) -> bool:
        """Whether the sender is a swarm node (so it also speaks the swarm framing)."""
        return self.v[:2] == CLIENT[:2]


def decode(datagram: bytes) -> KrpcMessage:
    """A checked :class:`KrpcMessage`; raises :class:`KrpcError`."""
    if len(datagram) > MAX_DATAGRAM:
        raise KrpcError("datagram too large")
    try:
        msg = bdecode(datagram, max_depth=8)
    except BencodeError as exc:
        raise KrpcError(f"not bencode: {exc}") from exc
    if not isinstance(msg, dict):
        raise KrpcError("not a dict")
    t, y = msg.get(b"t"), msg.get(b"y")
    if not isinstance(t, bytes) or not 0 < len(t) <= 16 or y not in (b"q", b"r", b"e"):
        raise KrpcError("bad t or y")
    ip = None
    v = msg.get(b"v") if isinstance(msg.get(b"v"), bytes) else b""
    raw_ip = msg.get(b"ip")
    if isinstance(raw_ip, bytes) and len(raw_ip) in (COMPACT_PEER, COMPACT_PEER6):
        ip = unpack_peer(raw_ip)
    if y == b"q":
        q, a = msg.get(b"q"), msg.get(b"a")
        if not isinstance(q, bytes) or not isinstance(a, dict):
            raise KrpcError("query without q or a")
        return KrpcMessage(t, y, q=q, body=a, ip=ip, v=v, ro=msg.get(b"ro") == 1)
    if y == b"r":
        r = msg.get(b"r")
        if not isinstance(r, dict):
            raise KrpcError("response without r")
        return KrpcMessage(t, y, body=r, ip=ip, v=v)
    e = msg.get(b"e")
    if (not isinstance(e, list) or len(e) < 2 or not isinstance(e[0], int)
            or not isinstance(e[1], bytes)):
        raise KrpcError("malformed error")
    return KrpcMessage(t, y, error=(e[0], e[1].decode("utf-8", "replace")[:200]), ip=ip, v=v)


def query(t: bytes, method: str, args: dict[str, Any], ro: bool = False) -> bytes:
    """A query; ``ro`` marks it as a read-only node's (BEP 43)."""
    msg = {b"t": t, b"y": b"q", b"q": method.encode(), b"a": args, b"v": CLIENT}
    if ro:
        msg[b"ro"] = 1
    return bencode(msg)


def response(t: bytes, body: dict[str, Any], to: tuple[str, int] | None = None) -> bytes:
    msg: dict[bytes, Any] = {b"t": t, b"y": b"r", b"r": body, b"v": CLIENT}
    if to is not None and _version(to[0]):
        msg[b"ip"] = pack_peer(to)
    return bencode(msg)


def error(t: bytes, code: int, message: str) -> bytes:
    return bencode({b"t": t, b"y": b"e", b"e": [code, message[:200].encode()], b"v": CLIENT})


def _version(host: str) -> int:
    """4 or 6, or 0 for something that is not an IP address."""
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return 0


def pack_peer(addr: tuple[str, int]) -> bytes:
    """Compact peer info: 6 bytes for IPv4, 18 for IPv6 (BEP 32)."""
    return ipaddress.ip_address(addr[0]).packed + struct.pack(">H", addr[1])


def unpack_peer(raw: bytes) -> tuple[str, int]:
    ip = raw[:-2]
    addr = ipaddress.IPv4Address(ip) if len(ip) == 4 else ipaddress.IPv6Address(ip)
    return str(addr), struct.unpack(">H", raw[-2:])[0]


def pack_nodes(nodes: list[Node], version: int = 4) -> bytes:
    """Compact node info of the contacts of one family in ``nodes`` (``nodes``/``nodes6``)."""
    return b"".join(n.id + pack_peer((n.ip, n.port)) for n in nodes
                    if _version(n.ip) == version)


def unpack_nodes(raw: object, limit: int = 64, size: int = COMPACT_NODE) -> list[Node]:
    """Contacts from compact node info (``size`` 38 for ``nodes6``); a malformed blob yields
    nothing, bad entries are skipped."""
    if not isinstance(raw, bytes) or len(raw) % size:
        return []
    out = []
    for i in range(0, min(len(raw), limit * size), size):
        nid, (ip, port) = raw[i:i + 20], unpack_peer(raw[i + 20:i + size])
        if port:
            out.append(Node(nid, ip, port))
    return out


def answer_nodes(body: dict, limit: int = 64) -> list[Node]:
    """The contacts of an answer: ``nodes`` and ``nodes6`` (BEP 32)."""
    return (unpack_nodes(body.get(b"nodes"), limit)
            + unpack_nodes(body.get(b"nodes6"), limit, COMPACT_NODE6))[:limit]


def wants(args: dict, sender: tuple[str, int]) -> set[bytes]:
    """BEP 32: the families a query asks contacts of (its own family when it says none)."""
    w = args.get(b"want")
    if isinstance(w, list):
        asked = {x for x in w if x in (b"n4", b"n6")}
        if asked:
            return asked
    return {b"n6"} if _version(sender[0]) == 6 else {b"n4"}


def node_fields(nodes: list[Node], want: set[bytes]) -> dict[bytes, bytes]:
    """``nodes`` and/or ``nodes6`` for an answer, as ``want`` asks."""
    out = {}
    if b"n4" in want:
        out[b"nodes"] = pack_nodes(nodes, 4)
    if b"n6" in want:
        out[b"nodes6"] = pack_nodes(nodes, 6)
    return out


def unpack_values(raw: object, limit: int = 200) -> list[tuple[str, int]]:
    """Peers from a get_peers ``values`` list of compact peer infos (6 or 18 bytes)."""
    if not isinstance(raw, list):
        return []
    return [unpack_peer(v) for v in raw[:limit]
            if isinstance(v, bytes) and len(v) in (COMPACT_PEER, COMPACT_PEER6)
            and v[-2:] != b"\0\0"]
