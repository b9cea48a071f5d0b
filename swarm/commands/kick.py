"""`swarm kick`: disconnect a peer now (its shards are reassigned; it may rejoin)."""

from __future__ import annotations

import argparse

from swarm.commands import _verbs

HELP = "disconnect a peer now (its shards are reassigned; it may rejoin)"
DESCRIPTION = HELP + """.

Authorised by the owner's FIDO2 key (--as owner, the default), an admin's peer key
(--as admin --key PATH) or the coordinator's (--as coordinator), as the roles table allows.
The command carries the current term; the coordinator checks it against the charter.
"""


def configure(p: argparse.ArgumentParser) -> None:
    _verbs.configure(p, "kick")


def run(args: argparse.Namespace) -> int:
    return _verbs.run(args, "kick")
