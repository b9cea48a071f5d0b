"""`swarm kick`: disconnect a peer now (its shards are reassigned; it may rejoin) (all in :mod:`swarm.commands._verbs`)."""

from swarm.commands._verbs import command

HELP, DESCRIPTION, configure, run = command("kick")
