"""Runtime benchmark: swarm.local(workers=2) against numpy and Ray, side by side.

    python bench/runtime.py            # table
    python bench/runtime.py --json     # machine-readable
    python bench/runtime.py --quick    # smaller sizes, for a smoke run
    python bench/runtime.py --ray-python .venv-ray/bin/python --require-ray   # `make bench`

Rows (same matrices side by side in one run; medians of --repeats):

- ``matmul n=4096 cold``: a fresh A and B each repeat, so B travels to both workers, every
  shard is verified with Freivalds and merged: the whole cost of one job.
- ``matmul n=4096 warm``: the same B again (already cached on the workers by content
  address), a fresh A: only activations travel. ``B cached`` passes the array (the
  requester hashes it each call to find it cached); ``B put once`` passes a
  ``client.put(B)`` ref, as Ray's warm row passes its ``ray.put`` ref.
- ``64 x (256x4096) @ cached W``: inference-style, W put once, 64 remote calls in flight.
- ``1x1 round trip``: the small-task overhead (median of many synchronous calls, in blocks
  of :data:`SMALL_BLOCK` per runner).
- ``floor``: the same work split over ``--workers`` processes of one BLAS thread each,
  every process already holding its operands (no transfer, no checks, no merge): what any
  runtime with that many single-threaded workers could reach on these cores, timed in the
  same rounds.
- ``ray ...``: the same sharded matmul on a local Ray, one task per band: ``cold`` puts a
  fresh B each time (as swarm's cold row sends it), ``warm`` puts B once and reuses the ref;
  the inference row puts W once and keeps 64 tasks in flight; the 1x1 row is one task per
  round trip (``ray.get(f.remote(one, one))``), timed in the same rounds as swarm's.
  Ray runs where ``import ray`` works or in the interpreter ``--ray-python`` names (``make
  bench`` installs Ray in its own venv, .venv-ray; never a test dependency);
  ``--require-ray`` makes a skipped Ray row a failed run. Both move arrays through shared
  memory on one machine; swarm also checks every shard (Freivalds), Ray verifies nothing.

On a shared 2-core machine every figure is noisy: compare the ratios in one run. No runner
pays for another's leftover work: each large call starts :data:`SETTLE_S` after the previous one
and small calls go in blocks of :data:`SMALL_BLOCK` (numpy's BLAS threads spin ~0.1 s after a
product; Ray's processes keep working after they answer), and none for the VM's memory: fresh
memory is written and freed before each large call (:func:`touch_memory`).
``--runs N`` runs the whole benchmark N times, each in a fresh process (own swarm, own
Ray), and reports per row the median over the runs of each run's own median and ratio,
with every run's ratio beside it (``make bench`` takes three).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import swarm  # noqa: E402
from swarm import loop as swarm_loop  # noqa: E402


def timed(fn, repeats: int) -> list[float]:
    """Wall time of each call, or the seconds ``fn`` returns (a runner timed elsewhere)."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        got = fn()
        out.append(got if isinstance(got, float) else time.perf_counter() - t)
    return out


SETTLE_S = 0.25
"""Pause before each timed call. numpy's OpenBLAS helper threads spin on after a product
(measured here: a whole core for the next ~0.1 s, nothing after 0.2 s), and the workers of
whatever ran next paid for it: swarm's first row after numpy lost 60-70 ms of ~0.5 s."""


SMALL_BLOCK = 50
"""Small calls are timed in blocks of this many per runner, with no pause between blocks:
a runtime keeps working for a while after answering (Ray's raylet and workers), and swarm's
1x1 round trip measured 0.90 ms alone but 1.22 ms with a Ray call between each two of its
calls. A pause does not help here: after 0.25 s idle this VM's round trips are slower for
the next few hundred calls (1.03 ms against 0.87 ms, swarm alone)."""


TOUCH_BYTES = 256 << 20
"""Fresh memory written and freed before each large call (:func:`touch_memory`)."""


def touch_memory(nbytes: int) -> None:
    """Write ``nbytes`` of fresh memory and free it, so that the next call's new pages are
    ones the kernel already holds.

    A VM that hands freed guest memory back to its host (free page reporting; this one's
    kernel runs with ``page_reporting.page_reporting_order=11``, ~2 s after a free) makes
    the next first write to it cost ~2.5 ms per MiB (4 GiB took 9.7 s here), so a runner
    whose memory grows pays for it inside its timings and one that reuses its memory does
    not: a swarm worker keeps each cold job's B (64 MiB) in its store, and a 64 MiB sealed
    segment took 153-173 ms to write on such pages against 18-20 ms on reused ones (cold
    job 662-711 ms against 495-502 ms); Ray's object store reuses the memory of the B it
    freed. Every runner gets the same: a machine whose memory is in use, as on hardware
    (bench/runtime.py, one run: swarm cold 0.68x -> 0.79x numpy, Ray cold 0.78x -> 0.84x)."""
    block = np.ones(nbytes // 4, np.float32)
    del block


def interleaved(fns: dict, repeats: int, block: int = 1, settle: float = SETTLE_S,
                touch: int = TOUCH_BYTES, seed: int = 0) -> dict[str, list[float]]:
    """Time each fn ``block`` times per round, rounds in a row, so load drift hits all of
    them alike; the order is shuffled each round (seeded), and each runner's turn starts
    ``settle`` seconds after ``touch`` bytes were written (:func:`touch_memory`), so that it
    pays neither for the previous turn's leftover work nor for the VM's memory."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    order = random.Random(seed)
    for _ in range(max(1, repeats // block)):
        names = list(fns)
        order.shuffle(names)
        for name in names:
            touch_memory(touch)
            time.sleep(settle)
            out[name] += timed(fns[name], block)
    return out


def rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


# -- Ray, driven from here so its rows are timed in the same rounds as swarm's ----------------

RAY_COLD = "ray cold (put B, task per band)"
RAY_WARM = "ray warm (B put once)"
RAY_INFERENCE = "ray refs (W put once)"
RAY_SMALL = "ray (task, unchecked)"
RAY_CALLS = ("cold", "warm", "inference", "small")


class RayBench:
    """The Ray side in this interpreter: ``call(what)`` -> seconds of one run, ``what`` one of
    :data:`RAY_CALLS` (the rows of the same names in :func:`bench_swarm`)."""

    def __init__(self, n: int, workers: int, batch: int, rows: int) -> None:
        import ray

        self.ray = ray
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)

        @ray.remote
        def band(a_rows, b):
            return a_rows @ b

        self.band, self.workers, self.n = band, workers, n
        self.rng = np.random.default_rng(1)
        self.fixed_a, fixed_b = rand(self.rng, n, n), rand(self.rng, n, n)
        self.fixed_ref = ray.put(fixed_b)
        self._run(rand(self.rng, 64, n), self.fixed_ref)  # workers up, code shipped
        self.xs = [rand(self.rng, rows, n) for _ in range(batch)]
        self.w_ref = ray.put(rand(self.rng, n, n))
        self.one = np.ones((1, 1), np.float32)
        ray.get(band.remote(self.xs[0], self.w_ref))

    def _run(self, a, b_ref):
        bands = np.array_split(a, self.workers * 2)
        return np.vstack(self.ray.get([self.band.remote(x, b_ref) for x in bands]))

    def call(self, what: str) -> float:
        if what == "cold":
            a, b = rand(self.rng, self.n, self.n), rand(self.rng, self.n, self.n)
            t = time.perf_counter()
            self._run(a, self.ray.put(b))
        elif what == "warm":
            t = time.perf_counter()
            self._run(self.fixed_a, self.fixed_ref)
        elif what == "inference":
            t = time.perf_counter()
            outs = self.ray.get([self.band.remote(x, self.w_ref) for x in self.xs])
            assert len(outs) == len(self.xs)
        elif what == "small":
            t = time.perf_counter()
            self.ray.get(self.band.remote(self.one, self.one))
        else:
            raise ValueError(f"no Ray run called {what!r}")
        return time.perf_counter() - t

    def close(self) -> None:
        self.ray.shutdown()


def ray_server(n: int, workers: int, batch: int, rows: int) -> int:
    """``--ray-server``: a RayBench answering :data:`RAY_CALLS` lines on stdin with seconds."""
    bench = RayBench(n, workers, batch, rows)
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            if line.strip() not in RAY_CALLS:
                break
            print(repr(bench.call(line.strip())), flush=True)
    finally:
        bench.close()
    return 0


class RayProcess:
    """A ``--ray-server`` child in another interpreter (Ray's own venv)."""

    def __init__(self, python: str, n: int, workers: int, batch: int, rows: int,
                 timeout: float = 300.0) -> None:
        import subprocess
        import threading

        self.proc = subprocess.Popen(
            [python, __file__, "--ray-server", "--n", str(n), "--workers", str(workers),
             "--batch", str(batch), "--rows", str(rows)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or line[0].strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"ray did not start with {python}: "
                               f"{self.proc.stderr.read()[-300:].strip()}")

    def call(self, what: str) -> float:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(60)
        except Exception:
            self.proc.kill()
            self.proc.wait(10)


# -- the floor: the work split over single-threaded processes, nothing else ------------------

FLOOR = "floor ({workers} bare 1-thread procs)"


def floor_server(index: int, workers: int, n: int, batch: int, rows: int) -> int:
    """``--floor-server``: process ``index`` of ``workers`` computes its share of a product
    from operands it already holds, on each "big" or "inference" line, and says "done"."""
    rng = np.random.default_rng(10 + index)
    a_band, b = rand(rng, -(-n // workers), n), rand(rng, n, n)
    xs = [rand(rng, rows, n) for _ in range(index, batch, workers)]
    a_band @ b  # BLAS warmed up
    print("ready", flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what == "big":
            a_band @ b
        elif what == "inference":
            for x in xs:
                x @ b
        else:
            break
        print("done", flush=True)
    return 0


class Floor:
    """``workers`` ``--floor-server`` children (one BLAS thread each), started at once."""

    def __init__(self, n: int, batch: int, rows: int, workers: int) -> None:
        import subprocess

        one = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        self.procs = [subprocess.Popen(
            [sys.executable, __file__, "--floor-server", str(i), "--workers", str(workers),
             "--n", str(n), "--batch", str(batch), "--rows", str(rows)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **one})
            for i in range(workers)]
        for proc in self.procs:
            if proc.stdout.readline().strip() != "ready":
                self.close()
                raise RuntimeError("a floor process did not start")

    def call(self, what: str) -> float:
        t = time.perf_counter()
        for proc in self.procs:
            proc.stdin.write(what + "\n")
            proc.stdin.flush()
        for proc in self.procs:
            if proc.stdout.readline().strip() != "done":
                raise RuntimeError("a floor process failed")
        return time.perf_counter() - t

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.close()
                proc.wait(60)
            except Exception:
                proc.kill()
                proc.wait(10)


def start_ray(python: str | None, n: int, workers: int, batch: int, rows: int
              ) -> tuple[object | None, str | None]:
    """(a Ray runner, None) or (None, why not)."""
    try:
        if python:
            return RayProcess(python, n, workers, batch, rows), None
        return RayBench(n, workers, batch, rows), None
    except ImportError:
        return None, "ray is not installed here (make bench installs it in .venv-ray)"
    except Exception as exc:
        return None, f"ray run failed: {exc}"


def bench_swarm(n: int, batch: int, rows: int, repeats: int, small_calls: int,
                workers: int, ray: object | None = None, floor: Floor | None = None
                ) -> list[dict]:
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

        b_ref = client.put(b_warm)
        runners = {"numpy a@b": lambda: fixed_a @ b_warm,
                   "swarm cold (B sent)": cold,
                   "swarm warm (B cached)": lambda: client.matmul(fixed_a, b_warm),
                   "swarm warm (B put once)": lambda: client.matmul(fixed_a, b_ref)}
        if ray is not None:
            runners[RAY_COLD] = lambda: ray.call("cold")
            runners[RAY_WARM] = lambda: ray.call("warm")
        floor_name = FLOOR.format(workers=workers)
        if floor is not None:
            runners[floor_name] = lambda: floor.call("big")
        times = interleaved(runners, repeats)
        results += _rows(f"matmul n={n} f32", times, "numpy a@b", 2.0 * n ** 3, floor_name)
        # -- inference: batch activations x one cached weight ---------------------------------
        w = rand(rng, n, n)
        xs = [rand(rng, rows, n) for _ in range(batch)]
        wref = client.put(w)
        swarm.get(client.matmul.remote(xs[0], wref))  # W now cached on the workers

        def inference():
            outs = swarm.get([client.matmul.remote(x, wref) for x in xs])
            assert len(outs) == batch

        runners = {"numpy loop": lambda: [x @ w for x in xs], "swarm refs": inference}
        if ray is not None:
            runners[RAY_INFERENCE] = lambda: ray.call("inference")
        if floor is not None:
            runners[floor_name] = lambda: floor.call("inference")
        times = interleaved(runners, max(2, repeats // 2 + 1))
        results += _rows(f"{batch} x ({rows}x{n}) @ cached W", times, "numpy loop",
                         2.0 * batch * rows * n * n, floor_name)
        # -- small-task overhead --------------------------------------------------------------
        one = np.ones((1, 1), np.float32)
        runners = {"swarm (verified)": lambda: client.matmul(one, one)}
        if ray is not None:
            runners[RAY_SMALL] = lambda: ray.call("small")
        for name, rt in interleaved(runners, small_calls, block=SMALL_BLOCK, settle=0.0,
                                    touch=0).items():
            results.append({"case": "1x1 matmul round trip", "runner": name,
                            "median_s": statistics.median(rt), "gflops": None,
                            "vs_numpy": None, "p90_s": sorted(rt)[int(0.9 * len(rt))]})
    return results


def _rows(case: str, times: dict[str, list[float]], numpy_name: str, flops: float,
          floor_name: str) -> list[dict]:
    """One row per runner: median seconds, GFLOPS, and speed relative to numpy and to the
    floor (1.0 = as fast as the bare single-threaded processes; None without a floor)."""
    base = statistics.median(times[numpy_name])
    floor = statistics.median(times[floor_name]) if floor_name in times else None
    rows = []
    for name, secs in times.items():
        med = statistics.median(secs)
        rows.append({"case": case, "runner": name, "median_s": med, "gflops": flops / med / 1e9,
                     "vs_numpy": base / med, "vs_floor": floor / med if floor else None})
    return rows


def combine(runs: list[dict]) -> dict:
    """Separate runs' JSON -> one: per row the median of the runs' medians and ratios, and
    each run's ratio (or seconds) in a list; the load of each run in ``meta``."""
    if any(isinstance(run["meta"]["load_1m"], list) for run in runs):
        raise ValueError("--combine takes the --json output of single runs, not of --runs N "
                         "(that is already combined)")
    keys = [[(r["case"], r["runner"]) for r in run["results"]] for run in runs]
    if any(k != keys[0] for k in keys):
        raise ValueError("the runs measured different rows")
    rows = []
    for i, first in enumerate(runs[0]["results"]):
        same = [run["results"][i] for run in runs]
        if any("skipped" in x for x in same):
            rows.append(next(x for x in same if "skipped" in x))
            continue
        row = dict(first)
        for key in ("median_s", "gflops", "vs_numpy", "vs_floor", "p90_s"):
            if first.get(key) is not None:
                row[key] = statistics.median(x[key] for x in same)
        if first.get("vs_numpy") is not None:
            row["vs_numpy_runs"] = " ".join(f"{x['vs_numpy']:.2f}" for x in same)
        else:
            row["median_s_runs"] = " ".join(f"{x['median_s']:.3g}" for x in same)
        rows.append(row)
    meta = dict(runs[0]["meta"])
    meta["runs"] = len(runs)
    meta["load_1m"] = [round(run["meta"]["load_1m"], 1) for run in runs]
    return {"meta": meta, "results": rows}


def separate_runs(count: int) -> tuple[dict, int]:
    """This script ``count`` times in fresh processes (same arguments, one run each)."""
    import subprocess

    argv = [a for a in sys.argv[1:] if a != "--json"]
    if "--runs" in argv:
        at = argv.index("--runs")
        del argv[at:at + 2]
    runs, failed = [], 0
    for _ in range(count):
        res = subprocess.run([sys.executable, __file__, "--json", *argv], capture_output=True,
                             text=True)
        if res.returncode not in (0, 1) or not res.stdout.strip():
            raise RuntimeError(f"a run failed (rc {res.returncode}): {res.stderr[-400:]}")
        failed |= res.returncode
        runs.append(json.loads(res.stdout))
    return combine(runs), failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="n=1024, fewer repeats")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", choices=["swarm"], default=None, help="leave Ray out")
    p.add_argument("--ray-python", metavar="PYTHON", default=None,
                   help="run the Ray rows with this interpreter (a venv where ray is installed)")
    p.add_argument("--require-ray", action="store_true",
                   help="exit 1 when the Ray rows could not be measured (make bench)")
    p.add_argument("--runs", type=int, default=1,
                   help="separate runs (fresh processes); rows report the median over runs")
    p.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                   help="combine saved --json outputs of separate runs instead of running")
    p.add_argument("--ray-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--floor-server", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    n, batch, rows, calls = (1024, 16, 128, 50) if args.quick else (4096, 64, 256, 200)
    if args.ray_server:
        return ray_server(args.n or n, args.workers, args.batch or batch, args.rows or rows)
    if args.floor_server is not None:
        return floor_server(args.floor_server, args.workers, args.n or n, args.batch or batch,
                            args.rows or rows)
    if args.combine or args.runs > 1:
        if args.combine:
            try:
                combined = combine([json.loads(Path(f).read_text()) for f in args.combine])
            except (OSError, ValueError, KeyError) as exc:
                print(f"cannot combine: {exc}", file=sys.stderr)
                return 2
            failed = 0
        else:
            combined, failed = separate_runs(args.runs)
        return report(combined, args, failed)
    ray, why = (None, "not asked for (--only swarm)") if args.only == "swarm" else \
        start_ray(args.ray_python, n, args.workers, batch, rows)
    results = []
    floor = None
    try:
        floor = Floor(n, batch, rows, args.workers)
        results += bench_swarm(n, batch, rows, args.repeats, calls, args.workers, ray, floor)
    finally:
        if ray is not None:
            ray.close()
        if floor is not None:
            floor.close()
    if ray is None:
        results.append({"case": f"matmul n={n} f32", "runner": "ray", "skipped": why})
    meta = {"cpus": os.cpu_count(), "load_1m": os.getloadavg()[0], "workers": args.workers,
            "numpy": np.__version__, "event_loop": swarm_loop.choice(),
            "settle_s": SETTLE_S, "touch_mib": TOUCH_BYTES >> 20}
    skipped = [r for r in results if "skipped" in r]
    failed = 1 if args.require_ray and skipped else 0
    if failed:
        print(f"Ray was required and not measured: {skipped[0]['skipped']}", file=sys.stderr)
    return report({"meta": meta, "results": results}, args, failed)


def report(out: dict, args: argparse.Namespace, failed: int) -> int:
    """Print ``out`` as JSON or as a table; returns ``failed``."""
    meta, results = out["meta"], out["results"]
    if args.json:
        print(json.dumps(out, indent=1))
        return failed
    from rich.console import Console
    from rich.table import Table

    load = meta["load_1m"]
    table = Table(title=f"swarm runtime vs numpy ({meta['cpus']} CPUs, load "
                        f"{load if isinstance(load, list) else round(load, 1)}, "
                        f"{args.workers} workers; medians)")
    for col in ("case", "runner", "median", "GFLOPS", "x numpy", "x floor"):
        table.add_column(col, justify="left" if col in ("case", "runner") else "right")
    for r in results:
        if "skipped" in r:
            table.add_row(r["case"], r["runner"], "-", "-", r["skipped"], "-")
            continue
        med = r["median_s"]
        table.add_row(r["case"], r["runner"],
                      f"{med * 1e3:.2f} ms" if med < 0.1 else f"{med:.3f} s",
                      f"{r['gflops']:.1f}" if r["gflops"] else "-",
                      (f"{r['vs_numpy']:.2f}" if r["vs_numpy"] else "-")
                      + (f" ({r['vs_numpy_runs']})" if r.get("vs_numpy_runs") else ""),
                      f"{r['vs_floor']:.2f}" if r.get("vs_floor") else "-")
    Console().print(table)
    return failed


if __name__ == "__main__":
    sys.exit(main())
