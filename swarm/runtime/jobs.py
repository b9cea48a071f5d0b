"""Jobs built from user calls: a verified, sharded matmul and single actor-method calls.

A matmul ``a @ b`` is split into row bands of ``a`` (``compute.plan_shards``, weighted by
each worker's measured rate, a few bands per worker so idle ones can steal); ``b`` travels
once per worker by content address and stays cached there; each band's result is checked
with Freivalds (:class:`FreivaldsCache`: fresh secret vectors per check, drawn in batches
per weight, ``compute.verify``'s rounding model) against
exactly the inputs the worker saw (after transfer-precision rounding), and merged with
``compute.merge_shards``.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

import compute
from compute.verify import ROUNDS, check_product, draw_vectors, products, project, warm_up
from identity.keys import PeerId
from swarm import wire
from swarm.links import shm
from swarm.links.assembly import Assembly
from swarm.runtime.objects import ObjectId, object_id
from swarm.runtime.requester import Arg, Call
from swarm.runtime.scheduler import RateBook

SHARDS_PER_WORKER = 2
"""Bands per worker reached over the network: its second band's operands travel while the
first computes, and the first's result travels while the second does. A worker linked by
shared memory gets one band: nothing travels, and every extra band costs a BLAS packing
pass over all of ``b`` and a gap between the bands (measured at n=4096 on 2 cores: two
1024-row bands took 0.39 s each plus a 25 ms gap, one 2048-row band 0.69 s; jobs 0.95 s
against 0.82-0.93 s)."""
MIN_SHARD_FLOPS = 4e6
"""Smaller bands cost more in round trips than they save."""
MIN_BAND_ROWS = 256
"""Rows of the smallest band against a large ``b`` (see :data:`LARGE_B_BYTES`), checked or
not. Every band costs a pass over all of ``b`` twice over: BLAS packs it for each call
(~25 ms at n=4096 on one core: a 64-row band ran at 45 GFLOPS, 256 rows at 72, 512 at
102), and a Freivalds check reads it (``b @ R``, memory-bound; for 64-row bands checks
were 39% of the band's work, 256: 12%, 1024: 4%). Unchecked 256-row calls had been cut
into 64-row bands: 64 in flight took 7.5 s against 4.3 s checked. A smaller ``b`` keeps
the flops floor."""
INLINE_CHECK_ELEMENTS = 1 << 14
"""Bands whose check touches at most about this many elements are checked on the loop (the
1x1 round trip: a thread hop cost more than the check)."""
LARGE_B_BYTES = 4 << 20
"""Below this ``b`` costs a band well under a millisecond to pack or check: round trips
dominate instead."""


def for_transfer(x: np.ndarray, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(what travels, what the worker computes with) for ``x`` at ``precision``."""
    sent = wire.cast_for_transfer(x, precision)
    seen = sent if precision == "f32" else wire.restore_precision(sent)
    return sent, seen


class FreivaldsCache:
    """Freivalds checks against a right operand ``b`` that many results share (a weight).

    Every check spends its own fresh secret Gaussian vectors (``compute.verify``: a vector
    kept per weight let a worker that passed once learn which corruption cancels and pass
    every later shard). ``b @ R`` is the check's largest cost (it reads all of ``b``) and is
    memory-bound, so vectors are drawn in batches per weight: one pass over ``b`` computes
    ``b @ R`` for several checks, and each check takes one batch member and never gives it
    back. Members are independent and secret, so spending one reveals nothing of the next.
    The first batch of a weight covers the bands of the job that brought it (plus its row
    norms, in the same pass); a weight that runs out is in use again, so each later batch
    doubles, up to :data:`STOCK`.
    """

    STOCK = 32
    """Most checks per batch (inference: many calls, one ``W``). Measured at n=4096: one
    check's pass over ``b`` 7-9 ms; a batch of 32 on one BLAS thread 44 ms (1.4 ms each)."""
    STOCK_BYTES = 8 << 20
    """Most bytes of later batches per weight (``r`` and ``b @ r`` take ``4 * rounds *
    (k + n)`` bytes per check: 128 KiB at n=4096, 2 MiB at 65536), so that a requester with
    several large weights in use keeps tens of MiB of vectors, not gigabytes."""

    def __init__(self, rounds: int = ROUNDS, max_entries: int = 8) -> None:
        self.rounds = rounds
        self.max_entries = max_entries
        self._weights: dict[Hashable, _Weight] = {}
        self._lock = threading.Lock()
        warm_up()  # the check's compiled pass loads while the job is sent out

    def _weight(self, key: Hashable) -> _Weight:
        with self._lock:
            w = self._weights.pop(key, None) or _Weight()
            self._weights[key] = w  # most recently used last
            if len(self._weights) > self.max_entries:
                self._weights.pop(next(iter(self._weights)))
            return w

    def _vectors(self, key: Hashable, b: np.ndarray, batch: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(r, b @ r, b's squared row norms) for one check; ``r`` is never handed out again."""
        w = self._weight(key)
        with w.lock:  # checks of one fresh weight wait for one pass, not one pass each
            if not w.stock:
                per_check = 4 * self.rounds * (b.shape[0] + b.shape[1])
                count = max(batch, min(2 * w.last, self.STOCK,
                                       max(1, self.STOCK_BYTES // per_check)))
                r = draw_vectors(b.shape[1], self.rounds * count)
                if w.norms2 is None:
                    br, w.norms2 = project(b, r)
                else:
                    br = products(b, r)
                w.last = count
                w.stock = [(r[:, i * self.rounds:(i + 1) * self.rounds],
                            br[:, i * self.rounds:(i + 1) * self.rounds]) for i in range(count)]
            r, br = w.stock.pop()
            return r, br, w.norms2

    def check(self, key: Hashable, a: np.ndarray, b: np.ndarray, c: object,
              batch: int = 1) -> bool:
        """Whether ``c`` equals ``a @ b`` within float tolerance; ``key`` names ``b``;
        ``batch``: how many checks against ``b`` the caller's job brings."""
        r, br, norms2 = self._vectors(key, b, batch)
        return check_product(a, b, c, r, norms2, br=br)


@dataclass
class _Weight:
    """What a :class:`FreivaldsCache` keeps per weight: public row norms, secret vectors."""

    norms2: np.ndarray | None = None
    last: int = 0
    """Size of the last batch drawn."""
    stock: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class MatmulJob:
    """The calls of one sharded matmul, and how to check, redo and merge them."""

    a: np.ndarray
    """Left operand as the workers see it (float32)."""
    b: np.ndarray
    """Right operand as the workers see it (float32)."""
    shards: list[compute.Shard]
    """Row bands of the output."""
    calls: list[Call]
    """One call per band."""
    owners: list[PeerId] | None
    """First worker of each band (from the rate-weighted plan)."""
    backend: compute.Backend
    """The requester's own backend (solo mode, tiebreaks)."""
    b_oid: ObjectId
    """Content address of ``b`` as it travels (the verifier's batching key)."""
    verifier: FreivaldsCache
    """Freivalds checks with ``b @ R`` kept per weight."""
    _out: Assembly | None = None
    _placed: dict[int, np.ndarray] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _merged: bool = False

    async def verify(self, i: int, outputs: list[np.ndarray]) -> bool:
        if len(outputs) != 1:
            return False
        if self.shards[i].size * self.a.shape[1] <= INLINE_CHECK_ELEMENTS:
            return self._verify_and_place(i, outputs[0])  # microseconds: no thread hop
        return await asyncio.to_thread(self._verify_and_place, i, outputs[0])

    def _verify_and_place(self, i: int, c: np.ndarray) -> bool:
        """Check shard ``i`` and, if right, place it in the output at once (in the check's
        thread, while other shards still compute), so merging is not left for the end; a band
        received in shared memory is mapped there, not copied (:class:`Assembly`)."""
        r0, r1 = self.shards[i].rows
        if not self.verifier.check(self.b_oid, self.a[r0:r1], self.b, c, len(self.shards)):
            return False
        self._place(i, c)
        return True

    def _place(self, i: int, c: np.ndarray) -> None:
        if len(self.shards) == 1:
            return  # the band is the output: merge hands it over, no copy
        with self._lock:
            if self._merged or i in self._placed:
                return  # the output is the caller's now, or a twin already filled the band
            if self._out is None:
                self._out = Assembly(self.a.shape[0], self.b.shape[1])
            self._out.place(self.shards[i].rows[0], c)  # bands are whole rows
            self._placed[i] = c

    async def check_shape(self, i: int, outputs: list[np.ndarray]) -> bool:
        """The least check (``verify="none"``): one float result of the band's shape."""
        return (len(outputs) == 1 and outputs[0].shape == self.shards[i].shape
                and outputs[0].dtype.kind == "f")

    def local(self, i: int) -> list[np.ndarray]:
        r0, r1 = self.shards[i].rows
        return [self.backend.matmul(self.a[r0:r1], self.b)]

    def merge(self, results: Sequence[list[np.ndarray]]) -> np.ndarray:
        """The output: bands placed as they were verified, the rest (local, unverified
        or replicated results) copied now; no band is written after this returns."""
        with self._lock:
            self._merged = True
            m, n = self.a.shape[0], self.b.shape[1]
            for r in results:
                shm.settle(r[0])  # placed or kept where it is: no descriptor is needed now
            if len(results) == 1 and _whole(results[0][0], m, n):
                return results[0][0]  # one band: it is the output (received zero-copy)
            if self._out is None:
                return compute.merge_shards(m, n, self.shards, [r[0] for r in results])
            for i, r in enumerate(results):
                if self._placed.get(i) is not r[0]:
                    self._out.place(self.shards[i].rows[0], r[0])  # settled: copied
            return self._out.array


def _whole(c: np.ndarray, m: int, n: int) -> bool:
    """Whether ``c`` can be handed over as an ``m x n`` float32 output as it is."""
    return (isinstance(c, np.ndarray) and c.shape == (m, n) and c.dtype == np.float32
            and c.flags.c_contiguous and c.flags.writeable)


@dataclass(frozen=True)
class Bands:
    """Row bands of one matmul's output and the worker each was sized for."""

    shards: list[compute.Shard]
    """The bands, in row order."""
    owners: list[PeerId] | None
    """First worker of each band; None without workers (the requester computes)."""


def plan_bands(m: int, k: int, n: int, *, workers: Sequence[PeerId], rates: RateBook,
               busy: Mapping[PeerId, int] | None = None,
               nearby: Collection[PeerId] = ()) -> Bands:
    """Split the ``m`` output rows among ``workers``: shares by measured rate, each share cut
    into up to :data:`SHARDS_PER_WORKER` bands (so a result travels while the next band
    computes; one band for the ``nearby`` workers, linked by shared memory), no band under
    the floor (round trips; packing and checking a large ``b``).

    ``busy`` counts bands this requester already gave each worker and that are not done
    (other jobs): a worker's weight is divided by ``1 + busy``. A job too small to reach
    every worker then goes to the least loaded (many small calls in flight spread out
    instead of piling on the fastest peer)."""
    min_rows = max(1, math.ceil(MIN_SHARD_FLOPS / (2.0 * k * n)))
    if 4 * k * n >= LARGE_B_BYTES:
        min_rows = max(min_rows, MIN_BAND_ROWS)
    peers = list(workers)
    if not peers:
        return Bands(compute.plan_shards(m, n, [1.0], min_rows=min_rows), None)
    busy = busy or {}
    weights = [rates.weight(p, peers) / (1 + busy.get(p, 0)) for p in peers]
    shares = compute.plan_shards(m, n, weights, min_rows=min_rows)
    shards: list[compute.Shard] = []
    owners: list[PeerId] = []
    for share in shares:
        r0, r1 = share.rows
        most = 1 if peers[share.worker] in nearby else SHARDS_PER_WORKER
        pieces = max(1, min(most, (r1 - r0) // min_rows))
        for band in compute.plan_shards(r1 - r0, n, [1.0] * pieces, min_rows=1):
            shards.append(compute.Shard(len(shards), (r0 + band.rows[0], r0 + band.rows[1]),
                                        (0, n), share.worker))
            owners.append(peers[share.worker])
    return Bands(shards, owners)


def matmul_job(a: np.ndarray, b: np.ndarray, *, workers: Sequence[PeerId], rates: RateBook,
               precision: str, backend: compute.Backend, verifier: FreivaldsCache,
               b_oid: ObjectId | None = None, bands: Bands | None = None) -> MatmulJob:
    """Plan ``a @ b`` over ``workers`` (already validated operands); ``bands`` when already
    planned (:func:`plan_bands`)."""
    a_sent, a_seen = for_transfer(a, precision)
    if b_oid is not None and precision == "f32" and b.dtype == np.float32:
        b_sent = b_seen = b
    else:
        b_sent, b_seen = for_transfer(b, precision)
        b_oid = object_id(b_sent, parallel=True)  # the workers wait for it
    m, k = a.shape
    n = b.shape[1]
    if bands is None:
        bands = plan_bands(m, k, n, workers=workers, rates=rates)
    shards, owners = bands.shards, bands.owners
    calls = []
    for s in shards:
        r0, r1 = s.rows
        calls.append(Call("matmul", "matmul",
                          (Arg(a_sent[r0:r1]), Arg(b_sent, b_oid)),
                          cost=2.0 * (r1 - r0) * k * n))
    return MatmulJob(a_seen, b_seen, shards, calls, owners, backend, b_oid, verifier)
