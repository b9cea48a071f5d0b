"""DHT nodes for tests: a small network on loopback, each node bootstrapped from the first."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from dht import DHTNode


@contextlib.asynccontextmanager
async def loopback_dht(count: int, **options: object) -> AsyncIterator[list[DHTNode]]:
    """``count`` nodes (``DHTNode(**options)``) on 127.0.0.1, stopped on the way out (a node
    the test stopped itself is fine: stopping twice is)."""
    nodes = [DHTNode(**options) for _ in range(count)]  # type: ignore[arg-type]
    try:
        for n in nodes:
            await n.listen(0, "127.0.0.1")
        for n in nodes[1:]:
            await n.bootstrap([nodes[0].address])
        yield nodes
    finally:
        for n in nodes:
            await n.stop()
