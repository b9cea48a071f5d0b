"""Links to browser tabs: a node relays them, since a tab cannot take incoming links.

A tab holds one WebRTC connection to the node that served its page. For each requester
that wants the tab as a worker, that node opens a fresh data channel on it and pipes wire
messages between the requester's TLS link and the channel: per requester an independent,
ordered link with its own credit window, the same wire protocol on both sides.

Requester side: :func:`dial` connects with TLS to the relay (checking the relay's key, as
named in the tab's signed member record), asks for the tab with :class:`RelayOpen` and
returns a :class:`RelayedLink` whose ``remote`` is the tab.

Trust: the relaying node served the tab its code, so it could make the tab do anything;
piping through it adds no power it did not have. What a requester trusts is unchanged:
every shard result is verified (Freivalds) before it is merged, and a wrong one counts
against the tab's PeerId as for any worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from aiortc import RTCDataChannel, RTCPeerConnection

from identity.keys import PeerId, PeerKey
from swarm import wire
from swarm.errors import LinkClosed, ProtocolError
from swarm.links import tls
from swarm.links.base import LinkOptions, LinkStats, PeerLink
from swarm.links.webrtc import CreditInbox, WebRTCLink

log = logging.getLogger("swarm.links.tabs")
OPEN_TIMEOUT = 10.0
"""Seconds for the relay to open a channel to the tab and answer."""


@wire.message("web.open")
class RelayOpen(wire.Message):
    """Requester -> relay: pipe this link to the tab ``target`` that you serve."""

    target: PeerId
    """The tab's PeerId (from its member record)."""


@wire.message("web.opened")
class RelayOpened(wire.Message):
    """Relay -> requester: the answer to :class:`RelayOpen`."""

    ok: bool
    """Whether the link now reaches the tab."""
    reason: str = ""
    """Why not, in words."""


class ChannelLink(WebRTCLink):
    """A link over one data channel of a connection that carries several (one per
    requester): closing it closes the channel, not the tab's connection."""

    kind = "webrtc"
    tab = True

    async def _close_transport(self) -> None:
        if self._closing_locally:
            try:
                await asyncio.wait_for(self._frames.closed_event.wait(), 1.0)
            except TimeoutError:
                pass
        self._frames.close(LinkClosed("connection lost: data channel closed"))
        self.channel.close()


def channel_link(local: PeerId, remote: PeerId, pc: RTCPeerConnection,
                 channel: RTCDataChannel, options: LinkOptions | None = None) -> ChannelLink:
    """Wrap an open data channel of ``pc`` as a link to ``remote`` (started)."""
    frames = CreditInbox((options or LinkOptions()).window)  # counted against credit granted
    channel.on("message", lambda data: frames.put_nowait(data if isinstance(data, bytes)
                                                         else b""))  # text: decoder refuses
    channel.on("close", lambda: frames.close(LinkClosed("connection lost: channel closed")))
    link = ChannelLink(local, remote, pc, channel, frames, False, options)
    link._start()
    if channel.readyState != "open":
        link._abort("data channel closed before use")
    return link


class RelayedLink(PeerLink):
    """A requester's link to a tab through its relay: the TLS link, with the tab as remote."""

    kind = "relay"
    tab = True

    def __init__(self, inner: PeerLink, target: PeerId) -> None:
        self.inner = inner
        self.local = inner.local
        self.remote = target
        self.via = inner.remote
        """The relaying node."""

    async def send(self, msg: wire.Message) -> None:
        await self.inner.send(msg)

    async def recv(self) -> wire.Message:
        return await self.inner.recv()

    async def close(self, reason: str = "closed") -> None:
        await self.inner.close(reason)

    @property
    def closed(self) -> bool:
        return self.inner.closed

    @property
    def close_reason(self) -> str | None:
        return getattr(self.inner, "close_reason", None)

    def add_close_callback(self, callback: Callable[[PeerLink], None]) -> None:
        self.inner.add_close_callback(lambda _: callback(self))

    def stats(self) -> LinkStats:
        return dataclasses.replace(self.inner.stats(), kind=self.kind, remote=self.remote)

    async def ping(self, timeout: float = 5.0) -> float:
        return await self.inner.ping(timeout)

    async def probe(self) -> bool:
        return await self.inner.probe()  # the relay's link carries this tab alone

    async def wait_closed(self) -> LinkClosed:
        return await self.inner.wait_closed()


async def dial(key: PeerKey, host: str, port: int, via: PeerId, target: PeerId,
               timeout: float = OPEN_TIMEOUT) -> RelayedLink:
    """A link to tab ``target`` through the relay ``via`` listening at ``host:port``.

    Raises LinkClosed when the relay does not serve that tab, TimeoutError, and whatever
    :func:`swarm.links.tls.connect` raises (a relay with another key: AuthenticationError).
    """
    inner = await tls.connect(key, host, port, via)
    try:
        await inner.send(RelayOpen(target))
        reply = await asyncio.wait_for(inner.recv(), timeout)
        if not isinstance(reply, RelayOpened):
            raise ProtocolError(f"relay answered {type(reply).__name__}, not web.opened")
        if not reply.ok:
            raise LinkClosed(f"relay {via.short()} cannot reach {target.short()}: "
                             f"{reply.reason}")
    except BaseException:
        await inner.close("relay refused")
        raise
    return RelayedLink(inner, target)


async def pipe(a: PeerLink, b: PeerLink,
               on_message: Callable[[PeerLink, wire.Message], None] | None = None) -> None:
    """Forward messages both ways until either link closes, then close both."""

    async def one_way(src: PeerLink, dst: PeerLink) -> None:
        async for msg in src:
            if on_message is not None:
                on_message(src, msg)
            await dst.send(msg)

    tasks = [asyncio.ensure_future(one_way(a, b)), asyncio.ensure_future(one_way(b, a))]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if not t.cancelled() and isinstance(t.exception(), Exception) \
                    and not isinstance(t.exception(), LinkClosed):
                log.warning("relay %s <-> %s: %r", a.remote.short(), b.remote.short(),
                            t.exception())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for link in (a, b):
            if not link.closed:
                await link.close("the other side of the relay closed")
