"""Election (invariant 1: same view -> same winner), successor choice and fencing (invariant 2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from identity.keys import PeerId
from swarm.control.election import Candidate, Fitness, TermGuard, elect, successor
from swarm.errors import StaleTerm

peer_ids = st.binary(min_size=32, max_size=32).map(PeerId)
healths = st.builds(
    Fitness,
    load=st.floats(0, 4),
    battery=st.none() | st.floats(0, 100),
    plugged=st.booleans(),
    thermal=st.none() | st.floats(20, 110),
)
candidates = st.builds(
    Candidate,
    peer_id=peer_ids,
    # few distinct values so that ties are common
    tflops=st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.5, float("nan"), float("inf")]),
    health=healths,
    eligible=st.booleans(),
    freshness=st.floats(0, 10),
)
views = st.lists(candidates, max_size=12)
unique_views = st.lists(candidates, max_size=12, unique_by=lambda c: c.peer_id)


@given(views, st.randoms(), st.lists(peer_ids, max_size=3))
def test_same_view_any_order_same_winner(view, rnd, blocked):
    """Every peer computing from the same set of members, in any order, gets one winner."""
    shuffled = list(view) + list(view[: len(view) // 2])  # duplicates, too
    rnd.shuffle(shuffled)
    some_blocked = blocked + [c.peer_id for c in view[:1]]
    assert elect(view, some_blocked) == elect(shuffled, list(reversed(some_blocked)))
    assert successor(view, PeerId(bytes(32)), some_blocked) == \
        successor(shuffled, PeerId(bytes(32)), some_blocked)


@given(unique_views, st.lists(peer_ids, max_size=3))
def test_winner_is_the_fastest_fit_unblocked_member_lowest_id_on_ties(view, blocked):
    winner = elect(view, blocked)
    pool = [c for c in view if c.can_coordinate and c.peer_id not in blocked]
    if not pool:
        assert winner is None
        return
    assert winner not in blocked
    best = max(c.tflops for c in pool)
    assert winner == min(c.peer_id for c in pool if c.tflops == best)


def _pid(n: int) -> PeerId:
    return PeerId(bytes([n]) * 32)


def test_highest_tflops_wins_then_lowest_peer_id():
    a, b, c = _pid(1), _pid(2), _pid(3)
    assert elect([Candidate(a, 1.0), Candidate(b, 2.0), Candidate(c, 2.0)]) == b
    assert elect([Candidate(a, 1.0), Candidate(b, 2.0)], blocked=[b]) == a
    assert elect([Candidate(a, 1.0), Candidate(b, 2.0)], exclude=[b]) == a
    assert elect([Candidate(b, 9.0, eligible=False)]) is None
    hot = Fitness(thermal=95.0)
    low = Fitness(battery=10.0, plugged=False)
    assert elect([Candidate(a, 1.0), Candidate(b, 5.0, hot), Candidate(c, 5.0, low)]) == a


def test_successor_is_the_healthiest_other_member():
    a, b, c, d = _pid(1), _pid(2), _pid(3), _pid(4)
    members = [
        Candidate(a, 9.0),  # the leaving coordinator
        Candidate(b, 2.0, Fitness(battery=40.0, plugged=False)),
        Candidate(c, 2.0, Fitness(load=0.9)),
        Candidate(d, 2.0, Fitness(load=0.1)),
    ]
    assert successor(members, leaving=a) == d  # same TFLOPS: mains beats battery, then load
    assert successor(members, leaving=a, exclude=[d]) == c
    assert successor([Candidate(a, 9.0)], leaving=a) is None


def test_term_guard_fences_lower_terms():
    g = TermGuard()
    g.check(1)
    assert g.observe(3)
    assert not g.observe(2)
    g.check(3)  # the current term is fine
    with pytest.raises(StaleTerm, match="term 2 refused: term 3"):
        g.check(2, "kick")
    assert g.highest == 3
