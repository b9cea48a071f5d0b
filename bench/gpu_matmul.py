"""The tiled WGSL kernel vs cuBLAS (torch) in f32 on the same NVIDIA GPU. Unattended.

    python bench/gpu_matmul.py [--json] [--sizes 4096 8192] [--repeats 10]
    python bench/gpu_matmul.py --wgsl-only --allow-cpu --sizes 256   # smoke test, no GPU

Goal (issue 5): the WGSL kernel reaches >= 30% of cuBLAS f32 at n = 4096 and 8192. TF32 is
switched off in torch so both sides do true f32 arithmetic. WGSL time is device time: inputs
uploaded once, ``repeats`` dispatches in one submission, waited on by mapping one word.
Every tile configuration below is tried and the best reported (each one's figure too), and
the WGSL result is checked with Freivalds against the inputs before any figure counts.

Exit codes: 0 measured; 4 no torch / no CUDA GPU / no GPU adapter for wgpu (the message
says which); 1 the WGSL result was wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import compute  # noqa: E402
from compute.kernels import DEFAULT_TILES, LARGE_TILES, TileConfig  # noqa: E402
from compute.wgpu_backend import WgpuBackend  # noqa: E402

EXIT_WRONG = 1
EXIT_UNAVAILABLE = 4

CONFIGS = [
    LARGE_TILES,
    DEFAULT_TILES,
    TileConfig(wg_x=16, wg_y=16, rm=8, vn=2, tk=16),
    TileConfig(wg_x=16, wg_y=8, rm=8, vn=2, tk=8),
    TileConfig(wg_x=8, wg_y=16, rm=8, vn=4, tk=8),
    TileConfig(wg_x=16, wg_y=16, rm=8, vn=1, tk=16),
]


def fail(code: int, message: str) -> int:
    print(f"gpu_matmul: {message}", file=sys.stderr)
    return code


def torch_tflops(n: int, repeats: int) -> float:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    a = torch.randn(n, n, device="cuda", dtype=torch.float32)
    b = torch.randn(n, n, device="cuda", dtype=torch.float32)
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        torch.mm(a, b)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / repeats
    return 2 * n**3 / seconds / 1e12


def wgsl_check(backend: WgpuBackend, n: int) -> bool:
    """The kernel's full product (with transfers) passes Freivalds' check."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return compute.verify_matmul(a, b, backend.matmul(a, b))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--wgsl-only", action="store_true",
                        help="skip torch (measure only the WGSL kernel)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="accept a CPU adapter (llvmpipe) for wgpu: a smoke test only")
    args = parser.parse_args(argv)

    if not args.wgsl_only:
        try:
            import torch
        except ImportError:
            return fail(EXIT_UNAVAILABLE, "torch is not installed; this benchmark compares "
                        "against cuBLAS through torch (pip install torch), or pass --wgsl-only")
        if not torch.cuda.is_available():
            return fail(EXIT_UNAVAILABLE, "torch sees no CUDA GPU; run this on a machine with "
                        "an NVIDIA GPU and driver, or pass --wgsl-only")
    result: dict = {"sizes": {}, "torch": None}
    if not args.wgsl_only:
        result["torch"] = {"version": torch.__version__, "device": torch.cuda.get_device_name(0)}

    try:
        backend = WgpuBackend.shared()  # one device; the tile shapes are tried on it
    except compute.BackendUnavailable as exc:
        return fail(EXIT_UNAVAILABLE, f"no wgpu device: {exc.reason}")
    info = backend.adapter_info()
    result["adapter"] = info
    if info["type"] != "DiscreteGPU" and not args.allow_cpu:
        return fail(EXIT_UNAVAILABLE, f"wgpu's adapter is {info['name']} ({info['type']}/"
                    f"{info['api']}), not a discrete GPU: is the Vulkan driver (ICD) for the "
                    "NVIDIA card installed? (--allow-cpu to measure it anyway)")
    print(f"adapter: {info['name']} [{info['type']}/{info['api']}]"
          + (f"; torch {result['torch']['version']} on {result['torch']['device']}"
             if result["torch"] else ""), file=sys.stderr)

    checked = wgsl_check(backend, min(args.sizes))
    result["freivalds_ok"] = checked
    if not checked:
        return fail(EXIT_WRONG, "the tiled kernel's product failed Freivalds' check")

    for n in args.sizes:
        row: dict = {"wgsl": {}}
        for config in CONFIGS:
            label = (f"{config.block_m}x{4 * config.block_n4} "
                     f"({config.rm}x{4 * config.vn}/thread, tk {config.tk})")
            try:
                seconds = backend.kernel_seconds(n, n, n, repeats=args.repeats, tiles=config)
            except compute.ComputeError as exc:
                row["wgsl"][label] = {"error": str(exc)}
                continue
            row["wgsl"][label] = {"tflops": 2 * n**3 / seconds / 1e12}
            print(f"n={n} wgsl {label}: {row['wgsl'][label]['tflops']:.3f} TFLOPS",
                  file=sys.stderr)
        measured = {k: v["tflops"] for k, v in row["wgsl"].items() if "tflops" in v}
        if measured:
            best = max(measured, key=measured.get)
            row["wgsl_best"] = {"tiles": best, "tflops": measured[best]}
        if not args.wgsl_only:
            row["cublas_tflops"] = torch_tflops(n, args.repeats)
            if measured:
                row["ratio"] = measured[best] / row["cublas_tflops"]
        result["sizes"][str(n)] = row
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(f"\n{'n':>6} {'cuBLAS TFLOPS':>14} {'WGSL TFLOPS':>12} {'WGSL/cuBLAS':>12}  best tiles")
    for n, row in result["sizes"].items():
        cublas = f"{row['cublas_tflops']:.2f}" if "cublas_tflops" in row else "-"
        best = row.get("wgsl_best", {})
        ratio = f"{100 * row['ratio']:.1f}%" if "ratio" in row else "-"
        print(f"{n:>6} {cublas:>14} {best.get('tflops', float('nan')):>12.3f} {ratio:>12}  "
              f"{best.get('tiles', '')}")
    print("goal: WGSL >= 30% of cuBLAS f32 at n = 4096 and 8192")
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"(took {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    sys.exit(code)
