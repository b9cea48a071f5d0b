"""WebRTC across NATs on the testbed of tests/system/nat.py (needs root, iptables, coturn):
every pair of {public, cone NAT, symmetric NAT} hosts, with and without a TURN server, each
pair in its own fresh namespaces: connection success, setup time, round trip and one-way
throughput (64 KiB messages) over the path ICE chose. Medians over --runs.

    sudo python bench/nat.py [--runs 3] [--mb 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.system.nat import NatNet, unavailable  # noqa: E402
from tests.system.rtc_peer import run_pair  # noqa: E402

KINDS = ("public", "cone", "symmetric")


def _host(net: NatNet, kind: str):
    if kind == "public":
        return net.public_host()
    return net.behind(net.router(kind, symmetric=kind == "symmetric"))


def cell(a: str, b: str, turn: bool, runs: int, mb: int, timeout: float) -> dict:
    results = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            net = NatNet(Path(tmp))
            try:
                ice = net.start_turn().ice_servers() if turn else None
                results.append(run_pair(_host(net, a), _host(net, b), Path(tmp), ice, mb,
                                        timeout))
            finally:
                net.close()
    ok = [r for r in results if r["ok"]]
    row = {"dialer": a, "answerer": b, "turn": turn, "connected": f"{len(ok)}/{runs}"}
    if ok:
        row.update(path=statistics.mode(r["path"] for r in ok),
                   setup_ms=statistics.median(r["setup_ms"] for r in ok),
                   rtt_ms=statistics.median(r["rtt_ms"] for r in ok),
                   mb_s=statistics.median(r["mb_s"] for r in ok))
    else:
        row.update(path="-", error=results[-1].get("error", "?"))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=10.0, help="ICE give-up time, s")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    why = unavailable()
    if why:
        print(f"bench/nat.py: {why}", file=sys.stderr)
        return 2
    rows = [cell(a, b, turn, args.runs, args.mb, args.timeout)
            for turn in (False, True) for i, a in enumerate(KINDS) for b in KINDS[i:]]
    if args.json:
        print(json.dumps({"results": rows, "meta": vars(args)}))
        return 0
    cols = ["dialer", "answerer", "turn", "connected", "path", "setup_ms", "rtt_ms", "mb_s"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.1f}" if isinstance(r.get(c), float) else str(r.get(c, "-"))
                         for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
