"""`swarm demo`: a local swarm on loopback, end to end."""

from __future__ import annotations

import argparse
import sys

from swarm.commands._common import add_json_option, print_json

HELP = "run a local demo swarm on loopback (publish, join, verified matmul, failover)"
DESCRIPTION = """\
Runs a whole swarm on this machine: publishes a swarm with a software owner key in a
temporary dir, starts worker processes that join it (plus one that returns wrong results on
purpose: SWARM_CHAOS=corrupt=1), submits a sharded matmul that is verified with Freivalds'
check, kills the coordinator with SIGKILL mid-job and shows the job finish, the wrong results
caught and the lying worker blocked by the new coordinator.
"""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=3, metavar="N", help="honest workers (3)")
    p.add_argument("--size", type=int, default=1024, metavar="N", help="matrix size N x N")
    add_json_option(p, "the report")


def run(args: argparse.Namespace) -> int:
    from swarm.commands.demo_run import run_demo
    from swarm.errors import ConfigError

    if not 1 <= args.workers <= 16:
        raise ConfigError("--workers must be between 1 and 16")
    if not 64 <= args.size <= 8192:
        raise ConfigError("--size must be between 64 and 8192")
    report = run_demo(args.workers, args.size, log=None if args.json else _say)
    if args.json:
        print_json(report)
    else:
        _print(report)
    return 0 if report["ok"] else 1


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _print(r: dict) -> None:
    print()
    print(f"swarm demo: {'OK' if r['ok'] else 'FAILED'} in {r['total_s']:.1f} s")
    print(f"  published {r['name']!r}; owner key {r['owner'][:12]} (software, not "
          f"hardware-backed)")
    print(f"  {len(r['members'])} members joined (join {r['join_s']:.2f} s median)")
    print(f"  coordinator {r['coordinator_before'][:12]} (term {r['term_before']}) killed "
          f"mid-job -> {str(r['coordinator_after'])[:12]} (term {r['term_after']}) "
          f"after {r['failover_s']:.2f} s")
    print(f"  job: {r['jobs']} x matmul {r['size']}x{r['size']} in {r['job_s']:.2f} s, "
          f"result {'correct' if r['correct'] else 'WRONG'} (max error {r['max_error']:.2e})")
    if r["job_s"] < r["failover_s"]:
        print("       (done before the new coordinator was elected: jobs run peer to peer and "
              "do not wait for one; the dead coordinator's shards were redone elsewhere)")
    jobs = r.get("jobs_total", r["jobs"])
    print(f"  every job of the demo ({jobs}), per peer:")
    print(f"  {'peer':<14}{'shards':>7}{'verified':>9}{'rejected':>9}{'failed':>7}")
    for peer, p in sorted(r["peers"].items()):
        tag = "  <- chaos worker" if peer == r["chaos_worker"] else ""
        print(f"  {peer[:12]:<14}{p['shards']:>7}{p['verified']:>9}{p['rejected']:>9}"
              f"{p['failed']:>7}{tag}")
    print(f"  chaos worker's wrong results caught: {r['wrong_results_caught']}; "
          f"blocked by the coordinator: {r['chaos_blocked']}")
