"""Benchmark: measured GFLOPS per backend and size, and the naive vs tiled WGSL kernel.

The figure a peer announces to the swarm (:func:`measured_tflops`) comes from here: it is
measured on this machine at start-up, never configured.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from compute.backend import Backend
from compute.errors import BackendUnavailable, InvalidInput
from compute.probe import probe
from compute.registry import available_backends, get_backend
from compute.timing import best_seconds, matmul_flops, square_operands

SIZES = (256, 512, 1024, 2048, 4096)
QUICK_SIZES = (256, 512)
QUICK_BUDGET_S = 3.0
KERNEL_N = 512
QUICK_KERNEL_N = 256


def _backend_gflops(backend: Backend, sizes: Sequence[int], budget_s: float) -> dict[str, float]:
    """GFLOPS at each size, smallest first, skipping sizes the budget cannot cover (each
    size is predicted at 8x the previous one's time)."""
    out: dict[str, float] = {}
    deadline = time.perf_counter() + budget_s
    last_n = last_s = None
    for n in sorted(sizes):
        left = deadline - time.perf_counter()
        if last_s is not None and last_s * (n / last_n) ** 3 * 3 > left:
            break
        a, b = square_operands(n)
        seconds = best_seconds(lambda a=a, b=b: backend.matmul(a, b), repeats=3,
                               budget_s=max(left / 4, 0.0), min_time_s=0.25, max_repeats=50)
        out[str(n)] = matmul_flops(n, n, n) / seconds / 1e9
        last_n, last_s = n, seconds
    return out


def benchmark(
    sizes: Sequence[int] | None = None,
    time_budget_s: float = 30.0,
    *,
    quick: bool = False,
    backends: Sequence[str] | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Measure every validated backend over ``sizes`` within ``time_budget_s`` seconds.

    ``sizes`` defaults to SIZES, or QUICK_SIZES with ``quick`` (what ``swarm join`` runs at
    start-up), which also caps the budget at ~3 s.
    Returns ``{"backends": [{"name", "validated", "reason", "adapter", "gflops": {"<n>":
    float}}], "kernel": {"n", "naive_gflops", "tiled_gflops", "speedup", "adapter"} | None,
    "best": {"backend", "gflops", "n"} | None, "tflops": float, "probe": {...},
    "elapsed_s": float}``.
    """
    if sizes is None:
        sizes = QUICK_SIZES if quick else SIZES
    if quick:
        time_budget_s = min(time_budget_s, QUICK_BUDGET_S)
    if not sizes or any(not isinstance(n, int) or not 1 <= n <= 16384 for n in sizes):
        raise InvalidInput(f"sizes must be integers in 1..16384, got {list(sizes)!r}")
    if time_budget_s <= 0:
        raise InvalidInput(f"time_budget_s must be positive, got {time_budget_s!r}")
    started = time.perf_counter()
    statuses = available_backends(backends, threads=threads)
    usable = [s for s in statuses if s.validated]
    # The kernel comparison gets a share of the budget when wgpu is there; backends split
    # the rest.
    kernel_share = 0.25 if any(s.name == "wgpu" for s in usable) else 0.0
    per_backend = time_budget_s * (1 - kernel_share) / max(1, len(usable))
    rows = []
    for status in statuses:
        row = {"name": status.name, "validated": status.validated, "reason": status.reason,
               "adapter": status.adapter, "gflops": {}}
        if status.validated:
            row["gflops"] = _backend_gflops(get_backend(status.name, threads=threads), sizes,
                                            per_backend)
        rows.append(row)
    kernel = None
    if any(s.name == "wgpu" for s in usable):
        kernel = kernel_comparison(QUICK_KERNEL_N if quick else KERNEL_N)
    result: dict[str, Any] = {"backends": rows, "kernel": kernel,
                              "probe": probe(gpu=backends is None or "wgpu" in backends)}
    best = None
    for row in rows:
        for n, g in row["gflops"].items():
            if best is None or g > best["gflops"]:
                best = {"backend": row["name"], "gflops": g, "n": int(n)}
    result["best"] = best
    result["tflops"] = measured_tflops(result)
    result["elapsed_s"] = time.perf_counter() - started
    return result


def kernel_comparison(n: int = KERNEL_N, repeats: int = 3) -> dict[str, Any]:
    """Naive vs tiled WGSL on the same adapter at ``n``: device time, no transfers."""
    backend = get_backend("wgpu")
    naive = backend.kernel_seconds(n, n, n, kernel="naive", repeats=repeats)
    tiled = backend.kernel_seconds(n, n, n, kernel="tiled", repeats=repeats)
    flops = matmul_flops(n, n, n)
    return {
        "n": n,
        "naive_gflops": flops / naive / 1e9,
        "tiled_gflops": flops / tiled / 1e9,
        "speedup": naive / tiled,
        "adapter": backend.adapter_info().get("name", ""),
        "tiles": backend.adapter_info().get("tiles", ""),
    }


def measured_tflops(result: dict[str, Any]) -> float:
    """The throughput a peer announces: the best GFLOPS any validated backend reached in
    ``result`` (from :func:`benchmark`), in TFLOPS. Zero when nothing was measured."""
    best = 0.0
    for row in result.get("backends", []):
        if row.get("validated"):
            best = max([best, *(float(g) for g in row.get("gflops", {}).values())])
    return best / 1000.0


def require_backend(result: dict[str, Any]) -> None:
    """Raise BackendUnavailable (with every reason) when ``result`` measured nothing."""
    if measured_tflops(result) <= 0:
        reasons = "; ".join(f"{r['name']}: {r['reason']}" for r in result["backends"])
        raise BackendUnavailable(f"no usable compute backend: {reasons or 'none known'}")
