"""`swarm dht serve`: an unattended DHT-only node."""

from __future__ import annotations

import argparse
import logging

from swarm import loop as swarm_loop
from swarm.errors import ConfigError, LocalError

HELP = "run a DHT-only node (bootstrap point for a swarm)"
DESCRIPTION = """\
serve: run an unattended DHT node that stores BEP 44 items and announcements for the swarm
and answers lookups. It prints `listening on HOST:PORT` once bound and runs until SIGTERM or
SIGINT. Its key, node id, neighbours and items live in DATA_DIR/dht, so a restarted node keeps
its items and rejoins through the neighbours it saved.
"""

log = logging.getLogger("swarm.dht")


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bad address {text!r}: expected HOST:PORT")
    return host, int(port)


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="dht_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="run a DHT node until SIGTERM",
                           description=DESCRIPTION)
    # the shared options also work after the action (`swarm dht serve --data-dir D`)
    serve.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS,
                       help="where the node's key, id, neighbours and items live")
    serve.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS)
    serve.add_argument("-q", "--quiet", action="count", default=argparse.SUPPRESS)
    serve.add_argument("--port", type=int, default=0, help="UDP port (0 picks a free one)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    serve.add_argument("--bootstrap", action="append", default=[], metavar="HOST:PORT",
                       help="a node to join through (repeatable)")


def run(args: argparse.Namespace) -> int:

    addrs = [parse_addr(a) for a in args.bootstrap]
    if not 0 <= args.port < 65536:
        raise ConfigError(f"bad port {args.port}")
    return swarm_loop.run(_serve(args, addrs))


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
    host, port = node.address
    print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            contacts = await node.bootstrap(addrs)
            log.info("joined with %d contacts", contacts)
        except LookupFailed as exc:
            log.warning("%s; retrying in the background", exc)
        await stop.wait()
    finally:
        await node.stop()
    return 0
