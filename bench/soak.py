"""Soak: N minutes of continuous verified matmul jobs on a loopback swarm with churn.

    python bench/soak.py [--minutes 10] [--workers 4] [--seed 1] [--json]

Starts `swarm publish` and workers (`swarm join`, numpy backend), runs the system tests'
requester (tests/system/driver.py) until the time is up, and every --churn-every seconds
does one seeded action: a new worker joins, a worker leaves (SIGTERM) or is SIGKILLed (the
coordinator included). Reports jobs submitted/completed, wrong results and lost jobs (both
must be 0), failovers (claims of a new term seen in the logs) and each process's peak RSS
per sampling window (it must level off). Exit 0 when nothing was wrong or lost."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DHT_UP = re.compile(r"up: dht \('([\d.]+)', (\d+)\)")
"""A node's log line with its DHT address."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("SWARM_CHAOS", None)
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--churn-every", type=float, default=15.0, help="seconds between actions")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--max-memory", default="256M", help="each worker's cache cap (join's)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    rss: dict[str, list[float]] = {}
    env = _env()

    def start(name: str, argv: list[str], **kw) -> subprocess.Popen:
        logs[name] = root / f"{name}.log"
        procs[name] = subprocess.Popen([sys.executable, "-m", *argv], env=env,
                                       stdin=subprocess.DEVNULL, stderr=logs[name].open("w"),
                                       **kw)
        return procs[name]

    def via_live() -> str:
        """The URI bootstrapping through a live node (the publisher may be gone)."""
        from swarm.uri import JoinURI, parse

        for name, proc in procs.items():
            if proc.poll() is None and name != "driver":
                m = DHT_UP.search(logs[name].read_text(errors="replace"))
                if m:
                    j = parse(uri)
                    return str(JoinURI(j.pubkey, j.name, j.salt, ((m[1], int(m[2])),),
                                       j.owner))
        return uri

    def join(name: str) -> None:
        start(name, ["swarm", "join", via_live(), "--yes", "--backend", "numpy", "--threads", "1",
                     "--max-memory", args.max_memory, "-v", "--data-dir", str(root / name)], stdout=subprocess.DEVNULL)

    started = time.monotonic()
    pub = start("pub", ["swarm", "publish", "--name", "soak", "--owner-key",
                        f"soft:{root / 'owner.key'}", "--backend", "numpy", "-v",
                        "--data-dir", str(root / "pub")], stdout=subprocess.PIPE, text=True)
    uri = pub.stdout.readline().strip()
    for i in range(args.workers):
        join(f"w{i}")
    stop = root / "stop"
    driver = start("driver", ["tests.system.driver", uri, "--data-dir", str(root / "req"),
                              "--until-file", str(stop), "--size", str(args.size),
                              "--batch", "3", "--min-workers", str(min(2, args.workers))],
                   stdout=(root / "driver.out").open("w"), cwd=ROOT)
    actions: list[tuple[float, str, str]] = []
    end = started + args.minutes * 60
    next_churn = time.monotonic() + args.churn_every
    n = args.workers
    try:
        while time.monotonic() < end and driver.poll() is None:
            for name, proc in procs.items():
                if proc.poll() is None:
                    try:
                        mb = psutil.Process(proc.pid).memory_info().rss / 2**20
                    except psutil.Error:
                        continue
                    rss.setdefault(name, []).append(mb)
            if time.monotonic() >= next_churn:
                alive = sorted(k for k, v in procs.items()
                               if k not in ("driver",) and v.poll() is None)
                kind = rng.choice(["join", "leave", "kill"]) if len(alive) > 2 else "join"
                if kind == "join":
                    name = f"w{n}"
                    n += 1
                    join(name)
                else:
                    name = rng.choice(alive)
                    procs[name].send_signal(signal.SIGTERM if kind == "leave" else
                                            signal.SIGKILL)
                actions.append((round(time.monotonic() - started, 1), kind, name))
                next_churn += args.churn_every
            time.sleep(1.0)
        stop.touch()
        try:
            driver.wait(180)
        except subprocess.TimeoutExpired:
            driver.kill()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in procs.values():
            proc.wait(10)
    rows = [json.loads(s) for s in (root / "driver.out").read_text().splitlines()
            if s.startswith("{")]
    summary = next((r["summary"] for r in rows if "summary" in r), None)
    claims = set()
    for log in logs.values():
        claims |= {int(m.group(1)) for m in re.finditer(r"-> coordinator at term (\d+)",
                                                         log.read_text(errors="replace"))}
    report = {
        "minutes": round((time.monotonic() - started) / 60, 2), "seed": args.seed,
        "submitted": sum(1 for r in rows if "job" in r),
        "completed": summary["ok"] if summary else 0,
        "wrong": summary["wrong"] if summary else None,
        "lost": summary["lost"] if summary else None,
        "rejected_shards": summary["rejected"] if summary else None,
        "failovers": max(0, len(claims) - 1), "churn": actions,
        "rss_mb": {k: _windows(v) for k, v in rss.items()},
        "median_job_s": _median([r["seconds"] for r in rows if "seconds" in r]),
        "logs": str(root),
    }
    ok = summary is not None and summary["wrong"] == 0 and summary["lost"] == 0 \
        and summary["ok"] == summary["jobs"]
    if args.json:
        print(json.dumps(report))
    else:
        _table(report)
    return 0 if ok else 1


def _windows(samples: list[float], parts: int = 4) -> list[float]:
    """Peak RSS (MiB) in each quarter of the process's life: it should level off."""
    if not samples:
        return []
    k = max(1, len(samples) // parts)
    return [round(max(samples[i:i + k]), 1) for i in range(0, len(samples), k)][:parts]


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def _table(r: dict) -> None:
    print(f"soak: {r['minutes']} min, seed {r['seed']}, logs in {r['logs']}")
    for k in ("submitted", "completed", "wrong", "lost", "rejected_shards", "failovers",
              "median_job_s"):
        print(f"  {k:<16}{r[k]}")
    print(f"  churn           {len(r['churn'])} actions: "
          + ", ".join(f"{t}s {k} {n}" for t, k, n in r["churn"]))
    print("  peak RSS MiB per quarter of each process's life:")
    for name, w in r["rss_mb"].items():
        print(f"    {name:<8}" + "  ".join(f"{x:7.1f}" for x in w))


if __name__ == "__main__":
    sys.exit(main())
