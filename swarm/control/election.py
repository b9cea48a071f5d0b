"""Deterministic coordinator election, successor choice and term fencing (sans-IO).

Every peer runs :func:`elect` on its own view of the members; the result depends only on
the set of members (never on order or on who computes it), so peers with the same view
agree without talking. Terms are fencing tokens: :class:`TermGuard` refuses any command
from a term below the highest one seen, so a deposed coordinator cannot act.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from identity.keys import PeerId
from swarm.errors import StaleTerm
from swarm.members import NO_COORDINATE, MemberRecord

LOW_BATTERY = 20.0  # percent, on battery power: not eligible to coordinate
HOT = 90.0  # degrees C: not eligible to coordinate


@dataclass(frozen=True)
class Fitness:
    """What decides whether a member is fit to coordinate: the health figures from its
    announcement (:class:`swarm.members.Health`), defaults filled in."""

    load: float = 0.0
    """CPU load as a fraction of all cores (0..1+)."""
    battery: float | None = None
    """Battery charge in percent; None when the machine has no battery."""
    plugged: bool = True
    """True when on mains power."""
    thermal: float | None = None
    """Hottest sensor in degrees C; None when unknown."""

    @property
    def fit(self) -> bool:
        """Fit to coordinate: not on a low battery and not overheating."""
        if self.battery is not None and not self.plugged and self.battery < LOW_BATTERY:
            return False
        return self.thermal is None or self.thermal < HOT


@dataclass(frozen=True)
class Candidate:
    """One member as the election sees it."""

    peer_id: PeerId
    """The member's identity; ties go to the lowest bytes."""
    tflops: float
    """Measured (benchmarked) throughput."""
    health: Fitness = Fitness()
    """Health figures from the member's announcement."""
    eligible: bool = True
    """False when the member's roles say it must not coordinate (an observer, a browser)."""
    freshness: float = 0.0
    """When the member last announced itself, on the controller's clock (its ``now``): an
    announcement made after we suspected the member clears the suspicion."""

    @property
    def can_coordinate(self) -> bool:
        return (self.eligible and self.health.fit and math.isfinite(self.tflops)
                and self.tflops >= 0)


def _dedupe(members: Iterable[Candidate]) -> dict[PeerId, Candidate]:
    """One entry per peer, chosen by content so that input order never matters."""
    best: dict[PeerId, Candidate] = {}
    for c in members:
        old = best.get(c.peer_id)
        if old is None or _content_key(c) > _content_key(old):
            best[c.peer_id] = c
    return best


def _content_key(c: Candidate) -> tuple:
    return (c.freshness, c.tflops if math.isfinite(c.tflops) else -1.0, repr(c))


def elect(members: Iterable[Candidate], blocked: Iterable[PeerId] = (),
          exclude: Iterable[PeerId] = ()) -> PeerId | None:
    """The live, unblocked, eligible member with the highest TFLOPS; ties to the lowest id.

    ``members`` is this peer's view of live members; ``exclude`` holds peers it suspects are
    dead (silent coordinators). Returns None when nobody can coordinate.
    """
    out = set(blocked) | set(exclude)
    pool = [c for c in _dedupe(members).values() if c.can_coordinate and c.peer_id not in out]
    if not pool:
        return None
    return min(pool, key=lambda c: (-c.tflops, c.peer_id.raw)).peer_id


def successor(members: Iterable[Candidate], leaving: PeerId, blocked: Iterable[PeerId] = (),
              exclude: Iterable[PeerId] = ()) -> PeerId | None:
    """The healthiest member to hand the coordinator role to when ``leaving`` goes.

    Ranked by TFLOPS, then battery (mains counts as full), then temperature, then load, then
    the lowest id; members unfit to coordinate are skipped.
    """
    out = set(blocked) | set(exclude) | {leaving}
    pool = [c for c in _dedupe(members).values() if c.can_coordinate and c.peer_id not in out]
    if not pool:
        return None

    def rank(c: Candidate) -> tuple:
        h = c.health
        battery = 100.0 if h.battery is None or h.plugged else h.battery
        return (-c.tflops, -battery, h.thermal or 0.0, h.load, c.peer_id.raw)

    return min(pool, key=rank).peer_id


class TermGuard:
    """Fencing: remembers the highest term seen and refuses commands from lower terms."""

    def __init__(self, highest: int = 0) -> None:
        self.highest = highest

    def observe(self, term: int) -> bool:
        """Record ``term``; True when it is new (higher than any seen)."""
        if term > self.highest:
            self.highest = term
            return True
        return False

    def admits(self, term: int) -> bool:
        return term >= self.highest

    def check(self, term: int, what: str = "command") -> None:
        """Raise :class:`StaleTerm` for a term below the highest seen, else observe it."""
        if term < self.highest:
            raise StaleTerm(f"{what} from term {term} refused: term {self.highest} is current")
        self.observe(term)


def candidate(record: MemberRecord, freshness: float) -> Candidate:
    """A member record as the election sees it (members and observers alike)."""
    h = record.health
    return Candidate(
        record.peer_id, record.tflops,
        Fitness(load=h.load or 0.0, battery=h.battery,
                plugged=True if h.plugged is None else h.plugged, thermal=h.thermal),
        eligible=("worker" in record.roles or "coordinator" in record.roles)
        and NO_COORDINATE not in record.roles,
        freshness=freshness)
