"""DHT benchmark: N nodes in one process on loopback.

Measures put and get latency (median, p99), RPCs per lookup, and the share of gets that find
the newest value before and after killing 30% of the nodes. Prints a table (``--json`` for
machine-readable output). Everything shares one event loop and one CPU, so latencies include
the other nodes' work: compare runs on the same machine, not against a real network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dht import DHTNode  # noqa: E402
from identity import PeerKey  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(coro):
    t0 = time.perf_counter()
    result = await coro
    return time.perf_counter() - t0, result


async def _batched(factories, concurrency: int):
    out = []
    for i in range(0, len(factories), concurrency):
        out += await asyncio.gather(*(_timed(f()) for f in factories[i:i + concurrency]))
    return out


def _rpcs(nodes) -> tuple[int, int]:
    return sum(n.stats.lookups for n in nodes), sum(n.stats.lookup_rpcs for n in nodes)


async def run(n: int, items: int, gets: int, concurrency: int, churn: float,
              rpc_timeout: float, seed: int) -> dict:
    rng = random.Random(seed)
    nodes = [DHTNode(rpc_timeout=rpc_timeout) for _ in range(n)]
    report: dict = {"nodes": n, "items": items, "gets": gets, "concurrency": concurrency,
                    "churn": churn, "rpc_timeout_s": rpc_timeout}
    try:
        t0 = time.perf_counter()
        for node in nodes:
            await node.listen()
        for node in nodes[1:]:
            await node.bootstrap([rng.choice(nodes[: nodes.index(node)]).address])
        report["bootstrap_s"] = time.perf_counter() - t0

        keys = [PeerKey.generate() for _ in range(items)]
        before = _rpcs(nodes)
        puts = await _batched([lambda k=k: rng.choice(nodes).put_mutable(k, b"v" * 100)
                               for k in keys], concurrency)
        after = _rpcs(nodes)
        report["put"] = _summary([t for t, _ in puts])
        report["put"]["rpcs_per_lookup"] = (after[1] - before[1]) / max(1, after[0] - before[0])

        async def gets_on(alive):
            b = _rpcs(alive)
            plan = [(rng.choice(alive), rng.choice(keys)) for _ in range(gets)]
            results = await _batched([lambda a=a, k=k: a.get_mutable(k.public_bytes)
                                      for a, k in plan], concurrency)
            e = _rpcs(alive)
            ok = sum(1 for _, r in results if r is not None and r.value == b"v" * 100)
            summary = _summary([t for t, _ in results])
            summary["success"] = ok / len(results)
            summary["rpcs_per_lookup"] = (e[1] - b[1]) / max(1, e[0] - b[0])
            return summary

        report["get"] = await gets_on(nodes)
        doomed = rng.sample(nodes, int(churn * n))
        await asyncio.gather(*(d.stop() for d in doomed))
        alive = [x for x in nodes if x not in doomed]
        report["get_after_churn"] = await gets_on(alive)
        report["get_after_churn_again"] = await gets_on(alive)
    finally:
        await asyncio.gather(*(x.stop() for x in nodes))
    return report


def _summary(latencies: list[float]) -> dict:
    return {"median_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * _pct(latencies, 0.99), "count": len(latencies)}


def print_table(r: dict) -> None:
    print(f"DHT benchmark: {r['nodes']} nodes in one process on loopback, "
          f"{r['concurrency']} operations in flight, rpc timeout {r['rpc_timeout_s']} s")
    print(f"bootstrap of all nodes: {r['bootstrap_s']:.1f} s")
    head = f"{'operation':<34}{'count':>6}{'median ms':>11}{'p99 ms':>9}{'RPCs/lookup':>13}{'success':>9}"
    print(head)
    print("-" * len(head))
    rows = [("put_mutable", r["put"]), ("get_mutable", r["get"]),
            (f"get after {int(r['churn'] * 100)}% killed (1st pass)", r["get_after_churn"]),
            (f"get after {int(r['churn'] * 100)}% killed (2nd pass)", r["get_after_churn_again"])]
    for name, s in rows:
        success = f"{100 * s['success']:.1f}%" if "success" in s else "-"
        print(f"{name:<34}{s['count']:>6}{s['median_ms']:>11.1f}{s['p99_ms']:>9.1f}"
              f"{s['rpcs_per_lookup']:>13.1f}{success:>9}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--items", type=int, default=50)
    p.add_argument("--gets", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--churn", type=float, default=0.3)
    p.add_argument("--rpc-timeout", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args.nodes, args.items, args.gets, args.concurrency, args.churn,
                             args.rpc_timeout, args.seed))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
