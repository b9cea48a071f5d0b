"""A plain worker process with no control plane: what ``swarm.local`` starts.

``python -m swarm.processes.worker --swarm-id HEX --bootstrap HOST:PORT [--data-dir D]`` runs one
:class:`~swarm.node.Node` until SIGTERM and prints one JSON line when it is ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

from swarm import loop as swarm_loop
from swarm.control.charter import validators
from swarm.errors import ConfigError
from swarm.node import Node, NodeConfig
from swarm.runtime.chaos import ENV as CHAOS_ENV
from swarm.runtime.chaos import parse as parse_chaos

log = logging.getLogger("swarm.node")


def _addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _swarm_id(text: str) -> bytes:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 20:
        raise argparse.ArgumentTypeError("a swarm id is 40 hex digits")
    return raw


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m swarm.processes.worker",
                                description="Run one swarm worker node until SIGTERM.")
    p.add_argument("--swarm-id", type=_swarm_id, required=True, help="40 hex digits")
    p.add_argument("--bootstrap", type=_addr, action="append", default=[], metavar="HOST:PORT")
    p.add_argument("--data-dir", default=None, help="default: $SWARM_HOME or the user dir")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dht-port", type=int, default=0)
    p.add_argument("--link-port", type=int, default=0)
    p.add_argument("--backend", default="auto")
    p.add_argument("--threads", type=int, default=None, help="BLAS threads")
    p.add_argument("--dht-timeout", type=float, default=5.0, help="DHT request timeout (s)")
    p.add_argument("--bench-size", type=int, action="append", default=None, metavar="N",
                   help="start-up benchmark size (repeatable; default: compute's quick set)")
    p.add_argument("--max-memory", type=int, default=4 << 30, metavar="BYTES",
                   help="cap on what it holds for others (announced as its offer)")
    p.add_argument("--role", action="append", default=None, choices=["worker", "requester"])
    p.add_argument("--model", action="append", default=[], metavar="PATH",
                   help="a GGUF file this worker holds: announced, and the spans it hosts "
                   "are made from it instead of received (repeatable)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the parent process exits (embedded local swarms)")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def _models(paths: list[str]) -> dict[str, tuple[str, ...]]:
    """NodeConfig's ``models`` and ``model_files`` for ``--model`` files (ConfigError for a
    file that is not a model this code runs)."""
    from models.catalog import describe
    from models.gguf_file import WeightsError

    try:
        refs = [describe(p) for p in paths]
    except WeightsError as exc:
        raise ConfigError(str(exc)) from None
    return {"models": tuple(r.address for r in refs),
            "model_files": tuple(str(r.path) for r in refs)}


async def run_node(config: NodeConfig, ready: Callable[[Node], None] | None = None,
                   exit_with_parent: bool = False) -> None:
    """Start a node, report readiness, run until SIGTERM/SIGINT, stop gracefully.

    ``exit_with_parent``: also stop when the parent process is gone (``swarm.local``'s
    workers must not outlive a client that was killed without cleaning up).
    """
    node = Node(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()

    async def watch_parent() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(1.0)
        log.warning("parent process %d is gone; stopping", parent)
        stop.set()

    watcher = loop.create_task(watch_parent()) if exit_with_parent else None
    await node.start()
    if ready is not None:
        ready(node)
    await stop.wait()
    if watcher is not None:
        watcher.cancel()
    await node.stop(graceful=True)


def main(argv: Sequence[str] | None = None) -> int:
    from swarm.config import data_dir, setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        swarm_loop.choice()  # a bad SWARM_LOOP is a clear error before anything starts
        chaos = parse_chaos(os.environ.get(CHAOS_ENV))
        config = NodeConfig(
            data_dir=data_dir(args.data_dir), swarm_id=args.swarm_id,
            roles=tuple(args.role or ["worker"]), host=args.host, dht_port=args.dht_port,
            link_port=args.link_port, bootstrap=tuple(args.bootstrap), backend=args.backend,
            threads=args.threads, chaos=chaos, dht_rpc_timeout=args.dht_timeout,
            store_capacity=args.max_memory, **_models(args.model),
            bench_sizes=tuple(args.bench_size) if args.bench_size else None,
            validators=validators())
    except ConfigError as exc:
        print(f"swarm node: {exc}", file=sys.stderr)
        return 2

    def ready(node: Node) -> None:
        assert node.record is not None
        print(json.dumps({"peer_id": str(node.peer_id), "dht": list(node.dht.address),
                          "links": [list(a) for a in node.record.links],
                          "tflops": node.tflops,
                          "loop": type(asyncio.get_running_loop()).__module__.split(".")[0]}),
              flush=True)

    swarm_loop.run(run_node(config, ready, args.exit_with_parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
