"""The quantized kernels (models.quant) against the machine's memory bandwidth and numpy.

    python bench/quant.py [--types Q4_0 Q4_K ...] [--reps 15]

Per block format and matrix shape (SmolLM2- and Qwen2.5-0.5B-sized, [out, in]):

* matvec: one row of x (a decode step). GB/s = the matrix's bytes as the file stores them
  over the median time, on ``models.quant.THREADS`` threads and on one (wall and the thread's
  CPU time: on a machine others load, the CPU time shows what the kernel does when it runs).
* numpy sgemv: the same product on the dequantized float32 matrix (what the forward did
  before): its time, and GB/s over its float32 bytes.
* prefill: 64 rows of x, GFLOPS (2 out in 64 / time), beside numpy sgemm on the float32 copy.

Memory bandwidth: numpy's streaming sum of a 512 MiB float32 array (one thread). Kernel and
numpy calls are interleaved, medians of ``--reps``; the load average is printed before and
after (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants  # noqa: E402

from models import quant  # noqa: E402
from models.quant import QTensor  # noqa: E402

SHAPES = [(896, 896), (4864, 896), (896, 4864), (1536, 576)]
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32"]


def weights(qtype: GGMLQuantizationType, out: int, n_in: int, rng) -> QTensor:
    """Random weights in ``qtype`` (gguf.quants where it quantizes, else valid raw blocks)."""
    try:
        raw = quants.quantize(rng.standard_normal((out, n_in)).astype(np.float32), qtype)
    except NotImplementedError:
        per_block, block_bytes = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (out, n_in // per_block, block_bytes), dtype=np.uint8)
        d = (rng.standard_normal((out, n_in // per_block, 2)) * 0.01).astype(np.float16)
        if qtype == GGMLQuantizationType.Q6_K:
            raw[..., 208:210] = d.view(np.uint8)[..., 0:2]
        else:
            raw[..., 0:4] = d.view(np.uint8)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(out, -1)
    return QTensor(qtype, (out, n_in), raw)


def timed(fns: list, reps: int, clock=time.perf_counter) -> list[float]:
    """Median seconds of each function, calls interleaved."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for i, f in enumerate(fns):
            t = clock()
            f()
            times[i].append(clock() - t)
    return [statistics.median(t) for t in times]


def bandwidth(reps: int) -> float:
    a = np.ones((512 << 20) // 4, np.float32)
    a.sum()
    (t,) = timed([a.sum], max(3, reps // 3))
    return a.nbytes / t / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", nargs="*", default=TYPES)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}; kernel threads: {quant.THREADS}")
    print(f"memory bandwidth (numpy sum of 512 MiB, one thread): {bandwidth(args.reps):.1f} GB/s")
    rng = np.random.default_rng(0)
    print("| type | out x in | MiB | matvec GB/s (threads) | 1 thread | 1 thread, CPU time | "
          "numpy sgemv f32 ms (GB/s) | matvec ms | prefill n=64 GFLOPS | numpy sgemm GFLOPS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    threads = quant.THREADS
    for name in args.types:
        qtype = GGMLQuantizationType[name]
        for out, n_in in SHAPES:
            if n_in % GGML_QUANT_SIZES[qtype][0]:
                continue  # a row of 896 is not whole 256-weight blocks (Qwen stores those Q5_0)
            w = weights(qtype, out, n_in, rng)
            deq = w.dequantize()
            x1 = rng.standard_normal((1, n_in)).astype(np.float32)
            x64 = rng.standard_normal((64, n_in)).astype(np.float32)
            w.matmul(x1), w.matmul(x64)  # compile or load the kernels

            def one_thread(w=w, x1=x1):
                quant.THREADS = 1
                try:
                    w.matmul(x1)
                finally:
                    quant.THREADS = threads

            mv, mv1, sgemv = timed([lambda w=w, x1=x1: w.matmul(x1), one_thread,
                                    lambda deq=deq, x1=x1: deq @ x1[0]], args.reps)
            (cpu1,) = timed([one_thread], args.reps, time.thread_time)
            pre, sgemm = timed([lambda w=w, x64=x64: w.matmul(x64),
                                lambda deq=deq, x64=x64: x64 @ deq.T], max(3, args.reps // 2))
            flops = 2 * out * n_in * 64
            print(f"| {name} | {out}x{n_in} | {w.nbytes / 2**20:.2f} | {w.nbytes / mv / 1e9:.1f} "
                  f"| {w.nbytes / mv1 / 1e9:.1f} | {w.nbytes / cpu1 / 1e9:.1f} | {sgemv * 1e3:.3f} ({deq.nbytes / sgemv / 1e9:.1f}) "
                  f"| {mv * 1e3:.3f} | {flops / pre / 1e9:.0f} | {flops / sgemm / 1e9:.0f} |",
                  flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
