"""Options every networked command shares (one place, so that each command has them all)."""

from __future__ import annotations

import argparse

_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


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


def add_network_options(parser: argparse.ArgumentParser) -> None:
    """Add the network options: ICE servers for WebRTC links behind NAT."""
    parser.add_argument(
        "--ice-server", action="append", default=[], metavar="URL", dest="ice_server",
        help="STUN/TURN server for WebRTC links (repeatable): stun:HOST:PORT or "
        "turn:USER:CREDENTIAL@HOST:PORT; also $SWARM_ICE_SERVERS, a JSON list of "
        "RTCIceServer objects {urls, username, credential}")
