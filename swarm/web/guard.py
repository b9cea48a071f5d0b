"""Connection limits for the node's HTTP server: what a client that never finishes its headers
may hold.

aiohttp's ``AppRunner`` has no connection cap and no header-read timeout (its keep-alive timer
stops at the first byte of a request, then waits for the rest for ever), and the key check runs
only once the headers are in. The server shares the node's process, so connections held open
without headers had used up its descriptors: the node could no longer open a file, accept a
link or dial. Here every connection counts against a cap per address and one in total, set far
below the descriptor limit (:func:`limits`); a connection must finish a request's headers
within ``header_timeout`` of opening (and within ``idle_timeout`` of its last answer), else it
is closed. A connection over a cap is closed as soon as it is accepted.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

HEADER_TIMEOUT = 10.0
"""Seconds a new connection has to finish its first request's headers."""
IDLE_TIMEOUT = 15.0
"""Seconds a kept-alive connection may wait between an answer and the next headers."""
PER_ADDRESS = 32
"""Connections one address may hold open at once."""
TOTAL = 256
"""Connections the server holds at once (less where the descriptor limit is low)."""


@dataclass
class Limits:
    per_address: int = PER_ADDRESS
    total: int = TOTAL
    header_timeout: float = HEADER_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT


def limits() -> Limits:
    """The defaults, with the total capped at a quarter of this process's descriptor limit
    (the rest stays for the node's links, files and dials)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    total = TOTAL if soft == resource.RLIM_INFINITY else max(8, min(TOTAL, soft // 4))
    return Limits(per_address=min(PER_ADDRESS, total), total=total)


@dataclass
class Guard:
    """Counts of open connections, per address and in all."""

    limits: Limits
    open: dict[str, int] = field(default_factory=dict)
    total: int = 0
    refused: int = 0
    """Connections closed on accept (over a cap)."""
    timed_out: int = 0
    """Connections closed for not finishing their headers in time."""

    def admit(self, address: str) -> bool:
        if self.total >= self.limits.total or \
                self.open.get(address, 0) >= self.limits.per_address:
            self.refused += 1
            return False
        self.open[address] = self.open.get(address, 0) + 1
        self.total += 1
        return True

    def leave(self, address: str) -> None:
        self.total -= 1
        left = self.open[address] - 1
        if left:
            self.open[address] = left
        else:
            del self.open[address]


class _Handler(RequestHandler):
    """aiohttp's handler, counted by the guard and closed when its headers are late."""

    guard: Guard
    _address: str | None = None
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        super().connection_made(transport)
        if not self.guard.admit(address):
            transport.abort()  # the descriptor goes back at once
            return
        self._address = address
        self._wait(self.guard.limits.header_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop()
        if self._address is not None:
            self.guard.leave(self._address)
            self._address = None
        super().connection_lost(exc)

    def _wait(self, seconds: float) -> None:
        self._stop()
        self._deadline = self._loop.call_later(seconds, self._late)

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        self.guard.timed_out += 1
        if self.transport is not None:
            self.transport.abort()


@web.middleware
async def headers_in(request: web.Request, handler):
    """A request's headers are in: its connection is busy (no deadline) until it answered,
    then it has ``idle_timeout`` to finish the next request's headers."""
    proto = request.protocol
    if not isinstance(proto, _Handler):
        return await handler(request)
    proto._stop()
    try:
        return await handler(request)
    finally:
        if proto.transport is not None and not proto.transport.is_closing():
            proto._wait(proto.guard.limits.idle_timeout)


async def serve(runner: web.AppRunner, host: str, port: int, guard: Guard
                ) -> asyncio.Server:
    """Listen on ``host:port`` for ``runner``'s app (set up, with :func:`headers_in` among its
    middlewares) with ``guard``'s limits; the caller closes the server before the runner."""
    server = runner.server
    assert server is not None, "runner.setup() first"

    def handler() -> _Handler:
        h = _Handler(server, loop=asyncio.get_running_loop(), **server._kwargs)
        h.guard = guard
        return h

    return await asyncio.get_running_loop().create_server(handler, host, port,
                                                          reuse_address=True)
