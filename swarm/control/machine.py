"""The coordinator state machine (sans-IO): fed events and ``now``, it returns actions.

Duties: FOLLOWER -> CANDIDATE (claiming term N+1 by a CAS put) -> COORDINATOR, which
heartbeats its state to every member; HANDING_OFF while a successor takes over at
term+1; STOPPED after leaving. Every role change goes through :meth:`Controller._set_state`,
which checks the transition table, logs and runs the entry actions.

Who may coordinate: the incumbent keeps the role until it leaves, fails or loses a term.
A follower that hears no heartbeat for ``Timing.failover`` seconds suspects the coordinator
and runs :func:`swarm.control.election.elect` over its view without it; the winner claims the next
term, the others give it ``failover`` seconds to show up before suspecting it in turn, or up
to ``claim`` seconds once it said that it claims (:meth:`Controller.claim_notice`). A
winner's claim is dropped if the coordinator speaks again before the claim's put.
A follower accepts a new coordinator's heartbeats when it is the same coordinator, when
the previous coordinator endorsed it (handoff), or when it is the peer its own election
picks once the old coordinator is set aside; commands from lower terms are refused
(:class:`swarm.control.election.TermGuard`).

:class:`swarm.control.core.ControlCore` drives it and turns its actions into the reads,
puts and messages its adapters (:mod:`swarm.control.plane`, the simulator) carry out.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from identity.keys import PeerId
from identity.statements import cut_reason
from swarm.control.election import Candidate, TermGuard, elect, successor
from swarm.control.state import MAX_ADMINS, BlockEntry, CoordinatorState, KickOrder, LiarReport
from swarm.errors import NotCoordinator, ProtocolError, StaleTerm

log = logging.getLogger("swarm.control")


class Duty(enum.Enum):
    """What a node does in the control plane now (``identity.Role`` is the authority an
    operator acts under: owner, admin, coordinator)."""

    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    COORDINATOR = "coordinator"
    HANDING_OFF = "handing-off"
    STOPPED = "stopped"


_TRANSITIONS: dict[Duty, frozenset[Duty]] = {
    Duty.FOLLOWER: frozenset({Duty.CANDIDATE, Duty.STOPPED}),
    Duty.CANDIDATE: frozenset({Duty.COORDINATOR, Duty.FOLLOWER, Duty.STOPPED}),
    Duty.COORDINATOR: frozenset({Duty.HANDING_OFF, Duty.FOLLOWER, Duty.STOPPED}),
    Duty.HANDING_OFF: frozenset({Duty.COORDINATOR, Duty.FOLLOWER, Duty.STOPPED}),
    Duty.STOPPED: frozenset(),
}


MAX_TERM_STEP = 64
"""A term counts only within this many of a term already counted: each claim adds one, so
an honest swarm never jumps further, and no signer can push the term to the integer limit."""
MAX_LIAR_SUSPECTS = 256
"""Peers with pending checked wrong-result evidence held by a coordinator (oldest dropped)."""
MAX_PIECES_PER_REPORTER = 8
"""Pieces of checked evidence one reporter may have counting at once (its next one retires
its oldest): flooding the suspect table takes as many reporters as it has room / 8."""
MAX_SEEN_REPORTS = 1024
"""Liar reports remembered (by digest) so that none is judged or passed on twice."""


@dataclass(frozen=True)
class Judgement:
    """What the coordinator's own check made of a liar report's evidence."""

    guilty: bool
    """True when the evidence proves a wrong result by the accused peer."""
    evidence: bytes = b""
    """An id of the evidence acted on (a digest), shown in the block's reason."""
    why: str = ""
    """Why not, for the log."""


EvidenceCheck = Callable[[LiarReport, PeerId], Judgement]
"""``check(report, reporter)``: the coordinator's own check of a report's evidence (the
runtime's signed result receipts plug in here: ``swarm.runtime.evidence.check_evidence``
maps onto it as ``Judgement(verdict.proven, evidence.key, verdict.why)``)."""


def refuse_unchecked(report: LiarReport, reporter: PeerId) -> Judgement:
    """The default check: no evidence check is installed, so no report is acted on (a bare
    report is anyone's word, and a few fresh keys could get an honest worker blocked)."""
    return Judgement(False, why="no evidence check installed; report not acted on")


def entitled(state: CoordinatorState, view: Mapping[PeerId, Candidate],
             blocked: Iterable[PeerId]) -> bool:
    """May ``state``'s signer coordinate at all: a live member whose announced roles make it
    eligible, not blocked. (Who coordinates *now* is the election's and the handoff's.)"""
    c = view.get(state.coordinator)
    return c is not None and c.can_coordinate and state.coordinator not in set(blocked)


def counted_states(states: Iterable[CoordinatorState], view: Mapping[PeerId, Candidate],
                   blocked: Iterable[PeerId], floor: int | None = None,
                   ) -> list[CoordinatorState]:
    """The coordinator-state items (read from the DHT) that count, lowest term first.

    Only items of entitled signers count, and only while each term is within
    :data:`MAX_TERM_STEP` of one already counted, starting from ``floor`` (the term of the
    state we follow). A node with no state (a newcomer, an observer) starts from the chain
    of terms that most signers share, ties to the lowest: one key, or a few fresh ones,
    cannot lift the term out of reach of the honest chain. An item whose signer the item
    before it blocks does not count.
    """
    out = set(blocked)
    ok = sorted((s for s in states if entitled(s, view, out)), key=lambda s: (s.term, s.seq))
    if floor is not None:
        top, chain = floor, []
        for s in ok:
            if s.term > top + MAX_TERM_STEP:
                break
            chain.append(s)
            top = max(top, s.term)
        return _unblocked(chain)
    runs: list[list[CoordinatorState]] = []
    for s in ok:
        if runs and s.term <= runs[-1][-1].term + MAX_TERM_STEP:
            runs[-1].append(s)
        else:
            runs.append([s])
    return _unblocked(max(runs, key=lambda r: (len({s.coordinator for s in r}), -r[0].term),
                          default=[]))


def _unblocked(chain: list[CoordinatorState]) -> list[CoordinatorState]:
    """Drop an item signed by a peer that an earlier item of the chain blocks (members
    refuse such a peer's heartbeats; its later claim must not count for anyone)."""
    kept: list[CoordinatorState] = []
    for s in chain:
        if not kept or s.coordinator not in kept[-1].blocked_ids:
            kept.append(s)
    return kept


class IllegalTransition(RuntimeError):
    """A bug: the state machine tried a move its table does not allow."""


@dataclass(frozen=True)
class Timing:
    """Intervals in seconds. Failover after SIGKILL takes about failover + one tick."""

    heartbeat: float = 0.5
    """How often the coordinator sends its state to every member."""
    failover: float = 2.0
    """Silence after which a follower suspects the coordinator. A suspicion is no verdict:
    the winner's claim is dropped if the coordinator speaks before the claim's put
    (:meth:`Controller.alive`). (1.25 s was tried for issue 48: on loopback about half the
    claims then took the members' whole DHT RPC timeout, 5 s, and timed out. The trials'
    logs showed the cause: the claim's lookups waited on the DHT nodes of `swarm status`
    processes that had exited, which every member kept as contacts; CLI nodes are read-only
    now (BEP 43) and claims took 0.01-0.11 s in 60 trials at 2.0 s. 1.25 s was not tried
    again: with claims that fast, a coordinator suspected falsely (a loaded host's late
    heartbeat) has little time to speak before the put drops the claim.)"""
    startup: float = 4.0
    """How long a member that has just started waits for the coordinator's first heartbeat
    before suspecting it: the coordinator hears of it first (its hello, then a topic
    read), which a loaded host does not do within one ``failover``."""
    first_election: float = 2.0
    """How long a member that knows of no coordinator (a swarm's cold start) waits for one
    before its election: the views fill meanwhile, so the first coordinator is the one the
    election picks with every starting member in view (an incumbent keeps the role)."""
    claim: float = 5.0
    """How long a CAS claim of the next term (two DHT lookups) may take."""
    handoff: float = 3.0
    """How long a successor has to take over before the next one is tried."""
    retry_successor: float = 60.0
    """How long a successor that did not take over is passed over: its refusal is often
    passing (it still coordinated the other side of a healed split, or its link was down)."""
    rebalance: float = 1.5
    """Hand the role to an elected member this many times faster than the incumbent."""
    liar_threshold: int = 2
    """Wrong results, each shown by distinct evidence the coordinator checked itself, before
    it blocks the peer (two, so that one odd result is not enough; bare reports count
    nothing)."""
    liar_window: float = 600.0
    """Seconds over which those reports count."""
    kick_max_age: float = 120.0
    """Kick orders older than this (by their timestamp) are ignored as replays."""
    forward_max_age: float = 3600.0
    """Forwarded blocks issued longer ago than this are ignored as replays."""
    collision: float = 10.0
    """The shortest gap between two new terms claimed because a coordinator nobody follows
    spoke at our term or holds a higher one (each claim reads every member's item: one
    datagram or one forged item must not buy that more often)."""

    @property
    def silence(self) -> float:
        """No heartbeat for this long: a follower reads the DHT itself (the sync core's
        ``silence``), so that the view its election runs on is fresh by ``failover`` (a
        stale copy of the dead coordinator's announcement would un-suspect it when the
        fresher one arrived). Half the failover, but never within a heartbeat and a half:
        a beat a little late must not cost every member two lookups."""
        return max(self.failover / 2, 1.5 * self.heartbeat)


# -- actions: what the adapter must do --------------------------------------------------------


@dataclass(frozen=True)
class PutState:
    """Sign ``state`` into the DHT under our key (seq = state.seq); report claims back."""

    state: CoordinatorState
    """The state to store."""
    claim: bool
    """True for a term claim: feed the outcome to :meth:`Controller.claim_result`."""


@dataclass(frozen=True)
class SendHeartbeat:
    """Send our state to these members (with the handoff endorsement if we have one)."""

    state: CoordinatorState
    """The current state."""
    to: tuple[PeerId, ...]
    """Recipients."""
    endorsement: bytes = b""
    """The handoff envelope our predecessor signed, when we took over by handoff."""


@dataclass(frozen=True)
class SendClaim:
    """Tell members that we claim ``term`` now: the claim (DHT reads and a put) may take
    longer than the ``failover`` they would give us before suspecting us in turn."""

    term: int
    """The term we claim."""
    to: tuple[PeerId, ...]
    """Recipients."""


@dataclass(frozen=True)
class SendHandoff:
    """Offer the coordinator role (and ``state``, at term+1) to ``to``."""

    state: CoordinatorState
    """The offered state: term+1, coordinator = the successor."""
    to: PeerId
    """The successor."""


@dataclass(frozen=True)
class SendKick:
    """Tell members (and the target) that ``order.target`` is kicked."""

    order: KickOrder
    """The signed-to-be order."""
    to: tuple[PeerId, ...]
    """Recipients."""


@dataclass(frozen=True)
class ForwardBlocks:
    """We coordinated at a lower term and the state that replaced ours lacks some of our
    blocks (a healed partition, or a heartbeat that never reached the new coordinator):
    hand their proofs to the new coordinator so that the blocks survive."""

    entries: tuple[BlockEntry, ...]
    """Blocked in our state, missing from the winner's."""
    to: PeerId
    """The coordinator whose state won."""
    term: int
    """The term in which we applied them."""


@dataclass(frozen=True)
class ForwardUnblocks:
    """Hand the proofs of unblocks we applied to ``to`` so that they are not swallowed by a
    healed partition: we coordinated at a lower term and the winner's state still blocks
    these peers with older blocks, or we coordinate and ``to`` forwarded a block that one of
    our unblocks overruled (it would apply that block again if it coordinated)."""

    peers: tuple[PeerId, ...]
    """Unblocked by us after the block ``to`` holds or forwarded."""
    to: PeerId
    """The coordinator whose state won, or the deposed one whose forward we refused."""


@dataclass(frozen=True)
class RelayReport:
    """Pass a liar report on to the coordinator (once: ``report.relayed`` is set)."""

    report: LiarReport
    """The report, marked relayed."""
    to: PeerId
    """The coordinator as we know it."""


@dataclass(frozen=True)
class Disconnect:
    """Drop links to ``peer``; the runtime reassigns its shards."""

    peer: PeerId
    """The peer to drop."""
    reason: str
    """Why (logged)."""
    blocked: bool
    """True when the peer is blocked (refuse it from now on), False for a kick."""


@dataclass(frozen=True)
class Persist:
    """Write ``state`` to the data dir (the blocklist survives a full restart)."""

    state: CoordinatorState
    """The state to keep."""


@dataclass(frozen=True)
class RoleChanged:
    """Our role changed (for logs, status and tests)."""

    old: Duty
    """Previous role."""
    new: Duty
    """New role."""
    term: int
    """Highest term seen."""


@dataclass(frozen=True)
class Left:
    """We are out of the swarm (left, handed off, or kicked); the process may exit."""

    reason: str
    """Why."""


Action = PutState | SendHeartbeat | SendClaim | SendHandoff | SendKick | ForwardBlocks | ForwardUnblocks \
    | RelayReport \
    | Disconnect | Persist | RoleChanged | Left


@dataclass(frozen=True)
class CheckedCommand:
    """An operator's command as the coordinator applies it: the signed
    :class:`identity.statements.Command` (kick, block, unblock) after the core checked its
    proof and role, or a block the coordinator makes itself (a proven liar)."""

    kind: str
    """block, unblock or kick."""
    target: PeerId
    """The peer it is about."""
    reason: str = ""
    """Why, for operators."""
    by: str = "coordinator"
    """The role that issued it: owner, admin or coordinator."""
    at: int = 0
    """Unix time it was issued."""
    term: int = 0
    """The coordinator term it was issued in (its fencing token)."""


MAX_UNBLOCKED = 4096
"""Unblocks remembered (peer -> term seen) to refuse replays of older forwarded blocks."""
FORWARD_RETRIES = 3
"""Times a deposed coordinator forwards its owed blocks again to the same coordinator
(``failover`` apart) when that coordinator's state still lacks them: a forward sent before
a link is back, or to a coordinator busy handing off, is lost or refused."""
MAX_HELD = 8
"""Operator commands a coordinator holds while it hands off (applied if it coordinates
again, forwarded to whoever took over if not); more are refused before the replay guard
records them. Only commands whose proof and role the core verified get here."""


class Controller:
    """One peer's view of who coordinates, and the coordinator's duties when it is us."""

    def __init__(self, me: PeerId, swarm: bytes, now: float, timing: Timing = Timing(),
                 state: CoordinatorState | None = None,
                 check_evidence: EvidenceCheck = refuse_unchecked, passive: bool = False) -> None:
        self.me = me
        self.passive = passive
        """A client that announces nothing: no heartbeats reach it, so the silence it judges
        coordinators by is its design, not news (logged at INFO, not as a warning)."""
        self.swarm = swarm
        self.timing = timing
        self.role = Duty.FOLLOWER
        self.state = state
        """The latest coordinator state we accepted (ours when we coordinate)."""
        self.guard = TermGuard(state.term if state else 0)
        self.view: dict[PeerId, Candidate] = {}
        self.suspects: dict[PeerId, float] = {}
        """Peers we take for dead (silent coordinators, or winners that never showed up), and
        since when: a heartbeat, or an announcement made after that, clears a suspicion."""
        self.expected: PeerId | None = state.coordinator if state else None
        self.last_heard = now
        self.endorsement: bytes = b""
        """The predecessor's signed handoff, shown by our heartbeats while we coordinate."""
        self._pending_endorsement = b""
        self.leaving = False
        self._pending: CoordinatorState | None = None
        self._deadline = 0.0
        self._next_beat = 0.0
        self._successor: PeerId | None = None
        self._failed_successors: dict[PeerId, float] = {}
        self._leave_tried: set[PeerId] = set()
        """Successors that did not take over while we were leaving (never offered again)."""
        """Successors that did not take over, and until when (monotonic) they are passed
        over."""
        self.check_evidence = check_evidence
        self._reports: OrderedDict[bytes, None] = OrderedDict()
        """Digests of liar reports already handled (bounded)."""
        self._liars: OrderedDict[PeerId, dict[bytes, tuple[float, PeerId]]] = OrderedDict()
        """Checked wrong-result evidence per suspect, members only (evidence id -> when and
        who delivered it), bounded (:meth:`_bound_suspects`)."""
        self._pieces: dict[PeerId, deque[tuple[PeerId, bytes]]] = {}
        """The pieces each reporter has in :attr:`_liars` (at most
        :data:`MAX_PIECES_PER_REPORTER`: a reporter's next one retires its oldest)."""
        self.past_coordinators: set[PeerId] = {state.coordinator} if state else set()
        """Coordinators whose state we followed: their own blocks are forwarded to us."""
        self._unblocked_at: dict[PeerId, int] = {}
        """When we last applied an unblock of each peer: a forwarded older block loses."""
        self._unblocked_term: OrderedDict[PeerId, int] = OrderedDict()
        """The highest term in which we saw each peer unblocked (ours or a state we
        followed): a forwarded block issued in that term or before is a replay."""
        self._owed: dict[PeerId, tuple[BlockEntry, int, float]] = {}
        """Blocks we applied as coordinator that the state which replaced ours lacks
        (peer -> entry, the term we applied it in, since when): forwarded to whoever
        coordinates until a state we follow shows them, applied again if we coordinate."""
        self._owed_unblocks: dict[PeerId, tuple[int, float]] = {}
        """Unblocks we applied as coordinator that the state which replaced ours does not show
        (it still blocks the peer, with a block issued before our unblock): peer -> (the
        unblock's time, since when); forwarded and applied again like :attr:`_owed`."""
        self._held: list[CheckedCommand] = []
        """Operator commands that arrived while we handed off (at most :data:`MAX_HELD`):
        the CLI sends each once, so refusing it lost it (issue 48)."""
        self._owed_tries = 0
        self._owed_next = 0.0
        self._leave_reason = ""
        self._predecessor: PeerId | None = None
        self._seq_floor = 0
        self._kicked: dict[PeerId, float] = {}
        """Kicked peers and until when (monotonic) they may not coordinate."""
        self._charter: tuple[tuple[PeerId, ...], dict] | None = None
        self._actions: list[Action] = []
        self._collided = float("-inf")
        self._claim_out = False
        """Our pending claim's put has gone out (:meth:`claim_put`): it may land now."""
        self._claimant: tuple[PeerId, float] | None = None
        """The member whose claim notice we took, and until when (monotonic) we wait for its
        claim instead of ``failover`` (:meth:`claim_notice`)."""
        self._notice_term = -1
        """The term of the state we held when we took a claim notice: one per failover."""
        self.followed: Callable[[CoordinatorState], bool] = lambda state: False
        """Whether members other than its signer say they follow ``state`` (the core counts
        their announcements): a rival's item only its signer vouches for moves nobody."""

    # -- queries -----------------------------------------------------------------------------

    @property
    def term(self) -> int:
        return self.guard.highest

    @property
    def coordinator(self) -> PeerId | None:
        """Who we believe coordinates now (None while nobody does)."""
        if self.role is Duty.COORDINATOR or self.role is Duty.HANDING_OFF:
            return self.me
        if self.state is None or self.state.coordinator in self.suspects:
            return None
        return self.state.coordinator

    def blocked(self) -> frozenset[PeerId]:
        """Peers refused everywhere: the blocklist of the state we follow."""
        return self.state.blocked_ids if self.state else frozenset()

    def actions(self) -> list[Action]:
        """Take the actions produced since the last call."""
        out, self._actions = self._actions, []
        return out

    # -- events ------------------------------------------------------------------------------

    def members(self, view: Iterable[Candidate], now: float) -> None:
        """The live members as the DHT lists them (including us)."""
        self.view = {c.peer_id: c for c in view}
        for peer, since in list(self.suspects.items()):
            c = self.view.get(peer)
            if c is not None and c.freshness > since:
                log.info("%s re-announced itself; no longer suspected", peer.short())
                del self.suspects[peer]
        if self.role is Duty.COORDINATOR:
            self._maybe_rebalance(now)

    def charter_changed(self, admins: Iterable[PeerId], policy: dict, now: float) -> None:
        """The verified charter's admins or policy changed: a coordinator carries them."""
        self._charter = (tuple(sorted(admins))[:MAX_ADMINS], dict(policy))
        st = self.state
        if self.role is Duty.COORDINATOR and st is not None \
                and (st.admins, st.policy) != self._charter:
            self._publish(st.successor(admins=self._charter[0], policy=self._charter[1]), now)

    def note_seq(self, seq: int) -> None:
        """Our own DHT item already has ``seq``: later claims must number above it."""
        self._seq_floor = max(self._seq_floor, seq + 1)

    def rival(self, state: CoordinatorState, now: float, live: bool = False) -> None:
        """Another coordinator's state item in the DHT holds our term or a later one (two
        claims raced, e.g. across a full restart, or a partition healed): step down for an
        entitled rival within the term bound that other members follow or that our election
        picks over us; the next claim goes above. A rival nobody follows that loses the
        election is ignored, except that a new term decides, at most once per
        ``Timing.collision`` s, when it holds a higher term within our followers' reach (a
        coordinator of the other side of a healed split that nobody there followed: it
        refuses our lower term for good) or, ``live``, its heartbeat comes at our very term
        (two claims of one term both landed). An ordinary member that puts its own item
        above ours thus buys one claim per collision gap, never a term out of our
        followers' reach, and nobody follows it."""
        if self.role is not Duty.COORDINATOR or self.state is None \
                or state.coordinator == self.me or state.swarm != self.swarm \
                or not entitled(state, self.view, self.blocked()) \
                or state.term > self.term + MAX_TERM_STEP or state.term < self.state.term:
            return
        if not self.followed(state) and \
                elect(self.view.values(), self.blocked(), self._candidates_out()) \
                != state.coordinator:
            # A lone rival above us refuses our heartbeats for good (fencing): an honest
            # coordinator left over from a healed split, which nobody followed, stays alone
            # unless we claim above it. Once per collision gap, and only within reach of
            # our followers (their term + MAX_TERM_STEP); never for an item below our term.
            above = state.term > self.state.term \
                and state.term < self.state.term + MAX_TERM_STEP
            if not (above or (live and state.term == self.state.term)) \
                    or now < self._collided + self.timing.collision:
                log.info("ignoring %s's state at term %d: nobody else follows it and it "
                         "loses the election", state.coordinator.short(), state.term)
                return
            self._collided = now
        self.guard.observe(state.term)
        self._set_state(Duty.FOLLOWER, now, why=f"{state.coordinator.short()} also "
                                                f"holds term {state.term}")
        winner = elect(self.view.values(), self.blocked(), self._candidates_out())
        if winner == self.me:
            self._claim(now)  # at once, before our followers miss a heartbeat
            return
        self.expected = winner
        if winner is not None and self.state is not None:
            # Our state shows the winner the collision, if it has not seen it: it then
            # claims the next term at once rather than after its rival check.
            self._actions.append(SendHeartbeat(self.state, (winner,), self.endorsement))

    def dht_states(self, states: Iterable[CoordinatorState]) -> list[CoordinatorState]:
        """Coordinator-state items read from the DHT: the ones that count (see
        :func:`counted_states`), lowest term first; our next claim goes above them."""
        floor = self.state.term if self.state is not None else None
        kept = counted_states((s for s in states if s.swarm == self.swarm), self.view,
                              self.blocked(), floor)
        for s in kept:
            self.guard.observe(s.term)
        return kept

    def tick(self, now: float) -> None:
        """Timers: heartbeats, failover, claim and handoff deadlines."""
        for peer, until in list(self._kicked.items()):
            if now > until:
                del self._kicked[peer]
        if self.role is Duty.FOLLOWER:
            self._forward_owed(now)
            self._follow(now)
        elif self.role is Duty.CANDIDATE:
            if now > self._deadline:
                log.warning("claim of term %d timed out", self._pending.term if self._pending
                            else -1)
                self._drop_claim()
                self._set_state(Duty.FOLLOWER, now)
        elif self.role is Duty.COORDINATOR:
            if now >= self._next_beat:
                self._beat(now)
        elif self.role is Duty.HANDING_OFF:
            if now >= self._next_beat:
                self._beat(now)
            if now > self._deadline:
                log.warning("successor %s did not take over in time",
                            self._successor.short() if self._successor else "?")
                if self._successor is not None:
                    self._failed_successors[self._successor] = now + self.timing.retry_successor
                    if self.leaving:
                        self._leave_tried.add(self._successor)
                self._set_state(Duty.COORDINATOR, now)
                if self.leaving:
                    self._start_handoff(now)

    def claim_result(self, ok: bool, now: float, why: str = "",
                     beaten_by: CoordinatorState | None = None) -> None:
        """The outcome of a :class:`PutState` with ``claim=True``; ``beaten_by``: the state
        item that made it fail (the CAS found it), which we then follow if it is one we
        would follow as a heartbeat (its heartbeats may not have reached us: that is why we
        claimed)."""
        if self.role is not Duty.CANDIDATE or self._pending is None:
            return
        if not ok:
            log.warning("claim of term %d failed: %s", self._pending.term, why)
            self._drop_claim()
            self._set_state(Duty.FOLLOWER, now)
            if beaten_by is not None:
                try:
                    self.heartbeat(beaten_by, beaten_by.coordinator, now, heard=False)
                except (StaleTerm, NotCoordinator, ProtocolError) as exc:
                    log.info("not following %s, which holds term %d: %s",
                             beaten_by.coordinator.short(), beaten_by.term, exc)
            return
        self.guard.observe(self._pending.term)
        self.past_coordinators.add(self.me)
        self.state = self._pending
        self._pending = None
        self.endorsement = self._pending_endorsement
        self._actions.append(Persist(self.state))
        self._set_state(Duty.COORDINATOR, now)
        if self._predecessor is not None:
            # It may be blocked (out of our heartbeat list) but waits to hear we took over.
            self._actions.append(SendHeartbeat(self.state, (self._predecessor,),
                                               self.endorsement))
            self._predecessor = None

    def claim_put(self) -> None:
        """Our pending claim's put goes out now: from here it may land, so the coordinator
        we suspected speaking again no longer drops it (a rival check settles that)."""
        self._claim_out = True

    def claim_conflict(self, claim: CoordinatorState, states: Iterable[CoordinatorState],
                       ) -> CoordinatorState | None:
        """The CAS of a claim across the swarm: the highest state item that counts and
        holds the claimed term or a later one under another signer (the claim fails), or
        None."""
        higher = [s for s in self.dht_states(states)
                  if s.term >= claim.term and s.coordinator != self.me]
        return max(higher, key=lambda s: s.term, default=None)

    def implausible(self, head: CoordinatorState) -> str:
        """Why this state item is not worth fetching its blocklist pages for ("" when it
        is): its term must be within bounds and its signer the coordinator we follow or an
        entitled member (so that a stranger's heartbeats cost no DHT lookups)."""
        cur = self.state
        if not self.guard.admits(head.term) or head.term > self.term + MAX_TERM_STEP:
            return f"term {head.term} is outside {self.term}..{self.term + MAX_TERM_STEP}"
        if (cur is not None and head.coordinator == cur.coordinator) \
                or entitled(head, self.view, self.blocked()):
            return ""
        c = self.view.get(head.coordinator)
        return (f"{head.coordinator.short()} is " + ("not in our member view" if c is None
                else "blocked" if head.coordinator in self.blocked()
                else "not eligible to coordinate"))

    def heartbeat(self, state: CoordinatorState, sender: PeerId, now: float,
                  endorsed_by: PeerId | None = None, heard: bool = True) -> bool:
        """A coordinator's heartbeat, or (``heard=False``) its state read from the DHT; True
        if adopted.

        Only a heartbeat shows that the coordinator is alive: an item in the DHT may be the
        last one a dead coordinator put, so reading it neither clears a suspicion of its
        coordinator nor restarts the wait for it.

        Raises :class:`StaleTerm` for a lower term (fencing) and :class:`NotCoordinator`
        for a sender we have no reason to follow.
        """
        if self.role is Duty.STOPPED or sender == self.me:
            return False
        if sender != state.coordinator or state.swarm != self.swarm:
            raise ProtocolError("heartbeat not from the coordinator it names, or another swarm")
        if sender in self.blocked():
            raise NotCoordinator(f"{sender.short()} is blocked and cannot coordinate")
        if not self.guard.admits(state.term):
            raise StaleTerm(f"heartbeat from term {state.term} refused: term {self.term} "
                            "is current")
        if state.term > self.term + MAX_TERM_STEP:
            raise StaleTerm(f"heartbeat at term {state.term} jumps more than {MAX_TERM_STEP} "
                            f"terms above {self.term}")
        cur = self.state
        if cur is None and not entitled(state, self.view, self.blocked()):
            raise NotCoordinator(f"{sender.short()} is no member eligible to coordinate")
        if cur is not None:
            if state.term == cur.term and state.coordinator != cur.coordinator:
                self._same_term(state, now)
            if state.coordinator == cur.coordinator and state.seq <= cur.seq \
                    and state.term == cur.term:
                if heard:
                    self.alive(state.coordinator, state.term, now)
                return state.seq == cur.seq
            if not self._legitimate(state, endorsed_by):
                raise NotCoordinator(f"{sender.short()} claims term {state.term} but is neither "
                                     f"endorsed by {cur.coordinator.short()} nor elected here")
            if cur.coordinator not in (state.coordinator, self.me) \
                    and endorsed_by != cur.coordinator:
                # a failover we did not see begin: the swarm took the old one for dead
                self.suspects.setdefault(cur.coordinator, now)
        self._adopt(state, now, heard)
        return True

    def alive(self, sender: PeerId, term: int, now: float) -> None:
        """A heartbeat that ``sender`` signed at ``term`` came (its new state may still wait
        for its blocklist pages): the coordinator we follow at that term is alive, whatever
        we suspected. Its life does not wait on a DHT lookup: a slow page would otherwise
        make us take a live coordinator for dead and follow whoever claims next. A failover
        claim of ours whose put has not gone out yet is dropped: the suspicion was wrong
        (a late heartbeat, a busy host), and a new term would move the role for nothing."""
        cur = self.state
        if cur is None or (cur.coordinator, cur.term) != (sender, term) or sender == self.me:
            return
        if self.role is Duty.CANDIDATE and self._predecessor is None and not self._claim_out:
            # We suspected it, and it speaks before our claim's put went out: nothing of the
            # claim can land, so it is dropped (its term stays free) and we follow it again.
            log.info("%s speaks again: claim of term %d dropped before its put",
                     sender.short(), self._pending.term if self._pending else -1)
            self._pending = None
            self.suspects.pop(sender, None)
            self._set_state(Duty.FOLLOWER, now, why=f"{sender.short()} is alive")
        elif self.role is Duty.FOLLOWER:
            self.suspects.pop(sender, None)
            self.expected, self.last_heard = sender, now

    def claim_notice(self, sender: PeerId, term: int, now: float) -> None:
        """``sender`` says it claims ``term`` now. Taken from the member our election picks
        once the coordinator we follow is set aside (the one we would wait for anyway), for
        a term within reach: we wait up to ``Timing.claim`` for its claim instead of
        ``failover``, so that a claim slowed by its DHT lookups is not taken for a dead
        winner (a second claimant then claimed the same term, and the swarm settled one term
        later, issue 48). One notice per failover: a winner that never finishes its claim
        is suspected ``claim`` s after its notice at the latest."""
        cur = self.state
        held = cur.term if cur is not None else 0
        if self.role is not Duty.FOLLOWER or sender == self.me or sender in self.blocked() \
                or self._notice_term == held or not self.term < term <= self.term + MAX_TERM_STEP:
            return
        out = (self._candidates_out() - {sender}) | ({cur.coordinator} if cur else set())
        if elect(self.view.values(), self.blocked(), out) != sender:
            return
        self._notice_term = held
        self._claimant = (sender, now + self.timing.claim)
        self.suspects.pop(sender, None)  # it spoke: alive

    def handoff_offer(self, state: CoordinatorState, sender: PeerId, now: float,
                      endorsement: bytes = b"") -> None:
        """The coordinator offers us its role at term+1 (graceful handoff).

        ``endorsement`` is the signed offer itself: our heartbeats show it to followers.
        """
        cur = self.state
        if self.role is not Duty.FOLLOWER or self.leaving:
            raise NotCoordinator(f"cannot take over while {self.role.value}")
        if cur is None:  # a newcomer: the same rule as for a first heartbeat
            c = self.view.get(sender)
            if c is None or not c.can_coordinate or sender in self.blocked() \
                    or state.term > self.term + MAX_TERM_STEP:
                raise NotCoordinator("handoff offered by a peer that may not coordinate here")
        elif sender != cur.coordinator:
            raise NotCoordinator("handoff offered by a peer that is not the coordinator we "
                                 "follow")
        if state.coordinator != self.me or state.swarm != self.swarm:
            raise ProtocolError("handoff state names another coordinator or swarm")
        if state.term <= self.guard.highest or (cur is not None and state.term != cur.term + 1):
            raise StaleTerm(f"handoff at term {state.term} is not the next after {self.term}")
        log.info("taking over from %s at term %d", sender.short(), state.term)
        self._pending = state
        self._pending_endorsement = endorsement
        self._predecessor = sender
        self._set_state(Duty.CANDIDATE, now)
        self._actions.append(PutState(state, claim=True))

    def kick_order(self, order: KickOrder, sender: PeerId, now: float, wall: float) -> None:
        """A coordinator's kick order; refused from a stale term (fencing) or a non-coordinator."""
        if not self.guard.admits(order.term):
            raise StaleTerm(f"kick from term {order.term} refused: term {self.term} is current")
        cur = self.state
        if cur is None or order.term != cur.term or sender != cur.coordinator:
            raise NotCoordinator(f"kick from {sender.short()} at term {order.term}: not the "
                                 "coordinator we follow")
        if not abs(wall - order.at) <= self.timing.kick_max_age:  # NaN fails too
            raise StaleTerm(f"kick order from {wall - order.at:.0f} s ago ignored (replay?)")
        if order.target == self.me:
            log.warning("kicked by the coordinator: %s", order.reason or "no reason given")
            self._set_state(Duty.STOPPED, now, why=f"kicked: {order.reason}")
        else:
            self._kicked[order.target] = now + self.timing.kick_max_age
            self._actions.append(Disconnect(order.target, f"kicked: {order.reason}", False))

    def refuses_command(self) -> str | None:
        """Why :meth:`command` would refuse an operator command now (None: it applies or
        holds it). Asked before the replay guard records the command, so a refusal costs the
        sender nothing but a resend."""
        if self.state is None or self.role is Duty.HANDING_OFF and len(self._held) >= MAX_HELD:
            return f"this peer is {self.role.value}, busy"
        if self.role is not Duty.COORDINATOR and self.role is not Duty.HANDING_OFF:
            return f"this peer is {self.role.value}, not the coordinator" \
                + (f"; try {self.coordinator}" if self.coordinator else "")
        return None

    def command(self, cmd: CheckedCommand, now: float) -> CoordinatorState:
        """Apply an authorised operator command; only the coordinator does this. While we
        hand off it is held: applied if we coordinate again, forwarded if we do not."""
        if self.role is Duty.HANDING_OFF and self.state is not None and cmd.by != "coordinator":
            if len(self._held) >= MAX_HELD:
                raise NotCoordinator(f"this peer is {self.role.value}, busy")
            log.info("holding the %s of %s until our handoff ends", cmd.kind, cmd.target.short())
            self._held.append(cmd)
            return self.state
        if self.role is not Duty.COORDINATOR or self.state is None:
            raise NotCoordinator(f"this peer is {self.role.value}, not the coordinator"
                                 + (f"; try {self.coordinator}" if self.coordinator else ""))
        if cmd.kind == "block":
            entry = BlockEntry(cmd.target, cut_reason(cmd.reason), cmd.by, cmd.at)
            if cmd.target == self.me:
                # Our own block travels to the successor in the handoff; followers would
                # refuse a heartbeat from a coordinator its own state blocks.
                self.state = self.state.with_block(entry)
                self._actions.append(Persist(self.state))
                self._leave_reason = "this peer is blocked"
                self.leave(now)
            else:
                self._publish(self.state.with_block(entry), now)
                # Tell the blocked peer once (it leaves), then refuse it.
                self._actions.append(SendHeartbeat(self.state, (cmd.target,), self.endorsement))
                self._actions.append(Disconnect(cmd.target, f"blocked: {cmd.reason}", True))
        elif cmd.kind == "unblock":
            self._unblocked_at[cmd.target] = max(cmd.at, self._unblocked_at.get(cmd.target, 0))
            self._note_unblocked(cmd.target, self.state.term)
            if cmd.target in self.state.blocked_ids:
                # the state remembers it: a former coordinator's replay of an older block
                # is refused by every coordinator that continues this chain
                self._publish(self.state.without_block(
                    cmd.target, at=cmd.at, since=cmd.at - self.timing.forward_max_age), now)
        elif cmd.kind == "kick":
            if cmd.target == self.me:
                self._leave_reason = f"kicked: {cmd.reason}"
                self.leave(now)
            else:
                self._kicked[cmd.target] = now + self.timing.kick_max_age
                # A newcomer may not have heard us yet: our state first, then the order.
                self._actions.append(SendHeartbeat(self.state, (cmd.target,), self.endorsement))
                order = KickOrder(self.state.term, cmd.target, cmd.reason, cmd.at)
                to = tuple(p for p in self.view if p != self.me) + (
                    (cmd.target,) if cmd.target not in self.view else ())
                self._actions.append(SendKick(order, to))
                self._actions.append(Disconnect(cmd.target, f"kicked: {cmd.reason}", False))
        else:
            raise ProtocolError(f"unknown command {cmd.kind!r}")
        return self.state

    def forwarded_unblock(self, cmd: CheckedCommand, sender: PeerId, now: float, wall: float) -> None:
        """An owner's or admin's unblock (proof verified by the adapter), forwarded after a
        heal: applied when it was issued after the block our state holds. The replay checks
        of :meth:`forwarded_block`, and a block issued after the unblock always stands.

        Two senders: a deposed coordinator that applied it in its term while our state kept
        the peer blocked (we coordinate), or the coordinator that refused the block we
        forwarded because this unblock overruled it (we owe that block no longer)."""
        if cmd.kind != "unblock":
            raise ProtocolError("not an unblock")
        if not abs(wall - cmd.at) <= self.timing.forward_max_age:  # NaN fails too
            raise StaleTerm(f"forwarded unblock issued {wall - cmd.at:.0f} s ago (replay?)")
        owed = self._owed.get(cmd.target)
        if owed is not None and owed[0].at < cmd.at:
            log.info("no longer keeping %s blocked: the owner unblocked it later",
                     cmd.target.short())
            del self._owed[cmd.target]
            self._unblocked_at[cmd.target] = max(cmd.at, self._unblocked_at.get(cmd.target, 0))
            return
        if self.role is not Duty.COORDINATOR or self.state is None:
            raise NotCoordinator(f"this peer is {self.role.value}, not the coordinator")
        self._check_forward(cmd, sender, wall)
        if not self.state.term - MAX_TERM_STEP <= cmd.term < self.state.term:
            raise StaleTerm(f"forwarded unblock from term {cmd.term} at term {self.state.term}")
        entry = next((b for b in self.state.blocked if b.peer == cmd.target), None)
        if entry is None:
            return
        if entry.at >= cmd.at:
            raise StaleTerm(f"{cmd.target.short()} was blocked at {entry.at}, newer than the "
                            f"forwarded unblock ({cmd.at}): the block stands")
        log.info("unblocking %s: the owner's unblock, forwarded from a deposed coordinator",
                 cmd.target.short())
        self.command(cmd, now)

    def forwarded_block(self, cmd: CheckedCommand, sender: PeerId, now: float, wall: float) -> None:
        """A block that a deposed coordinator applied in its term, its owner or admin proof
        already verified by the adapter: applied unless it is a replay.

        Replays are refused: from a peer that never coordinated here, older than
        ``forward_max_age`` (by its issue time), issued more than :data:`MAX_TERM_STEP` terms
        back or not below our term, issued no later than a term in which we saw the peer
        unblocked, or older than an unblock we applied."""
        if cmd.kind != "block":
            raise ProtocolError("only blocks are forwarded")
        if self.role is not Duty.COORDINATOR or self.state is None:
            raise NotCoordinator(f"this peer is {self.role.value}, not the coordinator")
        self._check_forward(cmd, sender, wall)
        if not self.state.term - MAX_TERM_STEP <= cmd.term < self.state.term:
            raise StaleTerm(f"forwarded block from term {cmd.term} at term {self.state.term}")
        if self._unblocked_since(cmd.target, cmd.term, cmd.at):
            if self._unblocked_at.get(cmd.target, -1) >= cmd.at:  # we applied a later one
                self._actions.append(ForwardUnblocks((cmd.target,), sender))  # show it
            raise StaleTerm(f"{cmd.target.short()} was unblocked in term {cmd.term} or "
                            "later, or after the block was issued: the forwarded block is "
                            "superseded (or a replay)")
        if cmd.target in self.blocked():
            return
        log.info("keeping %s blocked: forwarded from a deposed coordinator", cmd.target.short())
        self.command(cmd, now)

    def _unblocked_since(self, peer: PeerId, term: int, at: int) -> bool:
        """Whether an unblock supersedes a block of ``peer`` issued in ``term`` at Unix time
        ``at``: one we saw in that term or later, one issued after it that we applied, or
        one issued after it that the state we hold carries (the chain applied it, whether or
        not we were there to see it)."""
        return self._unblocked_term.get(peer, -1) >= term \
            or self._unblocked_at.get(peer, -1) >= at \
            or (self.state is not None and self.state.unblocked_after(peer, at))

    def _check_forward(self, cmd: CheckedCommand, sender: PeerId, wall: float) -> None:
        if sender == self.me or sender not in self.past_coordinators:
            raise NotCoordinator(f"{sender.short()} never coordinated here; it forwards no "
                                 "blocks")
        if not abs(wall - cmd.at) <= self.timing.forward_max_age:  # NaN fails too
            raise StaleTerm(f"forwarded block issued {wall - cmd.at:.0f} s ago (replay?)")

    def forwarded_auto_block(self, entry: BlockEntry, term: int, sender: PeerId, now: float,
                             wall: float) -> None:
        """A block that a coordinator we followed made itself (a repeat liar) in ``term``,
        before its state was replaced by ours without it (a failover or a healed
        partition); the same replay checks as :meth:`forwarded_block`."""
        if sender not in self.past_coordinators or entry.by != "coordinator":
            raise NotCoordinator(f"{sender.short()} never coordinated here; its blocks need "
                                 "an owner's or admin's proof")
        if entry.peer == self.me:
            return
        self.forwarded_block(CheckedCommand("block", entry.peer, entry.reason, "coordinator",
                                     entry.at, term), sender, now, wall)

    def liar_report(self, report: LiarReport, reporter: PeerId, now: float,
                    wall: int) -> Judgement | None:
        """A report that ``report.peer`` returned a wrong result.

        The coordinator acts only on evidence it checked itself (:attr:`check_evidence`),
        and blocks once ``liar_threshold`` distinct pieces of evidence agree within
        ``liar_window``; the block's reason names them. Another member passes a report
        with evidence on to the coordinator, once. Each report is handled once (bounded
        memory); a blocked reporter is not heard. Returns the verdict when we judged it.
        """
        digest = hashlib.sha256(reporter.raw + report.encode()).digest()
        if digest in self._reports or reporter in self.blocked() \
                or self.role is Duty.STOPPED:
            return None
        self._reports[digest] = None
        while len(self._reports) > MAX_SEEN_REPORTS:
            self._reports.popitem(last=False)
        peer = report.peer
        if self.role is not Duty.COORDINATOR:
            coord = self.coordinator
            if not report.relayed and report.evidence and coord not in (None, self.me,
                                                                         reporter):
                self._actions.append(RelayReport(replace(report, relayed=True), coord))
            return None
        if peer == self.me or peer in self.blocked():
            return None
        if peer not in self.view:
            log.info("liar report against %s from %s not judged: not a member here",
                     peer.short(), reporter.short())
            return None
        verdict = self.check_evidence(report, reporter)
        if not verdict.guilty:
            log.info("liar report against %s from %s not acted on: %s", peer.short(),
                     reporter.short(), verdict.why)
            return verdict
        self.proven_liar(peer, verdict.evidence, now, wall, reporter)
        return verdict

    def proven_liar(self, peer: PeerId, evidence: bytes, now: float, wall: int,
                    reporter: PeerId | None = None) -> None:
        """Evidence we checked ourselves, delivered by ``reporter`` (None: our own runtime),
        shows ``peer`` returned a wrong result.

        Blocks once ``liar_threshold`` distinct pieces of evidence agree within
        ``liar_window`` (the same evidence counts once); the reason names them. Only a
        member in our view is counted (a key that never joined is no one to block: throw-away
        keys grew the blocklist without bound, issue 33 finding 3); each reporter holds at
        most :data:`MAX_PIECES_PER_REPORTER` pieces, and a full table gives up a flooding
        reporter's pieces first, never a piece against a suspect others reported (a liar
        flushed its own first piece with 256 pieces against keys it held, finding 2).
        """
        if self.role is not Duty.COORDINATOR or peer == self.me or peer in self.blocked():
            return
        if peer not in self.view:
            log.info("evidence against %s counted for nothing: not a member here",
                     peer.short())
            return
        reporter = reporter or self.me
        seen = {e: v for e, v in self._liars.pop(peer, {}).items()
                if now - v[0] < self.timing.liar_window}
        if evidence not in seen:
            mine = self._pieces.setdefault(reporter, deque())
            while len(mine) >= MAX_PIECES_PER_REPORTER:
                p, e = mine.popleft()
                if p == peer:
                    seen.pop(e, None)
                else:
                    self._forget(p, e)
            mine.append((peer, evidence))
        seen[evidence] = (now, reporter)
        self._liars[peer] = seen
        self._bound_suspects(peer)
        if peer in self._liars and len(seen) >= self.timing.liar_threshold:
            ids = ",".join(sorted(e.hex()[:12] for e in seen))
            log.warning("blocking %s: wrong results shown by evidence %s", peer.short(), ids)
            self.command(CheckedCommand("block", peer, f"wrong result; evidence {ids}"[:100],
                                 "coordinator", wall), now)
            for e, (_, by) in self._liars.pop(peer).items():
                self._drop_piece(by, peer, e)

    def _forget(self, peer: PeerId, evidence: bytes) -> None:
        """Retire one piece of evidence from the suspect table."""
        pieces = self._liars.get(peer)
        if pieces is not None and pieces.pop(evidence, None) is not None and not pieces:
            del self._liars[peer]

    def _drop_piece(self, reporter: PeerId, peer: PeerId, evidence: bytes) -> None:
        mine = self._pieces.get(reporter)
        if mine is not None:
            try:
                mine.remove((peer, evidence))
            except ValueError:
                pass
            if not mine:
                del self._pieces[reporter]

    def _bound_suspects(self, newest: PeerId) -> None:
        """Keep :data:`MAX_LIAR_SUSPECTS` suspects: first give up those that left our view,
        then the one a single reporter holding the most pieces accuses alone (a flood), and
        only then the newest suspect itself."""
        while len(self._liars) > MAX_LIAR_SUSPECTS:
            gone = next((p for p in self._liars if p not in self.view), None)
            if gone is None:
                def flood(p: PeerId) -> int:
                    by = {r for _, r in self._liars[p].values()}
                    return len(self._pieces.get(next(iter(by)), ())) if len(by) == 1 else 0
                gone = max(self._liars, key=flood)
                if flood(gone) <= 1:
                    gone = newest
            for e, (_, by) in self._liars.pop(gone).items():
                self._drop_piece(by, gone, e)

    def blocked_by(self, state: CoordinatorState, now: float) -> None:
        """The state item that members follow (read from the DHT) blocks us: stop, keeping
        it (we missed the block while offline; our own older state would have let us
        coordinate in a bubble that every member refuses)."""
        if self.me not in state.blocked_ids or self.role is Duty.STOPPED:
            return
        log.warning("%s's state at term %d, which members follow, blocks this peer",
                    state.coordinator.short(), state.term)
        self.state = state
        self.guard.observe(state.term)
        self._actions.append(Persist(state))
        self.leaving = True
        self._leave_reason = "this peer is blocked"
        self._set_state(Duty.STOPPED, now, why="this peer is blocked")

    def started(self, now: float) -> None:
        """The control plane runs from now: the wait for the coordinator's heartbeats starts
        here, not when we were built (before the node's bootstrap and benchmark, which took
        longer than a failover: a restarted member suspected a live coordinator at once and
        took over, issue 33 finding 5). A coordinator to hear from gets one failover more:
        it hears of us (our hello, then its topic listing) before its heartbeats reach us."""
        t = self.timing
        wait = t.startup if self.expected not in (None, self.me) else t.first_election
        self.last_heard = now + max(wait - t.failover, 0.0)

    def leave(self, now: float) -> None:
        """Leave the swarm; a coordinator hands off first."""
        self.leaving = True
        if self.role is Duty.COORDINATOR:
            self._start_handoff(now)
        elif self.role is not Duty.HANDING_OFF and self.role is not Duty.STOPPED:
            self._set_state(Duty.STOPPED, now, why="left")

    # -- internals ---------------------------------------------------------------------------

    def _set_state(self, new: Duty, now: float, why: str = "") -> None:
        old = self.role
        if new not in _TRANSITIONS[old]:
            raise IllegalTransition(f"{old.value} -> {new.value}")
        self.role = new
        # The term of the state we hold (not the highest seen): after a failed handoff a
        # coordinator is back at its own term, and logs are evidence of who led which term.
        term = self.state.term if self.state is not None else self.term
        log.info("%s -> %s at term %d%s", old.value, new.value, term, f" ({why})" if why else "")
        self._actions.append(RoleChanged(old, new, term))
        if new is Duty.FOLLOWER:
            self._pending = None
            self.last_heard = now
            if self.state is not None and self.state.coordinator != self.me:
                self.expected = self.state.coordinator
        elif new is Duty.CANDIDATE:
            self._deadline = now + self.timing.claim
            self._claim_out = False
        elif new is Duty.COORDINATOR:
            self.expected = self.me
            if self._charter is not None and self.state is not None \
                    and (self.state.admins, self.state.policy) != self._charter:
                self._publish(self.state.successor(admins=self._charter[0],
                                                   policy=self._charter[1]), now)
            self._apply_owed(now)
            self._beat(now)
            self._apply_held(now)
        elif new is Duty.HANDING_OFF:
            self._deadline = now + self.timing.handoff
        elif new is Duty.STOPPED:
            self._actions.append(Left(why or "stopped"))
        if self._held and new is not Duty.COORDINATOR and new is not Duty.HANDING_OFF:
            self._pass_held(now)  # a rival took over without a state we adopted

    def _forward_owed(self, now: float) -> None:
        """Forward the blocks we owe to the coordinator we follow: at once for a new one,
        then again ``failover`` apart (at most :data:`FORWARD_RETRIES` times) while its state
        lacks them. Each retry costs it one signature check; it decides (replays refused)."""
        st = self.state
        if not (self._owed or self._owed_unblocks) or st is None or st.coordinator == self.me \
                or now < self._owed_next or self._owed_tries > FORWARD_RETRIES:
            return
        self._owed_tries += 1
        self._owed_next = now + self.timing.failover
        by_term: dict[int, list[BlockEntry]] = {}
        for peer, (entry, term, since) in list(self._owed.items()):
            if now - since > self.timing.forward_max_age:
                del self._owed[peer]
            elif peer != st.coordinator:
                by_term.setdefault(term, []).append(entry)
        for term, entries in sorted(by_term.items()):
            self._actions.append(ForwardBlocks(tuple(entries), st.coordinator, term))
        for peer, (_, since) in list(self._owed_unblocks.items()):
            if now - since > self.timing.forward_max_age:
                del self._owed_unblocks[peer]
        if self._owed_unblocks:
            self._actions.append(ForwardUnblocks(tuple(self._owed_unblocks), st.coordinator))

    def _apply_held(self, now: float) -> None:
        """Our handoff failed: apply the commands held meanwhile, in order (one that hands
        off again, blocking or kicking us, holds the rest again)."""
        held, self._held = self._held, []
        for cmd in held:
            try:
                self.command(cmd, now)
            except (NotCoordinator, StaleTerm, ProtocolError) as exc:
                log.warning("held %s of %s not applied: %s", cmd.kind, cmd.target.short(), exc)

    def _pass_held(self, now: float) -> None:
        """Another coordinator took over while we held commands: we owe it the blocks and
        unblocks (forwarded with their proofs, as a deposed coordinator's); a kick is lost
        (its target is kicked again if the owner retries)."""
        held, self._held = self._held, []
        term = self.state.term if self.state is not None else self.term
        for cmd in held:
            if cmd.kind == "block":
                entry = BlockEntry(cmd.target, cut_reason(cmd.reason), cmd.by, cmd.at)
                self._owed[cmd.target] = (entry, term, now)
                self._owed_unblocks.pop(cmd.target, None)
            elif cmd.kind == "unblock":
                self._owed.pop(cmd.target, None)
                self._owed_unblocks[cmd.target] = (cmd.at, now)
            else:
                log.warning("%s of %s arrived while we handed off: not applied", cmd.kind,
                            cmd.target.short())

    def _apply_owed(self, now: float) -> None:
        """We coordinate again while still owing blocks (their forward was lost, or its
        receiver handed the role back first): apply them ourselves, unless an unblock we
        saw supersedes them; and the unblocks we owe, unless a newer block came since."""
        owed, self._owed = self._owed, {}
        unblocks, self._owed_unblocks = self._owed_unblocks, {}
        st = self.state
        if st is None:
            return
        for entry in st.blocked:
            at, since = unblocks.get(entry.peer, (-1, 0.0))
            if entry.at < at and now - since <= self.timing.forward_max_age:
                log.info("unblocking %s: its unblock was lost while we did not coordinate",
                         entry.peer.short())
                st = st.without_block(entry.peer)
                self._note_unblocked(entry.peer, st.term)
        kept = [e for peer, (e, term, since) in owed.items()
                if peer != self.me and peer not in st.blocked_ids
                and now - since <= self.timing.forward_max_age
                and not self._unblocked_since(peer, term, e.at)]
        for entry in kept:
            log.info("keeping %s blocked: its block was lost while we did not coordinate",
                     entry.peer.short())
            try:
                st = st.with_block(entry)
            except ProtocolError as exc:  # the blocklist is full
                log.warning("not keeping %s blocked: %s", entry.peer.short(), exc)
                break
            self._actions.append(Disconnect(entry.peer, f"blocked: {entry.reason}", True))
        if st is not self.state:
            self.state = st
            self._actions.append(PutState(st, claim=False))
            self._actions.append(Persist(st))

    def _note_unblocked(self, peer: PeerId, term: int) -> None:
        self._unblocked_term[peer] = max(term, self._unblocked_term.pop(peer, term))
        while len(self._unblocked_term) > MAX_UNBLOCKED:
            self._unblocked_term.popitem(last=False)

    def _same_term(self, state: CoordinatorState, now: float) -> None:
        """A second coordinator at the term of the state we hold. Nobody acts on two
        coordinators in one term: we coordinated it (a new term decides, see :meth:`rival`),
        or we follow another one that is alive (we stay). Only a coordinator we suspect
        (silent: maybe a claim that failed after its item landed) may be replaced within
        its term, by the one our election picks (see :meth:`_legitimate`)."""
        cur = self.state
        assert cur is not None
        if cur.coordinator == self.me:
            if self.role is Duty.COORDINATOR:
                self.rival(state, now, live=True)
            raise StaleTerm(f"two coordinators at term {state.term}: a new term decides")
        if cur.coordinator not in self.suspects:
            raise StaleTerm(f"two coordinators at term {state.term}: we follow "
                            f"{cur.coordinator.short()}")

    def _drop_claim(self) -> None:
        """A claim ends unconfirmed (timed out, lost, overtaken): its put may still land,
        so the next claim goes above its term and its seq (else the DHT holds two items of
        ours at one seq and two coordinators at one term)."""
        if self._pending is not None:  # a claim or a handoff: either names us
            self.guard.observe(self._pending.term)
            self.note_seq(self._pending.seq)
        self._pending = None

    def _candidates_out(self) -> set[PeerId]:
        """Peers that may not coordinate now: suspected dead, or kicked a moment ago."""
        return set(self.suspects) | set(self._kicked)

    def _follow(self, now: float) -> None:
        if self.expected == self.me:
            self.expected = None
        if now - self.last_heard <= self.timing.failover:
            return
        if self._claimant is not None and self._claimant[0] == self.expected \
                and now <= self._claimant[1]:
            return  # its claim is under way (claim_notice)
        if self.expected is not None:
            self.suspects[self.expected] = now  # only what it does after this clears it
            log.log(logging.INFO if self.passive else logging.WARNING,
                    "no heartbeat from %s for %.1f s: suspecting it", self.expected.short(),
                    now - self.last_heard)
        winner = elect(self.view.values(), self.blocked(), self._candidates_out())
        self.last_heard = now
        if winner == self.me:
            self._claim(now)
        else:
            self.expected = winner

    def _claim(self, now: float) -> None:
        prev = self.state
        term = self.guard.highest + 1
        if prev is None:
            new = CoordinatorState(swarm=self.swarm, term=term, seq=1, coordinator=self.me)
        else:
            new = prev.successor(term=term, coordinator=self.me)
        if new.seq < self._seq_floor:
            new = replace(new, seq=self._seq_floor)
        self._pending = new
        self._pending_endorsement = b""
        self._predecessor = None
        self._set_state(Duty.CANDIDATE, now, why=f"claiming term {term}")
        out = self.blocked() | {self.me}
        self._actions.append(SendClaim(term, tuple(sorted(
            (p for p in self.view if p not in out), key=lambda p: p.raw))))
        self._actions.append(PutState(new, claim=True))

    def _legitimate(self, state: CoordinatorState, endorsed_by: PeerId | None) -> bool:
        cur = self.state
        if cur is None or state.coordinator == cur.coordinator:
            return True
        if endorsed_by is not None and endorsed_by == cur.coordinator:
            return True
        # Failover: is the sender whom we elect once the old coordinator is set aside? (A
        # heartbeat proves the sender alive: our suspicion of it does not count here.)
        out = (self._candidates_out() - {state.coordinator}) | {cur.coordinator}
        return elect(self.view.values(), self.blocked(), out) == state.coordinator

    def _adopt(self, state: CoordinatorState, now: float, heard: bool = True) -> None:
        old = self.state
        # a newer item of the coordinator we suspect, read in the DHT: its content, not its life
        alive = heard or old is None or (old.coordinator, old.term) != (state.coordinator,
                                                                        state.term)
        if old is None or old.term != state.term or old.coordinator != state.coordinator:
            log.info("following %s at term %d", state.coordinator.short(), state.term)
        newly = state.blocked_ids - (old.blocked_ids if old else frozenset())
        if self._held and state.coordinator != self.me:
            self._pass_held(now)  # before the forward below: the new coordinator gets them
        if old is not None and old.coordinator == self.me and state.coordinator != self.me \
                and state.term > old.term and self.role is not Duty.HANDING_OFF:
            # Deposed: blocks the winner lacks were lost (it never saw them), not unblocked.
            for b in old.blocked:
                if b.peer not in state.blocked_ids:
                    self._owed[b.peer] = (b, old.term, now)
            # and unblocks it still blocks with an older block were lost, not overruled
            for b in state.blocked:
                at = self._unblocked_at.get(b.peer, -1)
                if b.peer not in old.blocked_ids and at > b.at \
                        and self._unblocked_term.get(b.peer, -1) >= old.term:
                    self._owed_unblocks[b.peer] = (at, now)
        for peer in (old.blocked_ids if old else frozenset()) - state.blocked_ids:
            if peer not in self._owed:
                self._note_unblocked(peer, state.term)
        for peer in state.blocked_ids & self._owed.keys():
            del self._owed[peer]  # it arrived
        for b in state.blocked:  # a newer block supersedes an unblock we owe
            if b.at >= self._owed_unblocks.get(b.peer, (b.at, 0.0))[0]:
                self._owed_unblocks.pop(b.peer, None)
        for peer in self._owed_unblocks.keys() - state.blocked_ids:
            del self._owed_unblocks[peer]  # it arrived
        self.past_coordinators.add(state.coordinator)
        if old is None or (old.coordinator, old.term) != (state.coordinator, state.term):
            self._owed_tries = 0  # a new coordinator hears all of them at once
            self._owed_next = now
        if self.role is Duty.CANDIDATE:
            self._drop_claim()  # overtaken: our put may still land
        self.guard.observe(state.term)
        self.state = state
        if alive:
            self.expected = state.coordinator
            self.last_heard = now
            self.suspects.pop(state.coordinator, None)
        self._actions.append(Persist(state))
        self._forward_owed(now)
        for entry in state.blocked:
            if entry.peer in newly and entry.peer != self.me:
                self._actions.append(Disconnect(entry.peer, f"blocked: {entry.reason}", True))
        if self.me in newly:
            self.leaving = True
            self._set_state(Duty.STOPPED, now, why="this peer is blocked")
            return
        if self.role is Duty.CANDIDATE or self.role is Duty.COORDINATOR:
            self._set_state(Duty.FOLLOWER, now, why=f"{state.coordinator.short()} holds term "
                                                    f"{state.term}")
        elif self.role is Duty.HANDING_OFF:
            done = state.coordinator == self._successor
            if self.leaving:
                self._set_state(Duty.STOPPED, now, why=self._leave_reason
                                or ("handed off" if done else "left"))
            else:
                self._set_state(Duty.FOLLOWER, now, why="handed off")

    def _publish(self, state: CoordinatorState, now: float) -> None:
        self.state = state
        self._actions.append(PutState(state, claim=False))
        self._actions.append(Persist(state))
        self._beat(now)

    def _beat(self, now: float) -> None:
        if self.state is None or self.me in self.blocked():
            return  # a blocked coordinator only hands off; followers refuse its beats
        out = self.blocked() | {self.me}
        to = tuple(sorted((p for p in self.view if p not in out), key=lambda p: p.raw))
        self._actions.append(SendHeartbeat(self.state, to, self.endorsement))
        self._next_beat = now + self.timing.heartbeat

    def _start_handoff(self, now: float, to: PeerId | None = None) -> None:
        assert self.state is not None
        out = self._candidates_out() | self._passed_over(now)
        succ = to or successor(self.view.values(), self.me, self.blocked(), out)
        if succ is None and self.leaving:
            # one passed over before we left (a refusal is often passing) beats no handoff
            # at all, which leaves our followers a failover to wait
            out = self._candidates_out() | self._leave_tried
            succ = successor(self.view.values(), self.me, self.blocked(), out)
        if succ is None:
            log.info("no successor among %s (out: %s)", [
                (c.peer_id.short(), c.tflops, c.can_coordinate) for c in self.view.values()],
                [p.short() for p in out])
            if self.leaving:
                self._set_state(Duty.STOPPED, now,
                                why=self._leave_reason or "left; no successor available")
            return
        offer = self.state.successor(term=self.state.term + 1, coordinator=succ)
        self._successor = succ
        self._set_state(Duty.HANDING_OFF, now, why=f"handing off to {succ.short()}")
        self._actions.append(SendHandoff(offer, succ))

    def _passed_over(self, now: float) -> set[PeerId]:
        """Successors that failed to take over a moment ago."""
        for peer, until in list(self._failed_successors.items()):
            if now > until:
                del self._failed_successors[peer]
        return set(self._failed_successors)

    def _maybe_rebalance(self, now: float) -> None:
        if self.leaving or self.state is None:
            return
        winner = elect(self.view.values(), self.blocked(),
                       self._candidates_out() | self._passed_over(now))
        mine = self.view.get(self.me)
        if winner is None or winner == self.me or mine is None:
            return
        if self.view[winner].tflops > mine.tflops * self.timing.rebalance:
            self._start_handoff(now, to=winner)
