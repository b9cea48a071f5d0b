"""The node's HTTP server against slow-loris clients (issue 45, finding 4): connections that
never finish their headers, on real loopback sockets, hold at most a capped number of the
node's descriptors, and for a bounded time."""

from __future__ import annotations

import asyncio

from aiohttp import web

from swarm.web import guard

PARTIAL = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n"  # never the blank line


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def _server(limits: guard.Limits):
    app = web.Application(middlewares=[guard.headers_in])
    app.router.add_get("/", _hello)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=75)  # the guard's timers
    await runner.setup()
    g = guard.Guard(limits)
    listener = await guard.serve(runner, "127.0.0.1", 0, g)
    return runner, listener, g, listener.sockets[0].getsockname()[1]


async def _slow(port: int, source: str = "127.0.0.1"):
    r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    w.write(PARTIAL)
    await w.drain()
    return r, w


async def _closed(r: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closed this connection within ``within`` seconds."""
    try:
        return await asyncio.wait_for(r.read(), within) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


async def _get(port: int) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    data = await asyncio.wait_for(r.read(), 10)
    w.close()
    return data


def test_connections_over_the_cap_are_closed_and_late_headers_time_out():
    async def run():
        limits = guard.Limits(per_address=4, total=6, header_timeout=3.0, idle_timeout=1.0)
        runner, listener, g, port = await _server(limits)
        try:
            held = [await _slow(port) for _ in range(4)]
            extra = [await _slow(port) for _ in range(3)]  # over the address's cap
            assert all(await asyncio.gather(*(_closed(r, 2.0) for r, _ in extra)))
            assert g.refused == 3 and g.total == 4
            # other addresses share the total cap of 6
            others = [await _slow(port, f"127.0.0.{i}") for i in (2, 3, 4)]
            closed = await asyncio.gather(*(_closed(r, 1.0) for r, _ in others))
            assert closed.count(True) == 1 and g.total == 6
            # every held connection is closed once its headers are late
            assert all(await asyncio.gather(*(_closed(r, 10) for r, _ in held)))
            assert g.timed_out >= 4
            for _, w in held + extra + others:
                w.close()
            deadline = asyncio.get_running_loop().time() + 10
            while g.total:  # connection_lost of the last ones
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            assert (await _get(port)).endswith(b"hello")
            # a kept-alive connection idle after its answer is closed too
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await w.drain()
            assert b"hello" in await asyncio.wait_for(r.readuntil(b"hello"), 10)
            assert await _closed(r, 10)
            w.close()
        finally:
            listener.close()
            await runner.cleanup()

    asyncio.run(run())


def test_the_cap_leaves_most_descriptors_to_the_node():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
        low = guard.limits()
        assert low.total == 50 and low.per_address <= 32
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert guard.limits().total <= guard.TOTAL
