"""Start-up time of the `swarm` command: `swarm --help`, and `swarm dht serve` until it prints
`listening on`. Why: both run often (shell completion, help, unattended bootstrap nodes on
small machines), and importing aiortc or wgpu there costs a second of CPU for nothing.

    python bench/startup.py [--runs 15] [--tree NAME=PATH ...] [--json]

Each tree is a checkout of this project (default: this one); every run is a fresh process
with that tree first on PYTHONPATH and the same interpreter. Prints medians side by side (wall
and CPU time: on a shared machine CPU time is the steadier figure), and which heavy packages
the parser imported."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("aiortc", "aioice", "av", "wgpu", "numpy", "cryptography", "fido2", "rich",
         "kademlia", "psutil", "uvloop")
PROBE = """\
import sys
from swarm import cli
cli.build_parser()
print(",".join(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1].split(',')))))
"""


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.pop("SWARM_HOME", None)
    return env


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_help(tree: Path) -> tuple[float, float]:
    """Wall and CPU seconds of `swarm --help`."""
    cpu, start = _child_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "swarm", "--help"], env=_env(tree), check=True,
                   capture_output=True, timeout=60)
    return time.perf_counter() - start, _child_cpu() - cpu


def time_dht_serve(tree: Path) -> tuple[float, float]:
    """Wall seconds from exec to the `listening on` line, and CPU seconds of the whole run
    (start, listen, stop on SIGTERM): CPU time holds still when the machine is loaded."""
    with tempfile.TemporaryDirectory() as home:
        cpu, start = _child_cpu(), time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "swarm", "dht", "serve", "--port", "0",
                                 "--data-dir", home], env=_env(tree), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline()
            took = time.perf_counter() - start
            if "listening" not in line:
                raise RuntimeError(f"{tree}: dht serve printed {line!r}")
        finally:
            proc.terminate()
            proc.wait(30)
            proc.stdout.close()
    return took, _child_cpu() - cpu


def heavy_imports(tree: Path) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY)], env=_env(tree),
                         check=True, capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    trees = [(n, Path(p)) for n, _, p in (t.partition("=") for t in args.tree)] or \
        [("this tree", ROOT)]
    keys = ("help_ms", "help_cpu_ms", "dht_serve_ms", "dht_serve_cpu_ms")
    samples: dict[str, dict[str, list[float]]] = {n: {k: [] for k in keys} for n, _ in trees}
    for _ in range(args.runs):  # trees interleaved, so load changes hit them alike
        for name, tree in trees:
            figures = (*time_help(tree), *time_dht_serve(tree))
            for key, value in zip(keys, figures, strict=True):
                samples[name][key].append(value * 1000)
    results = {name: {**{k: round(statistics.median(v), 1) for k, v in samples[name].items()},
                      "parser_imports": heavy_imports(tree), "runs": args.runs}
               for name, tree in trees}
    if args.json:
        print(json.dumps(results, indent=1))
        return
    names = list(results)
    print(f"{'median of ' + str(args.runs) + ' runs':<36}" + "".join(f"{n:>12}" for n in names))
    for key, label in (("help_ms", "swarm --help, wall (ms)"),
                       ("help_cpu_ms", "swarm --help, CPU (ms)"),
                       ("dht_serve_ms", "dht serve to listening, wall (ms)"),
                       ("dht_serve_cpu_ms", "dht serve start+stop, CPU (ms)")):
        print(f"{label:<36}" + "".join(f"{results[n][key]:>12.0f}" for n in names))
    for n in names:
        print(f"heavy packages imported by the parser ({n}): {results[n]['parser_imports']}")


if __name__ == "__main__":
    main()
