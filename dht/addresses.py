"""Who a sender is, as far as an address can say: quota keys and BEP 42 node ids.

An attacker gets fresh keys and node ids for free but addresses only at a cost, so every
per-sender limit (store quotas, routing-table slots, lookup candidates) is keyed by
:func:`source_key`, and :func:`bep42_id` / :func:`bep42_valid` bind a mainline node id to
its IP (BEP 42) so that the ids closest to a key cannot all be claimed from one host.
"""

from __future__ import annotations

import ipaddress
import os
from collections import Counter, OrderedDict
from functools import lru_cache

_V4_MASK = bytes([0x03, 0x0F, 0x3F, 0xFF])
_V6_MASK = bytes([0x01, 0x03, 0x07, 0x0F, 0x1F, 0x3F, 0x7F, 0xFF])


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as BEP 42 uses."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_LOCAL = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8",
    "fc00::/7", "fe80::/10", "::1/128"))


def is_local(host: str) -> bool:
    """The addresses BEP 42 (and libtorrent) exempt: loopback, RFC 1918, link-local and
    unique-local. Not Python's ``is_private``, which also counts documentation and
    benchmarking ranges that libtorrent treats as public."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(ip.version == net.version and ip in net for net in _LOCAL)


def source_key(addr: tuple[str, int]) -> str:
    """Whose quota a request from ``addr`` counts against.

    A public IPv4 address is one source whatever its port (ports are free); an IPv6 sender
    is its /64 (one host gets a whole /64). Loopback and private addresses are one source per
    ``host:port``, so that nodes sharing a test host or a LAN are told apart.
    """
    return _source_key(str(addr[0]), int(addr[1]))


@lru_cache(maxsize=65536)  # asked per candidate of every lookup: parse each address once
def _source_key(host: str, port: int) -> str:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"{host}:{port}"
    if ip.is_loopback or ip.is_private or ip.is_link_local:
        return f"{ip}:{port}"
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def node_source(node) -> str:
    """:func:`source_key` of a kademlia ``Node`` (one without an address is its own source)."""
    if node.ip is None or node.port is None:
        return "id:" + node.id.hex()
    return source_key((node.ip, node.port))


def _crc_for(host: str, r: int) -> int:
    ip = ipaddress.ip_address(host)
    if ip.version == 4:
        raw = bytearray(a & m for a, m in zip(ip.packed, _V4_MASK, strict=True))
    else:
        raw = bytearray(a & m for a, m in zip(ip.packed[:8], _V6_MASK, strict=True))
    raw[0] |= (r & 7) << 5
    return crc32c(bytes(raw))


def bep42_id(host: str, r: int | None = None) -> bytes:
    """A node id valid for ``host`` under BEP 42 (random apart from the bound bits)."""
    rand = os.urandom(20)
    r = rand[19] if r is None else r & 0xFF
    crc = _crc_for(host, r & 7)
    head = bytes([(crc >> 24) & 0xFF, (crc >> 16) & 0xFF,
                  ((crc >> 8) & 0xF8) | (rand[2] & 0x07)])
    return head + rand[3:19] + bytes([r])


def bep42_valid(host: str, node_id: bytes) -> bool:
    """Whether ``node_id`` is bound to ``host`` (local addresses are exempt, as in BEP 42)."""
    if is_local(host):
        return True
    try:
        crc = _crc_for(host, node_id[19] & 7)
    except ValueError:
        return False
    return (node_id[0] == (crc >> 24) & 0xFF and node_id[1] == (crc >> 16) & 0xFF
            and (node_id[2] & 0xF8) == (crc >> 8) & 0xF8)


class RoundTrips:
    """Addresses that proved they receive what is sent to them; the reflection budget.

    A UDP source address is a claim until the sender answers something sent there: a reply
    to a request of ours (its random message id cannot be guessed), or a write token that
    only a reply from us carried. Until then a reply may be at most ``ratio`` times the
    request (QUIC's rule), so a spoofed request cannot make this node a reflection
    amplifier. Sans-IO; at most ``max_entries`` addresses, least recently proven first out.
    """

    def __init__(self, ratio: int = 3, max_entries: int = 4096) -> None:
        self.ratio = ratio
        self.max_entries = max_entries
        self._proven: OrderedDict[tuple[str, int], None] = OrderedDict()

    def note(self, addr: tuple[str, int]) -> None:
        key = (str(addr[0]), int(addr[1]))
        self._proven[key] = None
        self._proven.move_to_end(key)
        while len(self._proven) > self.max_entries:
            self._proven.popitem(last=False)

    def proven(self, addr: tuple[str, int]) -> bool:
        return (str(addr[0]), int(addr[1])) in self._proven

    def allows(self, addr: tuple[str, int], request_len: int, reply_len: int) -> bool:
        """Whether a reply of ``reply_len`` bytes may go to ``addr`` for that request."""
        return reply_len <= self.ratio * request_len or self.proven(addr)


class ExternalAddress:
    """This node's IP as other nodes see it (BEP 42: the ``ip`` in KRPC answers), by vote.

    The last ``window`` reports are kept, one per reporting source (:func:`source_key`, so
    one host with many ports is one vote); an IP becomes the external address when at least
    ``quorum`` sources and a strict majority of those kept report it. Sans-IO.
    """

    def __init__(self, window: int = 16, quorum: int = 3) -> None:
        self.window = window
        self.quorum = quorum
        self.current: str | None = None
        self._votes: OrderedDict[str, str] = OrderedDict()

    def note(self, reporter: tuple[str, int], seen: str) -> str | None:
        """Count one report; the new external IP when the vote just moved to it."""
        try:
            seen = str(ipaddress.ip_address(seen))
        except ValueError:
            return None
        key = source_key(reporter)
        self._votes.pop(key, None)
        self._votes[key] = seen
        while len(self._votes) > self.window:
            self._votes.popitem(last=False)
        ip, n = Counter(self._votes.values()).most_common(1)[0]
        if n >= self.quorum and 2 * n > len(self._votes) and ip != self.current:
            self.current = ip
            return ip
        return None
