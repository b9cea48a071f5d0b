"""Peer-link throughput and round trip, between two processes on loopback.

Starts ``python -m swarm.links.echo`` as the far end (a separate process, as between two
swarm peers), connects to it over TLS and over WebRTC (swarm-tuned and standard), and
measures one-way throughput of 4 MiB arrays (sent as Bulk, acknowledged by one Flush at
the end) and the median round trip of a small message echoed back. The ``tls`` row is what
two hosts see (shared memory off, ``SWARM_SHM=0``); ``tls+shm`` is two peers on one host,
whose large arrays go through shared memory.

    python bench/transport.py            # table
    python bench/transport.py --json     # JSON with webrtc_mb_s, tls_mb_s, tls_rtt_ms, ...

Figures on a shared or small machine are noisy: compare medians and ratios, not single runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from identity.keys import PeerKey  # noqa: E402
from swarm.links import tls, webrtc  # noqa: E402
from swarm.links.base import PeerLink  # noqa: E402
from swarm.links.echo import Echo, throughput  # noqa: E402

MESSAGE = 4 << 20


@contextlib.contextmanager
def far_end(kind: str, *extra: str, shm: bool = True):
    """The echo peer in its own process; yields (PeerId, port)."""
    key = PeerKey.generate()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if not shm:
        env["SWARM_SHM"] = "0"  # it offers none: the link stays on TLS
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm.links.echo", kind, "--seed", key.seed().hex(), *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        info = json.loads(proc.stdout.readline())
        yield key.peer_id, info["port"]
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def round_trips(link: PeerLink, n: int) -> list[float]:
    """Milliseconds for small request/response exchanges through the far end's app."""
    msg = Echo("ping", [np.zeros(16, dtype=np.float32)])
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await link.send(msg)
        await link.recv()
        out.append((time.perf_counter() - start) * 1e3)
    return out


async def measure(link: PeerLink, total: int, runs: int, pings: int) -> dict[str, float]:
    rates = [await throughput(link, total, MESSAGE) for _ in range(runs)]
    rtts = await round_trips(link, pings)
    await link.close()
    return {"mb_s": statistics.median(rates), "mb_s_min": min(rates), "mb_s_max": max(rates),
            "rtt_ms": statistics.median(rtts),
            "rtt_p90_ms": statistics.quantiles(rtts, n=10)[-1]}


async def bench_tls(args: argparse.Namespace, child: list[str], shm: bool = False
                    ) -> dict[str, float]:
    me = PeerKey.generate()
    with far_end("tls", *child, shm=shm) as (peer, port):
        start = time.perf_counter()
        link = await tls.connect(me, "127.0.0.1", port, expect=peer)
        setup = (time.perf_counter() - start) * 1e3
        assert (link.shm is not None) == shm
        return {**await measure(link, args.mb << 20, args.runs, args.pings), "setup_ms": setup}


async def bench_webrtc(args: argparse.Namespace, child: list[str], tuned: bool,
                       total: int) -> dict[str, float]:
    me = PeerKey.generate()
    signaler = await webrtc.UDPSignaler.bind(me)
    endpoint = webrtc.WebRTCEndpoint(me, signaler, host_addresses=["127.0.0.1"], tuned=tuned)
    try:
        with far_end("webrtc", *child, *([] if tuned else ["--standard"])) as (peer, port):
            start = time.perf_counter()
            link = await endpoint.connect(peer, ("127.0.0.1", port))
            setup = (time.perf_counter() - start) * 1e3
            assert link.tuned == tuned
            return {**await measure(link, total, args.runs, args.pings), "setup_ms": setup}
    finally:
        await endpoint.close()
        signaler.close()


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    child = [] if args.no_uvloop else ["--uvloop"]
    results = {"tls": await bench_tls(args, child),
               "tls+shm": await bench_tls(args, child, shm=True),
               "webrtc": await bench_webrtc(args, child, True, args.mb << 20)}
    if not args.skip_standard:
        results["webrtc-standard"] = await bench_webrtc(args, child, False,
                                                        args.standard_mb << 20)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--mb", type=int, default=256, help="MiB per throughput run")
    parser.add_argument("--standard-mb", type=int, default=32,
                        help="MiB per run for stock (untuned) WebRTC, which is slow")
    parser.add_argument("--runs", type=int, default=3, help="throughput runs (median kept)")
    parser.add_argument("--pings", type=int, default=200, help="round trips measured")
    parser.add_argument("--no-uvloop", action="store_true", help="stock asyncio event loop")
    parser.add_argument("--skip-standard", action="store_true", help="skip stock WebRTC")
    args = parser.parse_args()
    if not args.no_uvloop:
        import uvloop
        uvloop.install()
    results = asyncio.run(run(args))
    summary = {
        "tls_mb_s": round(results["tls"]["mb_s"], 1),
        "tls_rtt_ms": round(results["tls"]["rtt_ms"], 3),
        "shm_mb_s": round(results["tls+shm"]["mb_s"], 1),
        "webrtc_mb_s": round(results["webrtc"]["mb_s"], 1),
        "webrtc_rtt_ms": round(results["webrtc"]["rtt_ms"], 3),
        "event_loop": "asyncio" if args.no_uvloop else "uvloop",
        "cpus": os.cpu_count(),
    }
    if "webrtc-standard" in results:
        summary["webrtc_standard_mb_s"] = round(results["webrtc-standard"]["mb_s"], 1)
        summary["webrtc_standard_rtt_ms"] = round(results["webrtc-standard"]["rtt_ms"], 3)
    if args.json:
        print(json.dumps({**summary, "detail": results}, indent=2))
        return
    print(f"peer links, two processes on loopback ({summary['event_loop']}, "
          f"{summary['cpus']} CPUs; medians of {args.runs} runs)")
    print(f"{'link':<16} {'MB/s':>8} {'min':>8} {'max':>8} {'RTT ms':>8} {'p90 ms':>8} "
          f"{'setup ms':>9}")
    for name, r in results.items():
        print(f"{name:<16} {r['mb_s']:>8.1f} {r['mb_s_min']:>8.1f} {r['mb_s_max']:>8.1f} "
              f"{r['rtt_ms']:>8.3f} {r['rtt_p90_ms']:>8.3f} {r['setup_ms']:>9.1f}")
    print("goals: TLS >= 400 MB/s and RTT <= 1 ms; WebRTC >= 100 MB/s and RTT <= 5 ms")


if __name__ == "__main__":
    main()
