"""`swarm join`: lend this machine to a swarm until stopped."""

from __future__ import annotations

import argparse
import sys

from swarm.commands._common import (
    INTERRUPTED_CODE,
    add_json_option,
    add_model_option,
    chat_models,
    claim_data_dir,
    interrupted_exit,
    left_event,
    member_event,
    memory_size,
    print_json,
)

HELP = "join a swarm by its magnet URI and serve compute tasks until stopped"
DESCRIPTION = """\
Asks for consent ("Always join" is remembered for this swarm; --yes joins non-interactively),
benchmarks the compute backends, announces this machine to the swarm and serves tasks until
SIGTERM/SIGINT, then leaves gracefully: the running task finishes, queued ones go back, and
if this machine coordinates the swarm it hands the role to the healthiest member first.
Prints `peer: <PeerId>` on stderr once joined. Identity and consent live in the data dir,
which it locks while it runs: a second instance on the default dir gets its own (and so its
own identity; `data dir: PATH` on stderr says which). Exit status: 0 after SIGTERM, 130 after
SIGINT (Ctrl-C), 3 when kicked or blocked.
"""

def configure(p: argparse.ArgumentParser) -> None:
    from swarm.commands._network import add_network_options, rate

    add_network_options(p)
    p.add_argument("--relay-data", type=rate, default=0, metavar="RATE",
                   help="carry other members' links when they have no other path (behind "
                   "NATs, no TURN), at most RATE bytes/s, e.g. 2M (default: off)")
    p.add_argument("uri", help="the swarm's join URI (magnet:?xs=urn:btpk:...)")
    p.add_argument("--yes", action="store_true", help="consent without asking (scripts)")
    p.add_argument("--http", metavar="HOST:PORT",
                   help="also serve browser tabs: join page (link and QR code printed), "
                        "tab signaling and the live status panel (port 0: any free one)")
    add_model_option(p)
    p.add_argument("--backend", default="auto", choices=["auto", "wgpu", "numpy"],
                   help="compute backend (auto: the fastest that validates)")
    p.add_argument("--port", type=int, default=0, help="DHT UDP port (default: any free)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind and announce")
    p.add_argument("--max-memory", type=memory_size, default=4 << 30, metavar="SIZE",
                   help="cap on cached task data, e.g. 2G (default 4G)")
    p.add_argument("--threads", type=int, default=None, help="BLAS threads for numpy")
    p.add_argument("--no-coordinate", action="store_true",
                   help="serve tasks but never take the coordinator role")
    add_json_option(p, 'one object per line: {"event": "joined", "peer", "role", '
                       '"gflops", ...} once joined, {"event": "left", "reason", "exit_code"} '
                       'at exit')


def run(args: argparse.Namespace) -> int:
    from swarm import loop as swarm_loop
    from swarm import uri
    from swarm.commands import consent
    from swarm.commands._network import bootstrap_addresses
    from swarm.processes import member

    join = uri.parse(args.uri).with_peers(bootstrap_addresses(args))
    claim_data_dir(args)
    consent.obtain(args.data_dir, join.swarm_id, join.name or join.swarm_id.hex()[:12],
                   yes=args.yes)

    def ready(r: member.Ready) -> None:
        print(f"peer: {r.node.peer_id}", file=sys.stderr, flush=True)
        print(f"joined swarm {join.name!r} in {r.joined_in:.2f} s as {r.control.role.value}; "
              f"{r.node.tflops * 1000:.1f} GFLOPS", file=sys.stderr, flush=True)
        if args.json:
            print_json(member_event("joined", r))
        if r.web:
            from swarm.web.server import print_join_link

            print_join_link(r.web, sys.stderr)

    http = None
    if args.http:
        from swarm.web.server import parse_http

        http = parse_http(args.http)
    models = chat_models(args)
    reason = swarm_loop.run(member.serve(join, args.data_dir, backend=args.backend,
                                         port=args.port, host=args.host, threads=args.threads,
                                         ready=ready, store_capacity=args.max_memory,
                                         coordinate=not args.no_coordinate,
                                         ice_servers=args.ice_servers,
                                         relay_data=args.relay_data, http=http,
                                         models=models))
    print(f"swarm join: left ({reason})", file=sys.stderr)
    code = 0
    if reason.startswith(("kicked", "this peer is blocked")):
        from swarm.errors import EXIT_REFUSED

        code = EXIT_REFUSED
    if args.json:
        print_json(left_event(reason, INTERRUPTED_CODE if reason == member.INTERRUPTED else code))
    interrupted_exit(reason)
    return code
