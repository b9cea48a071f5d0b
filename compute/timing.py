"""Measured matmul throughput: the one way this package turns time into GFLOPS."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def matmul_flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def best_seconds(fn: Callable[[], object], repeats: int, budget_s: float | None = None) -> float:
    """Fastest of ``repeats`` timed calls (after one untimed warm-up), stopping early once
    ``budget_s`` is spent. The minimum is the least noisy figure on a shared machine."""
    fn()
    best = float("inf")
    start = time.perf_counter()
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    return best


def square_operands(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return a, b
