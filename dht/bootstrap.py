"""Bootstrap addresses: ``mainline`` (BitTorrent's public DHT routers) or ``HOST:PORT``.

Shared by every networked command's ``--bootstrap``. Nothing here sends a packet: tests and
the demo never name ``mainline``.
"""

from __future__ import annotations

from collections.abc import Iterable

MAINLINE = "mainline"
MAINLINE_ROUTERS: tuple[tuple[str, int], ...] = (
    ("router.bittorrent.com", 6881),
    ("dht.transmissionbt.com", 6881),
    ("router.utorrent.com", 6881),
)


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); ValueError otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"bad bootstrap address {text!r}: expected a string HOST:PORT")
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"bad bootstrap address {text!r}: write IPv6 as [ADDR]:PORT")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad bootstrap address {text!r}: expected HOST:PORT or 'mainline'")
    if any(c.isspace() for c in host):
        raise ValueError(f"bad bootstrap address {text!r}: the host has whitespace")
    return host, int(port)


def expand(values: Iterable[str]) -> list[tuple[str, int]]:
    """Turn ``mainline`` into the public routers and ``HOST:PORT`` into a pair, in order,
    without repeats. Raises ValueError (naming the value) on anything else."""
    if isinstance(values, str):
        raise ValueError("expand() takes a list of addresses, not one string")
    out: list[tuple[str, int]] = []
    for value in values:
        pairs = (list(MAINLINE_ROUTERS) if isinstance(value, str)
                 and value.strip().lower() == MAINLINE else [parse_addr(value)])
        out += [p for p in pairs if p not in out]
    return out
