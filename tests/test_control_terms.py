"""One coordinator per term: no peer ever acts on two coordinators in the same term.

A claim is a CAS over DHT items, not a vote, so two peers can claim one term when their
claims overlap (a slow claim outlasts failover, and others suspect its claimant). These
tests pin the rules: an unconfirmed claim is never reused, and a collision is settled in a
new term rather than inside the old one (a follower keeps the coordinator it follows while
it speaks; coordinators move on), so that no peer acts on two coordinators in one term even
when two claims of it both land.
"""

from __future__ import annotations

from swarm.control import machine as control
from swarm.control.election import Candidate
from swarm.control.machine import Controller, Duty, Timing
from swarm.control.state import CoordinatorState
from tests.test_control_machine import DT, SWARM, Sim, _pid, _stable


def test_a_claim_that_timed_out_is_never_reused():
    """Its put may still land: the next claim takes a higher term and a higher seq. (Before:
    the same term and seq again, and the DHT held two items of ours at one seq.)"""
    me = _pid("solo")
    t = Timing()
    c = Controller(me, SWARM, 0.0, t)
    c.members([Candidate(me, 1.0)], 0.0)
    now = t.failover + DT
    c.tick(now)
    first = [a for a in c.actions() if isinstance(a, control.PutState)]
    assert first and first[0].claim and c.role is Duty.CANDIDATE
    now += t.claim + DT
    c.tick(now)  # no claim_result: the claim timed out
    assert c.role is Duty.FOLLOWER
    now += t.failover + DT
    c.tick(now)
    again = [a for a in c.actions() if isinstance(a, control.PutState)]
    assert again and again[0].claim
    assert again[0].state.term > first[0].state.term
    assert again[0].state.seq > first[0].state.seq


def test_a_follower_never_switches_coordinators_within_a_term():
    """Two coordinators at one term (their claims overlapped): a follower keeps the one it
    follows while that one speaks, whichever has the lower id. (Before: the lower id won
    the tie, and the follower acted on two coordinators in one term.)"""
    sim, best = _stable({"a": 1.0, "b": 3.0, "c": 3.0})
    other = "c" if best == "b" else "b"
    a, term = sim.nodes["a"], sim.nodes["a"].term
    for followed, second in ((best, other), (other, best)):
        a.state = CoordinatorState(swarm=SWARM, term=term, seq=1, coordinator=sim.ids[followed])
        a.expected, a.last_heard = sim.ids[followed], sim.now
        st = CoordinatorState(swarm=SWARM, term=term, seq=2, coordinator=sim.ids[second])
        sim._deliver("a", "hb", lambda s=st, p=sim.ids[second]: a.heartbeat(s, p, sim.now))
        assert a.coordinator == sim.ids[followed]
        assert sim.refused[-1][2].startswith(f"two coordinators at term {term}")


def test_a_silent_coordinator_may_be_replaced_within_its_term():
    """A newcomer that read a term from a claim that lost (its signer never coordinated)
    follows the one that speaks once it suspects the silent one."""
    sim, best = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    a = sim.nodes["a"]
    ghost = CoordinatorState(swarm=SWARM, term=a.term, seq=9, coordinator=sim.ids["c"])
    a.state, a.expected = ghost, sim.ids["c"]
    a.suspects[sim.ids["c"]] = 0.0
    assert a.heartbeat(sim.nodes[best].state, sim.ids[best], sim.now)
    assert a.coordinator == sim.ids[best]


def test_two_coordinators_at_one_term_settle_in_the_next_term():
    """b and c both hold term 1 (a race): the swarm settles on one coordinator at term 2,
    and no peer acts on two coordinators in one term on the way. (Before: the lower id won
    term 1, so its rival and its rival's followers had acted on both.)"""
    sim = Sim({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.run_until(lambda: sim.agreed("b"))
    acted: dict[tuple[str, int], set[str]] = {}

    def record() -> None:
        for name, node in sim.nodes.items():
            if node.state is not None:
                acted.setdefault((name, node.state.term), set()).add(
                    sim.names[node.state.coordinator])

    # c claimed term 1 too, with a view that lacked b, and its item landed.
    c = sim.nodes["c"]
    c.state = CoordinatorState(swarm=SWARM, term=1, seq=1, coordinator=sim.ids["c"])
    c._set_state(Duty.CANDIDATE, sim.now)
    c._set_state(Duty.COORDINATOR, sim.now)
    sim.dht["c"] = c.state
    record()
    sim._run("c")  # its heartbeats reach a (which keeps b) and b (a new term decides)
    record()
    for _ in range(int(5 / DT)):
        sim.step()
        record()
    assert sim.agreed("b") and {n.term for n in sim.nodes.values()} == {2}
    assert {k: v for k, v in acted.items() if len(v) > 1} == {}, acted


def test_a_coordinator_heard_again_is_followed_with_the_usual_patience():
    """a, cut off, suspects b and waits for c to claim; b's heartbeats reach it again: it
    follows b at once, and b's death later is noticed after failover. (Before: a ignored
    b's heartbeats while it expected c, suspected c too and claimed the next term itself.)"""
    sim, best = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    a, t = sim.nodes["a"], sim.timing
    sim.cut.add("a")
    sim.run_until(lambda: sim.ids["b"] in a.suspects, limit=t.failover + 1)
    assert a.expected == sim.ids["c"]
    sim.cut.discard("a")
    sim.run_until(lambda: a.expected == sim.ids["b"] and not a.suspects, limit=1)
    sim.alive.discard("b")
    sim.run_until(lambda: sim.ids["b"] in a.suspects, limit=t.failover + 2 * DT)
