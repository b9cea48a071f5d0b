"""Issue 34, on every link type: decoded messages held for an application that does not read
are bounded in bytes (``window``), not only in number (64 messages of up to 2 GiB each had
been held). The reader stops at the window; the transport's own flow control (TCP, the
bound on shared-memory segments, a circuit's frame queue and the relay's links) holds the
rest back, and nothing is lost once the application reads."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from identity.keys import PeerKey
from swarm.links import LinkOptions, memory_pair, tls
from swarm.links.echo import Bulk

A, B = PeerKey.generate(), PeerKey.generate()


@contextlib.asynccontextmanager
async def _memory():
    a, b = memory_pair(A, B, LinkOptions(window=2 << 20))
    try:
        yield a, b
    finally:
        await a.close()


@contextlib.asynccontextmanager
async def _tls():
    links: asyncio.Queue = asyncio.Queue()
    server = await tls.listen(A, on_link=links.put_nowait, accept=lambda _: True,
                              options=LinkOptions(window=4 << 20))
    try:
        dialer = await tls.connect(B, "127.0.0.1", server.port, expect=A.peer_id)
        try:
            yield dialer, await asyncio.wait_for(links.get(), 5)
        finally:
            await dialer.close()
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def _circuit():
    from tests.test_links_circuit import _Net

    net = _Net(rate=400 << 20)
    try:
        link = await net.dial()
        yield link, await asyncio.wait_for(net.accepted.get(), 5)
    finally:
        await net.close()


@pytest.mark.parametrize(("pair", "chunk", "count"), [
    (_memory, 1 << 19, 30),
    (_tls, 1 << 20, 40),      # arrays come through shared memory here, where it is on
    (_circuit, 1 << 20, 24),
], ids=["memory", "tls", "circuit"])
async def test_an_application_that_does_not_read_holds_at_most_a_window(pair, chunk, count):
    async with pair() as (sender_link, reader):
        window = reader.options.window
        data = np.zeros(chunk, np.uint8)

        async def send_all():
            for _ in range(count):
                await sender_link.send(Bulk(data))

        sender = asyncio.create_task(send_all())

        async def stalled():
            while not reader._stalled:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(stalled(), 20)
        assert count * chunk > window + chunk  # the sender had more than a window to give
        assert sum(m.data.nbytes for m in reader._queue._items) <= window + chunk
        for _ in range(count):                 # nothing lost: all arrive once read
            assert (await asyncio.wait_for(reader.recv(), 10)).data.nbytes == chunk
        await asyncio.wait_for(sender, 10)
