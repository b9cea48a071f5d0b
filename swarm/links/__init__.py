"""Peer links: authenticated message links between two peers.

- :class:`PeerLink` is the one interface (send/recv messages, ping, stats, close).
- :mod:`swarm.links.tls`: direct TCP + TLS 1.3 with mutual authentication bound to the peer
  keys, for peers that announce a reachable address.
- :mod:`swarm.links.webrtc`: aiortc data channels, for NATs and browsers, with SDP carried
  in signed envelopes (no signaling server). Members send them through the links they
  already hold (:class:`~swarm.links.relay.RelaySignaler`); ``DHTSignaler`` and
  ``UDPSignaler`` serve only tests and the echo peer.
- :mod:`swarm.links.relay` (signals relayed through member links),
  :mod:`swarm.links.circuit` (data relayed through a member when no direct path exists),
  :mod:`swarm.links.reach` (the `status --reach` probe), :mod:`swarm.links.ice` (STUN/TURN),
  :mod:`swarm.links.signaling` (the signed envelopes), :mod:`swarm.links.shm` (same-host
  shared memory for big arrays), :mod:`swarm.links.assembly` (outputs assembled from
  shared-memory segments).
- :func:`memory_pair`: two connected in-memory links for tests.
- :mod:`swarm.links.echo`: a stand-alone echo peer (``python -m swarm.links.echo``) for
  two-process tests and ``bench/transport.py``.

Errors (in :mod:`swarm.errors`): :class:`~swarm.errors.LinkClosed` from send/recv once a link
is closed (``.reason``, ``.error``); :class:`~swarm.errors.ProtocolError` for bad frames
(the link closes); :class:`~swarm.errors.AuthenticationError` when a peer is not who it
should be (wrong certificate key, bad or replayed signaling envelope, fingerprint mismatch).
"""

from swarm.errors import LinkClosed
from swarm.links.base import LinkOptions, LinkStats, PeerLink
from swarm.links.memory import MemoryLink, memory_pair

__all__ = ["LinkClosed", "LinkOptions", "LinkStats", "MemoryLink", "PeerLink", "memory_pair"]
