"""Where a model's blocks run: contiguous spans placed by each worker's memory and speed
(sans-IO: sizes and offers in, spans out).

A worker offers memory (its ``--max-memory``, announced in its member record) and has a
speed (its measured or claimed throughput). A span of blocks ``[first, first + count)`` on
a worker needs the blocks' bytes plus their keys and values for the context the requester
reserves (:attr:`Need.cache`); it must fit the worker's offer. Among the placements that fit,
:func:`place` picks one that minimises the slowest span's time (``bytes / speed``): with
sequences pipelined through the spans, the slowest span sets the pace, so larger and faster
workers take more blocks. Any number of workers of any size: a worker may get no span (too
small to hold a block beside the others, or not needed); each worker gets at most one span.

A model that fits in no placement is refused up front (:class:`PlacementError` names the
shortfall), never started and failed half way.

How: for one order of the workers, whether every span can be kept under a time ``T`` is a
greedy walk (each worker takes as many blocks as fit its memory and ``T``; taking fewer never
helps the workers after it), so bisecting ``T`` finds the best placement for that order.
Orders tried: every order of distinct workers when there are at most :data:`EXACT_WORKERS`
of them (then the placement is the best one), else a few natural orders (fastest first,
largest first, and their reverses). With equal block sizes (every transformer's), whether a
placement exists does not depend on the order, so a refusal is exact for any number of
workers.

Whose word: an offer is the worker's own claim. A worker that claims more memory than it has
fails its span (it refuses the bundle or the caches: "busy"), and the requester treats it like
a dead worker (swarm.spans); one that claims more speed only gets more blocks to be slow with.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

EXACT_WORKERS = 5
"""Up to this many workers every order is tried (at most 5! = 120 orders)."""
BISECT = 48
"""Halvings of the time limit per order."""
MAX_WORKERS = 4096
MAX_BLOCKS = 4096


class PlacementError(ValueError):
    """No placement fits; the message names the shortfall."""

    def __init__(self, message: str, shortfall: int) -> None:
        super().__init__(message)
        self.shortfall = shortfall
        """Bytes that would have to be offered beyond what is (at least)."""


@dataclass(frozen=True, slots=True)
class Offer:
    """One worker's offer."""

    worker: Hashable
    """Who (a PeerId, or any key the caller uses)."""
    memory: int
    """Bytes it holds for others (its ``--max-memory``)."""
    speed: float = 1.0
    """Relative throughput (any unit, the same for all workers); > 0."""


@dataclass(frozen=True, slots=True)
class Need:
    """What a model's blocks need."""

    blocks: tuple[int, ...]
    """Bytes of each block's weights as a worker holds them, in order."""
    cache: int = 0
    """Bytes of keys and values one block keeps for the context reserved."""

    def span_bytes(self, first: int, count: int) -> int:
        return sum(self.blocks[first:first + count]) + self.cache * count


@dataclass(frozen=True, slots=True)
class Span:
    """Blocks ``[first, first + count)`` on ``worker``."""

    worker: Hashable
    first: int
    count: int
    bytes: int
    """What the span needs there (weights and caches)."""


@dataclass(frozen=True, slots=True)
class Placement:
    spans: tuple[Span, ...]
    """In block order, covering every block once."""
    time: float
    """The slowest span's bytes / speed."""

    def plan(self) -> list[tuple[int, int]]:
        """``[(first, count), ...]`` per span."""
        return [(s.first, s.count) for s in self.spans]

    def workers(self) -> list[Hashable]:
        return [s.worker for s in self.spans]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _check(need: Need, offers: Sequence[Offer]) -> None:
    if not need.blocks or len(need.blocks) > MAX_BLOCKS:
        raise ValueError(f"a model has 1..{MAX_BLOCKS} blocks, got {len(need.blocks)}")
    if any(type(b) is not int or b < 0 for b in need.blocks) or need.cache < 0:
        raise ValueError("block and cache sizes are ints >= 0")
    if len(offers) > MAX_WORKERS:
        raise ValueError(f"at most {MAX_WORKERS} workers, got {len(offers)}")
    if len({o.worker for o in offers}) != len(offers):
        raise ValueError("each worker offers once")
    for o in offers:
        if type(o.memory) is not int or o.memory < 0 or not o.speed > 0:
            raise ValueError(f"worker {o.worker}: memory is an int >= 0 and speed > 0")


def _walk(need: Need, order: Sequence[Offer], limit: float) -> list[Span] | None:
    """Each worker in ``order`` takes as many of the next blocks as fit its memory and keep
    its time within ``limit``; the spans, or None when blocks are left over."""
    n, at, spans = len(need.blocks), 0, []
    for o in order:
        if at == n:
            break
        used, end = 0, at
        while end < n:
            more = need.blocks[end] + need.cache
            if used + more > o.memory or (used + more) / o.speed > limit:
                break
            used, end = used + more, end + 1
        if end > at:
            spans.append(Span(o.worker, at, end - at, used))
            at = end
    return spans if at == n else None


def _orders(offers: Sequence[Offer]) -> list[Sequence[Offer]]:
    """Orders of the workers to walk; workers alike (same memory and speed) are
    interchangeable, so orders that differ only in them are walked once."""
    if len(offers) <= EXACT_WORKERS:
        seen, out = set(), []
        for order in itertools.permutations(offers):
            key = tuple((o.memory, o.speed) for o in order)
            if key not in seen:
                seen.add(key)
                out.append(order)
        return out
    fast = sorted(offers, key=lambda o: (-o.speed, -o.memory))
    big = sorted(offers, key=lambda o: (-o.memory, -o.speed))
    return [fast, big, fast[::-1], big[::-1]]


def _time(spans: Sequence[Span], speed: dict) -> float:
    return max(s.bytes / speed[s.worker] for s in spans)


def _best(need: Need, order: Sequence[Offer]) -> list[Span] | None:
    """The spans with the least slowest time that ``order`` gives (None: it places not all
    blocks): bisect the time limit; the best is one span's exact time, found to within
    float rounding."""
    spans = _walk(need, order, float("inf"))
    if spans is None:
        return None
    speed = {o.worker: o.speed for o in order}
    lo, hi = 0.0, _time(spans, speed)
    for _ in range(BISECT):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        trial = _walk(need, order, mid)
        if trial is None:
            lo = mid
        else:
            spans, hi = trial, _time(trial, speed)
    return spans


def place(need: Need, offers: Sequence[Offer]) -> Placement:
    """The placement of ``need``'s blocks over ``offers`` (module docstring), or
    PlacementError naming the shortfall. Deterministic for the same inputs."""
    _check(need, offers)
    offers = sorted(offers, key=lambda o: (-o.speed, -o.memory, repr(o.worker)))
    total = need.span_bytes(0, len(need.blocks))
    offered = sum(o.memory for o in offers)
    if not offers:
        raise PlacementError(f"no worker offers memory: the model's blocks need {_mib(total)}",
                             total)
    largest = max(need.blocks) + need.cache
    if largest > max(o.memory for o in offers):
        short = largest - max(o.memory for o in offers)
        raise PlacementError(f"the largest block needs {_mib(largest)} (weights and caches) and "
                             f"the largest offer is {_mib(max(o.memory for o in offers))}: "
                             f"{_mib(short)} short", short)
    if total > offered:
        raise PlacementError(f"the model's blocks need {_mib(total)} (weights and caches), the "
                             f"{len(offers)} workers offer {_mib(offered)}: "
                             f"{_mib(total - offered)} short", total - offered)
    speed = {o.worker: o.speed for o in offers}
    best: tuple[float, int, list[Span]] = (float("inf"), 0, [])
    for order in _orders(offers):
        spans = _best(need, order)
        if spans is not None and (_time(spans, speed), len(spans)) < best[:2]:
            best = (_time(spans, speed), len(spans), spans)
    if not best[2]:
        # every block fits some worker and the total fits, but not as contiguous spans
        # (blocks do not split): at least the largest block's worth is missing
        raise PlacementError(f"the model's blocks ({_mib(total)}) do not split into spans "
                             f"that fit the {len(offers)} offers ({_mib(offered)}): blocks do "
                             f"not split, about {_mib(largest)} more is needed", largest)
    return Placement(tuple(best[2]), best[0])
