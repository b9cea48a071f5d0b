"""Content-addressed object store with a memory cap, LRU eviction and locality tracking.

Every peer keeps one: a requester holds what it ``put`` and the results it received; a
worker holds inputs it was sent (weights stay put, so the next task that needs them costs
no transfer). The requester's store also tracks *where* each object lives
(:meth:`ObjectStore.holders`), which the scheduler uses to prefer peers that already hold a
task's large inputs and which keeps a cached input from being sent to a peer twice. That
record is bounded (:data:`MAX_TRACKED` objects, least recently used forgotten first): every
one-off matmul operand gets an id, and a long-lived requester must not keep one entry per
job forever (the soak's requester grew ~0.7 KB per job). Forgetting is always safe: the
worst case is sending an object again, which a worker that may have evicted it needs anyway.

An object id is the BLAKE3 of ``dtype|shape|bytes``: equal arrays share one id on every
peer, and a peer can check that what it received matches the id it was promised.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import blake3
import numpy as np

ID_LEN = 32
MAX_TRACKED = 4096
"""Objects whose holders a store remembers (~0.4 KB each with a few holders)."""


@dataclass(frozen=True, slots=True)
class ObjectId:
    """A content address: BLAKE3 of an array's dtype, shape and C-order bytes."""

    raw: bytes
    """The 32 digest bytes."""

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes) or len(self.raw) != ID_LEN:
            raise ValueError(f"an ObjectId is exactly {ID_LEN} bytes")

    def __repr__(self) -> str:
        return f"ObjectId({self.raw[:6].hex()})"

    def hex(self) -> str:
        return self.raw.hex()


def object_id(array: np.ndarray, *, parallel: bool = False) -> ObjectId:
    """The content address of ``array`` (copies only when it is not C-contiguous).

    BLAKE3, not SHA-256: every input a worker receives and every output it returns is
    hashed for its signed receipt, on the path of each result; SHA-256 (1.0-1.2 GB/s here)
    cost a worker ~0.1 s of a 0.85 s n=4096 band, BLAKE3 runs at ~3.6 GB/s on one core.
    ``parallel`` hashes on every core (BLAKE3's tree): a requester hashing a fresh ``b``
    before a job holds up every worker (64 MiB: 15.3 ms on one core, 8.3 ms on two).
    Browser tabs compute the same (``swarm/web/static/blake3.js``)."""
    arr = np.ascontiguousarray(array)
    threads = blake3.blake3.AUTO if parallel and arr.nbytes >= 1 << 20 else 1
    h = blake3.blake3(f"{arr.dtype.str}|{','.join(map(str, arr.shape))}|".encode(),
                      max_threads=threads)
    h.update(memoryview(arr).cast("B") if arr.size else b"")
    return ObjectId(h.digest())


class ObjectStore:
    """Arrays by content address, within ``capacity`` bytes, least recently used evicted first.

    Pinned objects (those a caller still holds a ref to, or an in-flight task needs) are never
    evicted; a store that cannot fit an object even after evicting everything unpinned keeps
    it anyway and reports ``over_capacity`` so that a node can refuse further puts instead of
    silently dropping data it promised to keep.
    """

    def __init__(self, capacity: int, max_tracked: int = MAX_TRACKED) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be a positive number of bytes")
        if max_tracked <= 0:
            raise ValueError("max_tracked must be a positive number of objects")
        self.capacity = capacity
        self.max_tracked = max_tracked
        self._objects: OrderedDict[ObjectId, np.ndarray] = OrderedDict()
        self._pins: dict[ObjectId, int] = {}
        self._holders: OrderedDict[ObjectId, set[bytes]] = OrderedDict()
        self.used = 0
        self.reserved = 0
        """Bytes held outside the store for others (queued and held calls' inline arrays)."""
        self.evictions = 0

    def __contains__(self, oid: object) -> bool:
        return oid in self._objects

    def __len__(self) -> int:
        return len(self._objects)

    @property
    def over_capacity(self) -> bool:
        return self.used + self.reserved > self.capacity

    def reserve(self, nbytes: int) -> bool:
        """Count ``nbytes`` held elsewhere against the capacity, evicting unpinned objects to
        make room; False (nothing reserved) when even that cannot fit them."""
        pinned = sum(self._objects[o].nbytes for o in self._pins if o in self._objects)
        if pinned + self.reserved + nbytes > self.capacity:
            return False
        self.reserved += nbytes
        self._evict()
        return True

    def release(self, nbytes: int) -> None:
        """Bytes reserved with :meth:`reserve` are no longer held."""
        self.reserved = max(0, self.reserved - nbytes)

    def put(self, array: np.ndarray, oid: ObjectId | None = None) -> ObjectId:
        """Store ``array`` (read-only view) and return its id; an existing copy is refreshed."""
        oid = oid or object_id(array)
        if oid in self._objects:
            self._objects.move_to_end(oid)
            return oid
        arr = np.ascontiguousarray(array)
        if arr is array and arr.flags.writeable:
            arr = arr.view()
        arr.flags.writeable = False
        self._objects[oid] = arr
        self.used += arr.nbytes
        self._evict()
        return oid

    def get(self, oid: ObjectId) -> np.ndarray | None:
        """The array, marked recently used; None when absent (never held or evicted)."""
        arr = self._objects.get(oid)
        if arr is not None:
            self._objects.move_to_end(oid)
        return arr

    def arrays(self) -> list[np.ndarray]:
        """Every array held (read-only), least recently used first."""
        return list(self._objects.values())

    def pin(self, oid: ObjectId) -> None:
        """Keep ``oid`` from eviction until a matching :meth:`unpin`."""
        self._pins[oid] = self._pins.get(oid, 0) + 1

    def unpin(self, oid: ObjectId) -> None:
        n = self._pins.get(oid, 0) - 1
        if n > 0:
            self._pins[oid] = n
        else:
            self._pins.pop(oid, None)
            self._evict()

    def discard(self, oid: ObjectId) -> None:
        """Drop ``oid`` now (pinned or not) and forget where it lives."""
        arr = self._objects.pop(oid, None)
        if arr is not None:
            self.used -= arr.nbytes
        self._pins.pop(oid, None)
        self._holders.pop(oid, None)

    def _evict(self) -> None:
        room = self.capacity - self.reserved
        if self.used <= room:
            return
        for oid in list(self._objects):
            if self.used <= room:
                break
            if oid in self._pins:
                continue
            self.used -= self._objects.pop(oid).nbytes
            self.evictions += 1

    # -- locality: which peers hold which object ------------------------------------------

    @property
    def tracked(self) -> int:
        """Objects with at least one known holder (at most ``max_tracked``)."""
        return len(self._holders)

    def holders(self, oid: ObjectId) -> frozenset[bytes]:
        """Raw PeerIds known to hold ``oid`` (because we sent it, or they told us)."""
        peers = self._holders.get(oid)
        if peers is None:
            return frozenset()
        self._holders.move_to_end(oid)
        return frozenset(peers)

    def add_holder(self, oid: ObjectId, peer: bytes) -> None:
        """``peer`` holds ``oid`` now; the least recently used record goes past the bound."""
        peers = self._holders.get(oid)
        if peers is None:
            peers = self._holders[oid] = set()
            while len(self._holders) > self.max_tracked:
                self._holders.popitem(last=False)
        else:
            self._holders.move_to_end(oid)
        peers.add(peer)

    def remove_holder(self, oid: ObjectId, peer: bytes) -> None:
        """``peer`` no longer holds ``oid`` (it evicted it, or it left)."""
        peers = self._holders.get(oid)
        if peers is not None:
            peers.discard(peer)
            if not peers:
                del self._holders[oid]

    def forget_peer(self, peer: bytes) -> None:
        """``peer`` left: it holds nothing we can count on any more."""
        for oid in [o for o, peers in self._holders.items() if peer in peers]:
            self.remove_holder(oid, peer)
