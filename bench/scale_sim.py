"""Issue 19 (b): the control plane of 100, 300 and 1,000 members, simulated in one process.

Every member runs the real Controller with real keys and signatures; the clock, the network
and the DHT are modelled (see :mod:`swarm.testing.sim`). Per swarm size it prints election
convergence from a cold start and after the coordinator dies, control traffic per member
per second (median and max; the coordinator apart) by kind, and how long a block and a
charter change take to reach every member, all in simulated seconds; wall time too.

    python bench/scale_sim.py [--members 100,300,1000] [--adapter poll|sync|both] [--json]
                              [--plot docs/img/scale_sim.png] [--from-json rows.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.node import NodeConfig  # noqa: E402
from swarm.testing.sim import KINDS, adapters, scenario  # noqa: E402


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _kb(v: float) -> str:
    return f"{v / 1000:.1f}"


def table(rows: list[dict]) -> str:
    """Side by side: one line per (adapter, members)."""
    head = ("adapter members | cold s  failover s  block s  charter s | member KB/s med  mean  "
            "max msgs/s med | coord KB/s msgs/s | " + "  ".join(f"{k} med" for k in KINDS)
            + " | wall s")
    out = [head, "-" * len(head)]
    for r in rows:
        t = r.get("traffic") or {}
        tot = t.get("total", {})
        out.append(
            f"{r['adapter']:>7} {r['members']:>7} | {_s(r.get('cold_start_s')):>6} "
            f"{_s(r.get('failover_s')):>11} {_s(r.get('block_s')):>8} "
            f"{_s(r.get('charter_s')):>10} | {_kb(tot.get('bytes_median', 0)):>15} "
            f"{_kb(tot.get('bytes_mean', 0)):>5} {_kb(tot.get('bytes_max', 0)):>6} "
            f"{tot.get('msgs_median', 0):>10.1f} | "
            f"{_kb(tot.get('coord_bytes', 0)):>10} {tot.get('coord_msgs', 0):>6.0f} | "
            + "  ".join(f"{_kb(t.get(k, {}).get('bytes_median', 0)):>{len(k) + 4}}"
                        for k in KINDS)
            + f" | {r.get('wall_s', 0):>6.1f}")
    return "\n".join(out)


def markdown(rows: list[dict]) -> str:
    """The figures as markdown tables (docs/benchmarks.md), adapters side by side."""
    def row(r: dict) -> str:
        t = r.get("traffic") or {}
        tot, hb, mem = t.get("total", {}), t.get("heartbeat", {}), t.get("membership", {})
        return (f"| {r['adapter']} | {r['members']} | {_s(r.get('cold_start_s'))} | "
                f"{_s(r.get('failover_s'))} | {_s(r.get('block_s'))} | "
                f"{_s(r.get('charter_s'))} | {_kb(tot.get('bytes_median', 0))} | "
                f"{_kb(tot.get('bytes_mean', 0))} | {_kb(tot.get('bytes_max', 0))} | "
                f"{tot.get('msgs_median', 0):.0f} | {_kb(hb.get('bytes_median', 0))} | "
                f"{_kb(mem.get('bytes_median', 0))} | {_kb(tot.get('coord_bytes', 0))} | "
                f"{tot.get('coord_msgs', 0):.0f} | {r.get('wall_s', 0):.0f} |")
    head = ("| adapter | members | cold start s | failover s | block s | charter s | "
            "member KB/s median | mean | max | member msgs/s median | heartbeat KB/s | "
            "membership KB/s | coordinator KB/s | coordinator msgs/s | wall s |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    order = sorted(rows, key=lambda r: (r["members"], r["adapter"]))
    return "\n".join([head] + [row(r) for r in order])


def plot(rows: list[dict], path: Path) -> None:
    """Each figure against the member count, one line per adapter (needs matplotlib, the
    ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (traffic, times) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in dict.fromkeys(r["adapter"] for r in rows):
        mine = sorted((r for r in rows if r["adapter"] == name and r.get("traffic")),
                      key=lambda r: r["members"])
        n = [r["members"] for r in mine]
        tot = [r["traffic"]["total"] for r in mine]
        traffic.plot(n, [t["bytes_median"] / 1000 for t in tot], "o-",
                     label=f"{name}: member median")
        traffic.plot(n, [t["bytes_max"] / 1000 for t in tot], "o:", label=f"{name}: member max")
        traffic.plot(n, [t["coord_bytes"] / 1000 for t in tot], "o--",
                     label=f"{name}: coordinator")
        for key, style in (("cold_start_s", "o-"), ("failover_s", "s--"), ("block_s", "^:"),
                           ("charter_s", "d-.")):
            times.plot(n, [r.get(key) if r.get(key) is not None else float("nan")
                           for r in mine], style, label=f"{name}: {key[:-2]}")
    for ax, title, unit in ((traffic, "control traffic per node", "KB/s (log)"),
                            (times, "to every member (simulated)", "s")):
        ax.set_xscale("log")
        ax.set_xlabel("members (log)", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=6)
    traffic.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", default="100,300,1000",
                    help="comma-separated swarm sizes (default 100,300,1000)")
    ap.add_argument("--adapter", default="both", choices=[*adapters(), "both"],
                    help="refresh policy: today's polling, the sync core, or both")
    ap.add_argument("--window", type=float, default=300.0,
                    help="simulated seconds of steady traffic measured (default 300: ten "
                         "periods of the sync core's 30 s safety net at 20 members)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loss", type=float, default=0.0,
                    help="share of control messages lost (default 0)")
    ap.add_argument("--churn", type=float, default=0.0,
                    help="members joining per minute during the window (default 0)")
    ap.add_argument("--latency", type=float, default=0.02,
                    help="one-way latency in s, plus up to 30 ms of jitter (default 0.02)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--plot", type=Path, help="also draw the figures into this PNG")
    ap.add_argument("--from-json", type=Path, help="render rows saved by --json; run nothing")
    ap.add_argument("--markdown", action="store_true", help="with --from-json: markdown")
    args = ap.parse_args(argv)
    if args.from_json:
        rows = json.loads(args.from_json.read_text())
        print(markdown(rows) if args.markdown else table(rows))
        if args.plot:
            plot(rows, args.plot)
        return 0
    logging.getLogger("swarm").setLevel(logging.ERROR)  # thousands of expected failovers
    sizes = [int(x) for x in args.members.split(",") if x.strip()]
    names = list(adapters()) if args.adapter == "both" else [args.adapter]
    rows = []
    for name in names:
        for n in sizes:
            rows.append(scenario(n, seed=args.seed, window=args.window,
                                 adapter=adapters()[name], loss=args.loss,
                                 latency=args.latency, churn=args.churn,
                                 announce_ttl=NodeConfig.announce_ttl))
            if not args.json:
                print(table(rows[-1:]).splitlines()[-1] if len(rows) > 1 else table(rows),
                      flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
