"""`swarm demo`: a local swarm on loopback, end to end."""

from __future__ import annotations

import argparse
import sys

HELP = "run a local demo swarm on loopback (publish, join, verified matmul, failover)"
DESCRIPTION = """\
Runs a whole swarm on this machine: publishes a swarm with a software owner key in a
temporary dir, starts worker processes that join it, submits a sharded matmul that is
verified with Freivalds' check, kills the coordinator mid-job and shows the job finish.
"""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=3, metavar="N", help="worker processes (3)")
    p.add_argument("--size", type=int, default=1024, metavar="N", help="matrix size N x N")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from swarm.cli import EXIT_UNAVAILABLE

    print(
        "swarm demo: the runtime and control plane are not built yet, so there is no swarm "
        "to demonstrate. Built so far: the project skeleton (see README.md).",
        file=sys.stderr,
    )
    return EXIT_UNAVAILABLE
