"""The coordinator state machine, driven by a fake clock and an in-memory network.

Covers invariants 1-3 without sockets: every peer follows one coordinator, a deposed
coordinator's commands are refused (fencing), failover after a crash, graceful handoff,
and a blocklist that survives coordinator changes and a full restart.
"""

from __future__ import annotations

import pytest

from identity.keys import PeerId, PeerKey
from swarm.control import machine as control
from swarm.control.election import Candidate, Fitness
from swarm.control.machine import CheckedCommand, Controller, Duty, Timing
from swarm.control.state import BlockEntry, BlockPage, CoordinatorState, KickOrder, LiarReport
from swarm.errors import NotCoordinator, ProtocolError, StaleTerm

SWARM = bytes(range(20))
DT = 0.05


def _pid(name: str) -> PeerId:
    return PeerKey.from_seed(name.encode().ljust(32, b".")).peer_id


def _check(report: LiarReport, reporter: PeerId) -> control.Judgement:
    """Stands in for the runtime's evidence check: evidence b"proof..." proves the lie."""
    if report.evidence.startswith(b"proof"):
        return control.Judgement(True, report.evidence)
    return control.refuse_unchecked(report, reporter)


def _lie(peer: PeerId, n: int) -> LiarReport:
    return LiarReport(peer, "wrong shard", b"proof%d" % n)


class Sim:
    """Controllers wired together; dead peers keep their stale DHT records in the view.

    ``dht`` holds each peer's own state item, as the plane stores it; a claim is the plane's
    CAS: it fails when an item that counts holds the claimed term or a later one, except for
    the ``cheats`` (modified code that stores its claim regardless)."""

    def __init__(self, tflops: dict[str, float], timing: Timing | None = None,
                 persisted: dict[str, CoordinatorState] | None = None,
                 health: dict[str, Fitness] | None = None) -> None:
        self.now = 0.0
        self.timing = timing = timing or Timing()
        self.tflops = dict(tflops)
        self.health = health or {}
        self.ids = {n: _pid(n) for n in tflops}
        self.names = {v: k for k, v in self.ids.items()}
        persisted = persisted or {}
        self.nodes = {n: Controller(self.ids[n], SWARM, 0.0, timing, persisted.get(n),
                                    check_evidence=_check) for n in tflops}
        self.alive = set(tflops)
        self.cut: set[str] = set()  # partitioned: sends and receives nothing
        self.persisted: dict[str, CoordinatorState] = dict(persisted)
        # Items outlive a full restart: each node's own is the last state it coordinated.
        self.dht: dict[str, CoordinatorState] = {
            n: s for n, s in persisted.items() if s.coordinator == self.ids[n]}
        self.cheats: set[str] = set()
        self.refused: list[tuple[str, str, str]] = []  # (receiver, what, error)
        self.disconnects: dict[str, list[tuple[PeerId, bool]]] = {n: [] for n in tflops}
        self.left: dict[str, str] = {}
        self.issued: dict[PeerId, CheckedCommand] = {}  # operator block commands, by target
        self.unblocks: dict[PeerId, CheckedCommand] = {}  # operator unblock commands, by target
        self.lose: dict[str, int] = {}  # messages of a kind still to lose (no link yet)
        self.announced: dict[str, float] = {}  # when each (re)announced itself (freshness)

    def operator(self, at_node: str, kind: str, target: str, at: int) -> None:
        """An owner's command reaching the coordinator ``at_node``."""
        cmd = CheckedCommand(kind, self.ids[target], "by the owner", "owner", at,
                      self.nodes[at_node].term)
        if kind == "block":
            self.issued[cmd.target] = cmd
        elif kind == "unblock":
            self.unblocks[cmd.target] = cmd
        self.nodes[at_node].command(cmd, self.now)
        self._run(at_node)

    def add(self, name: str, tflops: float) -> None:
        self.tflops[name] = tflops
        self.ids[name] = _pid(name)
        self.names[self.ids[name]] = name
        self.nodes[name] = Controller(self.ids[name], SWARM, self.now, self.timing,
                                      check_evidence=_check)
        self.alive.add(name)
        self.disconnects[name] = []
        self.nodes[name].members(self.view(), self.now)  # a node starts by reading the view

    def view(self) -> list[Candidate]:
        return [Candidate(self.ids[n], t, self.health.get(n, Fitness()),
                          freshness=self.announced.get(n, 0.0))
                for n, t in self.tflops.items() if n not in self.left]

    def step(self) -> None:
        self.now = round(self.now + DT, 6)
        for n in sorted(self.alive):
            node = self.nodes[n]
            node.members(self.view(), self.now)
            node.tick(self.now)
            self._run(n)

    def run_until(self, cond, limit: float = 30.0) -> float:
        start = self.now
        while not cond():
            assert self.now - start < limit, "condition not reached"
            self.step()
        return self.now - start

    def _reach(self, src: str, dst_id: PeerId) -> str | None:
        dst = self.names.get(dst_id)
        if dst is None or dst not in self.alive or src in self.cut or dst in self.cut:
            return None
        return dst

    def _deliver(self, dst: str, what: str, fn) -> None:
        if self.lose.get(what, 0) > 0:
            self.lose[what] -= 1
            return
        try:
            fn()
        except (StaleTerm, NotCoordinator) as exc:
            self.refused.append((dst, what, str(exc)))
        self._run(dst)

    def _run(self, name: str) -> None:
        node = self.nodes[name]
        for act in node.actions():
            if isinstance(act, control.PutState):
                if act.claim:
                    top = None if name in self.cheats else node.claim_conflict(
                        act.state, self.dht.values())
                    if top is None:
                        self.dht[name] = act.state
                    node.claim_result(top is None, self.now, beaten_by=top)
                    self._run(name)
                else:
                    self.dht[name] = act.state
            elif isinstance(act, control.Persist):
                self.persisted[name] = act.state
            elif isinstance(act, control.SendHeartbeat):
                endorser = PeerId(act.endorsement) if act.endorsement else None
                for to in act.to:
                    if (dst := self._reach(name, to)) is not None:
                        self._deliver(dst, "hb", lambda d=dst, a=act, e=endorser: self.nodes[
                            d].heartbeat(a.state, node.me, self.now, e))
            elif isinstance(act, control.SendHandoff):
                if (dst := self._reach(name, act.to)) is not None:
                    self._deliver(dst, "handoff", lambda d=dst, a=act: self.nodes[
                        d].handoff_offer(a.state, node.me, self.now, node.me.raw))
            elif isinstance(act, control.SendKick):
                for to in act.to:
                    if (dst := self._reach(name, to)) is not None:
                        self._deliver(dst, "kick", lambda d=dst, a=act: self.nodes[
                            d].kick_order(a.order, node.me, self.now, a.order.at))
            elif isinstance(act, control.ForwardBlocks):
                # The adapter forwards the signed owner/admin commands it holds for these
                # peers; here the commands an operator issued stand in for those proofs.
                for entry in act.entries:
                    cmd = self.issued.get(entry.peer)
                    if (dst := self._reach(name, act.to)) is None:
                        continue
                    if cmd is not None:
                        self._deliver(dst, "fwd", lambda d=dst, c=cmd: self.nodes[
                            d].forwarded_block(c, node.me, self.now, c.at))
                    elif entry.by == "coordinator":
                        self._deliver(dst, "fwdauto", lambda d=dst, e=entry, t=act.term:
                                      self.nodes[d].forwarded_auto_block(e, t, node.me,
                                                                         self.now, e.at))
            elif isinstance(act, control.ForwardUnblocks):
                for peer in act.peers:
                    cmd = self.unblocks.get(peer)
                    if cmd is not None and (dst := self._reach(name, act.to)) is not None:
                        self._deliver(dst, "fwd", lambda d=dst, c=cmd: self.nodes[
                            d].forwarded_unblock(c, node.me, self.now, c.at))
            elif isinstance(act, control.Disconnect):
                self.disconnects[name].append((act.peer, act.blocked))
            elif isinstance(act, control.Left):
                self.left[name] = act.reason
                self.alive.discard(name)

    # -- helpers ---------------------------------------------------------------------------

    def coordinators(self) -> set[str]:
        return {n for n in self.alive if self.nodes[n].role is Duty.COORDINATOR}

    def agreed(self, name: str, but: frozenset[str] = frozenset()) -> bool:
        """Everybody alive and connected (but ``but``) follows ``name``, which coordinates."""
        if self.nodes[name].role is not Duty.COORDINATOR:
            return False
        return all(self.nodes[n].coordinator == self.ids[name]
                   for n in self.alive - self.cut - but)


def _stable(tflops: dict[str, float], **kw) -> tuple[Sim, str]:
    sim = Sim(tflops, **kw)
    best = max(tflops, key=lambda n: (tflops[n], [-b for b in _pid(n).raw]))
    sim.run_until(lambda: sim.agreed(best))
    return sim, best


def test_startup_elects_the_fastest_member_at_term_1():
    sim, best = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    assert best == "b"
    assert sim.coordinators() == {"b"}
    assert {sim.nodes[n].term for n in sim.nodes} == {1}
    # Stays stable: nobody else claims while heartbeats flow.
    for _ in range(100):
        sim.step()
    assert sim.coordinators() == {"b"} and sim.nodes["a"].term == 1


def test_tie_goes_to_the_lowest_peer_id():
    sim = Sim({"a": 2.0, "b": 2.0, "c": 2.0})
    low = min(("a", "b", "c"), key=lambda n: _pid(n).raw)
    sim.run_until(lambda: sim.agreed(low))


def test_crash_failover_within_bound_keeps_blocklist():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.5})
    sim.nodes["b"].command(CheckedCommand("block", sim.ids["x"], "spam", "owner", 1), sim.now)
    sim._run("b")
    sim.run_until(lambda: all(sim.ids["x"] in sim.nodes[n].blocked() for n in ("a", "c")))
    sim.alive.discard("b")  # SIGKILL: silent, but its DHT record stays in everyone's view
    took = sim.run_until(lambda: sim.agreed("c"))
    t = sim.timing
    assert took <= t.failover + t.heartbeat + 4 * DT, took
    assert sim.nodes["c"].term == 2 and sim.nodes["a"].term == 2
    assert sim.ids["x"] in sim.nodes["c"].blocked() and sim.ids["x"] in sim.nodes["a"].blocked()
    assert sim.nodes["c"].state.prev  # the chain continues from the dead coordinator's state


def test_an_announcement_made_before_the_crash_does_not_revive_the_dead_coordinator():
    """b announced itself just before its SIGKILL, but the followers' views still held its
    older announcement when they suspected it. Reading the newer one afterwards is no sign
    of life: it must not clear the suspicion (b was elected again, suspected again after
    another ``failover``, and the failover took twice as long; in bench/control.py a
    graceful handoff then went to the dead peer and waited out its ``handoff`` timeout)."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.announced["b"] = sim.now - 30.0  # the announcement the views hold
    sim.step()
    died = sim.now
    sim.alive.discard("b")
    t = sim.timing
    sim.run_until(lambda: all(sim.ids["b"] in sim.nodes[n].suspects for n in "ac"))
    sim.announced["b"] = died - 0.5  # its last announcement, made before it died, read now
    sim.run_until(lambda: sim.agreed("c"), limit=t.failover + t.claim)
    for _ in range(int(t.failover / DT)):
        sim.step()
    assert sim.ids["b"] in sim.nodes["a"].suspects  # still: nothing it did since
    sim.nodes["c"].leave(sim.now)  # and a handoff from c goes to a, not to the dead b
    sim._run("c")
    assert sim.nodes["c"]._successor == sim.ids["a"]


def test_the_dead_coordinators_last_dht_item_is_no_sign_of_life():
    """b put a newer state item (a block) just before its SIGKILL; its heartbeat with it never
    went out. A follower that suspects b reads that item in the DHT (catching up): it takes
    the block, but an item in the DHT is not b speaking, so b stays suspected and the
    failover is not put off by another ``failover`` (it took 4.6-6 s in bench/control.py)."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.5})
    b = sim.nodes["b"]
    sim.alive.discard("b")
    sim.cut.add("c")  # a hears nobody for now (c's claim reaches it later)
    last = b.state.with_block(BlockEntry(sim.ids["x"], "spam", "owner", 5))
    sim.run_until(lambda: sim.ids["b"] in sim.nodes["a"].suspects)
    a = sim.nodes["a"]
    assert a.heartbeat(last, sim.ids["b"], sim.now, heard=False)  # adopted: the block
    assert sim.ids["x"] in a.blocked()
    assert sim.ids["b"] in a.suspects and a.expected == sim.ids["c"]
    a.heartbeat(last, sim.ids["b"], sim.now, heard=False)  # the same item read again
    for _ in range(int(sim.timing.failover / 2 / DT)):
        sim.step()
    assert sim.ids["b"] in a.suspects and a.expected == sim.ids["c"]
    sim.cut.clear()
    took = sim.run_until(lambda: sim.agreed("c", but=frozenset({"x"})), limit=sim.timing.claim)
    assert took < sim.timing.failover / 2, took


def test_a_follower_that_meets_the_failover_winner_first_takes_the_old_one_for_dead():
    """z still follows b (its own failover timer has not fired) when c's term-2 heartbeat
    arrives: it follows c, elected with b set aside, and takes b for dead like those that
    saw b fall silent. Otherwise z, offered the role a moment later, would still ask b's
    node in its claim's lookups and pick b as its own successor."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.alive.discard("b")
    sim.run_until(lambda: sim.agreed("c"))
    z = Controller(_pid("z"), SWARM, 0.0, sim.timing, state=sim.nodes["b"].state)
    z.members(sim.view(), sim.now)
    assert z.heartbeat(sim.nodes["c"].state, sim.ids["c"], sim.now)
    assert z.coordinator == sim.ids["c"] and sim.ids["b"] in z.suspects
    # an endorsed handoff is no failover: nobody is taken for dead by it
    y = Controller(_pid("y"), SWARM, 0.0, sim.timing, state=sim.nodes["b"].state)
    y.members(sim.view(), sim.now)
    assert y.heartbeat(sim.nodes["c"].state, sim.ids["c"], sim.now, endorsed_by=sim.ids["b"])
    assert sim.ids["b"] not in y.suspects


def test_a_claim_that_lost_follows_the_state_that_beat_it():
    """c's claim of term 2 lands but its heartbeats do not reach a (a cut), so a suspects c
    too and claims term 2 itself; the CAS shows it c's item. a then follows c (rather than
    the dead b), so that c's handoff offer, a moment later, comes from the coordinator a
    follows (it was refused as coming from a stranger, and timed out: handoff 7.5 s)."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.alive.discard("b")
    sim.cut.add("c")
    sim.run_until(lambda: sim.nodes["c"].role is Duty.COORDINATOR)
    a = sim.nodes["a"]
    sim.run_until(lambda: a.state.coordinator != sim.ids["b"], limit=3 * sim.timing.failover)
    assert a.state.coordinator == sim.ids["c"]  # its claim of term 2 failed on c's item
    assert a.role is Duty.FOLLOWER and a.term == 2
    assert sim.ids["c"] not in a.suspects and sim.ids["b"] in a.suspects
    assert a.last_heard == sim.now  # c gets the usual patience to be heard
    sim.cut.clear()  # within it, c's handoff offer comes from the coordinator a follows
    sim.nodes["c"].leave(sim.now)
    sim._run("c")
    sim.run_until(lambda: sim.agreed("a", but=frozenset({"c"})), limit=sim.timing.handoff)
    assert a.term == 3 and ("a", "handoff", "handoff offered by a peer that is not the "
                            "coordinator we follow") not in sim.refused


def test_chained_failover_when_the_successor_is_dead_too():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.alive -= {"b", "c"}
    sim.run_until(lambda: sim.agreed("a"), limit=10)
    assert sim.nodes["a"].term == 2


def test_fencing_a_deposed_coordinator_is_refused():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.cut.add("b")  # partitioned: b still thinks it coordinates at term 1
    sim.run_until(lambda: sim.agreed("c"))
    assert sim.nodes["b"].role is Duty.COORDINATOR and sim.nodes["b"].term == 1
    old = sim.nodes["b"].state
    # b's stale heartbeat and kick order reach a: refused, nothing applied.
    with pytest.raises(StaleTerm, match="term 1 refused: term 2"):
        sim.nodes["a"].heartbeat(old, sim.ids["b"], sim.now)
    with pytest.raises(StaleTerm):
        sim.nodes["a"].kick_order(KickOrder(1, sim.ids["c"], "coup", 0), sim.ids["b"],
                                  sim.now, 0)
    assert sim.nodes["a"].actions() == []
    assert sim.nodes["a"].coordinator == sim.ids["c"]
    # Healed: b hears term 2 and steps down; its term-1 heartbeats were refused meanwhile.
    sim.cut.clear()
    sim.run_until(lambda: sim.nodes["b"].role is Duty.FOLLOWER and sim.agreed("c"))
    assert any(what == "hb" and "term 1 refused" in err for _, what, err in sim.refused)
    assert sim.nodes["b"].term == 2


def test_graceful_handoff_to_the_healthiest_carries_state():
    health = {"c": Fitness(battery=30.0, plugged=False), "d": Fitness(load=0.1)}
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "d": 2.0}, health=health)
    b = sim.nodes["b"]
    b.command(CheckedCommand("block", sim.ids["a"], "test", "admin", 5), sim.now)
    sim._run("b")
    start = sim.now
    b.leave(sim.now)
    sim._run("b")
    sim.run_until(lambda: "b" in sim.left and sim.agreed("d"))
    assert sim.now - start <= 2 * DT  # one round of messages, no failover wait
    assert sim.left["b"] == "handed off"
    d = sim.nodes["d"]
    assert d.term == 2 and d.endorsement == sim.ids["b"].raw
    assert sim.ids["a"] in d.blocked()
    assert not any(w == "hb" for _, w, _ in sim.refused)


def test_handoff_falls_back_when_the_successor_is_gone():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.alive.discard("c")  # silent successor
    sim.nodes["b"].leave(sim.now)
    sim._run("b")
    sim.run_until(lambda: "b" in sim.left and sim.agreed("a"), limit=10)


def test_block_survives_coordinator_change_and_full_restart_in_the_sim():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.5})
    sim.nodes["b"].command(CheckedCommand("block", sim.ids["x"], "bad", "owner", 1), sim.now)
    sim._run("b")
    assert "x" in sim.left and sim.left["x"] == "this peer is blocked"
    sim.run_until(lambda: all(sim.ids["x"] in sim.persisted[n].blocked_ids
                              for n in ("a", "b", "c")))
    sim.alive.discard("b")
    sim.run_until(lambda: sim.agreed("c"))
    # Full restart of every node from its data dir; x comes back with a huge benchmark.
    persisted = {n: s for n, s in sim.persisted.items() if n != "x"}
    sim2 = Sim({"a": 1.0, "b": 3.0, "c": 2.0, "x": 50.0}, persisted=persisted)
    sim2.cheats.add("x")  # it claims past the CAS, too
    sim2.run_until(lambda: sim2.agreed("b", but=frozenset({"x"})))
    assert sim2.nodes["b"].term >= 2
    for n in ("a", "b", "c"):
        assert sim2.ids["x"] in sim2.nodes[n].blocked()
    # x, knowing nothing, claimed the role for itself: every member refused it.
    assert {d for d, what, err in sim2.refused if what == "hb" and "blocked" in err} \
        == {"a", "b", "c"}
    # A brand-new member learns the blocklist from the heartbeat.
    sim2.add("e", 0.1)
    sim2.run_until(lambda: sim2.ids["x"] in sim2.nodes["e"].blocked())
    # And unblock works, carried the same way.
    sim2.nodes["b"].command(CheckedCommand("unblock", sim2.ids["x"], "", "owner", 2), sim2.now)
    sim2._run("b")
    sim2.run_until(lambda: sim2.ids["x"] not in sim2.nodes["e"].blocked())


def test_blocked_peer_never_coordinates():
    sim, _ = _stable({"a": 1.0, "b": 3.0})
    sim.nodes["b"].command(CheckedCommand("block", sim.ids["a"], "", "owner", 1), sim.now)
    sim._run("b")
    fake = CoordinatorState(SWARM, 9, 9, sim.ids["a"])
    with pytest.raises(NotCoordinator, match="blocked"):
        Controller(_pid("z"), SWARM, 0, state=sim.nodes["b"].state).heartbeat(
            fake, sim.ids["a"], 1.0)


def test_an_unelected_claimant_is_refused():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    rogue = CoordinatorState(SWARM, 7, 99, sim.ids["a"])  # a is not whom c elects
    with pytest.raises(NotCoordinator, match="neither endorsed"):
        sim.nodes["c"].heartbeat(rogue, sim.ids["a"], sim.now)
    assert sim.nodes["c"].coordinator == sim.ids["b"]


def test_faster_newcomer_gets_the_role_by_handoff():
    sim, _ = _stable({"a": 1.0, "b": 2.0})
    sim.add("f", 10.0)
    sim.run_until(lambda: sim.agreed("f"))
    assert sim.nodes["f"].term == 2 and sim.nodes["b"].role is Duty.FOLLOWER


def _handing_off_with_the_offer_lost() -> Sim:
    """b coordinates; f, a member that follows it, turns out faster (b's benchmark came out
    slow under load in CI) and gets the role by handoff, but the offer is lost (the CI run's
    successor refused it, "before our start read answered"): b waits ``handoff`` s in
    HANDING_OFF."""
    sim, _ = _stable({"a": 1.0, "b": 2.0, "x": 0.5})
    sim.add("f", 1.5)
    sim.run_until(lambda: sim.nodes["f"].coordinator == sim.ids["b"])
    sim.lose["handoff"] = 1
    sim.tflops["f"] = 10.0
    sim.run_until(lambda: sim.nodes["b"].role is Duty.HANDING_OFF)
    assert sim.lose["handoff"] == 0
    return sim


def test_an_owner_command_during_a_failed_handoff_applies_when_we_coordinate_again():
    """The CI failure of test_failover_block_and_full_restart: the owner's block reached the
    coordinator while it handed off and was refused; the CLI sends once, so it was lost. b
    holds it, and applies it when its offer times out and it coordinates again."""
    sim = _handing_off_with_the_offer_lost()
    sim.operator("b", "block", "x", at=100)
    sim.operator("b", "kick", "a", at=100)
    assert sim.ids["x"] not in sim.nodes["b"].blocked()  # held, not yet applied
    sim.run_until(lambda: sim.nodes["b"].role is Duty.COORDINATOR,
                  limit=sim.timing.handoff + 1)
    assert sim.left.get("x") == "this peer is blocked"
    assert sim.left.get("a") == "kicked: by the owner"
    assert sim.ids["x"] in sim.persisted["b"].blocked_ids
    assert sim.ids["x"] in sim.nodes["f"].blocked()
    assert not [r for r in sim.refused if r[0] == "b"]


def test_an_owner_command_during_a_handoff_is_forwarded_to_the_successor():
    """The offer does reach f (late): f takes over at term 2 with a state that lacks the
    block b held; b forwards it with its proof, and f applies it, once."""
    sim = _handing_off_with_the_offer_lost()
    b, f = sim.nodes["b"], sim.nodes["f"]
    sim.operator("b", "block", "x", at=100)
    sim.operator("b", "unblock", "a", at=100)  # nothing to undo at f: dropped
    offer = b.state.successor(term=b.state.term + 1, coordinator=sim.ids["f"])
    f.handoff_offer(offer, sim.ids["b"], sim.now, sim.ids["b"].raw)
    sim._run("f")
    sim.run_until(lambda: sim.agreed("f") and sim.ids["x"] in f.blocked(), limit=2)
    assert f.term == 2 and b.role is Duty.FOLLOWER
    assert sim.left.get("x") == "this peer is blocked"
    assert ("f", "fwd") not in {(d, w) for d, w, _ in sim.refused}
    for _ in range(int(3 * sim.timing.failover / DT)):
        sim.step()
    assert sim.ids["x"] in sim.persisted["a"].blocked_ids and f.term == 2


def test_a_handing_off_coordinator_holds_only_a_few_commands():
    sim = _handing_off_with_the_offer_lost()
    b = sim.nodes["b"]
    for i in range(control.MAX_HELD):
        sim.operator("b", "kick", "a", at=100 + i)
    assert b.refuses_command() == "this peer is handing-off, busy"
    with pytest.raises(NotCoordinator, match="busy"):
        sim.operator("b", "kick", "a", at=200)
    assert Controller(_pid("z"), SWARM, 0.0).refuses_command() is not None


def test_kick_disconnects_and_the_kicked_peer_leaves():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.nodes["b"].command(CheckedCommand("kick", sim.ids["a"], "maintenance", "admin", 0), sim.now)
    sim._run("b")
    assert sim.left.get("a") == "kicked: maintenance"
    assert (sim.ids["a"], False) in sim.disconnects["c"]
    assert (sim.ids["a"], False) in sim.disconnects["b"]


def test_a_kicked_peer_is_not_handed_the_role_it_was_kicked_from():
    sim, _ = _stable({"a": 1.0, "b": 2.0})
    sim.add("f", 10.0)  # faster: b would hand off to it at once, but b kicks it first
    sim.nodes["b"].command(CheckedCommand("kick", sim.ids["f"], "go away", "owner", 0), sim.now)
    sim._run("b")
    assert sim.left.get("f") == "kicked: go away"
    sim.add("f", 10.0)  # rejoins straight away: kicked, not blocked, but not promoted yet
    for _ in range(40):
        sim.step()
    assert sim.coordinators() == {"b"}


def test_repeat_liars_are_blocked_by_the_coordinator():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    b = sim.nodes["b"]
    b.timing = Timing(liar_threshold=2)
    b.liar_report(_lie(sim.ids["a"], 1), sim.ids["c"], sim.now, 100)
    b.liar_report(_lie(sim.ids["a"], 1), sim.ids["c"], sim.now, 100)  # the same one again
    assert sim.ids["a"] not in b.blocked()
    b.liar_report(_lie(sim.ids["a"], 2), sim.ids["c"], sim.now + 5, 100)
    assert sim.ids["a"] in b.blocked()
    assert b.state.blocked[0].by == "coordinator"
    assert "evidence" in b.state.blocked[0].reason  # what it acted on


def test_commands_need_the_coordinator_and_transitions_are_checked():
    sim, _ = _stable({"a": 1.0, "b": 3.0})
    with pytest.raises(NotCoordinator, match="follower"):
        sim.nodes["a"].command(CheckedCommand("block", sim.ids["b"]), sim.now)
    with pytest.raises(control.IllegalTransition):
        sim.nodes["a"]._set_state(Duty.COORDINATOR, sim.now)
    sim.nodes["a"].leave(sim.now)
    assert sim.nodes["a"].role is Duty.STOPPED
    with pytest.raises(control.IllegalTransition):
        sim.nodes["a"]._set_state(Duty.FOLLOWER, sim.now)


def test_a_coordinator_blocked_by_the_owner_hands_off_with_its_own_block():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    sim.nodes["b"].command(CheckedCommand("block", sim.ids["b"], "owner said so", "owner", 1), sim.now)
    sim._run("b")
    sim.run_until(lambda: "b" in sim.left and sim.agreed("c"))
    assert sim.left["b"] == "this peer is blocked"
    assert sim.ids["b"] in sim.nodes["a"].blocked() and sim.nodes["c"].term == 2
    assert not any(w == "hb" for _, w, _ in sim.refused)


def test_a_claim_numbers_above_our_own_stale_dht_item():
    sim = Sim({"a": 1.0})
    a = sim.nodes["a"]
    a.note_seq(41)  # the adapter found our item at seq 41 from an older chain
    sim.step()
    # and a term-6 state of someone entitled in the DHT (a member that left since)
    a.members([*sim.view(), Candidate(_pid("old"), 0.5)], sim.now)
    a.dht_states([CoordinatorState(SWARM, 6, 9, _pid("old"))])
    sim.run_until(lambda: a.role is Duty.COORDINATOR)
    assert a.state.seq == 42 and a.term == 7


def test_a_rival_at_our_term_makes_us_step_down_and_claim_above_it():
    sim, _ = _stable({"a": 1.0, "b": 3.0})
    b = sim.nodes["b"]
    rival = CoordinatorState(SWARM, 1, 5, sim.ids["a"])  # found in the DHT after a restart
    b.followed = lambda state: state == rival  # members say they follow it (issue 33)
    b.rival(rival, sim.now)
    assert b.role is Duty.CANDIDATE  # still the one elected: claims above it at once
    sim._run("b")
    sim.run_until(lambda: sim.agreed("b"))
    assert b.term == 2 and sim.nodes["a"].term == 2


def test_a_slow_successor_is_still_followed_once_it_speaks():
    """The successor's claim took longer than failover + claim: followers suspected it too,
    yet its first heartbeat (a higher term, elected once the dead one is set aside) is
    accepted."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0}, health={"a": Fitness(thermal=95.0)})
    a = sim.nodes["a"]  # too hot to coordinate: it only follows
    sim.alive -= {"b", "c"}  # b dead; c too slow to speak for a while
    t = sim.timing
    sim.run_until(lambda: sim.ids["c"] in a.suspects, limit=2 * t.failover + t.claim + 1)
    state = sim.nodes["b"].state.successor(term=2, coordinator=sim.ids["c"])
    assert a.heartbeat(state, sim.ids["c"], sim.now)
    assert a.coordinator == sim.ids["c"] and a.role is Duty.FOLLOWER


def _split_brain_with_a_block(unblock_on_winner_at: int | None):
    """b coordinates term 1 cut off with x; c wins term 2 on the other side; the owner
    blocks x through b during the split (and maybe unblocks it through c); then heal."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.5})
    sim.cut.add("b")
    sim.run_until(lambda: sim.agreed("c", but=frozenset({"b"})))
    sim.cut = {"a", "c"}  # b and x on one side now; a and c on the other
    sim.operator("b", "block", "x", at=100)
    assert sim.ids["x"] in sim.nodes["b"].blocked()
    if unblock_on_winner_at is not None:
        sim.operator("c", "unblock", "x", at=unblock_on_winner_at)
    sim.cut.clear()
    sim.run_until(lambda: sim.nodes["b"].role is Duty.FOLLOWER and sim.agreed(
        "c", but=frozenset({"x"})))
    for _ in range(20):
        sim.step()
    return sim


def test_a_block_made_on_the_losing_side_of_a_partition_survives_the_heal():
    sim = _split_brain_with_a_block(unblock_on_winner_at=None)
    assert sim.nodes["c"].term == 2
    for n in ("a", "b", "c"):
        assert sim.ids["x"] in sim.nodes[n].blocked(), n
    assert sim.ids["x"] in sim.persisted["c"].blocked_ids  # and in what a restart reads


def test_an_unblock_issued_after_the_forwarded_block_wins():
    sim = _split_brain_with_a_block(unblock_on_winner_at=200)
    for n in ("a", "b", "c"):
        assert sim.ids["x"] not in sim.nodes[n].blocked(), n


def _unblocked_on_the_losing_side(lose_forwards: int = 0) -> Sim:
    """x is blocked everywhere (at 100); b (the coordinator) is cut off with x, c wins term 2
    on the other side with the block in its state, and the owner unblocks x through b (at
    200); then heal. c's state replaces b's and still blocks x with the older block."""
    sim, _ = _stable({"a": 1.0, "b": 4.0, "c": 1.5, "x": 0.5})
    sim.operator("b", "block", "x", at=100)
    for _ in range(20):
        sim.step()
    sim.cut.add("b")
    sim.run_until(lambda: sim.agreed("c", but=frozenset({"b", "x"})))
    assert sim.ids["x"] in sim.nodes["c"].blocked()
    sim.cut = {"a", "c"}
    sim.operator("b", "unblock", "x", at=200)
    assert sim.ids["x"] not in sim.nodes["b"].blocked()
    sim.lose["fwd"] = lose_forwards
    sim.cut.clear()
    sim.run_until(lambda: sim.nodes["b"].role is Duty.FOLLOWER and sim.agreed(
        "c", but=frozenset({"x"})))
    return sim


def test_an_unblock_made_on_the_losing_side_of_a_partition_survives_the_heal():
    """The owner's unblock is newer than the block the winner's state holds: the deposed
    coordinator hands its proof on, and nobody keeps x blocked (an owner command swallowed
    by a partition otherwise)."""
    sim = _unblocked_on_the_losing_side()
    sim.run_until(lambda: sim.ids["x"] not in sim.nodes["c"].blocked(), limit=5)
    for _ in range(20):
        sim.step()
    for n in ("a", "b", "c"):
        assert sim.ids["x"] not in sim.nodes[n].blocked(), n
    assert sim.ids["x"] not in sim.persisted["c"].blocked_ids  # nor in what a restart reads


def test_a_lost_unblock_forward_is_sent_again_and_a_newer_block_is_not_undone():
    sim = _unblocked_on_the_losing_side(lose_forwards=1)
    sim.run_until(lambda: sim.ids["x"] not in sim.nodes["c"].blocked(),
                  limit=3 * sim.timing.failover)
    assert sim.lose["fwd"] == 0  # the first forward was lost
    # the owner blocks x again (newer than the unblock): a replay of the forward is refused
    sim.operator("c", "block", "x", at=300)
    cmd = sim.unblocks[sim.ids["x"]]
    with pytest.raises(StaleTerm, match="newer"):
        sim.nodes["c"].forwarded_unblock(cmd, sim.ids["b"], sim.now, cmd.at)
    for _ in range(int(3 * sim.timing.failover / DT)):
        sim.step()
    for n in ("a", "b", "c"):
        assert sim.ids["x"] in sim.nodes[n].blocked(), n


def test_a_deposed_coordinator_that_coordinates_again_applies_the_unblocks_it_owes():
    sim = _unblocked_on_the_losing_side(lose_forwards=1000)
    assert sim.ids["x"] in sim.nodes["b"].blocked()  # it follows c's state for now
    sim.announced["b"] = sim.now  # c hands the role back to b, the faster
    sim.run_until(lambda: sim.agreed("b", but=frozenset({"x"})))
    for _ in range(20):
        sim.step()
    for n in ("a", "b", "c"):
        assert sim.ids["x"] not in sim.nodes[n].blocked(), n


def _blocked_on_the_losing_side() -> Sim:
    """b (the fastest) is cut off with x; c wins term 2 on the other side; the owner blocks
    x through b."""
    sim, _ = _stable({"a": 1.0, "b": 4.0, "c": 1.5, "x": 0.5})
    sim.cut.add("b")
    sim.run_until(lambda: sim.agreed("c", but=frozenset({"b"})))
    sim.cut = {"a", "c"}
    sim.operator("b", "block", "x", at=100)
    return sim


def test_a_block_whose_forward_was_lost_or_refused_is_forwarded_again():
    """The CI failure of test_partition_and_heal: after the heal b's forward of its block
    is lost (no link yet), and c starts handing the role to b, the faster, so a forward
    reaching it then is refused. b owes the block until c's state shows it."""
    sim = _blocked_on_the_losing_side()
    sim.lose["fwd"] = 1
    sim.cut.clear()
    sim.step()
    sim.announced["b"] = sim.now  # its re-announcement clears c's suspicion: c hands off
    sim.run_until(lambda: sim.nodes["c"].role is Duty.HANDING_OFF)
    sim.run_until(lambda: sim.ids["x"] in sim.nodes["a"].blocked())
    assert sim.lose["fwd"] == 0  # the first forward was lost
    assert ("c", "fwd", "this peer is handing-off, not the coordinator") in sim.refused
    for n in ("a", "b", "c"):
        assert sim.ids["x"] in sim.nodes[n].blocked(), n


def test_the_deposed_coordinator_learns_of_the_unblock_that_overruled_its_block():
    """The mirror case: b blocks x on its side of the split, the owner unblocks x through c
    (later). c refuses b's forward and shows b the unblock, so b owes nothing: when b
    coordinates again, x stays unblocked."""
    sim = _blocked_on_the_losing_side()
    sim.operator("c", "unblock", "x", at=200)
    sim.cut.clear()
    sim.run_until(lambda: sim.nodes["b"].role is Duty.FOLLOWER)
    sim.announced["b"] = sim.now  # c hands the role back to b, the faster
    sim.run_until(lambda: sim.agreed("b", but=frozenset({"x"})),
                  limit=sim.timing.retry_successor + 10)
    for _ in range(20):
        sim.step()
    for n in ("a", "b", "c"):
        assert sim.ids["x"] not in sim.nodes[n].blocked(), n


def test_a_leaving_coordinator_hands_off_to_a_member_passed_over_before_it_left():
    """A successor that did not take over a moment ago (a rebalance offer it refused while
    busy) is passed over for a minute; a coordinator that leaves in that minute left with no
    handoff at all ("no successor available", the README tour under load), and its followers
    waited a failover. Leaving, it tries such a member once; never one that failed during
    this leave."""
    sim, _ = _stable({"a": 1.0, "b": 3.0})
    b = sim.nodes["b"]
    b._failed_successors[sim.ids["a"]] = sim.now + sim.timing.retry_successor
    start = sim.now
    b.leave(sim.now)
    sim._run("b")
    sim.run_until(lambda: "b" in sim.left and sim.agreed("a"))
    assert sim.left["b"] == "handed off"
    assert sim.now - start <= 2 * DT  # one round of messages, no failover wait
    assert sim.nodes["a"].endorsement == sim.ids["b"].raw


def test_a_failed_handoff_is_tried_again_after_a_while():
    """Right after the heal c offers the role to b, the faster, while b still coordinates
    its side: b refuses and the offer times out. That refusal must not bar b for good: once
    ``retry_successor`` has passed, c hands off to b again."""
    sim = _blocked_on_the_losing_side()
    sim.cut.clear()
    sim.step()
    sim.announced["b"] = sim.now  # announced after c suspected it: c hands off to it
    sim.run_until(lambda: sim.nodes["c"].role is Duty.HANDING_OFF)
    sim.run_until(lambda: sim.nodes["c"].role is Duty.COORDINATOR)  # the offer timed out
    assert ("b", "handoff", "cannot take over while coordinator") in sim.refused
    waited = sim.run_until(lambda: sim.agreed("b", but=frozenset({"x"})),
                           limit=sim.timing.retry_successor + 5)
    assert waited >= sim.timing.retry_successor - 1
    assert sim.ids["x"] in sim.nodes["b"].blocked()


def test_a_deposed_coordinator_that_coordinates_again_applies_the_blocks_it_owes():
    """Every forward of b's block is lost; c then hands the role to b with a state that
    lacks it. That lack is no unblock: b blocks x again as it takes over."""
    sim = _blocked_on_the_losing_side()
    sim.lose["fwd"] = 1000
    sim.cut.clear()
    sim.run_until(lambda: sim.nodes["b"].role is Duty.FOLLOWER)
    assert sim.ids["x"] not in sim.nodes["b"].blocked()
    sim.announced["b"] = sim.now
    sim.run_until(lambda: sim.agreed("b", but=frozenset({"x"})))
    for _ in range(20):
        sim.step()
    assert sim.nodes["b"].term == 3
    for n in ("a", "b", "c"):
        assert sim.ids["x"] in sim.nodes[n].blocked(), n
    assert sim.ids["x"] in sim.persisted["b"].blocked_ids


def test_only_the_coordinator_takes_forwarded_blocks():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "x": 0.5})
    with pytest.raises(NotCoordinator):
        sim.nodes["a"].forwarded_block(CheckedCommand("block", sim.ids["x"], "r", "owner", 1),
                                       sim.ids["b"], sim.now, 1)
    with pytest.raises(ProtocolError):
        sim.nodes["b"].forwarded_block(CheckedCommand("kick", sim.ids["x"], "r", "owner", 1),
                                       sim.ids["a"], sim.now, 1)


def test_a_coordinators_own_block_of_a_liar_survives_a_failover_it_missed():
    """b blocks a repeat liar x, but c (cut off from b) has already claimed term 2 without
    the block; once they meet, b forwards its own block and c keeps x blocked."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.5})
    sim.cut = {"c"}
    sim.run_until(lambda: sim.nodes["c"].role is Duty.COORDINATOR)  # c's failover, term 2
    sim.nodes["b"].liar_report(_lie(sim.ids["x"], 1), sim.ids["a"], sim.now, 100)
    sim.nodes["b"].liar_report(_lie(sim.ids["x"], 2), sim.ids["a"], sim.now, 100)
    sim._run("b")
    assert sim.ids["x"] in sim.nodes["b"].blocked()
    assert sim.ids["x"] not in sim.nodes["c"].blocked()
    sim.cut.clear()
    sim.run_until(lambda: sim.nodes["b"].role is Duty.FOLLOWER and sim.agreed(
        "c", but=frozenset({"x"})))
    for _ in range(20):
        sim.step()
    for n in ("a", "b", "c"):
        assert sim.ids["x"] in sim.nodes[n].blocked(), n


def test_an_auto_block_is_taken_only_from_a_coordinator_we_followed():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "x": 0.5})
    stranger = _pid("stranger")
    entry = BlockEntry(sim.ids["x"], "2 wrong results", "coordinator", 1)
    with pytest.raises(NotCoordinator, match="never coordinated"):
        sim.nodes["b"].forwarded_auto_block(entry, 0, stranger, sim.now, 1)
    assert sim.ids["x"] not in sim.nodes["b"].blocked()


def test_a_block_keeps_the_whole_reason_its_signed_command_allows():
    """An owner's signed block may give a reason of MAX_REASON bytes (identity's limit):
    the block entry, its blocklist page and the follower's copy keep all of it."""
    from identity.statements import MAX_REASON

    sim, _ = _stable({"a": 1.0, "b": 3.0, "x": 0.5})
    reason = "spam from a scraper, " * (MAX_REASON // 21) + "x" * (MAX_REASON % 21)
    assert len(reason.encode()) == MAX_REASON
    sim.nodes["b"].command(CheckedCommand("block", sim.ids["x"], reason, "owner", 1), sim.now)
    sim._run("b")
    sim.run_until(lambda: sim.ids["x"] in sim.nodes["a"].blocked())
    entry, = (e for e in sim.nodes["a"].state.blocked if e.peer == sim.ids["x"])
    assert entry.reason == reason
    page, = sim.nodes["b"].state.pages()
    assert BlockPage.decode(page.encode()).entries[0].reason == reason
