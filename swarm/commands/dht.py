"""`swarm dht serve`: an unattended DHT-only node."""

from __future__ import annotations

import argparse
import logging

from swarm.commands._common import add_global_options, add_json_option, print_json
from swarm.commands._network import add_network_options, bootstrap_addresses
from swarm.errors import ConfigError, LocalError

HELP = "run a DHT-only node (bootstrap point for a swarm)"
DESCRIPTION = """\
serve: run an unattended DHT node that stores BEP 44 items and announcements for the swarm
and answers lookups. It prints `listening on HOST:PORT` once bound (--json: one JSON object
per line instead) and runs until SIGTERM or SIGINT. Its key, node id, neighbours and items
live in DATA_DIR/dht, so a restarted node keeps its items and rejoins through the neighbours
it saved.
"""

log = logging.getLogger("swarm.dht")


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); a bad one is a usage error."""
    from swarm.uri import parse_peer

    return parse_peer(text)


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="dht_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="run a DHT node until SIGTERM",
                           description=DESCRIPTION)
    add_global_options(serve)  # also after the action: `swarm dht serve --data-dir D`
    serve.add_argument("--port", type=int, default=0, help="UDP port (0 picks a free one)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    add_json_option(serve, 'one object per line: {"event": "listening", "host", '
                           '"port"}, "bootstrapped" {"contacts"} or "bootstrap_failed" '
                           '{"error"}, "stopped"')
    add_network_options(serve)


def run(args: argparse.Namespace) -> int:
    import asyncio

    addrs = bootstrap_addresses(args)
    if not 0 <= args.port < 65536:
        raise ConfigError(f"bad port {args.port}")
    return asyncio.run(_serve(args, addrs))


async def _serve(args: argparse.Namespace, addrs: list[tuple[str, int]]) -> int:
    import asyncio
    import signal

    from dht import DHTNode, LookupFailed
    from swarm.control.charter import register_validators

    node = DHTNode(data_dir=args.data_dir / "dht")
    register_validators(node)  # refuse forged charters and coordinator states network-wide
    try:
        await node.listen(args.port, args.host)
    except OSError as exc:
        await node.stop()
        raise LocalError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before announcing: a SIGTERM right after
        loop.add_signal_handler(sig, stop.set)  # `listening` must still stop cleanly
    host, port = node.address
    if args.json:
        print_json({"event": "listening", "host": host, "port": port})
    else:
        print(f"listening on {host}:{port}", flush=True)
    try:
        try:
            contacts = await node.bootstrap(addrs)
            log.info("joined with %d contacts", contacts)
            if args.json:
                print_json({"event": "bootstrapped", "contacts": contacts})
        except LookupFailed as exc:
            log.warning("%s; retrying in the background", exc)
            if args.json:
                print_json({"event": "bootstrap_failed", "error": str(exc)})
        await stop.wait()
    finally:
        await node.stop()
    if args.json:
        print_json({"event": "stopped"})
    return 0
