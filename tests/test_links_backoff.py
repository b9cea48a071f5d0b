"""Reconnect with backoff: the schedule, and redialing a TLS peer that comes up late."""

from __future__ import annotations

import asyncio

import pytest

from identity.keys import PeerKey
from swarm.errors import AuthenticationError
from swarm.links import tls
from swarm.links.backoff import Backoff, dial


def test_delays_grow_exponentially_up_to_the_cap_with_jitter():
    b = Backoff(initial=1, factor=2, cap=5, jitter=0.5)
    assert [b.next_delay(0.0) for _ in range(5)] == [1, 2, 4, 5, 5]
    b.reset()
    assert b.next_delay(0.999) == pytest.approx(0.5, abs=1e-3)


async def test_dial_retries_until_the_peer_is_up():
    a, b = PeerKey.generate(), PeerKey.generate()
    links: asyncio.Queue = asyncio.Queue()
    # reserve a port, then leave it closed: the first dials get "connection refused"
    probe = await tls.listen(a, on_link=links.put_nowait)
    port = probe.port
    await probe.close()
    slept: list[float] = []
    server = None

    async def fake_sleep(delay: float) -> None:
        nonlocal server
        slept.append(delay)
        if len(slept) == 2:  # the peer comes up after the second failure
            server = await tls.listen(a, port=port, on_link=links.put_nowait)

    try:
        link = await dial(lambda: tls.connect(b, "127.0.0.1", port, a.peer_id),
                          sleep=fake_sleep, rand=lambda: 0.0,
                          backoff=Backoff(initial=0.1, factor=3))
        assert slept == pytest.approx([0.1, 0.3])
        assert link.remote == a.peer_id
        await link.close()
    finally:
        if server is not None:
            await server.close()


async def test_dial_gives_up_and_never_retries_the_wrong_peer():
    calls = 0

    async def refused():
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("nobody")

    async def no_sleep(_):
        return None

    with pytest.raises(ConnectionRefusedError):
        await dial(refused, attempts=3, sleep=no_sleep)
    assert calls == 3

    async def impostor():
        nonlocal calls
        calls += 1
        raise AuthenticationError("not the expected peer")

    calls = 0
    with pytest.raises(AuthenticationError):
        await dial(impostor, attempts=3, sleep=no_sleep)
    assert calls == 1
