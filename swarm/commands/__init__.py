"""One module per `swarm` subcommand; see :mod:`swarm.cli` for the contract."""
