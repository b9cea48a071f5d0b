"""Control-plane timings on loopback: join, failover after SIGKILL, handoff after SIGTERM.

    python bench/control.py [--rounds 3] [--workers 3] [--json]

Each round starts a fresh swarm (`swarm publish` + N `swarm join` processes), measures
  join      process start -> `peer:` line (imports, benchmark, DHT, charter, control plane)
  joined    the member's own figure: node up -> charter verified and control plane running
  failover  SIGKILL of the coordinator -> a higher term by another member seen in the DHT
  handoff   SIGTERM of the (new) coordinator -> its successor's term seen in the DHT
and prints medians. The machine is shared: quote ratios and medians, not single runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.commands.demo_run import SwarmProcess, child_env  # noqa: E402
from swarm.control import observer  # noqa: E402
from swarm.uri import parse  # noqa: E402


async def _wait(node, join, pred, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            view = await observer.observe(node, join)
            if pred(view):
                return view
        except Exception:  # noqa: BLE001,S110 - not in the DHT yet
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError("no change seen")


def one_round(workers: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-control-"))
    env = child_env()
    procs: dict[str, SwarmProcess] = {}
    try:
        procs["pub"] = SwarmProcess("pub", ["publish", "--name", "bench", "--owner-key",
                                            f"soft:{root / 'o.key'}", "--backend", "numpy"],
                                    root, env)
        uri = procs["pub"].first_stdout_line(90)
        starts = {}
        for i in range(workers):
            starts[f"w{i}"] = time.monotonic()
            procs[f"w{i}"] = SwarmProcess(f"w{i}", ["join", uri, "--yes", "--backend", "numpy",
                                                    "--threads", "1"], root, env)
        peers = {n: p.wait_for("peer: ", 90).split()[1] for n, p in procs.items()}
        join = [time.monotonic() - starts[n] for n in starts]
        joined = [float(procs[n].wait_for("joined swarm", 90).split(" in ")[1].split(" s")[0])
                  for n in starts]

        async def scenario():
            j = parse(uri)
            async with observer.dht_observer(j) as node:
                v = await _wait(node, j, lambda v: len(v.members) == len(peers)
                                and v.coordinator is not None, 60)
                name = next(n for n, p in peers.items() if p == str(v.coordinator))
                t0 = time.monotonic()
                procs[name].stop(signal.SIGKILL)
                v2 = await _wait(node, j, lambda x: x.state and x.state.term > v.state.term
                                 and str(x.coordinator) != peers[name], 30)
                failover = time.monotonic() - t0
                name2 = next(n for n, p in peers.items() if p == str(v2.coordinator))
                t1 = time.monotonic()
                procs[name2].stop(signal.SIGTERM)
                await _wait(node, j, lambda x: x.state and x.state.term > v2.state.term, 30)
                return failover, time.monotonic() - t1

        failover, handoff = asyncio.run(scenario())
        return {"join": statistics.median(join), "joined": statistics.median(joined),
                "failover": failover, "handoff": handoff}
    finally:
        for p in procs.values():
            p.stop(signal.SIGKILL)
            p.popen.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rounds = [one_round(args.workers) for _ in range(args.rounds)]
    keys = ("join", "joined", "failover", "handoff")
    table = {k: {"median": statistics.median(r[k] for r in rounds),
                 "min": min(r[k] for r in rounds), "max": max(r[k] for r in rounds)}
             for k in keys}
    if args.json:
        print(json.dumps({"rounds": rounds, "summary": table}, indent=1))
        return 0
    print(f"control plane on loopback, {args.workers} workers + publisher, "
          f"{args.rounds} rounds (seconds)")
    print(f"{'measure':<10}{'median':>9}{'min':>9}{'max':>9}")
    for k in keys:
        t = table[k]
        print(f"{k:<10}{t['median']:>9.3f}{t['min']:>9.3f}{t['max']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
