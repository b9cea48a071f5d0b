"""The `swarm` command line: one parser, one module per subcommand.

Each subcommand lives in ``swarm/commands/<name>.py`` and exposes ``HELP`` (one line for
``swarm --help``), ``configure(parser)`` and ``run(args) -> int``. Modules import their heavy
dependencies inside ``run`` so that ``swarm --help`` stays fast.

Exit codes mean the same for every subcommand (see ``EXIT_*``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence

from swarm import __version__
from swarm.config import data_dir, setup_logging
from swarm.errors import ConfigError, ConsentRefused, LocalError, RemoteError, SwarmError

EXIT_OK = 0
EXIT_FAILURE = 1  # the work failed: a remote error, a job that could not complete
EXIT_USAGE = 2  # bad arguments, bad URI, bad file: fix the command line
EXIT_REFUSED = 3  # consent declined, or not authorised to do this
EXIT_UNAVAILABLE = 4  # something this machine lacks: no security key, no backend
EXIT_INTERRUPTED = 130

# Subcommands in the order `swarm --help` lists them; each is the module swarm.commands.<name>.
# A name whose module is not built yet is left out of the parser.
PLANNED: tuple[str, ...] = (
    "demo",
    "publish",
    "join",
    "submit",
    "status",
    "kick",
    "block",
    "unblock",
    "owner",
    "bench",
    "dht",
)
COMMANDS: tuple[str, ...] = tuple(
    name for name in PLANNED if importlib.util.find_spec(f"swarm.commands.{name}") is not None
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


def _command_module(name: str):
    return importlib.import_module(f"swarm.commands.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm",
        description="Turn volunteer machines into one compute pool: publish a swarm, join it "
        "with a magnet URI, and submit work that runs as verified actor tasks on its peers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"swarm {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        metavar="DIR",
        help="where keys, consent and state live (default: $SWARM_HOME or the user data dir)",
    )
    common.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    common.add_argument("-q", "--quiet", action="count", default=0, help="less log output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in COMMANDS:
        module = _command_module(name)
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", module.HELP),
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    setup_logging(args.verbose - args.quiet)
    try:
        args.data_dir = data_dir(args.data_dir)
        if hasattr(args, "ice_server"):  # networked commands: validated before any I/O
            from swarm.links.ice import ice_servers

            args.ice_servers = ice_servers(args.ice_server, os.environ)
        return int(args._run(args) or EXIT_OK)
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
