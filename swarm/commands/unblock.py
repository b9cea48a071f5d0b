"""`swarm unblock`: lift a block (all in :mod:`swarm.commands._verbs`)."""

from swarm.commands._verbs import command

HELP, DESCRIPTION, configure, run = command("unblock")
