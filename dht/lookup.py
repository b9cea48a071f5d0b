"""Iterative Kademlia lookup that hears from the k closest responders (not the first value).

kademlia's ``ValueSpiderCrawl`` stops at the first round with any value and returns the most
common one, so a stale majority wins. This lookup is a plain algorithm over a ``query``
callable (hivemind's traverse style): it keeps ``alpha`` queries in flight, always to the
closest unqueried candidates, and ends when the k closest nodes that answered have all been
asked. The caller then picks the best value by its own rule (highest valid seq).

A query still unanswered after ``slow_after`` seconds stops counting against ``alpha``
(libtorrent's "short timeout"), and after ``GRACE`` times that it stops holding the lookup
open: after churn, dead contacts would otherwise cost one full RPC timeout per ``alpha`` of
them. A late answer still counts if the lookup is still running.

Candidates are one per source (:func:`dht.addresses.source_key`): a reply listing many ids
at one address (a socket claiming the ids closest to the key, to eclipse it and serve a stale
item) yields only the first of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kademlia.node import Node

from dht.addresses import node_source

T = TypeVar("T")
Query = Callable[[Node], Awaitable[tuple[list[Node], T] | None]]
GRACE = 4  # a slow node that would rank in the top k is awaited this many slow_afters


@dataclass
class LookupResult(Generic[T]):
    """What a lookup heard."""

    responses: list[tuple[Node, T]]
    """The k closest nodes that answered, nearest first, each with its reply."""
    rpcs: int = 0
    """Requests sent (answered or not)."""
    failed: list[Node] = field(default_factory=list)
    """Nodes that did not answer (or were still silent when the lookup ended)."""


async def lookup(target: bytes, seeds: list[Node], query: Query[Any], *, k: int, alpha: int,
                 own_id: bytes | None = None, skip: Container[bytes] = (),
                 slow_after: float = 1.0,
                 keep: Callable[[asyncio.Task], None] | None = None) -> LookupResult[Any]:
    """Run the lookup; ``query(node)`` returns (closer nodes, reply) or None on failure.

    Nodes whose id is in ``skip`` (e.g. ones that just timed out) are never asked. Queries
    still running at the end are handed to ``keep`` (so a dead node's timeout can still evict
    it) or, without ``keep``, cancelled.
    """
    t = int.from_bytes(target, "big")
    clock = asyncio.get_running_loop().time
    known: dict[bytes, Node] = {}
    sources: set[str] = set()
    state: dict[bytes, str] = {}  # new | pending | slow | ok | failed
    replies: dict[bytes, Any] = {}
    result: LookupResult[Any] = LookupResult([])
    pending: dict[asyncio.Task, tuple[Node, float]] = {}
    grace = GRACE * slow_after

    def add(n: Node) -> None:
        if n.id == own_id or n.id in known or n.id in skip:
            return
        src = node_source(n)
        if src in sources:
            return
        sources.add(src)
        known[n.id] = n
        state[n.id] = "new"

    def settle(task: asyncio.Task) -> None:
        n, _ = pending.pop(task)
        answer = task.result() if not task.cancelled() and not task.exception() else None
        if answer is None:
            state[n.id] = "failed"
            result.failed.append(n)
            return
        closer, reply = answer
        state[n.id] = "ok"
        replies[n.id] = reply
        for c in closer:
            add(c)

    for n in seeds:
        add(n)
    finished = False
    try:
        while True:
            now = clock()
            for n, started in pending.values():
                if state[n.id] == "pending" and now - started >= slow_after:
                    state[n.id] = "slow"
            ranked = sorted((n for n in known.values()
                             if state[n.id] in ("new", "pending", "ok")),
                            key=lambda n: n.long_id ^ t)[:k]
            active = sum(1 for n, _ in pending.values() if state[n.id] == "pending")
            for n in [n for n in ranked if state[n.id] == "new"][: max(0, alpha - active)]:
                state[n.id] = "pending"
                result.rpcs += 1
                pending[asyncio.ensure_future(query(n))] = (n, now)
            # Done when the k closest non-slow nodes all answered and no slow node that would
            # rank among them is still within its grace period (a merely slow node usually
            # answers within a few estimated RTTs; a dead one never does). Until some node
            # has answered, every slow query is awaited to its end (an overloaded host).
            slow = [(n, started) for n, started in pending.values() if state[n.id] == "slow"]
            edge = ranked[-1].long_id ^ t if len(ranked) >= k else None
            if not any(s == "ok" for s in state.values()):
                relevant = [started for _, started in slow]
            else:
                relevant = [started for n, started in slow if now - started < grace
                            and (edge is None or (n.long_id ^ t) < edge)]
            if all(state[n.id] == "ok" for n in ranked) and not relevant:
                break
            if not pending:
                break
            deadlines = [started + slow_after for n, started in pending.values()
                         if state[n.id] == "pending"]
            deadlines += [started + grace for started in relevant if now - started < grace]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            done, _ = await asyncio.wait(pending, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                settle(task)
        finished = True
    finally:
        for task in pending:
            if finished and keep is not None:
                keep(task)
            else:
                task.cancel()
    result.failed += [n for n, _ in pending.values()]
    answered = sorted((n for n in known.values() if state[n.id] == "ok"),
                      key=lambda n: n.long_id ^ t)[:k]
    result.responses = [(n, replies[n.id]) for n in answered]
    return result
