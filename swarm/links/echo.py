"""A stand-alone peer that answers over a real link, for two-process tests and benchmarks.

Run ``python -m swarm.links.echo tls --seed HEX`` (or ``webrtc``): it prints one JSON line
``{"peer": ..., "port": ...}`` on stdout once it listens, then serves links until stdin
closes. Every message is echoed back, except :class:`Bulk` (counted, not echoed, so a
sender can measure one-way throughput) and :class:`Flush` (answered with the counts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time

import numpy as np

from identity.keys import PeerKey
from swarm import loop as swarm_loop
from swarm import wire
from swarm.errors import LinkClosed
from swarm.links.base import LinkOptions, PeerLink
from swarm.loop import Supervisor


@wire.message("echo.echo")
class Echo(wire.Message):
    """Sent back as it came."""

    text: str
    """Anything."""
    arrays: list[np.ndarray]
    """Arrays to send back."""


@wire.message("echo.bulk")
class Bulk(wire.Message):
    """Payload for throughput runs; the echo peer only counts it."""

    data: np.ndarray
    """The bytes being moved."""


@wire.message("echo.flush")
class Flush(wire.Message):
    """Ask the echo peer for what it counted; it answers with :class:`Flushed`."""

    token: int
    """Echoed back, to match the answer."""


@wire.message("echo.flushed")
class Flushed(wire.Message):
    """The echo peer's counts since its link opened."""

    token: int
    """The Flush's token."""
    messages: int
    """Bulk messages received."""
    nbytes: int
    """Bulk array bytes received."""


async def serve(link: PeerLink) -> None:
    """Echo one link until it closes."""
    messages = nbytes = 0
    try:
        async for msg in link:
            if isinstance(msg, Bulk):
                messages += 1
                nbytes += msg.data.nbytes
            elif isinstance(msg, Flush):
                await link.send(Flushed(msg.token, messages, nbytes))
            else:
                await link.send(msg)
    except LinkClosed:
        pass


async def throughput(link: PeerLink, total: int, message: int = 4 << 20) -> float:
    r"""MB/s of ``total`` bytes of Bulk arrays of ``message`` bytes to a :func:`serve`\ d
    link, timed until the far end confirms them all."""
    data = np.ones(message, dtype=np.uint8)
    count = max(1, total // message)
    await link.send(Flush(0))  # what the far end counted so far
    before = await asyncio.wait_for(link.recv(), 60)
    start = time.perf_counter()
    for _ in range(count):
        await link.send(Bulk(data))
    await link.send(Flush(1))
    answer = await asyncio.wait_for(link.recv(), 300)
    elapsed = time.perf_counter() - start
    if not (isinstance(answer, Flushed) and answer.nbytes - before.nbytes == count * message):
        raise AssertionError(f"the far end counted {answer}, not {count * message} bytes")
    return count * message / elapsed / 1e6


async def _wait_stdin_closed() -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)


async def _main(args: argparse.Namespace) -> None:
    key = PeerKey.from_seed(bytes.fromhex(args.seed)) if args.seed else PeerKey.generate()
    options = LinkOptions(frame_timeout=args.frame_timeout)
    links = Supervisor(logging.getLogger(__name__), "echo link")

    def on_link(link: PeerLink) -> None:
        links.spawn(serve(link))

    if args.kind == "tls":
        from swarm.links import tls
        server = await tls.listen(key, args.host, 0, on_link=on_link, options=options)
        print(json.dumps({"peer": str(key.peer_id), "port": server.port}), flush=True)
        await _wait_stdin_closed()
        await server.close()
    else:
        from swarm.links import webrtc
        signaler = await webrtc.UDPSignaler.bind(key, args.host)
        endpoint = webrtc.WebRTCEndpoint(key, signaler, on_link=on_link, options=options,
                                         host_addresses=[args.host],
                                         tuned=not args.standard)
        print(json.dumps({"peer": str(key.peer_id), "port": signaler.port}), flush=True)
        await _wait_stdin_closed()
        await endpoint.close()
        signaler.close()
    for task in list(links):
        task.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swarm.links.echo", description=__doc__)
    parser.add_argument("kind", choices=["tls", "webrtc"])
    parser.add_argument("--seed", help="hex Ed25519 seed (default: a fresh key)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--frame-timeout", type=float, default=10.0)
    parser.add_argument("--standard", action="store_true",
                        help="webrtc: offer no swarm-only tuning (behave like a browser)")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = parser.parse_args(argv)
    # this tool compares loop kinds: the flag decides, not the environment
    os.environ[swarm_loop.ENV] = "uvloop" if args.uvloop else "asyncio"
    swarm_loop.run(_main(args))


if __name__ == "__main__":
    main()

__all__ = ["Bulk", "Echo", "Flush", "Flushed", "main", "serve"]
