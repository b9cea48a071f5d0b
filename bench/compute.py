"""compute benchmarks: tiled vs naive WGSL, numpy backend overhead, Freivalds' cost.

    python bench/compute.py [--json] [--quick]

Goals (issue 5): tiled >= 4x naive on llvmpipe; numpy backend within 10% of raw ``a @ b``;
Freivalds' check <= 3% of the product at n = 2048. Runs are interleaved (side by side) and
both the median and the best (minimum) are kept: on a shared machine every call can catch a
stall of 10-20 ms from other tenants, which swamps medians of sub-millisecond calls; the
minimum is the uncontended figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import compute  # noqa: E402
from compute.wgpu_backend import WgpuBackend  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(fns: dict, rounds: int) -> dict[str, tuple[float, float]]:
    """(median, min) seconds of each function, run in alternating order ``rounds`` times."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return {name: (statistics.median(ts), min(ts)) for name, ts in times.items()}


def kernels(sizes, repeats) -> list[dict]:
    try:
        gpu = WgpuBackend.shared()
    except compute.BackendUnavailable as exc:
        return [{"error": exc.reason}]
    rows = []
    for n in sizes:
        naive = [gpu.kernel_seconds(n, n, n, kernel="naive", repeats=1) for _ in range(repeats)]
        tiled = [gpu.kernel_seconds(n, n, n, kernel="tiled", repeats=1) for _ in range(repeats)]
        flops = 2.0 * n**3
        rows.append({"n": n, "adapter": gpu.adapter_info()["name"],
                     "naive_gflops": flops / statistics.median(naive) / 1e9,
                     "tiled_gflops": flops / statistics.median(tiled) / 1e9,
                     "speedup": statistics.median(naive) / statistics.median(tiled)})
    return rows


def numpy_overhead(sizes, rounds) -> list[dict]:
    backend = compute.get_backend("numpy")
    rows = []
    for n in sizes:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        med = interleaved({"backend": lambda a=a, b=b: backend.matmul(a, b),
                           "raw": lambda a=a, b=b: a @ b}, rounds)
        rows.append({"n": n, "backend_ms": med["backend"][0] * 1e3,
                     "raw_ms": med["raw"][0] * 1e3,
                     "ratio_median": med["backend"][0] / med["raw"][0],
                     "ratio_best": med["backend"][1] / med["raw"][1]})
    return rows


def freivalds_cost(sizes, rounds) -> list[dict]:
    rows = []
    for n in sizes:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = a @ b
        bad = c.copy()
        bad[n // 3, n // 2] += 1.0 + abs(float(c[n // 3, n // 2]))
        med = interleaved({"matmul": lambda a=a, b=b: a @ b,
                           "verify": lambda a=a, b=b, c=c: compute.verify_matmul(a, b, c),
                           "verify1": lambda a=a, b=b, c=c: compute.verify_matmul(a, b, c, 1)},
                          rounds)
        rows.append({"n": n, "matmul_ms": med["matmul"][0] * 1e3,
                     "verify_ms": med["verify"][0] * 1e3,
                     "cost_pct_median": 100 * med["verify"][0] / med["matmul"][0],
                     "cost_pct_best": 100 * med["verify"][1] / med["matmul"][1],
                     "cost_pct_best_1_round": 100 * med["verify1"][1] / med["matmul"][1],
                     "accepts_correct": compute.verify_matmul(a, b, c),
                     "rejects_one_wrong": not compute.verify_matmul(a, b, bad)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    args = parser.parse_args(argv)
    quick = args.quick
    result = {
        "kernels": kernels((128, 256) if quick else (256, 512, 1024), 1 if quick else 3),
        "numpy_overhead": numpy_overhead((256, 512) if quick else (256, 512, 1024, 2048),
                                         5 if quick else 15),
        "freivalds": freivalds_cost((256, 512) if quick else (1024, 2048, 4096),
                                    3 if quick else 9),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("Tiled vs naive WGSL kernel, same adapter, device time (median)")
    print(f"{'n':>6} {'naive GFLOPS':>13} {'tiled GFLOPS':>13} {'tiled/naive':>12}  adapter")
    for r in result["kernels"]:
        if "error" in r:
            print(f"  wgpu unavailable: {r['error']}")
            continue
        print(f"{r['n']:>6} {r['naive_gflops']:>13.2f} {r['tiled_gflops']:>13.2f} "
              f"{r['speedup']:>11.1f}x  {r['adapter']}")
    print("\nnumpy backend vs raw a @ b (f32, median of interleaved runs)")
    print(f"{'n':>6} {'backend ms':>11} {'raw ms':>9} {'ratio(median)':>14} {'ratio(best)':>12}")
    for r in result["numpy_overhead"]:
        print(f"{r['n']:>6} {r['backend_ms']:>11.3f} {r['raw_ms']:>9.3f} "
              f"{r['ratio_median']:>14.3f} {r['ratio_best']:>12.3f}")
    print("\nFreivalds' check (2 rounds) vs the numpy product it verifies (median)")
    print(f"{'n':>6} {'matmul ms':>10} {'verify ms':>10} {'cost%(median)':>14} "
          f"{'cost%(best)':>12} {'1 round(best)':>14}  accepts  rejects-1-wrong")
    for r in result["freivalds"]:
        print(f"{r['n']:>6} {r['matmul_ms']:>10.2f} {r['verify_ms']:>10.3f} "
              f"{r['cost_pct_median']:>14.2f} {r['cost_pct_best']:>12.2f} "
              f"{r['cost_pct_best_1_round']:>14.2f}  "
              f"{str(r['accepts_correct']):>7}  {r['rejects_one_wrong']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
