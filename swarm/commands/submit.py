"""`swarm submit`: run a verified, sharded job on a swarm and write the result."""

from __future__ import annotations

import argparse
import math
import os
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
    """A .npy file's array, loaded only after its header was read and its shape held
    against the limits and the file's size (a truncated file claiming 2e6 x 2e6 must not
    allocate 14 TiB). Its dtype, rank and values are checked by the caller."""
    import numpy as np
    from numpy.lib import format as npy

    from swarm.errors import ConfigError
    from swarm.runtime.actors import MAX_DIM

    what = f"{name}: {path}"
    try:
        with open(path, "rb") as f:
            try:
                version = npy.read_magic(f)
                read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, _, dtype = read(f)
            except Exception as exc:  # numpy raises ValueError, SyntaxError, EOFError ...
                raise ConfigError(f"{what} is not a plain .npy array (save one with "
                                  f"numpy.save; {str(exc)[:80]})") from None
            if dtype.hasobject:
                raise ConfigError(f"{what} is not a plain .npy array: it holds Python "
                                  f"objects (never unpickled); save a float32 array")
            if len(shape) > 3 or not all(d <= MAX_DIM for d in shape):
                raise ConfigError(f"{what} has shape {shape}; a matmul operand is 2-D with "
                                  f"each dimension 1..{MAX_DIM}")
            need = math.prod(shape) * dtype.itemsize
            have = os.fstat(f.fileno()).st_size - f.tell()
            if have < need:
                raise ConfigError(f"{what} is truncated: its header claims {shape} "
                                  f"({need} bytes) but {have} follow")
            f.seek(0)
            arr = np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} is a directory, not a .npy file") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
    return arr


def _check_product_range(a, b, a_path: Path, b_path: Path) -> None:
    """Operands must be finite in float32, and so must their product, or it could not be
    verified (Freivalds' check needs it finite): found here, from one pass over each
    operand, before anything is sent."""
    import numpy as np

    from compute.verify import project
    from swarm.errors import ConfigError

    with np.errstate(over="ignore", invalid="ignore"):
        for path, x in ((a_path, a), (b_path, b)):
            if not np.isfinite(x.astype(np.float32)).all():
                raise ConfigError(f"{path} holds NaN, infinite or out-of-range values "
                                  f"(float32 reaches about 3.4e38); nothing was sent")
        b32 = np.ascontiguousarray(b, dtype=np.float32)
        ones = np.ones((b32.shape[1], 1), np.float32)
        b_ones, b_norms2 = project(b32, ones)
        z, a_norms2 = project(np.ascontiguousarray(a, dtype=np.float32), b_ones)
        ok = (np.isfinite(z).all() and np.isfinite(b_norms2).all()
              and np.isfinite(a_norms2).all()
              and np.isfinite(a_norms2.max() * b_norms2.max()))
    if not ok:
        raise ConfigError(f"{a_path} @ {b_path}: the values are too large to multiply in "
                          f"float32 (the product overflows); scale the inputs down")


def _target(args: argparse.Namespace) -> tuple[str, bytes | None]:
    """What to connect to: the URI (or HOST:PORT list) with ``--bootstrap``/``SWARM_BOOTSTRAP``
    addresses first and the members this data dir saw before last, and the swarm's id
    (None when HOST:PORT comes without ``--swarm``: connect() then says what is missing)."""
    from swarm.commands._network import bootstrap_addresses, with_remembered
    from swarm.members import load_seen_peers
    from swarm.uri import MAX_PEERS, parse_target

    join, peers = parse_target(args.uri)  # the message every command gives for a bad URI
    extra = bootstrap_addresses(args)
    if join is not None:
        return str(with_remembered(join.with_peers(extra), args.data_dir)), join.swarm_id
    sid = None
    if args.swarm:
        try:
            sid = bytes.fromhex(args.swarm)
        except ValueError:
            from swarm.errors import ConfigError

            raise ConfigError(f"--swarm {args.swarm[:50]!r}: expected 40 hex digits") from None
    seen = load_seen_peers(args.data_dir, sid) if sid and len(sid) == 20 else []
    peers = list(dict.fromkeys([*extra, *peers, *seen]))[:MAX_PEERS]
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in peers), sid


def connect(args: argparse.Namespace, min_workers: int, timeout: float, hint: str = "",
            target: str | None = None):
    """A client joined as :func:`_target` says (`submit`, `embed` and `generate` alike),
    with the errors a user can act on: no worker within ``timeout`` (``hint`` says what
    else to try), or no peer answering at all."""
    import swarm
    from swarm.commands._network import unreachable
    from swarm.errors import RemoteError

    target = target if target is not None else _target(args)[0]
    try:
        return swarm.connect(target, swarm=args.swarm, data_dir=args.data_dir,
                             min_workers=min_workers, timeout=timeout,
                             ice_servers=args.ice_servers)
    except TimeoutError:
        raise RemoteError(f"no worker of the swarm answered within {timeout:g} s "
                          f"(is anybody joined?{hint})") from None
    except RemoteError as exc:
        raise unreachable(exc, target.count("x.pe=") or target.count(",") + 1) from None


def run(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    from swarm.errors import ConfigError
    from swarm.runtime.actors import method_spec

    if args.timeout <= 0:
        raise ConfigError("--timeout must be > 0 seconds")
    if args.min_workers < 0:
        raise ConfigError("--min-workers must be >= 0")
    target, sid = _target(args)
    a, b = _load(args.a, "A"), _load(args.b, "B")
    try:
        method_spec("matmul", "matmul").check([a, b], {})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cannot multiply {args.a} by {args.b}: {exc}") from None
    _check_product_range(a, b, args.a, args.b)
    if not args.output.parent.exists():
        raise ConfigError(f"output directory {args.output.parent} does not exist")
    started = time.monotonic()
    client = connect(args, 0, min(args.timeout, 60.0), target=target)
    with client:
        _wait_for_workers(client, args.min_workers, min(args.timeout, 60.0))
        _remember_members(client, args.data_dir, sid)
        left = max(1.0, args.timeout - (time.monotonic() - started))
        opts = {"verify": args.verify, "precision": args.precision, "timeout": left}
        c = _run_with_progress(client, a, b, opts, quiet=args.json)
        report = client.last_report
    np.save(args.output, c, allow_pickle=False)
    _print_report(report, args, c.shape, time.monotonic() - started)
    return 0


def _wait_for_workers(client, count: int, timeout: float) -> None:
    """Wait until ``count`` workers are linked, saying how many there are as it changes
    ("waiting for workers: 1/3" on stderr), not in silence."""
    import time

    from swarm.errors import RemoteError

    deadline = time.monotonic() + timeout
    shown, delay = -1, 0.05
    while True:
        linked = len(client._loop.run(client.node.connect_workers(), timeout))
        if linked >= count:
            if shown >= 0:
                print(f"workers: {linked}/{count}, starting", file=sys.stderr, flush=True)
            return
        if linked != shown:
            print(f"waiting for workers: {linked}/{count}", file=sys.stderr, flush=True)
            shown = linked
        if time.monotonic() > deadline:
            raise RemoteError(f"only {linked} of the {count} workers asked for (--min-workers) "
                              f"answered within {timeout:g} s (is anybody joined?)")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def _remember_members(client, data_dir, sid: bytes | None) -> None:
    """Keep the live members' DHT addresses for the next command (best effort)."""
    from swarm.commands._network import remember

    if sid is None:
        return
    try:
        records = client._loop.run(client.node.members(), 10)
    except Exception:  # noqa: BLE001 - only the memory is lost
        return
    remember(data_dir, sid, [r.dht for r in records if r.dht])


def _run_with_progress(client, a, b, opts, quiet: bool):
    from swarm.errors import RemoteError

    if quiet or not sys.stderr.isatty():
        fut = client._loop.submit(client._matmul(a, b, opts))
    else:
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

        from swarm.commands._common import progress_bar

        progress = progress_bar(TextColumn("matmul"), BarColumn(), TextColumn(
            "{task.completed}/{task.total} shards"), TimeElapsedColumn())
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
                                          f"{seconds:.2f} s ({report.shards} shard"
                                          f"{'' if report.shards == 1 else 's'}, "
                                          f"verify={args.verify})")
