"""Iterative Kademlia lookup that hears from the k closest responders (not the first value).

kademlia's ``ValueSpiderCrawl`` stops at the first round with any value and returns the most
common one, so a stale majority wins. This lookup is a plain algorithm over a ``query``
callable (hivemind's traverse style): it keeps ``alpha`` queries in flight, always to the
closest unqueried candidates, and ends when the k closest nodes that answered have all been
asked.

The algorithm is :class:`Lookup`, a sans-IO state machine fed answers, failures and ``now``
that says whom to ask next and when it next needs waking; :func:`lookup` is its asyncio
adapter (tasks, ``asyncio.wait``, the loop clock) and nothing more. The caller then picks the best value by its own rule (highest valid seq).

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
from collections.abc import Awaitable, Callable, Container, Iterable
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


class Lookup:
    """One iterative lookup as a state machine. ``step(now)`` returns the nodes to ask now;
    feed each outcome to :meth:`answered` or :meth:`failed`, then ``step`` again; sleep at
    most until :meth:`wake_at`; stop when :attr:`done`; read :meth:`result`."""

    def __init__(self, target: bytes, seeds: Iterable[Node], *, k: int, alpha: int,
                 own_id: bytes | None = None, skip: Container[bytes] = (),
                 slow_after: float = 1.0, admit: Callable[[Node], bool] | None = None
                 ) -> None:
        self.admit = admit
        self.t = int.from_bytes(target, "big")
        self.k, self.alpha, self.own_id, self.skip = k, alpha, own_id, skip
        self.slow_after = slow_after
        self.grace = GRACE * slow_after
        self.known: dict[bytes, Node] = {}
        self.sources: set[str] = set()
        self.state: dict[bytes, str] = {}  # new | pending | slow | ok | failed
        self.started: dict[bytes, float] = {}  # pending or slow -> when asked
        self.replies: dict[bytes, Any] = {}
        self.rpcs = 0
        self.failures: list[Node] = []
        self.done = False
        self._edge: int | None = None
        for n in seeds:
            self._add(n)

    def _add(self, n: Node) -> None:
        if n.id == self.own_id or n.id in self.known or n.id in self.skip:
            return
        if self.admit is not None and not self.admit(n):
            return
        src = node_source(n)
        if src in self.sources:
            return
        self.sources.add(src)
        self.known[n.id] = n
        self.state[n.id] = "new"

    def _dist(self, n: Node) -> int:
        return n.long_id ^ self.t

    def answered(self, node: Node, closer: Iterable[Node], reply: Any) -> None:
        self.started.pop(node.id, None)
        self.state[node.id] = "ok"
        self.replies[node.id] = reply
        for c in closer:
            self._add(c)

    def failed(self, node: Node) -> None:
        self.started.pop(node.id, None)
        self.state[node.id] = "failed"
        self.failures.append(node)

    def _relevant_slow(self, now: float, edge: int | None) -> list[float]:
        """Start times of slow queries the lookup still waits for. Until some node has
        answered, every slow query is awaited to its end (an overloaded host); after, only
        one within its grace period that would rank among the k closest."""
        slow = [(self.known[nid], at) for nid, at in self.started.items()
                if self.state[nid] == "slow"]
        if not any(s == "ok" for s in self.state.values()):
            return [at for _, at in slow]
        return [at for n, at in slow if now - at < self.grace
                and (edge is None or self._dist(n) < edge)]

    def step(self, now: float) -> list[Node]:
        """Nodes to ask now (at most ``alpha`` not-yet-slow queries in flight)."""
        if self.done:
            return []
        for nid, at in self.started.items():
            if self.state[nid] == "pending" and now - at >= self.slow_after:
                self.state[nid] = "slow"  # stops counting against alpha
        ranked = sorted((n for n in self.known.values()
                         if self.state[n.id] in ("new", "pending", "ok")), key=self._dist)[:self.k]
        active = sum(1 for nid in self.started if self.state[nid] == "pending")
        ask = [n for n in ranked if self.state[n.id] == "new"][:max(0, self.alpha - active)]
        for n in ask:
            self.state[n.id] = "pending"
            self.started[n.id] = now
            self.rpcs += 1
        edge = self._dist(ranked[-1]) if len(ranked) >= self.k else None
        # Done when the k closest non-slow nodes all answered and no slow node that would
        # rank among them is still within its grace period, or when nothing is in flight.
        if (not ask and all(self.state[n.id] == "ok" for n in ranked)
                and not self._relevant_slow(now, edge)) or not self.started:
            self.done = True
        self._edge = edge
        return ask

    def wake_at(self, now: float) -> float | None:
        """When a pending query turns slow or a slow one's grace ends (None: only answers)."""
        deadlines = [at + self.slow_after for nid, at in self.started.items()
                     if self.state[nid] == "pending"]
        deadlines += [at + self.grace for at in self._relevant_slow(now, self._edge)
                      if now - at < self.grace]
        return min(deadlines) if deadlines else None

    def in_flight(self) -> list[Node]:
        return [self.known[nid] for nid in self.started]

    def result(self) -> LookupResult[Any]:
        answered = sorted((n for n in self.known.values() if self.state[n.id] == "ok"),
                          key=self._dist)[:self.k]
        return LookupResult([(n, self.replies[n.id]) for n in answered], self.rpcs,
                            self.failures + self.in_flight())


async def lookup(target: bytes, seeds: list[Node], query: Query[Any], *, k: int, alpha: int,
                 own_id: bytes | None = None, skip: Container[bytes] = (),
                 slow_after: float = 1.0,
                 keep: Callable[[asyncio.Task], None] | None = None,
                 admit: Callable[[Node], bool] | None = None) -> LookupResult[Any]:
    """Run a :class:`Lookup`; ``query(node)`` returns (closer nodes, reply) or None on failure.

    Nodes whose id is in ``skip`` (e.g. ones that just timed out), or that ``admit`` refuses
    (e.g. ids not bound to their address by BEP 42), are never asked. Queries
    still running at the end are handed to ``keep`` (so a dead node's timeout can still evict
    it) or, without ``keep``, cancelled.
    """
    clock = asyncio.get_running_loop().time
    machine = Lookup(target, seeds, k=k, alpha=alpha, own_id=own_id, skip=skip,
                     slow_after=slow_after, admit=admit)
    pending: dict[asyncio.Task, Node] = {}

    def launch(nodes: list[Node]) -> None:
        for n in nodes:
            pending[asyncio.ensure_future(query(n))] = n

    finished = False
    try:
        launch(machine.step(clock()))
        while not machine.done:
            wake = machine.wake_at(clock())
            timeout = None if wake is None else max(0.0, wake - clock())
            done, _ = await asyncio.wait(pending, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                node = pending.pop(task)
                answer = (task.result() if not task.cancelled() and not task.exception()
                          else None)
                if answer is None:
                    machine.failed(node)
                else:
                    machine.answered(node, *answer)
            launch(machine.step(clock()))
        finished = True
    finally:
        for task in pending:
            if finished and keep is not None:
                keep(task)
            else:
                task.cancel()
    return machine.result()
