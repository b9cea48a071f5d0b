"""Iterative Kademlia lookup that hears from the k closest responders (not the first value).

kademlia's ``ValueSpiderCrawl`` stops at the first round with any value and returns the most
common one, so a stale majority wins. This lookup is a plain algorithm over a ``query``
callable (hivemind's traverse style): it keeps ``alpha`` queries in flight, always to the
closest unqueried candidates, and ends when the k closest nodes that answered have all been
asked. The caller then picks the best value by its own rule (highest valid seq).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kademlia.node import Node

T = TypeVar("T")
Query = Callable[[Node], Awaitable[tuple[list[Node], T] | None]]


@dataclass
class LookupResult(Generic[T]):
    """What a lookup heard."""

    responses: list[tuple[Node, T]]
    """The k closest nodes that answered, nearest first, each with its reply."""
    rpcs: int = 0
    """Requests sent (answered or not)."""
    failed: list[Node] = field(default_factory=list)
    """Nodes that did not answer."""


async def lookup(target: bytes, seeds: list[Node], query: Query[Any], *, k: int, alpha: int,
                 own_id: bytes | None = None, skip: Container[bytes] = ()) -> LookupResult[Any]:
    """Run the lookup; ``query(node)`` returns (closer nodes, reply) or None on failure.

    Nodes whose id is in ``skip`` (e.g. ones that just timed out) are never asked.
    """
    t = int.from_bytes(target, "big")
    known: dict[bytes, Node] = {}
    state: dict[bytes, str] = {}  # new | pending | ok | failed
    replies: dict[bytes, Any] = {}
    result: LookupResult[Any] = LookupResult([])

    def add(n: Node) -> None:
        if n.id != own_id and n.id not in known and n.id not in skip:
            known[n.id] = n
            state[n.id] = "new"

    for n in seeds:
        add(n)

    pending: dict[asyncio.Task, Node] = {}
    try:
        while True:
            live = sorted((n for n in known.values() if state[n.id] != "failed"),
                          key=lambda n: n.long_id ^ t)[:k]
            fresh = [n for n in live if state[n.id] == "new"]
            for n in fresh[: max(0, alpha - len(pending))]:
                state[n.id] = "pending"
                result.rpcs += 1
                pending[asyncio.ensure_future(query(n))] = n
            if not pending:
                break
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                n = pending.pop(task)
                answer = task.result() if not task.cancelled() and not task.exception() else None
                if answer is None:
                    state[n.id] = "failed"
                    result.failed.append(n)
                    continue
                closer, reply = answer
                state[n.id] = "ok"
                replies[n.id] = reply
                for c in closer:
                    add(c)
    finally:
        for task in pending:
            task.cancel()
    answered = sorted((n for n in known.values() if state[n.id] == "ok"),
                      key=lambda n: n.long_id ^ t)[:k]
    result.responses = [(n, replies[n.id]) for n in answered]
    return result
