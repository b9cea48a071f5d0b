"""`swarm publish`: found a swarm and serve as its first node."""

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
    open_owner_key,
    print_json,
)

HELP = "create a swarm owned by your security key, print its join URI, serve it"
DESCRIPTION = """\
Creates a swarm (or reopens the one published under the same --name from this data dir):
enrols the owner key (touch your security key), signs the charter with it, puts the
charter in the DHT, prints the join URI alone on the first line of stdout (--json: a JSON
object with it, one per line as events happen), then serves as
the swarm's first node until SIGINT/SIGTERM. Give the URI to the people who should join.
Locks its data dir while it runs (a second instance on the default dir gets its own) and
prints `data dir: PATH` on stderr. Exit status after a graceful leave: 0 on SIGTERM, 130 on
SIGINT (Ctrl-C).
"""


def configure(p: argparse.ArgumentParser) -> None:
    from swarm.commands._network import add_network_options, rate

    add_network_options(p)
    p.add_argument("--relay-data", type=rate, default=0, metavar="RATE",
                   help="carry other members' links when they have no other path (behind "
                   "NATs, no TURN), at most RATE bytes/s, e.g. 2M (default: off)")
    p.add_argument("--name", required=True, help="the swarm's name (at most 24 bytes)")
    p.add_argument("--owner-key", default="fido2", metavar="fido2|soft:PATH",
                   help="owner key: a FIDO2 security key (default), or a software key file "
                        "(not hardware-backed; for tests and demos)")
    p.add_argument("--port", type=int, default=0, help="DHT UDP port (default: any free)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind and announce")
    p.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                   help="charter policy, e.g. require_hardware=true")
    p.add_argument("--http", metavar="HOST:PORT",
                   help="also serve browser tabs: join page (link and QR code printed), "
                        "tab signaling and the live status panel (port 0: any free one)")
    add_model_option(p)
    p.add_argument("--backend", default="auto", choices=["auto", "wgpu", "numpy"])
    p.add_argument("--max-memory", type=memory_size, default=4 << 30, metavar="SIZE",
                   help="cap on what it holds for others (task data, model spans), e.g. "
                   "450M (default 4G); announced as its offer")
    add_json_option(p, 'one object per line instead of the URI: {"event": '
                       '"published", "uri", "peer", "owner", ...} once up, {"event": "left", '
                       '"reason", "exit_code"} at exit')


def _policy(items: list[str]):
    from identity import Policy
    from swarm.errors import ConfigError

    require_hardware = False
    for item in items:
        key, _, value = item.partition("=")
        if key != "require_hardware" or value.lower() not in ("true", "false"):
            raise ConfigError(f"--policy {item!r}: known policy: require_hardware=true|false")
        require_hardware = value.lower() == "true"
    return Policy(require_hardware=require_hardware)


def run(args: argparse.Namespace) -> int:

    from swarm import loop as swarm_loop
    from swarm.commands import owned
    from swarm.commands._network import bootstrap_addresses
    from swarm.members import swarm_id
    from swarm.processes import member
    from swarm.uri import JoinURI

    # every argument is checked before the data dir is claimed or a key touched
    peers = tuple(bootstrap_addresses(args))
    owned.check_name(args.name)
    policy = _policy(args.policy)
    http = None
    if args.http:
        from swarm.web.server import parse_http

        http = parse_http(args.http)
    models = chat_models(args)
    claim_data_dir(args)
    swarm = owned.load(args.data_dir, args.name)
    if swarm is None:
        auth = open_owner_key(args.owner_key, create=True)
        try:
            swarm = owned.create(args.data_dir, args.name, auth, policy)
        finally:
            auth.close()
    uri = JoinURI(swarm.swarm_key.public_bytes, swarm.charter.name, peers=peers,
                  owner=swarm.credential.fingerprint())
    pub = member.Publication(swarm.swarm_key, swarm.head, tuple(swarm.history))

    def ready(r: member.Ready) -> None:
        if args.json:
            print_json({**member_event("published", r), "owner": swarm.credential.fingerprint()
                        .hex(), "hardware_backed": swarm.credential.hardware_backed})
        else:
            print(str(r.uri), flush=True)
        print(f"peer: {r.node.peer_id}", file=sys.stderr, flush=True)
        print(f"swarm {swarm.charter.name!r} ({swarm_id(uri.pubkey).hex()[:12]}) is up; "
              f"owner key {swarm.credential.short()}"
              f"{'' if swarm.credential.hardware_backed else ' (software, not hardware-backed)'}",
              file=sys.stderr, flush=True)
        if r.web:
            from swarm.web.server import print_join_link

            print_join_link(r.web, sys.stderr)

    reason = swarm_loop.run(member.serve(uri, args.data_dir, backend=args.backend, port=args.port,
                                         host=args.host, publication=pub, ready=ready,
                                         ice_servers=args.ice_servers,
                                         relay_data=args.relay_data, http=http,
                                         models=models, store_capacity=args.max_memory))
    print(f"swarm publish: left ({reason})", file=sys.stderr)
    if args.json:
        print_json(left_event(reason, INTERRUPTED_CODE if reason == member.INTERRUPTED else 0))
    interrupted_exit(reason)
    return 0
