"""`swarm block`: keep a peer out of the swarm until unblocked (survives restarts)."""

from __future__ import annotations

import argparse

from swarm.commands import _verbs

HELP = "keep a peer out of the swarm until unblocked (survives restarts)"
DESCRIPTION = HELP + """.

Authorised by the owner's FIDO2 key (--as owner, the default), an admin's peer key
(--as admin --key PATH) or the coordinator's (--as coordinator), as the roles table allows.
The command carries the current term; the coordinator checks it against the charter.
"""


def configure(p: argparse.ArgumentParser) -> None:
    _verbs.configure(p, "block")


def run(args: argparse.Namespace) -> int:
    return _verbs.run(args, "block")
