"""Which local address reaches a peer: nodes that only look or ask (observers, requesters)
bind there, not to loopback, so they work from another machine."""

from __future__ import annotations

import socket
from collections.abc import Sequence


def source_address(peers: Sequence[tuple[str, int]], default: str = "127.0.0.1") -> str:
    """The local IPv4 address the kernel's routes use to reach the first of ``peers``
    (a connected UDP socket sends nothing); ``default`` when there are none or no route."""
    for host, port in peers:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((host, port))
                return s.getsockname()[0]
        except OSError:
            continue
    return default
