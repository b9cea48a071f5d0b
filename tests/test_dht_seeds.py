"""Bootstrap seeds: one that died since it was saved does not hold the start up (issue 48:
every ``swarm status`` after a member died waited out a whole RPC timeout on it)."""

from __future__ import annotations

import socket
import time

import pytest

from dht import DHTNode

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
RPC_TIMEOUT = 8.0


async def test_a_silent_seed_does_not_hold_the_bootstrap_for_its_rpc_timeout():
    """A socket that takes datagrams and never answers (a host that froze, or a seed gone
    where no ICMP comes back) beside a live seed: bootstrap returns once the live one has
    answered and the silent one had the lookup's grace, not after the silent one's whole
    RPC timeout; the live seed is in the routing table."""
    mute = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    mute.bind(("127.0.0.1", 0))
    live, node = DHTNode(rpc_timeout=RPC_TIMEOUT), DHTNode(rpc_timeout=RPC_TIMEOUT)
    try:
        await live.listen(0, "127.0.0.1")
        await node.listen(0, "127.0.0.1")
        t0 = time.monotonic()
        contacts = await node.bootstrap([mute.getsockname(), live.address])
        took = time.monotonic() - t0
        assert contacts >= 1
        assert took < RPC_TIMEOUT / 2, took
        assert any(n.port == live.address[1] for n in node.protocol.router.contacts())
    finally:
        await node.stop()
        await live.stop()
        mute.close()
