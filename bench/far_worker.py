"""Small jobs beside a far worker: does the requester stop making them wait for it?

    python bench/far_worker.py [--delays 0 20 200] [--batches 12] [--json]

One requester, two real actor hosts over in-memory links: a near one, and one that adds
``delay`` ms to every answer (``ChaosSpec(delay_ms=...)``: a peer far away, or a browser
tab). Batches of four 192x192 matmul jobs run at a time, as ``swarm.get([...])`` does; each
batch's time is its slowest job. Prints, per delay, the median and worst batch (the first
two batches, which measure the workers, left out) and how many tasks went to the far worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import compute  # noqa: E402
from identity.keys import PeerKey  # noqa: E402
from swarm.links import memory_pair  # noqa: E402
from swarm.runtime import jobs  # noqa: E402
from swarm.runtime.chaos import ChaosSpec  # noqa: E402
from swarm.runtime.host import ActorHost  # noqa: E402
from swarm.runtime.requester import Requester  # noqa: E402

N, BATCH, WARM = 192, 4, 2


async def run(delay_ms: float, batches: int) -> dict:
    """Median and worst batch (ms) beside a worker ``delay_ms`` away, and its task count."""
    me = PeerKey.generate()
    req = Requester(me.peer_id)
    hosts, serving = [], []
    for far in (True, False):
        host = ActorHost(compute.get_backend("numpy"), store_capacity=1 << 24,
                         chaos=ChaosSpec(delay_ms=delay_ms) if far else None)
        mine, theirs = memory_pair(me, PeerKey.generate())
        serving.append(asyncio.create_task(host.serve(theirs)))
        req.attach(mine)
        hosts.append(host)
    far_peer = next(iter(req.links))
    to_far = total = 0

    def sent(peer, _msg) -> None:
        nonlocal to_far, total
        to_far += peer == far_peer
        total += 1

    rng = np.random.default_rng(0)
    b = rng.standard_normal((N, N), dtype=np.float32)
    verifier, backend = jobs.FreivaldsCache(), compute.get_backend("numpy")

    async def job() -> float:
        a = rng.standard_normal((N, N), dtype=np.float32)
        bands = jobs.plan_bands(N, N, N, workers=req.workers(), rates=req.rates,
                                busy=req.assigned)
        plan = jobs.matmul_job(a, b, workers=req.workers(), rates=req.rates, precision="f32",
                               backend=backend, verifier=verifier, bands=bands)
        t0 = time.perf_counter()
        with req.assigning(bands.owners or []):
            results, _ = await req.run(plan.calls, local=plan.local, verify=plan.verify,
                                       owners=plan.owners, timeout=60)
        np.testing.assert_allclose(plan.merge(results), a @ b, rtol=1e-3, atol=1e-3)
        return time.perf_counter() - t0

    spans = []
    try:
        for i in range(batches):
            if i == WARM:
                req.on_task_sent = sent
            spans.append(max(await asyncio.gather(*[job() for _ in range(BATCH)])))
    finally:
        await req.close()
        await asyncio.gather(*serving, return_exceptions=True)
        for host in hosts:
            await host.close()
    timed = spans[WARM:]
    return {"delay_ms": delay_ms, "median_ms": statistics.median(timed) * 1e3,
            "worst_ms": max(timed) * 1e3, "tasks_to_far": to_far, "tasks": total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays", type=float, nargs="+", default=[0.0, 20.0, 200.0],
                    help="the far worker's added latency per answer, ms")
    ap.add_argument("--batches", type=int, default=12, help="batches per delay (>= 3)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.batches <= WARM:
        ap.error(f"--batches must be more than {WARM}")
    rows = [asyncio.run(run(d, args.batches)) for d in args.delays]
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
        return
    print("| far worker's delay | median batch | worst batch | tasks to the far worker, of all |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['delay_ms']:.0f} ms | {r['median_ms']:.1f} ms | {r['worst_ms']:.1f} ms "
              f"| {r['tasks_to_far']} of {r['tasks']} |")


if __name__ == "__main__":
    main()
