"""How each member is reached from here: the probe behind ``swarm status --reach``.

Each member is tried the way a requester would dial it: TLS to an announced address
("direct"), else WebRTC signaled through the members reached directly (they relay signals
for the peers that hold links to them), reported with the ICE path it took ("webrtc
host-srflx", "webrtc relay-relay" ...), else a circuit through a member that relays data
("member relay <member>"), else "unreachable" with why. Every attempt is
bounded; every link opened here is closed before returning.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from identity.keys import PeerId, PeerKey
from swarm.links import tls
from swarm.links.base import PeerLink
from swarm.links.circuit import CircuitEndpoint
from swarm.links.relay import RELAY_ADDR, RelaySignaler

DIRECT_TIMEOUT = 3.0
WEBRTC_TIMEOUT = 10.0


async def probe(key: PeerKey, members: Sequence[tuple[PeerId, Sequence[tuple[str, int]]]],
                ice_servers: Sequence[object] = (), host: str | None = None,
                direct_timeout: float = DIRECT_TIMEOUT,
                webrtc_timeout: float = WEBRTC_TIMEOUT) -> dict[PeerId, str]:
    """``{peer: how}`` for every ``(peer, link addresses)`` in ``members``."""
    from swarm.links.webrtc import WebRTCEndpoint, selected_path

    direct: dict[PeerId, PeerLink] = {}
    why: dict[PeerId, str] = {}

    async def dial(peer: PeerId, addrs: Sequence[tuple[str, int]]) -> None:
        for h, p in addrs:
            try:
                direct[peer] = await tls.connect(key, h, p, peer, timeout=direct_timeout)
                return
            except Exception as exc:
                why[peer] = f"tls {h}:{p}: {exc or type(exc).__name__}"
        why.setdefault(peer, "no address")

    await asyncio.gather(*(dial(p, a) for p, a in members))
    result = {p: "direct" for p in direct}
    rest = [p for p, _ in members if p not in direct]
    if not rest:
        await _close(direct.values())
        return result
    signaler = RelaySignaler(key, lambda to: list(direct.values()))
    endpoint = WebRTCEndpoint(key, signaler, ice_servers=list(ice_servers),
                              host_addresses=[host] if host else None,
                              connect_timeout=webrtc_timeout)
    signaler.on_unreachable = endpoint.unreachable

    circuits = CircuitEndpoint(key, on_link=lambda link: None, accept=lambda _: False)

    async def read(link: PeerLink) -> None:
        with contextlib.suppress(ConnectionError):
            async for msg in link:
                await signaler.handle(link, msg) or await circuits.handle(link, msg)

    readers = [asyncio.ensure_future(read(link)) for link in direct.values()]

    async def rtc(peer: PeerId) -> None:
        try:
            link = await endpoint.connect(peer, RELAY_ADDR)
        except Exception as exc:
            why[peer] += f"; webrtc: {exc or type(exc).__name__}"
        else:
            result[peer] = f"webrtc {selected_path(link.pc)}"
            await link.close("probe done")
            return
        for relay in direct.values():
            try:
                link = await circuits.connect(relay, peer, timeout=webrtc_timeout)
            except Exception as exc:
                why[peer] += f"; member relay {relay.remote.short()}: {exc}"
                continue
            result[peer] = f"member relay {relay.remote.short()}"
            await link.close("probe done")
            return
        result[peer] = f"unreachable ({why[peer]})"

    try:
        await asyncio.gather(*(rtc(p) for p in rest))
    finally:
        await endpoint.close()
        await circuits.close()
        await _close(direct.values())
        for r in readers:
            r.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return result


async def _close(links) -> None:
    await asyncio.gather(*(link.close("probe done") for link in list(links)),
                         return_exceptions=True)
