"""The options every command that goes on the network shares: where to join the DHT.

``--bootstrap HOST:PORT`` (repeatable) and ``SWARM_BOOTSTRAP`` (comma-separated HOST:PORT)
name DHT nodes to join through besides the URI's ``x.pe`` hints, so a swarm stays
reachable after every peer the URI names is gone (any ``swarm dht serve`` node will do).
``--ice-server URL`` (and ``SWARM_ICE_SERVERS``) names STUN/TURN servers for WebRTC links to
peers behind NAT (parsed and checked by :mod:`swarm.links.ice`). Every networked command
calls :func:`add_network_options` on its parser and :func:`bootstrap_addresses` on its
arguments; nothing else parses these.
"""

from __future__ import annotations

import argparse
import os

ENV = "SWARM_BOOTSTRAP"
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def add_network_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--bootstrap`` and ``--ice-server`` (both repeatable) to ``parser``; returns it."""
    parser.add_argument("--bootstrap", action="append", default=[], metavar="HOST:PORT",
                        help=f"a DHT node to join through, besides the URI's peers "
                             f"(repeatable; 'mainline' for the public BitTorrent DHT "
                             f"routers; also ${ENV}, comma-separated)")
    parser.add_argument(
        "--ice-server", action="append", default=[], metavar="URL", dest="ice_server",
        help="STUN/TURN server for WebRTC links (repeatable): stun:HOST:PORT or "
        "turn:USER:CREDENTIAL@HOST:PORT; also $SWARM_ICE_SERVERS, a JSON list of "
        "RTCIceServer objects {urls, username, credential}")
    return parser


def bootstrap_addresses(args: argparse.Namespace) -> list[tuple[str, int]]:
    """``--bootstrap`` then ``SWARM_BOOTSTRAP`` addresses, parsed and deduplicated;
    :class:`swarm.errors.URIError` (a usage error) names a bad one."""
    from swarm.errors import ConfigError, URIError
    from swarm.uri import parse_peer

    given = [("--bootstrap", t) for t in getattr(args, "bootstrap", None) or []]
    given += [(ENV, t.strip()) for t in os.environ.get(ENV, "").split(",") if t.strip()]
    out: list[tuple[str, int]] = []
    for where, text in given:
        if text.strip().lower() == "mainline":  # the public BitTorrent routers: never in tests or the demo
            from dht.bootstrap import MAINLINE_ROUTERS

            out.extend(MAINLINE_ROUTERS)
            continue
        try:
            out.append(parse_peer(text))
        except URIError as exc:
            why = str(exc).removeprefix("x.pe: ")
            raise ConfigError(f"{where} {text[:60]!r}: expected HOST:PORT ({why})") from None
    return list(dict.fromkeys(out))


def rate(text: str) -> int:
    """A byte rate such as 500k, 2M or 1G (per second) for ``--relay-data``."""
    t = text.strip().lower().removesuffix("/s").rstrip("b")
    mult = _UNITS.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if t[-1:] in _UNITS else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte rate: {text!r} (e.g. 2M)") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a byte rate is >= 0")
    return value


def with_remembered(join, data_dir):
    """``join`` with the members this data dir saw live last time added after its own
    peers (at most the URI's limit), so a client still reaches the swarm when every peer
    the URI names is gone. Members keep the same list (:mod:`swarm.members`)."""
    from swarm.members import load_seen_peers
    from swarm.uri import MAX_PEERS, JoinURI

    seen = load_seen_peers(data_dir, join.swarm_id)
    peers = tuple(dict.fromkeys([*join.peers, *seen]))[:MAX_PEERS]
    return JoinURI(join.pubkey, join.name, join.salt, peers, join.owner)


def remember(data_dir, sid: bytes, addrs) -> None:
    """Keep the DHT addresses of the members just seen live (freshest first, bounded;
    best effort: a read-only data dir loses only the memory)."""
    from swarm.members import load_seen_peers, save_seen_peers

    addrs = [tuple(a) for a in addrs if a]
    if not addrs:
        return
    try:
        save_seen_peers(data_dir, sid, [*addrs, *load_seen_peers(data_dir, sid)])
    except OSError as exc:
        import logging

        logging.getLogger("swarm.commands").debug("cannot remember peers: %s", exc)


def unreachable(exc: Exception, tried: int) -> Exception:
    """``exc`` from a failed bootstrap, said as what to do about it."""
    from swarm.errors import RemoteError

    if "no bootstrap" not in str(exc):
        return exc
    return RemoteError(
        f"cannot reach the swarm: no peer answered ({tried} tried: the URI's and those this "
        f"data dir saw before); its members may have left or moved. Ask a member for a fresh "
        f"URI (`swarm status --json` prints join_uri) or give a running DHT node with "
        f"--bootstrap HOST:PORT")
