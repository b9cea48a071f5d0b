"""Jobs built from user calls: a verified, sharded matmul and single actor-method calls.

A matmul ``a @ b`` is split into row bands of ``a`` (``compute.plan_shards``, weighted by
each worker's measured rate, a few bands per worker so idle ones can steal); ``b`` travels
once per worker by content address and stays cached there; each band's result is checked
with Freivalds (``compute.verify_matmul``) against exactly the inputs the worker saw (after
transfer-precision rounding), and merged with ``compute.merge_shards``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

import compute
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


class BatchVerifier:
    """Freivalds checks of results that share a right operand, done together.

    A check reads all of ``b`` (``b @ r``): for many small shards against one big weight that
    read, not the shards, dominates. Results waiting while a check runs are stacked into the
    next one (``verify_matmul`` checks row by row, so a stack passes only if every row does);
    a failing stack is re-checked shard by shard to find the wrong one.
    """

    def __init__(self) -> None:
        self._queues: dict[Hashable, list[tuple[np.ndarray, np.ndarray, asyncio.Future]]] = {}
        self._running: set[Hashable] = set()

    async def check(self, key: Hashable, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> bool:
        """Whether ``c == a @ b``; ``key`` names ``b`` (its content address)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queues.setdefault(key, []).append((a, c, fut))
        if key not in self._running:
            self._running.add(key)
            loop.create_task(self._drain(key, b))
        return await fut

    async def _drain(self, key: Hashable, b: np.ndarray) -> None:
        try:
            while self._queues.get(key):
                batch = self._queues.pop(key)
                try:
                    verdicts = await asyncio.to_thread(self._verify, b, batch)
                except Exception as exc:  # bad inputs (not finite): every waiter learns why
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, _, fut), ok in zip(batch, verdicts, strict=True):
                    if not fut.done():
                        fut.set_result(ok)
        finally:
            self._running.discard(key)

    @staticmethod
    def _verify(b: np.ndarray, batch: list) -> list[bool]:
        if len(batch) > 1 and all(c.shape == (a.shape[0], b.shape[1]) for a, c, _ in batch):
            a_all = np.concatenate([a for a, _, _ in batch])
            c_all = np.concatenate([c for _, c, _ in batch])
            if compute.verify_matmul(a_all, b, c_all):
                return [True] * len(batch)
        return [compute.verify_matmul(a, b, c) for a, c, _ in batch]


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
    verifier: BatchVerifier
    """Shared Freivalds batcher."""

    async def verify(self, i: int, outputs: list[np.ndarray]) -> bool:
        if len(outputs) != 1 or not isinstance(outputs[0], np.ndarray):
            return False
        r0, r1 = self.shards[i].rows
        return await self.verifier.check(self.b_oid, self.a[r0:r1], self.b, outputs[0])

    def local(self, i: int) -> list[np.ndarray]:
        r0, r1 = self.shards[i].rows
        return [self.backend.matmul(self.a[r0:r1], self.b)]

    def merge(self, results: Sequence[list[np.ndarray]]) -> np.ndarray:
        m, n = self.a.shape[0], self.b.shape[1]
        return compute.merge_shards(m, n, self.shards, [r[0] for r in results])


def matmul_job(a: np.ndarray, b: np.ndarray, *, workers: Sequence[PeerId], rates: RateBook,
               precision: str, backend: compute.Backend, verifier: BatchVerifier,
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
