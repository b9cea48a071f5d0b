"""`swarm block`: keep a peer out of the swarm until unblocked (survives restarts) (all in :mod:`swarm.commands._verbs`)."""

from swarm.commands._verbs import command

HELP, DESCRIPTION, configure, run = command("block")
