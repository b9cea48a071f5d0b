"""`swarm bench`: measure this machine's compute backends (the figure a peer announces)."""

from __future__ import annotations

import argparse
from typing import Any

from swarm.commands._common import add_json_option, print_json, print_table

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
    add_json_option(p, "the full result")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, about 3 seconds (what `swarm join` runs)")
    p.add_argument("--sizes", type=_sizes, metavar="N,N,...",
                   help="matrix sizes to measure (default 256,512,1024,2048,4096)")
    p.add_argument("--budget", type=float, default=30.0, metavar="SECONDS",
                   help="time budget for the measurements (default 30)")
    p.add_argument("--backend", action="append", choices=("numpy", "wgpu"),
                   help="measure only this backend (repeatable)")
    p.add_argument("--threads", type=int, metavar="N", help="BLAS threads for numpy")


def print_report(result: dict[str, Any]) -> None:
    """The benchmark result as a table per backend, then the kernel and announced figures."""
    sizes = sorted({int(n) for row in result["backends"] for n in row["gflops"]})
    rows = []
    for row in result["backends"]:
        if not row["validated"]:
            rows.append((row["name"], f"unusable: {row['reason']}", "", *([None] * len(sizes))))
            continue
        adapter = row["adapter"] or {}
        kind = "/".join(x for x in (adapter.get("type"), adapter.get("api")) if x)
        rows.append((row["name"], adapter.get("name", ""), kind,
                     *(f"{row['gflops'][str(n)]:.1f}" if str(n) in row["gflops"] else None
                       for n in sizes)))
    cols = [f"n={n}" for n in sizes]
    print_table(("backend", "device", "kind", *cols), rows, right=cols,
                caption="GFLOPS per square size n, end to end: upload, multiply, read back")
    kernel = result.get("kernel")
    if kernel:
        print(f"WGSL kernels on {kernel['adapter']} at n={kernel['n']} (device time): "
              f"naive {kernel['naive_gflops']:.2f} GFLOPS, tiled {kernel['tiled_gflops']:.2f} "
              f"GFLOPS ({kernel['speedup']:.1f}x; tiles {kernel['tiles']})")
    best = result.get("best")
    if best:
        print(f"announced throughput: {result['tflops']:.4f} TFLOPS "
              f"({best['backend']} at n={best['n']})")
    host = result.get("probe", {}).get("host", {})
    if host:
        print(f"host: {host.get('cpus')} CPUs, {host.get('memory_bytes', 0) / 2**30:.1f} "
              f"GiB; measured in {result['elapsed_s']:.1f} s")


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
        print_json(result)
    else:
        print_report(result)
    return 0
