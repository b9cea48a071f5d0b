"""`swarm bench`: measure this machine's compute backends (the figure a peer announces)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

HELP = "measure this machine's matmul throughput per backend (numpy, wgpu)"
DESCRIPTION = """\
Validates each compute backend (numpy's BLAS; WGSL on wgpu) against known products, then
measures GFLOPS over square matmuls of growing size within a time budget, and the naive
beside the tiled WGSL kernel on the same adapter. A backend that fails validation is listed
with the reason and never used. --quick is what `swarm join` runs at start-up.
"""


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be integers, got {text!r}") from None
    if not sizes or any(not 1 <= n <= 16384 for n in sizes):
        raise argparse.ArgumentTypeError("sizes must be between 1 and 16384")
    return sizes


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, about 3 seconds (what `swarm join` runs)")
    p.add_argument("--sizes", type=_sizes, metavar="N,N,...",
                   help="matrix sizes to measure (default 256,512,1024,2048,4096)")
    p.add_argument("--budget", type=float, default=30.0, metavar="SECONDS",
                   help="time budget for the measurements (default 30)")
    p.add_argument("--backend", action="append", choices=("numpy", "wgpu"),
                   help="measure only this backend (repeatable)")
    p.add_argument("--threads", type=int, metavar="N", help="BLAS threads for numpy")


def format_table(result: dict[str, Any]) -> str:
    """The benchmark result as a readable plain-text report."""
    sizes = sorted({int(n) for row in result["backends"] for n in row["gflops"]})
    lines = []
    head = (f"{'backend':<8} {'device':<34} {'kind':<14} "
            + " ".join(f"{f'n={n}':>9}" for n in sizes))
    lines += [head, "-" * len(head)]
    for row in result["backends"]:
        if not row["validated"]:
            lines.append(f"{row['name']:<8} unusable: {row['reason']}")
            continue
        adapter = row["adapter"] or {}
        kind = "/".join(x for x in (adapter.get("type"), adapter.get("api")) if x)
        cells = " ".join(f"{row['gflops'][str(n)]:>9.1f}" if str(n) in row["gflops"]
                         else f"{'-':>9}" for n in sizes)
        lines.append(f"{row['name']:<8} {adapter.get('name', '')[:34]:<34} {kind[:14]:<14} {cells}")
    lines.append("(GFLOPS per square size n, end to end: upload, multiply, read back)")
    kernel = result.get("kernel")
    if kernel:
        lines += ["", f"WGSL kernels on {kernel['adapter']} at n={kernel['n']} (device time): "
                  f"naive {kernel['naive_gflops']:.2f} GFLOPS, tiled {kernel['tiled_gflops']:.2f} "
                  f"GFLOPS ({kernel['speedup']:.1f}x; tiles {kernel['tiles']})"]
    best = result.get("best")
    if best:
        lines += ["", f"announced throughput: {result['tflops']:.4f} TFLOPS "
                  f"({best['backend']} at n={best['n']})"]
    host = result.get("probe", {}).get("host", {})
    if host:
        lines.append(f"host: {host.get('cpus')} CPUs, {host.get('memory_bytes', 0) / 2**30:.1f} "
                     f"GiB; measured in {result['elapsed_s']:.1f} s")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import compute
    from compute.bench import benchmark, require_backend
    from swarm.errors import ConfigError, LocalError

    try:
        result = benchmark(args.sizes, args.budget, quick=args.quick,
                           backends=args.backend, threads=args.threads)
        require_backend(result)
    except compute.InvalidInput as exc:
        raise ConfigError(str(exc)) from exc
    except compute.BackendUnavailable as exc:
        raise LocalError(str(exc)) from exc
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(result))
    return 0
