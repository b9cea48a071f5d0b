"""`swarm submit`: run a verified, sharded job on a swarm and write the result."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from swarm.commands._common import add_json_option, print_json, print_table

HELP = "submit a job (matmul) to a swarm as a requester, verified, with a per-peer report"
DESCRIPTION = """\
Joins the swarm named by URI as a requester (no work is taken on), splits the job into
shards weighted by each worker's measured speed, verifies every shard (Freivalds' check by
default), redoes wrong or lost shards elsewhere, and writes the result.

  swarm submit 'magnet:?xs=urn:btpk:...' matmul A.npy B.npy -o C.npy
  swarm submit HOST:PORT --swarm ID matmul A.npy B.npy -o C.npy --json

Inputs are .npy files (loaded without pickle). Exit status: 0 done, 1 the swarm could not
finish the job, 2 bad arguments or input files.
"""


def configure(p: argparse.ArgumentParser) -> None:
    from swarm.commands._network import add_network_options

    add_network_options(p)
    p.add_argument("uri", metavar="URI", help="join URI (magnet:?xs=...) or HOST:PORT bootstrap")
    p.add_argument("op", choices=["matmul"], help="the job: matmul computes A @ B")
    p.add_argument("a", type=Path, metavar="A.npy")
    p.add_argument("b", type=Path, metavar="B.npy")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="C.npy")
    p.add_argument("--verify", choices=["freivalds", "replicate", "none"], default="freivalds",
                   help="how remote results are checked (default: freivalds)")
    p.add_argument("--precision", choices=["f32", "f16", "bf16"], default="f32",
                   help="transfer precision of the inputs (results come back in f32)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="give up after S seconds (default 600)")
    p.add_argument("--swarm", metavar="ID", help="swarm id (40 hex) when URI is HOST:PORT")
    p.add_argument("--min-workers", type=int, default=1, metavar="N",
                   help="wait for N workers before starting (0: compute here if none)")
    add_json_option(p, "the report")


def _load(path: Path, name: str):
    from tokenize import TokenError

    import numpy as np

    from swarm.errors import ConfigError

    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file {path}") from None
    except (ValueError, SyntaxError, TokenError, EOFError, OverflowError) as exc:
        # numpy parses the header with tokenize/ast: a garbled one raises these.
        raise ConfigError(f"{name}: {path} is not a plain .npy array ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc}") from None
    if not isinstance(arr, np.ndarray):
        raise ConfigError(f"{name}: {path} holds several arrays (.npz); save one with np.save")
    return arr


def _with_bootstrap(args: argparse.Namespace) -> str:
    """The target with ``--bootstrap``/``SWARM_BOOTSTRAP`` addresses added to it."""
    from swarm.commands._network import bootstrap_addresses
    from swarm.uri import parse

    extra = bootstrap_addresses(args)
    if not extra:
        return args.uri
    if args.uri.startswith("magnet:"):
        return str(parse(args.uri, require_owner=False).with_peers(extra))
    shown = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in extra]
    return ",".join([args.uri, *shown])


def run(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    import swarm
    from swarm.errors import ConfigError, RemoteError
    from swarm.runtime.actors import method_spec

    if args.timeout <= 0:
        raise ConfigError("--timeout must be > 0 seconds")
    a, b = _load(args.a, "A"), _load(args.b, "B")
    try:
        method_spec("matmul", "matmul").check([a, b], {})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cannot multiply {args.a} by {args.b}: {exc}") from None
    if not args.output.parent.exists():
        raise ConfigError(f"output directory {args.output.parent} does not exist")
    started = time.monotonic()
    try:
        client = swarm.connect(_with_bootstrap(args), swarm=args.swarm, data_dir=args.data_dir,
                               min_workers=args.min_workers, timeout=min(args.timeout, 60.0),
                               ice_servers=args.ice_servers)
    except TimeoutError:
        raise RemoteError(f"no worker of the swarm answered within "
                          f"{min(args.timeout, 60.0):g} s (is anybody joined?)") from None
    with client:
        left = max(1.0, args.timeout - (time.monotonic() - started))
        opts = {"verify": args.verify, "precision": args.precision, "timeout": left}
        c = _run_with_progress(client, a, b, opts, quiet=args.json)
        report = client.last_report
    np.save(args.output, c, allow_pickle=False)
    _print_report(report, args, c.shape, time.monotonic() - started)
    return 0


def _run_with_progress(client, a, b, opts, quiet: bool):
    from swarm.errors import RemoteError

    if quiet or not sys.stderr.isatty():
        fut = client._loop.submit(client._matmul(a, b, opts))
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("matmul"), BarColumn(), TextColumn("{task.completed}/"
                            "{task.total} shards"), TimeElapsedColumn(), transient=True)
        task = progress.add_task("matmul", total=None)
        progress.start()

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        fut = client._loop.submit(client._matmul(a, b, opts, update))
        fut.add_done_callback(lambda _: progress.stop())
    try:
        return fut.result()
    except TimeoutError as exc:
        raise RemoteError(f"the job did not finish in time: {exc}") from None


def _print_report(report, args, shape, seconds: float) -> None:
    rows = [{"peer": peer, "shards": r.shards, "bytes_out": r.bytes_out, "bytes_in": r.bytes_in,
             "seconds": round(r.seconds, 4), "verified": r.verified, "rejected": r.rejected,
             "failed": r.failed} for peer, r in sorted(report.peers.items())]
    if args.json:
        print_json({"output": str(args.output), "shape": list(shape),
                    "seconds": round(seconds, 4), "verify": args.verify,
                    "precision": args.precision, "shards": report.shards, "peers": rows})
        return
    keys = ("shards", "bytes_out", "bytes_in", "seconds", "verified", "rejected", "failed")
    cols = [k.replace("_", " ") for k in keys]
    print_table(("peer", *cols), [
        (r["peer"] if r["peer"] == "local" else r["peer"][:12], *(r[k] for k in keys))
        for r in rows], right=cols, title=f"{args.output}: {shape[0]}x{shape[1]} in "
                                          f"{seconds:.2f} s ({report.shards} shards, "
                                          f"verify={args.verify})")
