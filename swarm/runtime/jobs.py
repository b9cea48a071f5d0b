"""Jobs built from user calls: a verified, sharded matmul and single actor-method calls.

A matmul ``a @ b`` is split into row bands of ``a`` (``compute.plan_shards``, weighted by
each worker's measured rate, a few bands per worker so idle ones can steal); ``b`` travels
once per worker by content address and stays cached there; each band's result is checked
with Freivalds (:class:`FreivaldsCache`: fresh Gaussian vectors per check, ``compute.verify``'s
rounding model) against
exactly the inputs the worker saw (after transfer-precision rounding), and merged with
``compute.merge_shards``.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

import compute
from compute.verify import ROUNDS, check_product, draw_vectors, row_norms2
from identity.keys import PeerId
from swarm import wire
from swarm.runtime.objects import ObjectId, object_id
from swarm.runtime.requester import Arg, Call
from swarm.runtime.scheduler import RateBook

SHARDS_PER_WORKER = 2
MIN_SHARD_FLOPS = 4e6
"""Smaller bands cost more in round trips than they save."""


def for_transfer(x: np.ndarray, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(what travels, what the worker computes with) for ``x`` at ``precision``."""
    sent = wire.cast_for_transfer(x, precision)
    seen = sent if precision == "f32" else wire.restore_precision(sent)
    return sent, seen


class FreivaldsCache:
    """Freivalds checks against a right operand ``b`` that many results share (a weight).

    Every check draws fresh secret Gaussian vectors (``compute.verify``: a vector kept per
    weight let a worker that passed once learn which corruption cancels and pass every later
    shard), so ``b @ R`` is recomputed each time. What is kept per weight is only public:
    ``b``'s squared row norms for the rounding model's threshold.
    """

    def __init__(self, rounds: int = ROUNDS, max_entries: int = 8) -> None:
        self.rounds = rounds
        self.max_entries = max_entries
        self._norms: dict[Hashable, np.ndarray] = {}
        self._lock = threading.Lock()

    def _b_norms2(self, key: Hashable, b: np.ndarray) -> np.ndarray:
        with self._lock:
            norms = self._norms.get(key)
        if norms is None:
            norms = row_norms2(b)
            with self._lock:
                if len(self._norms) >= self.max_entries:
                    self._norms.pop(next(iter(self._norms)))
                self._norms[key] = norms
        return norms

    def check(self, key: Hashable, a: np.ndarray, b: np.ndarray, c: object) -> bool:
        """Whether ``c`` equals ``a @ b`` within float tolerance; ``key`` names ``b``."""
        return check_product(a, b, c, draw_vectors(b.shape[1], self.rounds),
                             self._b_norms2(key, b))


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
    _out: np.ndarray | None = None
    _placed: dict[int, np.ndarray] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _merged: bool = False

    async def verify(self, i: int, outputs: list[np.ndarray]) -> bool:
        if len(outputs) != 1:
            return False
        return await asyncio.to_thread(self._verify_and_place, i, outputs[0])

    def _verify_and_place(self, i: int, c: np.ndarray) -> bool:
        """Check shard ``i`` and, if right, copy it into the output at once (in the check's
        thread, while other shards still compute), so merging is not left for the end."""
        r0, r1 = self.shards[i].rows
        if not self.verifier.check(self.b_oid, self.a[r0:r1], self.b, c):
            return False
        self._place(i, c)
        return True

    def _place(self, i: int, c: np.ndarray) -> None:
        with self._lock:
            if self._merged or i in self._placed:
                return  # the output is the caller's now, or a twin already filled the band
            if self._out is None:
                self._out = np.empty((self.a.shape[0], self.b.shape[1]), dtype=np.float32)
            (r0, r1), (c0, c1) = self.shards[i].rows, self.shards[i].cols
            self._out[r0:r1, c0:c1] = c
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
            if self._out is None:
                m, n = self.a.shape[0], self.b.shape[1]
                return compute.merge_shards(m, n, self.shards, [r[0] for r in results])
            for i, r in enumerate(results):
                if self._placed.get(i) is not r[0]:
                    (r0, r1), (c0, c1) = self.shards[i].rows, self.shards[i].cols
                    self._out[r0:r1, c0:c1] = r[0]
            return self._out


def matmul_job(a: np.ndarray, b: np.ndarray, *, workers: Sequence[PeerId], rates: RateBook,
               precision: str, backend: compute.Backend, verifier: FreivaldsCache,
               b_oid: ObjectId | None = None) -> MatmulJob:
    """Plan ``a @ b`` over ``workers`` (already validated operands)."""
    a_sent, a_seen = for_transfer(a, precision)
    if b_oid is not None and precision == "f32" and b.dtype == np.float32:
        b_sent = b_seen = b
    else:
        b_sent, b_seen = for_transfer(b, precision)
        b_oid = object_id(b_sent)
    m, k = a.shape
    n = b.shape[1]
    min_rows = max(1, math.ceil(MIN_SHARD_FLOPS / (2.0 * k * n)))
    peers = list(workers)
    if peers:
        weights = [rates.weight(p, peers) for p in peers for _ in range(SHARDS_PER_WORKER)]
    else:
        weights = [1.0]
    shards = compute.plan_shards(m, n, weights, min_rows=min_rows)
    owners = [peers[s.worker // SHARDS_PER_WORKER] for s in shards] if peers else None
    calls = []
    for s in shards:
        r0, r1 = s.rows
        calls.append(Call("matmul", "matmul",
                          (Arg(a_sent[r0:r1]), Arg(b_sent, b_oid)),
                          cost=2.0 * (r1 - r0) * k * n))
    return MatmulJob(a_seen, b_seen, shards, calls, owners, backend, b_oid, verifier)
