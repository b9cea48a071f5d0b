"""Runtime benchmark: swarm.local(workers=2) over TLS against numpy (and Ray, if installed).

    python bench/runtime.py            # table
    python bench/runtime.py --json     # machine-readable
    python bench/runtime.py --quick    # smaller sizes, for a smoke run

Rows (same matrices side by side in one run; medians of --repeats):

- ``matmul n=4096 cold``: a fresh A and B each repeat, so B travels to both workers, every
  shard is verified with Freivalds and merged: the whole cost of one job.
- ``matmul n=4096 warm``: the same B again (already cached on the workers by content
  address), a fresh A: only activations travel.
- ``64 x (256x4096) @ cached W``: inference-style, W put once, 64 remote calls in flight.
- ``1x1 round trip``: the small-task overhead (median of many synchronous calls).
- ``ray ...``: the same sharded matmul on a local Ray (``ray.put`` the weight, one task per
  shard), only when ``import ray`` works here or ``--ray-python`` names an interpreter that
  has it (an optional extra, never a test dependency). Ray moves arrays through shared
  memory on one machine and verifies nothing; swarm moves them over TLS and checks every
  shard, so this row shows the price of that.

On a shared 2-core machine every figure is noisy: compare the ratios in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import swarm  # noqa: E402


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def interleaved(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Time each fn once per round, rounds in a row, so load drift hits all of them alike."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            out[name] += timed(fn, 1)
    return out


def rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def bench_swarm(n: int, batch: int, rows: int, repeats: int, small_calls: int,
                workers: int) -> list[dict]:
    rng = np.random.default_rng(0)
    results = []
    with swarm.local(workers=workers) as client:
        # -- one big matmul, cold (fresh B) and warm (B cached) ------------------------------
        pairs = iter([(rand(rng, n, n), rand(rng, n, n)) for _ in range(repeats)])
        fixed_a, b_warm = rand(rng, n, n), rand(rng, n, n)
        client.matmul(rand(rng, 64, n), b_warm)  # links warm, rates measured, B cached

        def cold():
            a, b = next(pairs)
            assert client.matmul(a, b).shape == (n, n)

        times = interleaved({"numpy a@b": lambda: fixed_a @ b_warm,
                             "swarm cold (B sent)": cold,
                             "swarm warm (B cached)": lambda: client.matmul(fixed_a, b_warm)},
                            repeats)
        flops = 2.0 * n ** 3
        base = statistics.median(times["numpy a@b"])
        for name, secs in times.items():
            med = statistics.median(secs)
            results.append({"case": f"matmul n={n} f32", "runner": name, "median_s": med,
                            "gflops": flops / med / 1e9, "vs_numpy": base / med})
        # -- inference: batch activations x one cached weight ---------------------------------
        w = rand(rng, n, n)
        xs = [rand(rng, rows, n) for _ in range(batch)]
        wref = client.put(w)
        swarm.get(client.matmul.remote(xs[0], wref))  # W now cached on the workers

        def inference():
            outs = swarm.get([client.matmul.remote(x, wref) for x in xs])
            assert len(outs) == batch

        times = interleaved({"numpy loop": lambda: [x @ w for x in xs],
                             "swarm refs": inference}, max(2, repeats // 2 + 1))
        flops = 2.0 * batch * rows * n * n
        base = statistics.median(times["numpy loop"])
        for name, secs in times.items():
            med = statistics.median(secs)
            results.append({"case": f"{batch} x ({rows}x{n}) @ cached W", "runner": name,
                            "median_s": med, "gflops": flops / med / 1e9,
                            "vs_numpy": base / med})
        # -- small-task overhead --------------------------------------------------------------
        one = np.ones((1, 1), np.float32)
        rt = timed(lambda: client.matmul(one, one), small_calls)
        results.append({"case": "1x1 matmul round trip", "runner": "swarm (verified)",
                        "median_s": statistics.median(rt), "gflops": None, "vs_numpy": None,
                        "p90_s": sorted(rt)[int(0.9 * len(rt))]})
    return results


def bench_ray(n: int, repeats: int, workers: int) -> list[dict]:
    try:
        import ray
    except ImportError:
        return [{"case": f"matmul n={n} f32", "runner": "ray", "skipped":
                 "ray is not installed here (optional: pip install ray)"}]
    rng = np.random.default_rng(0)
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote
        def band(a_rows, b):
            return a_rows @ b

        def run(a, b):
            b_ref = ray.put(b)
            bands = np.array_split(a, workers * 2)
            return np.vstack(ray.get([band.remote(x, b_ref) for x in bands]))

        pairs = iter([(rand(rng, n, n), rand(rng, n, n)) for _ in range(repeats)])
        fixed_a, fixed_b = rand(rng, n, n), rand(rng, n, n)
        run(rand(rng, 64, n), rand(rng, n, 64))
        times = interleaved({"numpy a@b": lambda: fixed_a @ fixed_b,
                             "ray (put B, task per band)": lambda: run(*next(pairs))}, repeats)
    finally:
        ray.shutdown()
    med = statistics.median(times["ray (put B, task per band)"])
    return [{"case": f"matmul n={n} f32", "runner": "ray (put B, task per band)",
             "median_s": med, "gflops": 2.0 * n ** 3 / med / 1e9,
             "vs_numpy": statistics.median(times["numpy a@b"]) / med}]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="n=1024, fewer repeats")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", choices=["swarm", "ray"], default=None)
    p.add_argument("--ray-python", metavar="PYTHON", default=None,
                   help="run the Ray rows with this interpreter (a venv where ray is installed)")
    args = p.parse_args()
    n, batch, rows, calls = (1024, 16, 128, 50) if args.quick else (4096, 64, 256, 200)
    results = []
    if args.only != "ray":
        results += bench_swarm(n, batch, rows, args.repeats, calls, args.workers)
    if args.only != "swarm" and args.ray_python:
        import subprocess

        out = subprocess.run([args.ray_python, __file__, "--only", "ray", "--json",
                              "--repeats", str(args.repeats), "--workers", str(args.workers)]
                             + (["--quick"] if args.quick else []),
                             capture_output=True, text=True, timeout=900)
        try:
            results += json.loads(out.stdout)["results"]
        except (ValueError, KeyError):
            results.append({"case": f"matmul n={n} f32", "runner": "ray",
                            "skipped": f"ray run failed: {out.stderr.strip()[-200:]}"})
    elif args.only != "swarm":
        results += bench_ray(n, args.repeats, args.workers)
    meta = {"cpus": os.cpu_count(), "load_1m": os.getloadavg()[0], "workers": args.workers,
            "numpy": np.__version__}
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"swarm runtime vs numpy ({meta['cpus']} CPUs, load "
                        f"{meta['load_1m']:.1f}, {args.workers} workers; medians)")
    for col in ("case", "runner", "median", "GFLOPS", "x numpy"):
        table.add_column(col, justify="left" if col in ("case", "runner") else "right")
    for r in results:
        if "skipped" in r:
            table.add_row(r["case"], r["runner"], "-", "-", r["skipped"])
            continue
        med = r["median_s"]
        table.add_row(r["case"], r["runner"],
                      f"{med * 1e3:.2f} ms" if med < 0.1 else f"{med:.3f} s",
                      f"{r['gflops']:.1f}" if r["gflops"] else "-",
                      f"{r['vs_numpy']:.2f}" if r["vs_numpy"] else "-")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
