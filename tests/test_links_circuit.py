"""Member data relay: a circuit carries a link's frames through a member that opted in,
sealed end to end (the relay sees ciphertext only; any change closes the circuit), at most
the relay's byte rate, and refused clearly where the relay does not relay or cannot reach.

The circuits here run over in-memory links (``memory_pair``): what is under test is the
circuit's sealing, rate and refusals, not the transport; over TLS and real processes:
tests/system/test_nat_swarm.py (the member relay test)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from identity.keys import PeerKey
from swarm.errors import LinkClosed
from swarm.links import memory_pair
from swarm.links.circuit import CircuitData, CircuitEndpoint, DataRelay
from swarm.links.echo import Bulk, Echo


class _Net:
    """A and W each linked to relay R; every link end read by a pump."""

    def __init__(self, rate: int, tamper=None, names: str = "AW", max_circuits: int = 64
                 ) -> None:
        self.keys = {n: PeerKey.generate() for n in "AWRX"}
        self.links = {}
        self.relay = DataRelay(self.links, rate, max_circuits)
        self.accepted: asyncio.Queue = asyncio.Queue()
        self.seen: list[bytes] = []
        self.tasks = []
        self.ends = {}
        for name in names:
            mine, relays = memory_pair(self.keys[name], self.keys["R"])
            self.links[self.keys[name].peer_id] = relays
            ep = CircuitEndpoint(self.keys[name], on_link=self.accepted.put_nowait)
            self.ends[name] = (ep, mine)
            self.tasks += [asyncio.ensure_future(self._pump_relay(relays, tamper)),
                           asyncio.ensure_future(self._pump_end(ep, mine))]

    async def _pump_relay(self, link, tamper) -> None:
        async for msg in link:
            if isinstance(msg, CircuitData):
                self.seen.append(msg.data.tobytes())
                if tamper and len(self.seen) == 3:
                    msg = CircuitData(msg.circuit, tamper(msg.data))
            await self.relay.handle(link, msg)

    async def _pump_end(self, ep, link) -> None:
        async for msg in link:
            await ep.handle(link, msg)

    async def dial(self, name: str = "A"):
        ep, relay_link = self.ends[name]
        return await ep.connect(relay_link, self.keys["W"].peer_id, timeout=5)

    async def close(self) -> None:
        for ep, link in self.ends.values():
            await ep.close()
            await link.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_a_circuit_carries_a_link_the_relay_cannot_read():
    net = _Net(rate=50 << 20)
    try:
        link = await net.dial()
        theirs = await asyncio.wait_for(net.accepted.get(), 5)
        assert (link.remote, theirs.remote) == (net.keys["W"].peer_id, net.keys["A"].peer_id)
        secret = np.frombuffer(b"matrix rows nobody else may read" * 64, np.uint8)
        await link.send(Echo("hello", [secret]))
        got = await asyncio.wait_for(theirs.recv(), 5)
        assert got.text == "hello" and got.arrays[0].tobytes() == secret.tobytes()
        await theirs.send(Echo("back", []))
        assert (await asyncio.wait_for(link.recv(), 5)).text == "back"
        assert await link.ping(5) > 0
        assert net.seen and not any(b"nobody else" in s or b"hello" in s for s in net.seen)
        await link.close("done")
        with pytest.raises(LinkClosed):
            await asyncio.wait_for(theirs.recv(), 5)
    finally:
        await net.close()


async def test_a_frame_changed_by_the_relay_closes_the_circuit():
    net = _Net(rate=50 << 20, tamper=lambda d: np.bitwise_xor(d, 1).astype(np.uint8))
    try:
        link = await net.dial()
        theirs = await asyncio.wait_for(net.accepted.get(), 5)
        for i in range(4):
            await link.send(Echo(str(i), []))
        with pytest.raises(LinkClosed):
            for _ in range(5):
                await asyncio.wait_for(theirs.recv(), 5)
        assert "altered" in str(theirs.error)
    finally:
        await net.close()


async def test_the_relay_caps_its_byte_rate():
    rate = 512 << 10
    net = _Net(rate=rate)
    try:
        link = await net.dial()
        theirs = await asyncio.wait_for(net.accepted.get(), 5)
        blob = np.zeros(256 << 10, np.uint8)
        t0 = time.monotonic()
        for _ in range(6):  # 1.5 MiB through a 0.5 MiB/s relay (1 s of burst)
            await link.send(Bulk(blob))
        for _ in range(6):
            await asyncio.wait_for(theirs.recv(), 10)
        assert time.monotonic() - t0 >= 1.5
        assert net.relay.carried >= 6 * blob.nbytes
    finally:
        await net.close()


async def test_refused_where_the_member_does_not_relay_or_cannot_reach():
    net = _Net(rate=0)
    try:
        with pytest.raises(ConnectionError, match="does not relay data"):
            await net.dial()
        net.relay.rate = 1 << 20
        ep, relay_link = net.ends["A"]
        with pytest.raises(ConnectionError, match="no link to"):
            await ep.connect(relay_link, net.keys["X"].peer_id, timeout=5)
    finally:
        await net.close()


async def test_one_dialer_gets_a_bounded_share_of_the_relay():
    from swarm.links.circuit import MAX_PER_SENDER

    net = _Net(rate=1 << 20)
    try:
        links = [await net.dial() for _ in range(MAX_PER_SENDER)]
        with pytest.raises(ConnectionError, match="for you already"):
            await net.dial()
        await links[0].close()
        for _ in range(50):  # the close travels through the relay
            if net.relay._opened_by.get(net.keys["A"].peer_id) < MAX_PER_SENDER:
                break
            await asyncio.sleep(0.02)
        assert (await net.dial()).remote == net.keys["W"].peer_id
    finally:
        await net.close()


async def test_a_replayed_circuit_hello_is_refused():
    """Issue 34: a relay that keeps a dialer's hello and plays it again (now, or after the
    dialer's link has lived a while) gets a refusal: a hello carries its signing time and
    is taken once within MAX_SKEW. Before, the replay became a second circuit link from the
    dialer that replaced its live one and then died of silence."""
    from swarm.links.circuit import MAX_SKEW, CircuitClose, CircuitIncoming, CircuitOpen

    net = _Net(rate=50 << 20)
    hellos = []
    handle = net.relay.handle

    async def recording(link, msg):
        if isinstance(msg, CircuitOpen):
            hellos.append(msg.hello)
        return await handle(link, msg)

    net.relay.handle = recording
    try:
        link = await net.dial()
        theirs = await asyncio.wait_for(net.accepted.get(), 5)
        assert len(hellos) == 1
        ep_w = net.ends["W"][0]
        to_w = net.links[net.keys["W"].peer_id]      # the relay's own link to W
        refusals: asyncio.Queue = asyncio.Queue()
        real = net.relay.handle

        async def watching(link_, msg):
            if isinstance(msg, CircuitClose) and msg.circuit >= 1 << 40:
                refusals.put_nowait(msg.reason)
                return True
            return await real(link_, msg)

        net.relay.handle = watching
        a_id = net.keys["A"].peer_id
        await to_w.send(CircuitIncoming(a_id, 1 << 40, hellos[0]))          # at once
        assert "replayed" in await asyncio.wait_for(refusals.get(), 5)
        later = ep_w.clock
        ep_w.clock = lambda: later() + 2 * MAX_SKEW                          # much later
        await to_w.send(CircuitIncoming(a_id, (1 << 40) + 1, hellos[0]))
        assert "stale" in await asyncio.wait_for(refusals.get(), 5)
        assert net.accepted.empty() and not theirs.closed and not link.closed
        assert await link.ping(5) > 0                                          # still live
    finally:
        await net.close()


async def test_a_full_relay_gives_a_newcomer_its_fair_share():
    """Issue 34: throw-away keys at MAX_PER_SENDER circuits each had filled a relay for
    everybody. When full, a dialer under its fair share takes the newest circuit of the one
    holding the most (told why); one at or over its share is refused, clearly."""
    net = _Net(rate=50 << 20, names="AWX", max_circuits=8)
    try:
        hog = [await net.dial("X") for _ in range(8)]      # the relay is full
        for _ in hog:
            await asyncio.wait_for(net.accepted.get(), 5)
        mine = await net.dial("A")                          # refused on the old relay
        assert await mine.ping(5) > 0
        gone = await asyncio.wait_for(hog[-1].wait_closed(), 5)
        assert "fair share" in gone.reason
        assert not any(link.closed for link in hog[:-1])
        with pytest.raises(ConnectionError, match="fair share"):
            await net.dial("X")
    finally:
        await net.close()
