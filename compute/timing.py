"""Measured matmul throughput: the one way this package turns time into GFLOPS."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def matmul_flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def best_seconds(fn: Callable[[], object], repeats: int, budget_s: float | None = None, *,
                 min_time_s: float = 0.0, max_repeats: int = 1000) -> float:
    """Fastest of at least ``repeats`` timed calls (after one untimed warm-up), stopping
    early once ``budget_s`` is spent, and repeating (up to ``max_repeats``) until
    ``min_time_s`` has passed. The minimum is the least noisy figure on a shared machine;
    ``min_time_s`` outlasts transient slowdowns (on llvmpipe machines, BLAS calls run up to
    20x slower for ~0.2 s after GPU work).
    """
    fn()
    best = float("inf")
    start = time.perf_counter()
    count = 0
    while True:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        count += 1
        elapsed = time.perf_counter() - start
        if budget_s is not None and elapsed > budget_s:
            break
        if count >= max(1, repeats) and (elapsed >= min_time_s or count >= max_repeats):
            break
    return best


def square_operands(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return a, b
