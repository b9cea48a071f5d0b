"""What every subcommand shares: the global options, ``--json`` and tables.

The global options (``--data-dir``, ``-v``, ``-q``) are accepted before the subcommand and
after it (or after a nested action such as ``swarm dht serve``): :func:`add_global_options`
adds them to each level with a suppressed default, so a level where they are not given leaves
the outer value alone. Counts given at both places add up (see :func:`verbosity`).

``--json`` prints JSON on stdout and nothing else there: one object for a command that reports
once, one object per line (``{"event": ...}``) for a command that runs until stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def add_global_options(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``--data-dir``, ``-v`` and ``-q`` on ``p``; ``top`` for the main parser (real defaults)."""
    unset = argparse.SUPPRESS
    p.add_argument("--data-dir", metavar="DIR", default=None if top else unset,
                   help="where keys, consent and state live "
                        "(default: $SWARM_HOME or the user data dir)")
    p.add_argument("-v", "--verbose", action="count", dest="verbose" if top else "verbose_after",
                   default=0 if top else unset, help="more log output (repeatable)")
    p.add_argument("-q", "--quiet", action="count", dest="quiet" if top else "quiet_after",
                   default=0 if top else unset, help="less log output (repeatable)")


def verbosity(args: argparse.Namespace) -> int:
    """The log level offset: every ``-v`` minus every ``-q``, wherever they were given."""
    return (args.verbose + getattr(args, "verbose_after", 0)
            - args.quiet - getattr(args, "quiet_after", 0))


def claim_data_dir(args: argparse.Namespace) -> None:
    """Lock the data dir for a serving process's life (:func:`swarm.config.claim_data_dir`:
    a second instance beside one on the default dir gets its own) and say which it is."""
    from swarm.config import claim_data_dir as claim

    asked = args.data_dir
    args.data_dir = claim(asked, getattr(args, "data_dir_given", True))
    why = "" if args.data_dir == asked else f" ({asked} is in use by another swarm process)"
    print(f"data dir: {args.data_dir}{why}", file=sys.stderr, flush=True)


def open_owner_key(spec: str, *, create: bool = False):
    """``--owner-key`` opened; a ``soft:PATH`` that does not exist is a usage error unless
    ``create`` (only ``swarm publish`` founds an owner key: elsewhere a typo in the path
    must not quietly make a new, useless one)."""
    from swarm.commands import owned

    if not create:
        check_owner_key(spec)
    return owned.open_owner_key(spec)


def check_owner_key(spec: str) -> None:
    """Refuse a ``soft:PATH`` owner key that does not exist (before going on the network)."""
    from pathlib import Path

    from swarm.errors import ConfigError

    if spec.startswith("soft:") and not Path(spec[5:]).expanduser().exists():
        raise ConfigError(f"--owner-key {spec}: no such key file (only `swarm publish` "
                          f"creates an owner key; give the path it used)")


def add_json_option(p: argparse.ArgumentParser, what: str = "the result") -> None:
    """``--json``; ``what`` says what stdout then holds."""
    p.add_argument("--json", action="store_true", help=f"print JSON on stdout: {what}")


def print_json(obj: Any) -> None:
    """One JSON object on one line of stdout, flushed (a reader may wait for it)."""
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str = "",
                caption: str = "", right: Sequence[str] = ()) -> None:
    """A table through rich; ``right`` names the right-aligned (numeric) columns. Not on a
    terminal (a pipe, a log) it is printed 160 columns wide, without colour.

    Cells are plain text, never rich markup: they carry what peers chose (block reasons,
    names), and ``[`` in them must print as is, not style the table or raise."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title) if title else None,
                  caption=Text(caption) if caption else None, title_justify="left",
                  caption_justify="left")
    for col in columns:
        table.add_column(Text(col), justify="right" if col in right else "left")
    for row in rows:
        table.add_row(*(Text("-" if cell is None else str(cell)) for cell in row))
    console = Console() if sys.stdout.isatty() else Console(width=160, no_color=True)
    console.print(table)


def progress_bar(*columns: Any):
    """A rich progress bar on stderr (stdout carries the command's result: a redirected
    stdout got the bar's frames), erased when done. Callers draw it only where stderr is a
    terminal."""
    from rich.console import Console
    from rich.progress import Progress

    return Progress(*columns, console=Console(stderr=True), transient=True)


def member_event(event: str, ready: Any) -> dict[str, Any]:
    """The JSON line `publish --json` and `join --json` print once the member is up, from
    a :class:`swarm.processes.member.Ready`."""
    node, uri = ready.node, ready.uri
    return {"event": event, "peer": str(node.peer_id), "uri": str(uri), "name": uri.name,
            "swarm": uri.swarm_id.hex(), "role": ready.control.role.value,
            "joined_in_s": round(ready.joined_in, 3), "gflops": round(node.tflops * 1000, 3),
            "dht": list(node.dht.address)}


def interrupted_exit(reason: str) -> None:
    """After a member's graceful leave: a leave that Ctrl-C started ends like every other
    interrupted command (``KeyboardInterrupt``: "interrupted", exit 130); SIGTERM's is a
    clean 0, as systemd expects."""
    from swarm.processes.member import INTERRUPTED

    if reason == INTERRUPTED:
        raise KeyboardInterrupt


INTERRUPTED_CODE = 128 + 2  # what the shell reports after SIGINT; `left` events carry it


def left_event(reason: str, exit_code: int) -> dict[str, Any]:
    """The last JSON line of `publish --json` and `join --json`: why the member left."""
    return {"event": "left", "reason": reason, "exit_code": exit_code}


_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_size(text: str) -> int:
    """``--max-memory``'s value: bytes, or a number with K, M, G or T (binary units)."""
    t = text.strip().lower().rstrip("ib").rstrip("b")
    mult = _UNITS.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in _UNITS else t
    try:
        value = int(float(num) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2G, 512M)") from None
    if value < 1 << 20:
        raise argparse.ArgumentTypeError("--max-memory must be at least 1M")
    return value


def add_model_option(p: argparse.ArgumentParser) -> None:
    """``--model`` (repeatable): a model file the member holds, and serves with ``--http``."""
    p.add_argument("--model", action="append", default=[], metavar="PATH|NAME",
                   help="a model file this member holds (repeatable): a .gguf file (llama or "
                   "qwen2 architecture) or a known model: smollm2 (default), qwen2.5-0.5b, "
                   "qwen2.5-1.5b. It is announced, the spans of it this member hosts are read "
                   "from it instead of sent, and with --http /v1/chat/completions serves it")


def chat_models(args: argparse.Namespace) -> list:
    """The ``--model`` files, each checked before anything starts (models.catalog.describe):
    a file this code cannot run is a ConfigError (exit 2), a known model not installed here
    a LocalError (exit 4)."""
    from swarm.errors import ConfigError, LocalError

    if not args.model:
        return []
    from models.catalog import describe
    from models.gguf_file import ModelMissing, WeightsError

    refs = []
    for m in args.model:
        try:
            refs.append(describe(m))
        except ModelMissing as exc:
            raise LocalError(str(exc)) from None
        except WeightsError as exc:
            raise ConfigError(str(exc)) from None
    return refs
