"""models: real models whose matrix products run through an injectable executor.

Imports numpy and ``compute`` only (never ``swarm``): the swarm plugs in as an
:class:`models.executor.Executor`. See :mod:`models.executor` for the seam.
"""
