"""Control-plane cost against the swarm's size, (a): real processes on this machine.

    python bench/scale.py [--sizes 2,4,7,13,24] [--max 13] [--window 20] [--json] [--plot PNG]
    python bench/scale.py --from-json rows.json [--plot PNG]    # re-render a saved run
    python bench/scale.py --sim [bench/scale_sim.py's flags]   # (b): 100-1,000 simulated

For each size K: `swarm publish` + K-1 `swarm join` processes (numpy backend, one BLAS
thread, a software owner key, the helpers of tests/control_support.py), then
  join      the members' own "joined swarm in X s" figure (median)
  cpu       idle CPU per node over the window, as a share of one core, from
            /proc/<pid>/stat (workers' median; the coordinator apart)
  bytes     DHT-socket bytes (in + out) per node per second over the window (control
            messages ride on the DHT socket), from each node's SWARM_STATS counters
  lookups   DHT lookups per worker per second over the window
  failover  SIGKILL of the coordinator -> a higher term by another member seen in the DHT
The machine is shared (2 cores): quote medians and ratios, not single runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.control_support import SIGKILL, SIGTERM, Cluster  # noqa: E402

SIZES = (2, 4, 7, 13, 24)
TICKS = os.sysconf("SC_CLK_TCK")
FIELDS = {"members", "join_s", "cpu_worker", "cpu_worker_max", "cpu_coordinator",
          "bytes_per_node_s", "bytes_coordinator_s", "lookups_worker_s", "failover_s"}
"""What a row holds (written by --json, read by --from-json)."""


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def counters(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def one_size(k: int, window: float, root: Path, profile: Path | None = None) -> dict:
    cluster = Cluster(root, env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                                 "MKL_NUM_THREADS": "1"})

    def stats_env(name: str) -> dict[str, str]:
        env = {"SWARM_STATS": str(root / f"{name}.stats")}
        if profile is not None and name == "w1":
            env["SWARM_PROFILE"] = str(profile / f"worker-{k}")
        return env

    try:
        pub = cluster.start("pub", "publish", "--name", "scale", "--owner-key",
                            f"soft:{root / 'owner.key'}", "--backend", "numpy",
                            env=stats_env("pub"))
        cluster.uri = pub.wait_line(lambda s: s.startswith("magnet:?"), 120, "out")
        procs = {"pub": pub}
        for i in range(1, k):
            procs[f"w{i}"] = cluster.start(f"w{i}", "join", cluster.uri, "--yes", "--backend",
                                           "numpy", "--threads", "1", env=stats_env(f"w{i}"))
        joined = [float(p.wait_line(lambda s: s.startswith("joined swarm"), 180)
                        .split(" in ")[1].split(" s")[0]) for n, p in procs.items() if n != "pub"]
        peers = {n: p.peer for n, p in procs.items()}
        obs = cluster.observer()
        st = obs.wait(lambda s: {m["peer_id"] for m in s["members"]} == set(peers.values())
                      and s["coordinator"] in peers.values(), 120 + 5 * k, f"{k} members")
        coord = next(n for n, p in peers.items() if p == st["coordinator"])
        time.sleep(3.0)  # let the joins' own traffic settle
        c0 = {n: cpu_seconds(p.popen.pid) for n, p in procs.items()}
        s0 = {n: counters(root / f"{n}.stats") for n in procs}
        t0 = time.monotonic()
        time.sleep(window)
        c1 = {n: cpu_seconds(p.popen.pid) for n, p in procs.items()}
        s1 = {n: counters(root / f"{n}.stats") for n in procs}
        span = time.monotonic() - t0
        cpu = {n: (c1[n] - c0[n]) / span for n in procs}
        rates: dict[str, dict[str, float]] = {}
        for n in procs:
            a, b = s0[n], s1[n]
            if a and b and b["t"] > a["t"]:
                dt = b["t"] - a["t"]
                rates[n] = {"bytes": (b["bytes_in"] + b["bytes_out"] - a["bytes_in"]
                                      - a["bytes_out"]) / dt,
                            "lookups": (b["lookups"] - a["lookups"]) / dt}
        workers = [n for n in procs if n != coord]
        if profile is not None and "w1" in workers:  # a graceful exit dumps the profile
            procs["w1"].signal(SIGTERM)
            procs["w1"].wait_exit(60)
        t_kill = time.monotonic()
        procs[coord].signal(SIGKILL)
        obs.wait(lambda s: s["term"] > st["term"] and s["coordinator"] != peers[coord]
                 and s["coordinator"] is not None, 60, "a new term")
        failover = time.monotonic() - t_kill
        return {
            "members": k,
            "join_s": statistics.median(joined) if joined else 0.0,
            "cpu_worker": statistics.median(cpu[n] for n in workers),
            "cpu_worker_max": max(cpu[n] for n in workers),
            "cpu_coordinator": cpu[coord],
            "bytes_per_node_s": statistics.median(r["bytes"] for r in rates.values())
            if rates else None,
            "bytes_coordinator_s": rates.get(coord, {}).get("bytes"),
            "lookups_worker_s": statistics.median(rates[n]["lookups"] for n in workers
                                                  if n in rates) if rates else None,
            "failover_s": failover,
        }
    finally:
        cluster.close()


def load(path: Path) -> list[dict]:
    """Rows saved by ``--json``; OSError or ValueError (naming the file) otherwise."""
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and FIELDS <= r.keys()
                                             for r in rows):
        raise ValueError(f"{path}: not a list of rows written by --json")
    return rows


def table(rows: list[dict], window: float | None) -> str:
    """The rows as the printed table."""
    lines = [f"idle control plane on loopback{f', {window:.0f} s window' if window else ''}; "
             "CPU as % of one core",
             f"{'members':>7} {'join s':>7} {'cpu wkr':>8} {'cpu max':>8} {'cpu crd':>8} "
             f"{'B/s node':>9} {'B/s crd':>9} {'lkp/s':>6} {'failover':>9}"]
    for r in rows:
        lines.append(
            f"{r['members']:>7} {r['join_s']:>7.2f} {100 * r['cpu_worker']:>7.1f}% "
            f"{100 * r['cpu_worker_max']:>7.1f}% {100 * r['cpu_coordinator']:>7.1f}% "
            f"{r['bytes_per_node_s'] or 0:>9.0f} {r['bytes_coordinator_s'] or 0:>9.0f} "
            f"{r['lookups_worker_s'] or 0:>6.2f} {r['failover_s']:>8.2f}s")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, before: list[dict] | None = None) -> None:
    """Idle CPU and control bytes against the member count (needs matplotlib, the ``bench``
    extra): what should stay flat for a worker, and what the coordinator pays; ``before``
    (an earlier run's rows) drawn in grey beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cpu, net) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, runs, colour in (("before: ", before, "grey"), ("", rows, None)):
        if not runs:
            continue
        runs = sorted(runs, key=lambda r: r["members"])
        n = [r["members"] for r in runs]
        kw = {"color": colour, "alpha": 0.6} if colour else {}
        cpu.plot(n, [100 * r["cpu_worker"] for r in runs], "o-", label=f"{label}worker", **kw)
        cpu.plot(n, [100 * r["cpu_coordinator"] for r in runs], "s--",
                 label=f"{label}coordinator", **kw)
        net.plot(n, [(r["bytes_per_node_s"] or 0) / 1000 for r in runs], "o-",
                 label=f"{label}per node", **kw)
        net.plot(n, [(r["bytes_coordinator_s"] or 0) / 1000 for r in runs], "s--",
                 label=f"{label}coordinator", **kw)
    for ax, title, unit in ((cpu, "idle CPU per process", "% of one core"),
                            (net, "control bytes (DHT socket)", "KB/s")):
        ax.set_xlabel("members", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)


def main() -> int:
    if "--sim" in sys.argv[1:]:  # (b): the one-process simulation, its own flags and table
        import scale_sim
        return scale_sim.main([a for a in sys.argv[1:] if a != "--sim"])
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Each size starts its own swarm (about 1 s per member to join on 2 cores, "
               "then the window, then a failover); --sim runs part (b), the simulation.")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="member counts to measure, comma-separated (default %(default)s)")
    ap.add_argument("--max", type=int, default=max(SIZES), help="skip sizes above this")
    ap.add_argument("--window", type=float, default=20.0,
                    help="seconds of idle swarm to measure CPU and bytes over (default 20)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--plot", type=Path, metavar="PNG",
                    help="also draw CPU and bytes against the member count into PNG")
    ap.add_argument("--from-json", type=Path, metavar="FILE",
                    help="render the rows saved by --json instead of measuring")
    ap.add_argument("--before", type=Path, metavar="FILE",
                    help="with --plot: an earlier run's rows (--json) drawn beside, in grey")
    ap.add_argument("--profile", type=Path, help="cProfile worker w1 into DIR/worker-K.<pid>")
    args = ap.parse_args()
    try:
        before = None if args.before is None else load(args.before)
        if args.from_json is not None:
            rows = load(args.from_json)
    except (OSError, ValueError) as exc:
        print(f"scale.py: cannot read {exc}", file=sys.stderr)
        return 2
    if args.from_json is not None:
        window = None
    else:
        logging.getLogger("kademlia").setLevel(logging.ERROR)  # the killed coordinator
        sizes = [k for k in (int(x) for x in args.sizes.split(",")) if 2 <= k <= args.max]
        rows = []
        for k in sizes:
            with tempfile.TemporaryDirectory(prefix=f"bench-scale-{k}-") as tmp:
                rows.append(one_size(k, args.window, Path(tmp), args.profile))
            if not args.json:
                print(f"  {k} members done", file=sys.stderr, flush=True)
        window = args.window
    if args.plot is not None:
        plot(rows, args.plot, before)
    print(json.dumps(rows, indent=1) if args.json else table(rows, window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
