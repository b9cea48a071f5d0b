"""Options every networked command shares (one place, so that each command has them all)."""

from __future__ import annotations

import argparse


def add_network_options(parser: argparse.ArgumentParser) -> None:
    """Add the network options: ICE servers for WebRTC links behind NAT."""
    parser.add_argument(
        "--ice-server", action="append", default=[], metavar="URL", dest="ice_server",
        help="STUN/TURN server for WebRTC links (repeatable): stun:HOST:PORT or "
        "turn:USER:CREDENTIAL@HOST:PORT; also $SWARM_ICE_SERVERS, a JSON list of "
        "RTCIceServer objects {urls, username, credential}")
