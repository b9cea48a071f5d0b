"""An in-memory connected pair of links, for tests and for a node talking to itself.

Frames still go through :func:`swarm.wire.encode` and the :class:`~swarm.wire.Decoder`, so
what works here works on the wire; the frame queue between the two ends is bounded, so flow
control behaves as on a real transport.
"""

from __future__ import annotations

from identity.keys import PeerId, PeerKey
from swarm import wire
from swarm.errors import LinkClosed
from swarm.links.base import FramedLink, LinkOptions, _Channel


class MemoryLink(FramedLink):
    """One end of :func:`memory_pair`."""

    kind = "memory"

    def __init__(self, local: PeerId, remote: PeerId, options: LinkOptions | None,
                 max_frames: int) -> None:
        super().__init__(local, remote, options)
        self._inbox = _Channel(max_frames)
        self._peer: MemoryLink | None = None

    async def _read_frame(self) -> bytes:
        return await self._inbox.get()

    async def _write_frames(self, frames: list[wire.Frame]) -> None:
        assert self._peer is not None
        for frame in frames:
            await self._peer._inbox.put(bytes(frame))  # a chunk joined, as a wire delivers it

    async def _close_transport(self) -> None:
        eof = LinkClosed("connection lost: the other end closed")
        self._inbox.close(eof)
        if self._peer is not None:
            self._peer._inbox.close(eof)


def memory_pair(a: PeerKey | PeerId, b: PeerKey | PeerId, options: LinkOptions | None = None,
                max_frames: int = 64) -> tuple[MemoryLink, MemoryLink]:
    """Two connected links: the first is ``a``'s end (remote ``b``), the second ``b``'s.

    Call from a running event loop; ``max_frames`` bounds the frames in flight each way.
    """
    ida = a.peer_id if isinstance(a, PeerKey) else a
    idb = b.peer_id if isinstance(b, PeerKey) else b
    left = MemoryLink(ida, idb, options, max_frames)
    right = MemoryLink(idb, ida, options, max_frames)
    left._peer, right._peer = right, left
    left._start()
    right._start()
    return left, right
