"""Control-plane timings on loopback: join, failover after SIGKILL, handoff after SIGTERM.

    python bench/control.py [--rounds 3] [--trials 10] [--workers 3] [--json]

Each round starts a fresh swarm (`swarm publish` + N `swarm join` processes), measures
  join      process start -> `peer:` line (imports, benchmark, DHT, charter, control plane)
  joined    the member's own figure: node up -> charter verified and control plane running
  failover  SIGKILL of the coordinator -> a higher term by another member seen in the DHT
            (an observer node in this process, polling)
  handoff   SIGTERM of the (new) coordinator -> its successor's term seen in the DHT
and prints medians. Each CLI trial (issue 48's failover as a user sees it) starts a fresh
swarm the same way, waits until every member's own view holds all members, runs
`swarm status --json` once from an observer data dir (which then
remembers the members), SIGKILLs the coordinator and runs `swarm status --json` from that
data dir back to back until one names another coordinator at a higher term:
  cli       SIGKILL -> that `swarm status` process's output
  claim     the winner's own figure: its claim's reads (the CAS, catching up) and put
  rounds    claims it took (new term - old term: each failed claim burns one)
  suspected members that logged "suspecting it" of the member that went on to win
(claims that timed out or failed are listed with --json, and on stderr as each trial ends)
The machine is shared: quote ratios and medians, not single runs. The processes keep
their bytecode in a temporary PYTHONPYCACHEPREFIX, as an installed swarm has it: with
PYTHONDONTWRITEBYTECODE (set on the project's CI machines) each `swarm status` compiled ~70
modules from source, about a quarter of its run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
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
    procs: dict[str, _Timed] = {}
    try:
        procs["pub"] = _Timed("pub", ["publish", "--name", "bench", "--owner-key",
                                      f"soft:{root / 'o.key'}", "--backend", "numpy", "-v"],
                              root, env)
        uri = procs["pub"].first_stdout_line(90)
        starts = {}
        for i in range(workers):
            starts[f"w{i}"] = time.monotonic()
            procs[f"w{i}"] = _Timed(f"w{i}", ["join", uri, "--yes", "--backend", "numpy",
                                              "--threads", "1", "-v"], root, env)
        peers = {n: p.wait_for("peer: ", 90).split()[1] for n, p in procs.items()}
        join = [time.monotonic() - starts[n] for n in starts]
        joined = [float(procs[n].wait_for("joined swarm", 90).split(" in ")[1].split(" s")[0])
                  for n in starts]
        # as the CLI trials: else a member that joined a moment ago may still wait out its
        # start-up grace (Timing.startup, 4 s): all 3 rounds measured 3.9-4.2 s failover
        _wait_views(procs, len(peers), 60)

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


class _Timed(SwarmProcess):
    """A swarm process whose stderr lines are kept with the time they arrived."""

    def _pump(self, stream) -> None:
        self.timed: list[tuple[float, str]] = []
        for line in stream:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.timed.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()


def _status(uri: str, data_dir: Path, env: dict) -> dict | None:
    """One `swarm status --json` run, as a user types it (None when it failed)."""
    out = subprocess.run([sys.executable, "-P", "-m", "swarm", "status", "--json", uri,
                          "--data-dir", str(data_dir)], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def _wait_views(procs: dict[str, _Timed], count: int, timeout: float) -> None:
    """Until every member's own view ("N members in view") holds all ``count`` members: a
    member that joined a moment before the SIGKILL may not list the last one yet, and the
    failover it then runs is a join race (two claims of one term were seen), not the one
    issue 48 measures."""
    def settled(p: _Timed) -> bool:
        with p.cond:
            seen = [int(m.group(1)) for line in p.lines
                    if (m := re.search(r"(\d+) members in view", line))]
        return bool(seen) and seen[-1] == count

    deadline = time.monotonic() + timeout
    while not all(settled(p) for p in procs.values()):
        if time.monotonic() > deadline:
            raise TimeoutError("the members' views never held every member")
        time.sleep(0.05)


def cli_trial(workers: int, logs: Path | None = None) -> dict:
    """Issue 48's failover: SIGKILL the coordinator, `swarm status --json` until it names
    another coordinator at a higher term. ``logs``: each process's stderr goes there, each
    line with its time after the SIGKILL (``NAME.log``)."""
    root = Path(tempfile.mkdtemp(prefix="bench-control-cli-"))
    env = child_env()
    procs: dict[str, _Timed] = {}
    t0 = time.monotonic()  # the SIGKILL's time once it is sent: the logs count from it
    try:
        procs["pub"] = _Timed("pub", ["publish", "--name", "bench", "--owner-key",
                                      f"soft:{root / 'o.key'}", "--backend", "numpy", "-v"],
                              root, env)
        uri = procs["pub"].first_stdout_line(90)
        for i in range(workers):
            procs[f"w{i}"] = _Timed(f"w{i}", ["join", uri, "--yes", "--backend", "numpy",
                                              "--threads", "1", "-v"], root, env)
        peers = {n: p.wait_for("peer: ", 90).split()[1] for n, p in procs.items()}
        for n in peers:
            if n != "pub":
                procs[n].wait_for("joined swarm", 90)
        _wait_views(procs, len(peers), 60)
        obs = root / "observer"
        deadline = time.monotonic() + 60
        while True:
            v = _status(uri, obs, env)
            if v is not None and v["coordinator"] and len(v["members"]) == len(peers):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the swarm never showed all members: {v}")
        old, term = v["coordinator"], v["term"]
        name = next(n for n, p in peers.items() if p == old)
        t0 = time.monotonic()
        procs[name].stop(signal.SIGKILL)
        polls = []
        while True:
            s0 = time.monotonic()
            v2 = _status(uri, obs, env)
            polls.append(time.monotonic() - s0)
            if v2 is not None and v2["coordinator"] not in (None, old) and v2["term"] > term:
                break
            if time.monotonic() > t0 + 60:
                raise TimeoutError("no new coordinator in 60 s")
        cli = time.monotonic() - t0
        winner = next(n for n, p in peers.items() if p == v2["coordinator"])
        short = v2["coordinator"][:8]
        claim = None
        for _, line in procs[winner].timed:
            m = re.search(r"claim of term (\d+) stored in ([\d.]+) s", line)
            if m and int(m.group(1)) == v2["term"]:
                claim = float(m.group(2))
        failed = [line.split("swarm.control: ")[-1] for n, p in procs.items() if n != name
                  for at, line in p.timed if at > t0
                  and re.search(r"claim of term \d+ (timed out|failed)", line)]
        suspected = sum(any(f"no heartbeat from {short}" in line and at > t0
                            for at, line in p.timed)
                        for n, p in procs.items() if n not in (name, winner))
        return {"cli": cli, "claim": claim, "rounds": v2["term"] - term,
                "suspected": suspected, "failed": failed, "status_s": statistics.median(polls),
                "polls": len(polls)}
    finally:
        for p in procs.values():
            p.stop(signal.SIGKILL)
            p.popen.wait(10)
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            for n, p in procs.items():
                (logs / f"{n}.log").write_text("".join(f"{at - t0:+9.3f} {line}\n"
                                                       for at, line in p.timed))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=10,
                    help="CLI failover trials (0: none)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--logs", type=Path, default=None,
                    help="keep each CLI trial's process logs under LOGS/trial-N/")
    args = ap.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # child_env() copies os.environ
    os.environ.setdefault("PYTHONPYCACHEPREFIX", tempfile.mkdtemp(prefix="bench-control-pyc-"))
    rounds = [one_round(args.workers) for _ in range(args.rounds)]
    trials = []
    for i in range(args.trials):
        trials.append(cli_trial(args.workers,
                                args.logs / f"trial-{i + 1}" if args.logs else None))
        print(f"trial {i + 1}: {trials[-1]}", file=sys.stderr, flush=True)
    keys = ("join", "joined", "failover", "handoff")
    table = {k: {"median": statistics.median(r[k] for r in rounds),
                 "min": min(r[k] for r in rounds), "max": max(r[k] for r in rounds)}
             for k in keys} if rounds else {}
    cli = {}
    if trials:
        times = [t["cli"] for t in trials]
        cli = {"median": statistics.median(times), "max": max(times),
               "one_round": sum(t["rounds"] == 1 for t in trials), "trials": len(trials)}
    if args.json:
        print(json.dumps({"rounds": rounds, "summary": table, "cli_trials": trials,
                          "cli": cli}, indent=1))
        return 0
    if rounds:
        print(f"control plane on loopback, {args.workers} workers + publisher, "
              f"{args.rounds} rounds, in-process observer (seconds)")
        print(f"{'measure':<10}{'median':>9}{'min':>9}{'max':>9}")
        for k in keys:
            t = table[k]
            print(f"{k:<10}{t['median']:>9.3f}{t['min']:>9.3f}{t['max']:>9.3f}")
    if trials:
        print(f"\nfailover as `swarm status --json` shows it, {len(trials)} CLI trials "
              "(seconds; claim: the winner's claim; status: one status run)")
        print(f"{'trial':<7}{'cli':>8}{'claim':>8}{'rounds':>8}{'suspected':>11}"
              f"{'status':>8}{'polls':>7}")
        for i, t in enumerate(trials, 1):
            claim = f"{t['claim']:.2f}" if t["claim"] is not None else "-"
            print(f"{i:<7}{t['cli']:>8.2f}{claim:>8}{t['rounds']:>8}{t['suspected']:>11}"
                  f"{t['status_s']:>8.2f}{t['polls']:>7}")
        inproc = f", in-process observer median {table['failover']['median']:.2f} s" \
            if rounds else ""
        print(f"cli failover: median {cli['median']:.2f} s, max {cli['max']:.2f} s, one claim "
              f"round in {cli['one_round']} of {cli['trials']}{inproc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
