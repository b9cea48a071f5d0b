"""`swarm status`: a swarm as seen from the DHT (owner, coordinator, term, members, running
jobs, blocks)."""

from __future__ import annotations

import argparse

from swarm.commands._common import add_json_option, print_json, print_table
from swarm.commands._network import add_network_options

HELP = "show a swarm's owner, coordinator and term, members, running jobs and blocklist"
DESCRIPTION = """\
Joins the DHT as an observer (no compute, no membership) and reports the verified charter's
owner (hardware-backed or not), the coordinator and its term, the live members (PeerId,
TFLOPS, health, role, link kind, tasks queued or running, memory offered and used) with the
running jobs per requester, which worker hosts which blocks of which model, and the
blocklist. --json prints one JSON object with the keys coordinator, term, members
[{peer_id, tflops, tasks, memory: {offered, used}, models, spans: [{model, blocks}], ...}],
running_tasks, jobs [{requester, workers, tasks}], placements [{model, spans: [{worker,
blocks: [first, last]}]}], blocked, owner, join_uri (a fresh join URI naming up to four live members that answered
just now: share it when the peers in the original URI are gone).

Running work comes from the members' own announcements: a worker re-announces at most
every 2 s while its work changes (and every 40 s otherwise), so tasks and jobs are up to
about 2 s (plus one DHT round trip) stale.
"""


def configure(p: argparse.ArgumentParser) -> None:

    add_network_options(p)
    p.add_argument("uri", help="the swarm's join URI")
    add_json_option(p, "the status")
    p.add_argument("--reach", action="store_true",
                   help="also dial every member and show how it is reached from here: "
                   "direct (TLS), webrtc LOCAL-REMOTE (ICE path: host, srflx, prflx, relay "
                   "= TURN) signaled through members, member relay, or unreachable")


def _memory(m: dict | None) -> str | None:
    if m is None:
        return None
    return f"{m['used'] / (1 << 20):.0f}/{m['offered'] / (1 << 20):.0f} MiB"


def run(args: argparse.Namespace) -> int:

    from swarm import loop as swarm_loop
    from swarm import uri
    from swarm.commands._network import (
        bootstrap_addresses,
        remember,
        unreachable,
        with_remembered,
    )
    from swarm.control import observer
    from swarm.errors import RemoteError

    join = with_remembered(uri.parse(args.uri).with_peers(bootstrap_addresses(args)),
                           args.data_dir)

    async def look() -> dict:
        async with observer.dht_observer(join) as node:
            view = await observer.observe(node, join)
            remember(args.data_dir, join.swarm_id, view.addrs.values())
            data = view.to_json()
            data["join_uri"] = str(await observer.join_uri(node, join, view))
            if args.reach:
                from swarm.links.reach import probe

                how = await probe(node.key, [(r.peer_id, r.links) for r, _ in view.members],
                                  args.ice_servers, node.address[0])
                for m, (r, _) in zip(data["members"], view.members, strict=True):
                    m["reach"] = how.get(r.peer_id, "unreachable")
            return data

    try:
        data = swarm_loop.run(look())
    except RemoteError as exc:
        raise unreachable(exc, len(join.peers)) from None
    if args.json:
        print_json(data)
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
    reach = args.reach  # one more column: how each member is reached from here
    print_table(("peer", "TFLOPS", "role", "load", "link", "tasks", "memory used/offered")
                + (("reach",) if reach else ()), [
        (m["peer_id"][:12], f"{m['tflops']:.4f}", m["role"],
         None if m["health"]["load"] is None else f"{m['health']['load']:.2f}", m["link"],
         m["tasks"], _memory(m["memory"])) + ((m.get("reach", ""),) if reach else ())
        for m in data["members"]],
        right=("TFLOPS", "load", "tasks", "memory used/offered"))
    print(f"running tasks: {data['running_tasks']}")
    print(f"join URI: {data['join_uri']}")
    for j in data["jobs"]:
        print(f"  job of {j['requester'][:12]}: {j['tasks']} tasks on "
              + ", ".join(w[:12] for w in j["workers"]))
    for p in data["placements"]:
        print(f"model {(p['model'] or 'unnamed')[:12]}: " + ", ".join(
            f"blocks {s['blocks'][0]}-{s['blocks'][1]} on {s['worker'][:12]}"
            for s in p["spans"]))
    if data["blocked"]:
        print_table(("blocked peer", "by", "reason"),
                    [(b["peer_id"][:12], b["by"], b["reason"] or "-") for b in data["blocked"]])
    return 0
