"""The DHT node's traffic counters (kept by the node and its protocol, read by benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    """Counters for benchmarks and status output."""

    lookups: int = 0
    """Iterative lookups run."""
    listings: int = 0
    """Topic listings run (:meth:`DHTNode.get_peers`; each is one of the lookups)."""
    lookup_rpcs: int = 0
    """Requests those lookups sent."""
    requests: int = 0
    """Request datagrams this node sent (both codecs, retries and writes included)."""
    bytes_in: int = 0
    """UDP payload bytes received on the DHT socket (control messages ride on it too)."""
    bytes_out: int = 0
    """UDP payload bytes sent on the DHT socket."""
