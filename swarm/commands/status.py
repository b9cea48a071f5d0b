"""`swarm status`: a swarm as seen from the DHT (owner, coordinator, term, members, running
jobs, blocks)."""

from __future__ import annotations

import argparse
import asyncio
import json

from swarm.commands._network import add_network_options

HELP = "show a swarm's owner, coordinator and term, members, running jobs and blocklist"
DESCRIPTION = """\
Joins the DHT as an observer (no compute, no membership) and reports the verified charter's
owner (hardware-backed or not), the coordinator and its term, the live members (PeerId,
TFLOPS, health, role, link kind, tasks queued or running) with the running jobs per
requester, and the blocklist. --json prints one JSON object with the keys coordinator, term,
members [{peer_id, tflops, tasks, ...}], running_tasks, jobs [{requester, workers, tasks}],
blocked, owner.

Running work comes from the members' own announcements: a worker re-announces at most
every 2 s while its work changes (and every 40 s otherwise), so tasks and jobs are up to
about 2 s (plus one DHT round trip) stale.
"""


def configure(p: argparse.ArgumentParser) -> None:
    add_network_options(p)
    p.add_argument("uri", help="the swarm's join URI")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--reach", action="store_true",
                   help="also dial every member and show how it is reached from here: "
                   "direct (TLS), webrtc LOCAL-REMOTE (ICE path: host, srflx, prflx, relay "
                   "= TURN) signaled through members, member relay, or unreachable")


def run(args: argparse.Namespace) -> int:
    from swarm import uri
    from swarm.control import observer

    join = uri.parse(args.uri)

    async def look() -> dict:
        async with observer.dht_observer(join) as node:
            view = await observer.observe(node, join)
            data = view.to_json()
            if args.reach:
                from swarm.links.reach import probe

                how = await probe(node.key, [(r.peer_id, r.links) for r, _ in view.members],
                                  args.ice_servers, node.address[0])
                for m, (r, _) in zip(data["members"], view.members, strict=True):
                    m["reach"] = how.get(r.peer_id, "unreachable")
            return data

    data = asyncio.run(look())
    if args.json:
        print(json.dumps(data, indent=1, sort_keys=True))
        return 0
    own = data["owner"]
    print(f"swarm {data['name']!r} ({data['swarm'][:12]})")
    print(f"owner key {own['fingerprint'][:12]}: "
          f"{'hardware-backed' if own['hardware_backed'] else 'NOT hardware-backed'} "
          f"({own['attestation']} attestation)")
    if data["admins"]:
        print("admins: " + ", ".join(a[:12] for a in data["admins"]))
    coord = data["coordinator"]
    print(f"coordinator: {coord[:12] if coord else 'none'}  term {data['term']}")
    print(f"{'peer':<14}{'TFLOPS':>9}  {'role':<12}{'load':>6}  {'link':<5}{'tasks':>6}")
    for m in data["members"]:
        load = m["health"]["load"]
        print(f"{m['peer_id'][:12]:<14}{m['tflops']:>9.4f}  {m['role']:<12}"
              f"{'-' if load is None else f'{load:.2f}':>6}  {m['link']:<5}{m['tasks']:>6}"
              + (f"  {m['reach']}" if "reach" in m else ""))
    print(f"running tasks: {data['running_tasks']}")
    for j in data["jobs"]:
        print(f"  job of {j['requester'][:12]}: {j['tasks']} tasks on "
              + ", ".join(w[:12] for w in j["workers"]))
    if data["blocked"]:
        print("blocked:")
        for b in data["blocked"]:
            print(f"  {b['peer_id'][:12]}  by {b['by']}: {b['reason'] or '-'}")
    return 0
