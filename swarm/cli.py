"""The `swarm` command line: one parser, one module per subcommand.

Each subcommand lives in ``swarm/commands/<name>.py`` and exposes ``HELP`` (one line for
``swarm --help``), ``configure(parser)`` and ``run(args) -> int``. Modules import their heavy
dependencies inside ``run`` so that ``swarm --help`` stays fast. The global options
(``--data-dir``, ``-v``, ``-q``) work before and after the subcommand (``_common``).

Exit codes mean the same for every subcommand (see ``EXIT_*``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from swarm import __version__
from swarm.commands._common import add_global_options, verbosity
from swarm.config import ENV_HOME, data_dir, setup_logging
from swarm.errors import (  # noqa: F401 (EXIT_*: the CLI's codes, defined below it)
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigError,
    ConsentRefused,
    LocalError,
    RemoteError,
    SwarmError,
)

# Subcommands in the order `swarm --help` lists them; each is the module swarm.commands.<name>.
COMMANDS: tuple[str, ...] = (
    "demo",
    "publish",
    "join",
    "generate",
    "submit",
    "embed",
    "train",
    "status",
    "kick",
    "block",
    "unblock",
    "owner",
    "bench",
    "doctor",
    "dht",
)

EPILOG = f"""\
exit codes:
  {EXIT_OK}    success
  {EXIT_FAILURE}    the work failed (a peer misbehaved, a job could not complete)
  {EXIT_USAGE}    bad arguments, URI or input file
  {EXIT_REFUSED}    refused: no consent, or not authorised
  {EXIT_UNAVAILABLE}    unavailable here: no security key, no usable backend
  {EXIT_INTERRUPTED}  interrupted

Data lives in --data-dir, else $SWARM_HOME, else the platform's user data dir.
Run `swarm COMMAND --help` for each command's options.
"""

log = logging.getLogger("swarm.cli")


def _command_module(name: str) -> ModuleType:
    """``swarm.commands.<name>``, or a stand-in that says the installation lacks it: a
    missing module is listed in --help and fails clearly when run, never vanishes."""
    qualified = f"swarm.commands.{name}"
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:
            raise  # the module is there but imports something missing: a real bug
        log.debug("no module %s", qualified)
    missing = ModuleType(qualified)
    message = (f"this installation lacks the module {qualified}; reinstall the package "
               "(pip install --force-reinstall swarm-compute)")
    missing.HELP = f"(unavailable: {qualified} is missing)"

    def run(args: argparse.Namespace) -> int:
        raise LocalError(message)

    missing.configure = lambda p: p.add_argument("rest", nargs=argparse.REMAINDER,
                                                 help=argparse.SUPPRESS)
    missing.run = run
    return missing


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm",
        description="Turn volunteer machines into one compute pool: publish a swarm, join it "
        "with a magnet URI, and submit work that runs as verified actor tasks on its peers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"swarm {__version__}")
    add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in COMMANDS:
        module = _command_module(name)
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", module.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_global_options(p)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    setup_logging(verbosity(args))
    try:
        args.data_dir_given = bool(args.data_dir or os.environ.get(ENV_HOME))
        args.data_dir = data_dir(args.data_dir)
        if hasattr(args, "ice_server"):  # networked commands: validated before any I/O
            args.ice_servers = []
            if args.ice_server or os.environ.get("SWARM_ICE_SERVERS", "").strip():
                # (only then: the WebRTC stack costs `swarm status` a third of its start)
                from swarm.links.ice import ice_servers

                args.ice_servers = ice_servers(args.ice_server, os.environ)
        code = int(args._run(args) or EXIT_OK)
        sys.stdout.flush()  # a closed pipe shows here, where it is handled, not at exit
        return code
    except ConfigError as exc:
        print(f"swarm {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConsentRefused as exc:
        print(f"swarm {args.command}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except LocalError as exc:
        print(f"swarm {args.command}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (RemoteError, SwarmError) as exc:
        print(f"swarm {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"swarm {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _stdout_closed()
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback to users
        return _unexpected(args, exc)


def _stdout_closed() -> int:
    """The reader of stdout went away (``swarm status URI | head``): stop quietly with 1,
    as rich does for its tables, and keep Python's exit-time flush of stdout from printing
    a second error."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    return EXIT_FAILURE


def _unexpected(args: argparse.Namespace, exc: Exception) -> int:
    """An exception no command turned into a message: one line (the traceback at -vv)."""
    log.debug("traceback", exc_info=exc)
    if type(exc).__module__.split(".")[0] == "dht":  # the DHT's own errors: a remote failure
        print(f"swarm {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if isinstance(exc, OSError):  # a port in use, a full disk, a file we may not read
        print(f"swarm {args.command}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(f"swarm {args.command}: internal error: {type(exc).__name__}: {exc} (rerun with "
          f"-vv for the traceback, and please report it)", file=sys.stderr)
    return EXIT_FAILURE
