"""The quantized kernels (models.quant) against the machine's memory bandwidth and numpy.

    python bench/quant.py [--types Q4_0 Q4_K ...] [--reps 15] [--smollm2 RUNS]

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


def smollm2(prompt: int, decode: int, runs: int) -> None:
    """SmolLM2-135M's local forward, float32 (models.llama) and with the file's own blocks
    (QTensor for every matrix, the same layer pass: models.span.run_layers), two BLAS and
    kernel threads each, runs alternating: prefill and median decode tok/s, and whether the
    greedy tokens agree."""
    from gguf import GGUFReader
    from threadpoolctl import threadpool_limits

    from models import gguf_weights
    from models.llama import Llama
    from models.span import PARTS, Layer, Seq, rms_norm, run_layers

    path = gguf_weights.default_path()
    model = Llama(gguf_weights.load(path))
    c = model.config
    t = quant.gguf_tensors(GGUFReader(path))
    layers = [Layer(t[f"blk.{i}.attn_norm.weight"], t[f"blk.{i}.ffn_norm.weight"],
                    {p: t[f"blk.{i}.{p}.weight"] for p in PARTS}) for i in range(c.n_layers)]
    head, norm = t["token_embd.weight"], t["output_norm.weight"]

    def products(j, pairs):
        return [layers[j].matrices[p].matmul(h) for p, h in pairs]

    def quantized(ids, cache):
        seq = Seq.start(len(ids), cache)
        x = run_layers(c, layers, head.rows(np.asarray(ids)), [seq], products)
        cache.length = seq.end
        return head.matmul(rms_norm(x[-1:], norm, c.norm_eps))[0]

    rng = np.random.default_rng(0)
    ids = rng.integers(0, c.vocab_size, prompt).tolist()
    results: dict[str, list] = {"float32": [], "quantized": []}
    for _ in range(runs):
        for name, fwd in (("float32", model.forward), ("quantized", quantized)):
            cache = model.new_cache(prompt + decode)
            with threadpool_limits(2, user_api="blas"):
                t0 = time.perf_counter()
                logits = fwd(ids, cache)
                pre = time.perf_counter() - t0
                steps, tokens = [], []
                for _ in range(decode):
                    tokens.append(int(np.argmax(logits)))
                    t0 = time.perf_counter()
                    logits = fwd([tokens[-1]], cache)
                    steps.append(time.perf_counter() - t0)
            results[name].append((prompt / pre, 1 / statistics.median(steps), tokens))
    print(f"\nSmolLM2-135M local forward, prompt {prompt}, decode {decode}, medians of {runs} "
          f"(load before: {os.getloadavg()})")
    print("| weights | prefill tok/s | decode tok/s | resident weight MiB |")
    print("|---|---|---|---|")
    mib = {"float32": sum(a.nbytes for a in model.weights.tensors.values()) / 2**20,
           "quantized": sum(v.nbytes for v in t.values()) / 2**20}
    for name, rows in results.items():
        print(f"| {name} | {statistics.median(r[0] for r in rows):.0f} | "
              f"{statistics.median(r[1] for r in rows):.1f} | {mib[name]:.0f} |")
    same = all(a[2] == b[2] for a, b in zip(results["float32"], results["quantized"],
                                           strict=True))
    print(f"greedy tokens equal: {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", nargs="*", default=TYPES)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--smollm2", type=int, default=3, metavar="RUNS",
                    help="runs of SmolLM2's forward, float32 against quantized (0: skip)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    args = ap.parse_args()
    if args.smollm2:
        smollm2(args.prompt, args.decode, args.smollm2)
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
