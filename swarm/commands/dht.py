"""`swarm dht serve|get|put`: an unattended DHT node, and BEP 44 items by hand.

``get``/``put`` run a short-lived node in KRPC mode, so they work against swarm nodes and
against any BitTorrent mainline DHT node alike (``--bootstrap mainline``).
"""

from __future__ import annotations

import argparse
import logging

from swarm.commands._common import (
    INTERRUPTED_CODE,
    add_global_options,
    add_json_option,
    print_json,
)
from swarm.commands._network import add_network_options, bootstrap_addresses
from swarm.errors import ConfigError, LocalError, RemoteError

HELP = "run a DHT node, or get/put BEP 44 items"
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
    serve.add_argument("--krpc", action="store_true",
                       help="send KRPC (the mainline wire) to other nodes; implied by "
                            "--bootstrap mainline")
    get = sub.add_parser("get", help="read a BEP 44 item",
                         description="get: read a mutable item (--key, --salt) or an "
                                     "immutable one (--target) from the DHT.")
    which = get.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", metavar="HEX", help="the item's 32-byte ed25519 public key")
    which.add_argument("--target", metavar="HEX", help="an immutable item's 20-byte target")
    get.add_argument("--salt", default="", metavar="TEXT", help="a mutable item's salt")
    put = sub.add_parser("put", help="store a BEP 44 item",
                         description="put: store --value JSON as an immutable item, or as a "
                                     "mutable one signed with --key-file (a 32-byte ed25519 "
                                     "seed in hex) under --salt, with optional --cas SEQ.")
    put.add_argument("--value", required=True, metavar="JSON",
                     help="strings, integers, lists and objects (bencode has no floats, "
                          "booleans or null)")
    put.add_argument("--key-file", metavar="FILE", help="32-byte ed25519 seed, hex")
    put.add_argument("--salt", default="", metavar="TEXT")
    put.add_argument("--cas", type=int, metavar="SEQ", help="only if the stored seq is SEQ")
    for verb in (get, put):
        verb.add_argument("--bootstrap", action="append", default=[], metavar="HOST:PORT",
                          required=True, help="a node to ask through (repeatable; "
                                              "'mainline' for the public BitTorrent DHT)")
        verb.add_argument("--json", action="store_true",
                          help='print {"seq", "value", "target"} as JSON')
        verb.add_argument("--timeout", type=float, default=30.0, metavar="S",
                          help="give up after S seconds (30)")
        verb.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS)
        verb.add_argument("-q", "--quiet", action="count", default=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from swarm import loop as swarm_loop

    addrs = bootstrap_addresses(args)
    if args.dht_command in ("get", "put"):
        return swarm_loop.run(_items(args, addrs))
    if not 0 <= args.port < 65536:
        raise ConfigError(f"bad port {args.port}")
    from swarm.commands._common import claim_data_dir

    claim_data_dir(args)  # the node's id and routing table live there
    if swarm_loop.run(_serve(args, addrs)) == INTERRUPTED_CODE:
        raise KeyboardInterrupt  # "interrupted", as every command says after Ctrl-C
    return 0


async def _serve(args: argparse.Namespace, addrs: list[tuple[str, int]]) -> int:
    import asyncio
    import signal

    from dht import DHTNode, LookupFailed
    from swarm.control.charter import register_validators

    # among mainline nodes (which drop the swarm framing) the node must also send KRPC
    mainline = args.krpc or any(v.strip().lower() == "mainline" for v in args.bootstrap)
    node = DHTNode(data_dir=args.data_dir / "dht", krpc=mainline)
    register_validators(node)  # refuse forged charters and coordinator states network-wide
    try:
        await node.listen(args.port, args.host)
    except OSError as exc:
        await node.stop()
        raise LocalError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    got: list[int] = []

    def on_signal(sig: int) -> None:
        got.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):  # before announcing: a SIGTERM right after
        loop.add_signal_handler(sig, on_signal, sig)  # `listening` must still stop cleanly
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
    return INTERRUPTED_CODE if got[:1] == [signal.SIGINT] else 0  # SIGTERM: a clean stop


def json_to_bencodable(value: object) -> object:
    """--value JSON -> a bencodable value (str -> UTF-8 bytes); ConfigError otherwise."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        raise ConfigError(f"bencode has no {type(value).__name__} values: {value!r}")
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int):
        return value
    if isinstance(value, list):
        return [json_to_bencodable(v) for v in value]
    if isinstance(value, dict):
        return {k.encode(): json_to_bencodable(v) for k, v in value.items()}
    raise ConfigError(f"cannot store {value!r}")


def bencoded_to_json(value: object) -> object:
    """A stored value for JSON output: bytes as text when UTF-8, else {"hex": ...}."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"hex": value.hex()}
    if isinstance(value, list):
        return [bencoded_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k.decode("utf-8", "replace"): bencoded_to_json(v) for k, v in value.items()}
    return value


def _hex(text: str, size: int, what: str) -> bytes:
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise ConfigError(f"{what} must be {size} bytes in hex ({2 * size} hex digits)")
    return raw


def _seed_key(path: str):
    from pathlib import Path

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read --key-file {path}: {exc.strerror}") from exc
    return Ed25519PrivateKey.from_private_bytes(_hex(text, 32, "--key-file's seed"))


async def _items(args: argparse.Namespace, addrs: list[tuple[str, int]]) -> int:
    import asyncio
    import json

    from dht import DHTNode, ItemError, LookupFailed, mutable_target

    salt = args.salt.encode()
    if args.dht_command == "put":
        try:
            value = json_to_bencodable(json.loads(args.value))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--value is not JSON: {exc}") from exc
        key = _seed_key(args.key_file) if args.key_file else None
        if key is None and (args.salt or args.cas is not None):
            raise ConfigError("--salt and --cas need --key-file (a mutable item)")
    else:
        pubkey = _hex(args.key, 32, "--key") if args.key else None
        target = _hex(args.target, 20, "--target") if args.target else None
    node = DHTNode(rpc_timeout=2.0, krpc=True, read_only=True)  # gone in seconds: BEP 43
    try:
        await node.listen(0, "0.0.0.0" if any(not _loopback(h) for h, _ in addrs)
                          else "127.0.0.1")
        await asyncio.wait_for(node.bootstrap(addrs), args.timeout)
        if args.dht_command == "put":
            if key is None:
                target = await asyncio.wait_for(node.put_immutable(value), args.timeout)
                out = {"seq": None, "value": bencoded_to_json(value), "target": target.hex()}
            else:
                item = await asyncio.wait_for(
                    node.put_mutable(key, value, salt=salt, cas=args.cas), args.timeout)
                out = {"seq": item.seq, "value": bencoded_to_json(item.value),
                       "target": item.target.hex()}
        elif pubkey is not None:
            item = await asyncio.wait_for(node.get_mutable(pubkey, salt), args.timeout)
            if item is None:
                raise LookupFailed(f"no item under key {args.key} salt {args.salt!r}")
            out = {"seq": item.seq, "value": bencoded_to_json(item.value),
                   "target": mutable_target(pubkey, salt).hex()}
        else:
            got = await asyncio.wait_for(node.get_immutable(target), args.timeout)
            if got is None:
                raise LookupFailed(f"no item under target {args.target}")
            out = {"seq": None, "value": bencoded_to_json(got), "target": target.hex()}
    except (LookupFailed, TimeoutError) as exc:
        raise RemoteError(f"{args.dht_command} failed: {exc or 'timed out'}") from exc
    except ItemError as exc:
        raise RemoteError(f"{args.dht_command} refused: {exc}") from exc
    finally:
        await node.stop()
    if args.json:
        print(json.dumps(out))
    else:
        seq = "" if out["seq"] is None else f" seq {out['seq']}"
        print(f"{out['target']}{seq}: {json.dumps(out['value'])}")
    return 0


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
