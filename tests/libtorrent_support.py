"""libtorrent sessions as mainline DHT nodes on loopback, for the interop tests.

``lt`` is the module (PyPI ``libtorrent``, in the ``test`` extra). Without it the importing
test module is skipped, which fails the run under CI (tests/conftest.py). Nothing leaves 127.0.0.1: ``dht_bootstrap_nodes`` is empty and no router is named.
"""

from __future__ import annotations

import asyncio
import time

import pytest

lt = pytest.importorskip("libtorrent")  # a failure under CI (tests/conftest.py)


def session(**extra: object) -> lt.session:
    """One libtorrent session with its DHT on 127.0.0.1 and nothing else enabled."""
    return lt.session({
        "listen_interfaces": "127.0.0.1:0", "enable_dht": True, "enable_lsd": False,
        "enable_upnp": False, "enable_natpmp": False, "dht_bootstrap_nodes": "",
        "enable_outgoing_utp": False, "enable_incoming_utp": False,
        "dht_restrict_routing_ips": False, "dht_restrict_search_ips": False,
        # every node here shares 127.0.0.1: libtorrent's per-IP limits (5 packets/s, then a
        # 5-minute block; 8 KB/s out) would treat the whole test network as one flooder
        "dht_block_ratelimit": 1_000_000, "dht_upload_rate_limit": 10_000_000,
        "alert_mask": lt.alert_category.dht | lt.alert_category.dht_operation
        | lt.alert_category.error, "alert_queue_size": 100_000, **extra})


def network(n: int, **extra: object) -> list[lt.session]:
    """``n`` sessions that each know all the others."""
    sessions = [session(**extra) for _ in range(n)]
    ports = [s.listen_port() for s in sessions]
    for s in sessions:
        for p in ports:
            if p != s.listen_port():
                s.add_dht_node(("127.0.0.1", p))
    return sessions


def wait_alert(session: lt.session, kind, match=lambda a: True, timeout: float = 30.0):
    """The first alert of ``kind`` that matches (others are popped and dropped), polling
    without an event loop (for tests that drive processes, not coroutines)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        session.wait_for_alert(100)
        for a in session.pop_alerts():
            if isinstance(a, kind) and match(a):
                return a
    raise AssertionError(f"no {kind.__name__} within {timeout} s")


async def alert(session: lt.session, kind, match=lambda a: True, timeout: float = 30.0):
    """The first alert of ``kind`` that matches, popping (and dropping) others, on an event
    loop. Sessions not popped for a while drop new alerts once their queue is full, so pop
    (``session.pop_alerts()``) before asking."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for a in session.pop_alerts():
            if isinstance(a, kind) and match(a):
                return a
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {kind.__name__} within {timeout} s")
