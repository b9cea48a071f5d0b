"""Which coordinator state a reader that follows nobody yet takes (a newcomer's start read,
a passive client, ``swarm status``): the one most members say they follow, among the DHT
items that count, with the rules for reading again and for whose votes count.

Kept apart from :mod:`swarm.control.core` so that observers (``swarm status``, run again and
again while a user waits for a failover) import the rule without the core's weight (the
runtime's evidence checks, numpy).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from identity import PeerId
from swarm.control.election import Candidate
from swarm.control.machine import counted_states
from swarm.control.state import CoordinatorState
from swarm.members import MemberRecord, follows


def followers(records: Iterable[MemberRecord]) -> Counter[tuple[int, bytes]]:
    """How many members (one record each) say they follow each :func:`follows` key."""
    return Counter(r.follows for r in records if r.follows is not None)


def newest_counted(states: Iterable[CoordinatorState], view: dict[PeerId, Candidate],
                   blocked: Iterable[PeerId] = (), floor: int | None = None,
                   votes: Counter[tuple[int, bytes]] | None = None,
                   ) -> CoordinatorState | None:
    """The state item to follow among those that count (:func:`counted_states`), for a
    reader that follows nobody yet (a newcomer, a client, ``swarm status``): the one most
    members say they follow (``votes``, from :func:`followers`), the newest among equals.
    Taking the newest alone let one eligible member capture every newcomer by putting its
    own item one term above the coordinator's (issue 33, finding 1)."""
    votes = votes or Counter()
    return max(counted_states(states, view, blocked, floor),
               key=lambda s: (votes[follows(s.term, s.coordinator)], s.term, s.seq),
               default=None)


def deciding_voters(states: Iterable[CoordinatorState], view: dict[PeerId, Candidate],
                    records: Iterable[MemberRecord]) -> list[MemberRecord]:
    """The records whose votes decide between the counted states (:func:`newest_counted`)
    when more than one coordinator or term counts, else none: a reader that follows nobody
    counts only those of them it can reach (their DHT node answers it).

    A record is its member's last word until it expires (minutes): in a split, the other
    side's records still vote for the coordinator it cut off, and a newcomer or ``swarm
    status`` on this side would name that unreachable coordinator over the one its own side
    elected. Whom a reader can reach, nobody can vote for from afar; an attacker can still
    only add its own one vote (issue 33, finding 1)."""
    keys = {follows(s.term, s.coordinator) for s in counted_states(states, view, ())}
    if len(keys) < 2:
        return []
    return [r for r in records if r.follows in keys]


STATE_READS = 3
"""Reads of the members' coordinator-state items an observer makes, at most, before it says
that nobody coordinates (see :func:`rereads`)."""
REREAD_PAUSE = 0.3
"""Seconds between two such reads: a busy host gets a moment to catch up."""


def rereads(view: dict[PeerId, Candidate], found: dict[PeerId, CoordinatorState | None],
            ) -> tuple[PeerId, ...]:
    """The members whose coordinator-state item to read again, by peer id, before an observer
    concludes that nobody coordinates: while none of the items in ``found`` (member -> what
    its read returned) counts (:func:`newest_counted`), the members of ``view`` that may
    coordinate and whose read came back empty; nothing once one counts.

    One DHT read is no proof that an item is absent: a lookup stops waiting for a node that
    answers late (a loaded host) soon after another one answered, and in a small swarm the
    coordinator's own node may be the only one holding its newest item. A swarm that has a
    coordinator has its item; "no coordinator" must not rest on one missed read of it. Once
    an item counts, the members without one (workers that never coordinated) are not read
    again."""
    if newest_counted([s for s in found.values() if s is not None], view) is not None:
        return ()
    return tuple(sorted((p for p, s in found.items()
                         if s is None and p in view and view[p].can_coordinate),
                        key=lambda p: p.raw))
