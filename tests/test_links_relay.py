"""Signaling relayed by a member: sealed to the receiver (the relay cannot read it), signed
by the sender (it cannot forge or redirect it), refused fast when the receiver is not
attached, rate-capped per sender."""

from __future__ import annotations

import asyncio

import pytest

from identity.keys import PeerKey
from swarm.errors import AuthenticationError
from swarm.links import memory_pair
from swarm.links.relay import (
    MAX_BOXED,
    RelayedSignal,
    RelaySignal,
    RelaySignaler,
    SignalRelay,
    _x25519_private,
    _x25519_public,
    box,
    unbox,
)
from swarm.links.webrtc import WebRTCEndpoint


def test_box_opens_only_for_its_receiver():
    a, b = PeerKey.generate(), PeerKey.generate()
    raw = _x25519_private(b).public_key().public_bytes_raw()
    assert _x25519_public(b.peer_id).public_bytes_raw() == raw  # same X25519 key both ways
    sealed = box(b.peer_id, b"offer")
    assert b"offer" not in sealed
    assert unbox(b, sealed) == b"offer"
    with pytest.raises(AuthenticationError):
        unbox(a, sealed)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(AuthenticationError):
        unbox(b, tampered)


def test_relay_refuses_unknown_oversized_and_flooding_senders():
    now = [0.0]
    relay = SignalRelay(rate=2, burst=2, clock=lambda: now[0])
    a, b = PeerKey.generate().peer_id, PeerKey.generate().peer_id
    assert "no link to" in relay.route(a, RelaySignal(b, b"x" * 64))
    assert "exceeds" in relay.route(a, RelaySignal(b, b"x" * (MAX_BOXED + 1)))
    assert "no link to" in relay.route(a, RelaySignal(b, b"x"))
    assert "rate" in relay.route(a, RelaySignal(b, b"x"))  # burst of 2 spent above
    now[0] += 1.0  # two more tokens
    assert "no link to" in relay.route(a, RelaySignal(b, b"x"))
    assert "oneself" in relay.route(a, RelaySignal(a, b"x"))


class _Cluster:
    """A relay R with links to A and B; every link end read by a pump task."""

    def __init__(self) -> None:
        self.keys = {n: PeerKey.generate() for n in "ABRC"}
        self.relay = SignalRelay()
        self.seen: list[bytes] = []
        self.tasks: list[asyncio.Task] = []
        self.endpoints: dict[str, WebRTCEndpoint] = {}
        self.links = []

    def add(self, name: str, tamper=None) -> WebRTCEndpoint:
        mine, relays = memory_pair(self.keys[name], self.keys["R"])
        self.links += [mine, relays]
        self.relay.attach(relays)
        sig = RelaySignaler(self.keys[name], lambda to: [mine])
        ep = WebRTCEndpoint(self.keys[name], sig, host_addresses=["127.0.0.1"],
                            connect_timeout=10)
        sig.on_unreachable = ep.unreachable
        self.endpoints[name] = ep

        async def relay_side() -> None:
            async for msg in relays:
                if isinstance(msg, RelaySignal):
                    self.seen.append(msg.payload)
                    if tamper:
                        msg = tamper(msg)
                await self.relay.handle(relays, msg)

        async def peer_side() -> None:
            async for msg in mine:
                await sig.handle(mine, msg)

        self.tasks += [asyncio.ensure_future(relay_side()), asyncio.ensure_future(peer_side())]
        return ep

    async def close(self) -> None:
        for ep in self.endpoints.values():
            await ep.close()
        for link in self.links:
            await link.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_webrtc_link_through_a_relay_that_cannot_read_the_signals():
    c = _Cluster()
    got: asyncio.Queue = asyncio.Queue()
    try:
        a = c.add("A")
        b = c.add("B")
        b.on_link = got.put_nowait
        link = await a.connect(c.keys["B"].peer_id, ("relay", 0))
        theirs = await asyncio.wait_for(got.get(), 10)
        assert theirs.remote == c.keys["A"].peer_id
        assert await link.ping(5) > 0
        assert c.relay.passed == 2  # offer and answer
        assert c.seen and not any(b"v=0" in p or b"fingerprint" in p for p in c.seen)
        await link.close()
    finally:
        await c.close()


async def test_dial_to_a_peer_the_relay_cannot_reach_fails_at_once():
    c = _Cluster()
    try:
        a = c.add("A")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ConnectionError, match="no link to"):
            await a.connect(c.keys["C"].peer_id, ("relay", 0))
        assert loop.time() - t0 < 5  # not the 10 s connect timeout
    finally:
        await c.close()


async def test_relay_cannot_forge_or_redirect():
    """A relay that alters the sealed offer, or names another sender, gets nowhere."""

    def alter(msg: RelaySignal) -> RelaySignal:
        p = bytearray(msg.payload)
        p[40] ^= 1
        return RelaySignal(msg.to, bytes(p))

    c = _Cluster()
    try:
        a = c.add("A", tamper=alter)
        b = c.add("B")
        refused: list = []
        b.on_refused = lambda peer, exc: refused.append(exc)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(a.connect(c.keys["B"].peer_id, ("relay", 0)), 3)
        # the genuine offer, re-attributed by the relay to another sender, is refused too
        sig_b = RelaySignaler(c.keys["B"], lambda to: [])
        sig_b.on_message(b._inbox)
        await sig_b.handle(c.links[2], RelayedSignal(c.keys["C"].peer_id, c.seen[0]))
        assert any("relayed as from" in str(e) for e in refused), refused
    finally:
        await c.close()


async def test_one_relay_refusing_many_times_does_not_make_a_peer_unreachable():
    """Issue 34: a signal goes out through every relay; only a refusal from a relay it went
    through counts, once per relay. One relay answering with as many refusals as there are
    relays (or a relay the signal never went through) had failed the dial at once. Real
    TLS links to two relays and a third member."""
    from swarm.links import tls
    from swarm.links.relay import RelayRefused

    me, target = PeerKey.generate(), PeerKey.generate()
    relays = [PeerKey.generate() for _ in range(3)]
    servers, theirs, mine = [], [], []
    try:
        for key in relays:
            got: asyncio.Queue = asyncio.Queue()
            servers.append(await tls.listen(key, on_link=got.put_nowait))
            mine.append(await tls.connect(me, "127.0.0.1", servers[-1].port, expect=key.peer_id))
            theirs.append(await asyncio.wait_for(got.get(), 5))
        unreachable = []
        signaler = RelaySignaler(me, lambda to: mine[:2],
                                 on_unreachable=lambda peer, why: unreachable.append(why))
        await signaler.send(target.peer_id, ("relay", 0), b"a signed offer")
        for link in theirs[:2]:                  # each relay got the signal once
            assert isinstance(await asyncio.wait_for(link.recv(), 5), RelaySignal)
        # relay 0 refuses twice, relay 2 (never asked) refuses too
        for link in (theirs[0], theirs[0], theirs[2]):
            await link.send(RelayRefused(target.peer_id, "no link (a lie)"))
        for link in (mine[0], mine[0], mine[2]):
            msg = await asyncio.wait_for(link.recv(), 5)
            assert await signaler.handle(link, msg)
        assert unreachable == []
        await theirs[1].send(RelayRefused(target.peer_id, "no link to it"))
        assert await signaler.handle(mine[1], await asyncio.wait_for(mine[1].recv(), 5))
        assert unreachable == ["no link to it"]  # every relay asked refused: now it is
    finally:
        for link in mine + theirs:
            await link.close()
        for server in servers:
            await server.close()


async def test_a_dead_duplicate_link_does_not_detach_a_peer_whose_link_is_open():
    """Issue 34: the newest link to a peer is the one a relay uses; when it closes, an older
    one still open takes over instead of the peer being dropped from the relay's table."""
    relay = SignalRelay()
    r, p = PeerKey.generate(), PeerKey.generate()
    real_mine, real = memory_pair(r, p)
    fake_mine, fake = memory_pair(r, p)
    relay.attach(real_mine)
    relay.attach(fake_mine)
    assert relay.links[p.peer_id] is fake_mine
    await fake_mine.close("silent")
    assert relay.links[p.peer_id] is real_mine
    await real_mine.close()
    assert p.peer_id not in relay.links
