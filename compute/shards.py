"""Shard plans: split an (M x K) @ (K x N) product among workers by measured throughput.

``rows`` mode gives each worker a band of rows of ``a`` (it needs all of ``b``); ``tiles``
mode gives each worker one rectangle of the output, cut by recursive bisection so that
tiles stay near-square (a worker then needs only its rows of ``a`` and columns of ``b``).
Either way every output element belongs to exactly one shard, and a shard's area is
proportional to its worker's weight, up to rounding and ``min_rows``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compute.errors import InvalidInput

MODES = ("rows", "tiles")


@dataclass(frozen=True)
class Shard:
    """One piece of the output: ``c[rows[0]:rows[1], cols[0]:cols[1]]``."""

    index: int
    """Position of this shard in the plan (0-based)."""
    rows: tuple[int, int]
    """Half-open row range of the output (and of ``a``)."""
    cols: tuple[int, int]
    """Half-open column range of the output (and of ``b``)."""
    worker: int = 0
    """Index into the ``weights`` the plan was made for: who this shard was sized for."""

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]


def _check_weights(weights: Sequence[float]) -> list[float]:
    ws = [float(w) for w in weights]
    if not ws:
        raise InvalidInput("weights must name at least one worker")
    if any(not math.isfinite(w) or w < 0 for w in ws):
        raise InvalidInput(f"weights must be finite and non-negative, got {list(weights)}")
    if sum(ws) <= 0:
        raise InvalidInput("at least one weight must be positive")
    return ws


def _apportion(total: int, weights: Sequence[float], minimum: int) -> list[int]:
    """Split ``total`` units by weight (largest remainder); parts are 0 or >= ``minimum``.

    Workers whose share would fall below ``minimum`` are dropped, lightest first, and the
    rest re-split, so no part is a sliver; if even the heaviest cannot reach ``minimum``,
    it takes everything.
    """
    live = [i for i, w in enumerate(weights) if w > 0]
    while True:
        wsum = sum(weights[i] for i in live)
        exact = {i: total * weights[i] / wsum for i in live}
        parts = {i: int(math.floor(exact[i])) for i in live}
        left = total - sum(parts.values())
        for i in sorted(live, key=lambda i: (-(exact[i] - parts[i]), -weights[i], i))[:left]:
            parts[i] += 1
        small = [i for i in live if parts[i] < minimum]
        if not small or len(live) == 1:
            break
        live.remove(min(small, key=lambda i: (weights[i], -i)))
    out = [0] * len(weights)
    for i in live:
        out[i] = parts[i]
    return out


def _bisect(
    rows: tuple[int, int],
    cols: tuple[int, int],
    workers: list[int],
    weights: Sequence[float],
    min_side: int,
    out: list[tuple[tuple[int, int], tuple[int, int], int]],
) -> None:
    if len(workers) == 1:
        out.append((rows, cols, workers[0]))
        return
    # Split the workers into two groups of near-equal weight (heaviest first, greedy).
    left: list[int] = []
    right: list[int] = []
    wl = wr = 0.0
    for i in sorted(workers, key=lambda i: (-weights[i], i)):
        if wl <= wr:
            left.append(i)
            wl += weights[i]
        else:
            right.append(i)
            wr += weights[i]
    height, width = rows[1] - rows[0], cols[1] - cols[0]
    # Cut across the longer side; fall back to the other if the longer cannot be cut.
    for axis in sorted((0, 1), key=lambda ax: -(height, width)[ax]):
        length = (height, width)[axis]
        cut = _apportion(length, [wl, wr], min_side)
        if cut[0] and cut[1]:
            lo, hi = (rows, cols)[axis]
            mid = lo + cut[0]
            if axis == 0:
                _bisect((lo, mid), cols, left, weights, min_side, out)
                _bisect((mid, hi), cols, right, weights, min_side, out)
            else:
                _bisect(rows, (lo, mid), left, weights, min_side, out)
                _bisect(rows, (mid, hi), right, weights, min_side, out)
            return
    # Too small to share: the heavier group keeps the whole rectangle.
    _bisect(rows, cols, left if wl >= wr else right, weights, min_side, out)


def plan_shards(
    m: int,
    n: int,
    weights: Sequence[float],
    *,
    mode: str = "rows",
    min_rows: int = 1,
) -> list[Shard]:
    """Split an ``m x n`` output among workers weighted by ``weights`` (e.g. measured GFLOPS).

    ``min_rows`` is the smallest band (rows mode) or tile side (tiles mode) worth sending:
    workers whose share would be smaller get nothing. Zero-weight workers get nothing. An
    empty output gives an empty plan.
    """
    if not all(isinstance(x, int | np.integer) and x >= 0 for x in (m, n)):
        raise InvalidInput(f"m and n must be non-negative integers, got {m!r}, {n!r}")
    if mode not in MODES:
        raise InvalidInput(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(min_rows, int | np.integer) or min_rows < 1:
        raise InvalidInput(f"min_rows must be a positive integer, got {min_rows!r}")
    ws = _check_weights(weights)
    m, n = int(m), int(n)
    if m == 0 or n == 0:
        return []
    if mode == "rows":
        counts = _apportion(m, ws, min_rows)
        shards, start = [], 0
        for worker, count in enumerate(counts):
            if count:
                shards.append(Shard(len(shards), (start, start + count), (0, n), worker))
                start += count
        return shards
    pieces: list[tuple[tuple[int, int], tuple[int, int], int]] = []
    live = [i for i, w in enumerate(ws) if w > 0]
    _bisect((0, m), (0, n), live, ws, min_rows, pieces)
    pieces.sort(key=lambda p: (p[0], p[1]))
    return [Shard(i, r, c, w) for i, (r, c, w) in enumerate(pieces)]


def merge_shards(
    m: int, n: int, shards: Sequence[Shard], results: Sequence[np.ndarray]
) -> np.ndarray:
    """Assemble shard results into the full ``m x n`` float32 output.

    Refuses (InvalidInput) a result whose shape does not match its shard, shards outside
    the output, overlapping shards, and plans that leave any element uncovered.
    """
    if len(shards) != len(results):
        raise InvalidInput(f"{len(shards)} shards but {len(results)} results")
    covered = 0
    for s in shards:
        (r0, r1), (c0, c1) = s.rows, s.cols
        if not (0 <= r0 < r1 <= m and 0 <= c0 < c1 <= n):
            raise InvalidInput(f"shard {s.index} {s.rows}x{s.cols} lies outside {m}x{n}")
        covered += s.size
    ordered = sorted(shards, key=lambda s: (s.rows, s.cols))
    for i, s in enumerate(ordered):
        for t in ordered[i + 1 :]:
            if t.rows[0] >= s.rows[1]:
                break
            if t.cols[0] < s.cols[1] and s.cols[0] < t.cols[1]:
                raise InvalidInput(f"shards {s.index} and {t.index} overlap")
    if covered != m * n:
        raise InvalidInput(f"shards cover {covered} of {m * n} output elements")
    out = np.empty((m, n), dtype=np.float32)
    for s, res in zip(shards, results, strict=True):
        res = np.asarray(res)
        if res.shape != s.shape:
            raise InvalidInput(f"shard {s.index} result has shape {res.shape}, want {s.shape}")
        out[s.rows[0] : s.rows[1], s.cols[0] : s.cols[1]] = res
    return out
