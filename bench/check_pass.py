"""The check's pass, old against new: numpy ``a @ b`` and ``verify_matmul`` interleaved.

    python bench/check_pass.py [--sizes 1024 2048 4096] [--rounds 15]

"old" is the pass before the compiled kernel (cache-sized row blocks, one BLAS thread, a
matrix-vector product per check vector and the squares, each re-reading the block from L2),
kept here only as the yardstick; "new" is :func:`compute.verify._pass`. Prints medians (ms)
and the load average before and after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compute import verify  # noqa: E402

_BLOCK = 1 << 17


def old_pass(x: np.ndarray, right: np.ndarray | None, weights: np.ndarray | None
             ) -> tuple[np.ndarray | None, np.ndarray]:
    """The numpy pass as it was (compute/verify.py before the kernel)."""
    from threadpoolctl import threadpool_limits

    m, k = x.shape
    cols = 0 if right is None else right.shape[1]
    proj = np.zeros((cols, m), np.float32)
    if m == 0 or k == 0:
        return (None if right is None else proj.T), np.zeros(m)
    vectors = [] if right is None else [np.ascontiguousarray(right[:, j]) for j in range(cols)]
    w = None if weights is None else np.asarray(weights, np.float32)
    sq = np.empty(m, np.float32)
    rows = max(1, _BLOCK // k)
    tmp = None if w is None else np.empty((min(rows, m), k), np.float32)
    with threadpool_limits(1, user_api="blas"), np.errstate(over="ignore", invalid="ignore"):
        for r0 in range(0, m, rows):
            blk = x[r0:r0 + rows]
            r1 = r0 + len(blk)
            for j, v in enumerate(vectors):
                np.matmul(blk, v, out=proj[j, r0:r1])
            if tmp is None:
                np.matmul(blk[:, None, :], blk[:, :, None], out=sq[r0:r1, None, None])
            else:
                t = tmp[:len(blk)]
                np.multiply(blk, blk, out=t)
                np.matmul(t, w, out=sq[r0:r1])
        out = sq.astype(np.float64)
        if not np.all(np.isfinite(out)):
            x64 = x.astype(np.float64)
            w64 = np.ones(k) if weights is None else np.asarray(weights, np.float64)
            out = (x64 * x64) @ w64
    return (None if right is None else proj.T), out


def old_check(a, b, c) -> bool:
    with mock.patch.object(verify, "_pass", old_pass):
        return verify.verify_matmul(a, b, c)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    load = Path("/proc/loadavg")
    print("loadavg before:", load.read_text().strip() if load.exists() else "?")
    for n in args.sizes:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = a @ b
        fns = {"matmul": lambda a=a, b=b: a @ b,
               "old": lambda a=a, b=b, c=c: old_check(a, b, c),
               "new": lambda a=a, b=b, c=c: verify.verify_matmul(a, b, c)}
        for fn in fns.values():
            assert fn() is not False  # warm-up (and the compile, outside the timing)
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
        print(f"n={n}: matmul {med['matmul']:.1f} ms; check old {med['old']:.2f} ms "
              f"({100 * med['old'] / med['matmul']:.1f}%), new {med['new']:.2f} ms "
              f"({100 * med['new'] / med['matmul']:.1f}%)")
    print("loadavg after:", load.read_text().strip() if load.exists() else "?")


if __name__ == "__main__":
    main()
