"""The control plane of one node as one sans-IO core: fed typed events, it returns typed actions.

:class:`ControlCore` holds every decision the control plane makes: the coordinator state
machine (:class:`~swarm.control.machine.Controller`), what to read from the DHT and when
(:class:`~swarm.control.sync.Sync`), the member view built from announcements, which state
items count, the order of a term claim (catch up, the CAS read, the put), control-message
dispatch, operator-command authorisation and replay checks, the owners' and admins' proofs
kept to forward, evidence dedupe and our own liar reports kept to resend. It does no I/O and
reads no clock: each :meth:`ControlCore.handle` call brings one event with ``now``
(monotonic) and ``wall`` (Unix time) and returns the actions to carry out, whose results
come back as events (a read's answer names the read it answers).

Two adapters drive it: :class:`swarm.control.plane.ControlPlane` (asyncio, the real DHT and
datagrams) and the simulator (:mod:`swarm.testing.sim`, a simulated clock, network and DHT).
Which state a reader with no state of its own follows (a newcomer, ``swarm status``) is
:mod:`swarm.control.follow`'s (observers import it without this module's weight).
"""

from __future__ import annotations

import enum
import logging
import math
import struct
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from identity import (
    BlockCommand,
    IdentityError,
    KickCommand,
    Ownership,
    PeerId,
    PeerKey,
    Signed,
    UnblockCommand,
    verify_command,
)
from identity.ceremony import AuthenticatorData, OwnerProof
from identity.roles import Role
from swarm.control import machine as control
from swarm.control.charter import CharterError
from swarm.control.election import Candidate, candidate
from swarm.control.follow import (  # noqa: F401 (the readers' rule, kept here too)
    REREAD_PAUSE,
    STATE_READS,
    deciding_voters,
    followers,
    newest_counted,
    rereads,
)
from swarm.control.machine import (
    MAX_UNBLOCKED,
    CheckedCommand,
    Controller,
    Disconnect,
    Duty,
    EvidenceCheck,
    Left,
    Persist,
    RoleChanged,
    Timing,
    counted_states,
    refuse_unchecked,
)
from swarm.control.replay import CommandGuard
from swarm.control.state import (
    BlockPage,
    CoordinatorState,
    Endorsement,
    ForwardedBlock,
    KickOrder,
    LiarReport,
    SignedMessage,
    StateItem,
    blocklist_digest,
    seal,
    unseal,
)
from swarm.control.sync import Digest, Fetch, Mode, Sync, SyncTiming, rival_batch, view_digest
from swarm.errors import NotCoordinator, ProtocolError, StaleTerm
from swarm.members import ANNOUNCE_TTL, MemberRecord, announced, follows
from swarm.runtime.evidence import Evidence

log = logging.getLogger("swarm.control")

TICK = 0.1
"""Seconds between two :class:`Tick` events (the adapters' timer)."""
BYE_WINDOW = 30.0
"""Seconds a member's bye (its own word that it leaves) counts after it was sent."""
MAX_JUDGED = 4096
"""Evidence keys remembered (so replays of one receipt count once)."""
COMMANDS = {KickCommand: "kick", BlockCommand: "block", UnblockCommand: "unblock"}
MAX_PENDING_REPORTS = 64
"""Our own liar reports kept to resend to a new coordinator (oldest dropped)."""
MAX_IGNORED = 256
"""Coordinators named by ignored DHT state items, logged once each (oldest forgotten)."""
MAX_JUDGED_PER_REPORTER = 16
"""Pieces of evidence judged per reporter per ``Timing.liar_window`` (each check costs the
coordinator a matmul check; two pieces block a liar)."""
MAX_REPORTERS = 1024
"""Reporters whose judging rate is remembered (oldest forgotten)."""
UNKNOWN_READ = 5.0
"""The shortest gap between two member listings brought forward by heartbeats from peers
our view lacks."""
REPUT_MIN, REPUT_MAX = 1.0, 30.0
"""Seconds before our state item is put again after a failed put (doubling up to the max)."""
MAX_PAGES_PUT = 4096
"""Blocklist pages remembered as stored (a heartbeat stores each page once)."""
SPREAD_BELOW = 20
"""Members (the DHT's k) below which a coordinator puts its state item again each time its
view grows: a put made while the swarm was smaller reached only the nodes there were (the
publisher's first one, its own node alone), so a reader's lookup rested on that one busy
node and ``swarm status`` said "coordinator: none" (tests/test_newcomer.py under load)."""


class Purpose(enum.Enum):
    """Why the core reads members' state items (the answer goes where it was asked for)."""

    START = "start"
    """The first read, at start: learn the term and coordinator."""
    STATE = "state"
    """A sync STATE fetch while we follow nobody (or a passive client): all members'."""
    CATCH_UP = "catch-up"
    """A sync STATE fetch: our coordinator's item, for a heartbeat we missed."""
    RIVALS = "rivals"
    """A coordinator's look for a rival's item (a batch of members)."""
    CLAIM_CAS = "claim-cas"
    """A claim's CAS across the swarm: every member's item (a failover claim also catches
    up from the suspected coordinator's)."""


# -- events: what the adapter tells the core --------------------------------------------------


@dataclass(frozen=True)
class Start:
    """The node starts its control plane (after its charter was accepted)."""


@dataclass(frozen=True)
class Tick:
    """The timer (every :data:`TICK` s): heartbeats, failover, the sync core's reads."""


@dataclass(frozen=True)
class Leave:
    """Leave gracefully (a coordinator hands off first)."""


@dataclass(frozen=True)
class MessageReceived:
    """A control datagram arrived (the DHT's direct message, its envelope already checked)."""

    sender: PeerId
    """Who the DHT envelope says sent it (the sealed message names its own signer)."""
    addr: tuple[str, int]
    """The DHT address it came from."""
    payload: bytes
    """The sealed control message (:func:`swarm.control.state.seal`)."""


@dataclass(frozen=True)
class ViewRead:
    """A :class:`ReadView` answered: the membership topic's announcements."""

    members: tuple[tuple[MemberRecord, float], ...] | None
    """Each decodable record with its announcement's expiry (Unix time); None when the
    lookup failed."""
    me: MemberRecord | None = None
    """Our own current record (we are in the view whether or not the lookup found us);
    None for a node that does not announce itself."""


@dataclass(frozen=True)
class StatesRead:
    """A :class:`ReadStates` answered."""

    read: ReadStates
    """The read this answers."""
    states: tuple[CoordinatorState, ...]
    """The items found (blocklists resolved); unreadable or missing ones left out."""


@dataclass(frozen=True)
class ItemResolved:
    """A :class:`ResolveItem` answered."""

    read: ResolveItem
    """The read this answers."""
    state: CoordinatorState | None
    """The full state; None when its pages could not be fetched or did not match."""
    why: str = ""
    """Why not (for the log)."""


@dataclass(frozen=True)
class CharterRead:
    """A :class:`ReadCharter` answered, or a charter verified elsewhere (at start)."""

    ownership: Ownership | None
    """The verified charter (never below the floor asked for); None when the read failed."""
    why: str = ""
    """Why it failed (for the log)."""


@dataclass(frozen=True)
class PutDone:
    """A :class:`PutItem` finished."""

    put: PutItem
    """The put this answers."""
    ok: bool
    """Whether the DHT stored it."""
    why: str = ""
    """Why not."""
    stored_seq: int | None = None
    """Our own item's seq in the DHT when a claim was refused for its seq (the next claim
    numbers above it)."""


@dataclass(frozen=True)
class PagesLost:
    """Blocklist pages a :class:`Send` asked to store could not be stored."""

    targets: tuple[bytes, ...]
    """Their targets (stored again before the next message that names them)."""


@dataclass(frozen=True)
class LiarCaught:
    """The node caught a worker returning a wrong result."""

    peer: PeerId
    """The worker."""
    reason: str
    """What was wrong (logged; cut to 100 characters)."""
    evidence: bytes = b""
    """The runtime's proof, checked by the coordinator before it acts."""


@dataclass(frozen=True)
class EvidenceReceived:
    """Evidence against a worker reached us (from a requester, or our own runtime)."""

    evidence: Evidence
    """The decoded evidence (its arrays are the adapter's to fetch)."""
    reporter: PeerId | None = None
    """Who delivered it (the link's peer); None for our own runtime's."""


@dataclass(frozen=True)
class EvidenceChecked:
    """A :class:`CheckEvidence` finished."""

    evidence: Evidence
    """The evidence checked."""
    proven: bool
    """True when it proves a wrong result by the receipt's worker."""
    why: str = ""
    """The verdict's explanation (for the log)."""
    reporter: PeerId | None = None
    """Who delivered it (as in :class:`CheckEvidence`)."""


Event = Start | Tick | Leave | MessageReceived | ViewRead | StatesRead | ItemResolved \
    | CharterRead | PutDone | PagesLost | LiarCaught | EvidenceReceived | EvidenceChecked


# -- actions: what the adapter must do ---------------------------------------------------------


@dataclass(frozen=True)
class ReadView:
    """List the membership topic; answer with :class:`ViewRead`. One is in flight at a time."""


@dataclass(frozen=True)
class ReadStates:
    """Read these members' coordinator-state items (blocklist pages resolved, using ``known``
    where it holds the same blocklist); answer with :class:`StatesRead`."""

    peers: tuple[PeerId, ...]
    """Whose items."""
    purpose: Purpose
    """What the answer is for."""
    known: CoordinatorState | None = None
    """The state we hold (its blocklist saves page reads)."""
    claim: CoordinatorState | None = None
    """The claimed state, for the claim's reads."""
    began: float = 0.0
    """When the claim began (monotonic), for its log line."""


@dataclass(frozen=True)
class ResolveItem:
    """Fetch the blocklist pages ``item`` names; answer with :class:`ItemResolved`."""

    item: StateItem
    """The decoded item of a heartbeat or handoff offer."""
    known: CoordinatorState | None
    """The state we hold (pages it already has are not fetched)."""
    message: SignedMessage
    """The message that carried it (handled on once resolved)."""
    addr: tuple[str, int]
    """Where that message came from."""
    then: SignedMessage | None = None
    """A kick order that carried this heartbeat, judged after it."""


@dataclass(frozen=True)
class ReadCharter:
    """Fetch and verify the charter chain; answer with :class:`CharterRead`."""

    floor: int
    """Refuse charters whose counter is below this (no rollback)."""


@dataclass(frozen=True)
class PutItem:
    """Store our coordinator-state item (its blocklist pages first, every one of them: a
    page put during a partition reached only that side's nodes); answer with
    :class:`PutDone`."""

    state: CoordinatorState
    """The state (seq = ``state.seq``)."""
    claim: bool
    """True for a term claim."""
    pages: tuple[BlockPage, ...] = ()
    """Its blocklist pages, stored first."""
    began: float = 0.0
    """When the claim began (monotonic), for its log line."""


@dataclass(frozen=True)
class Send:
    """Send one sealed control message to each of ``to`` (after storing ``pages``)."""

    to: tuple[PeerId, ...]
    """Recipients (their DHT addresses: :meth:`ControlCore.address`)."""
    payload: bytes
    """The sealed message."""
    pages: tuple[BlockPage, ...] = ()
    """Blocklist pages the message names that the DHT may not hold yet: store them first
    (a failure is reported with :class:`PagesLost`; the message goes anyway)."""


@dataclass(frozen=True)
class NoteGone:
    """Tell the DHT node that a member we take for dead is gone (lookups skip its node)."""

    peer: PeerId
    """The member."""
    addr: tuple[str, int]
    """Its DHT address."""


@dataclass(frozen=True)
class SavePeers:
    """Keep the DHT addresses of the members seen in the data dir (freshest first)."""

    addrs: tuple[tuple[str, int], ...]
    """The addresses."""


@dataclass(frozen=True)
class SaveFloor:
    """Keep the highest charter counter accepted in the data dir (no rollback on restart)."""

    counter: int
    """The counter."""


@dataclass(frozen=True)
class CheckEvidence:
    """Re-check evidence against its arrays (CPU-heavy: off the loop); answer with
    :class:`EvidenceChecked`."""

    evidence: Evidence
    """The evidence."""
    reporter: PeerId | None = None
    """Who delivered it (handed back in :class:`EvidenceChecked`)."""


@dataclass(frozen=True)
class AnswerEvidence:
    """Tell whoever delivered evidence whether it is taken here: judged now, or judged
    already. Refused evidence is sent again (to whoever coordinates then), so only
    evidence this core has decided on may be answered "taken": an answer given before that
    lost every piece that the core then turned away for a passing reason."""

    key: bytes
    """The evidence's key."""
    reporter: PeerId | None
    """Who delivered it (None: our own runtime, which reads :attr:`taken` from the plane)."""
    taken: bool
    """False: not judged here, deliver it again later."""


@dataclass(frozen=True)
class Follow:
    """Announce that we follow ``coordinator`` at ``term`` (our member record says so)."""

    term: int
    """The term of the state we follow."""
    coordinator: PeerId
    """Its coordinator (ourselves while we coordinate)."""


@dataclass(frozen=True)
class Started:
    """The start reads are done: the adapter may run its timer."""


Action = ReadView | ReadStates | ResolveItem | ReadCharter | PutItem | Send | NoteGone \
    | SavePeers | SaveFloor | CheckEvidence | AnswerEvidence | Follow | Started | Disconnect \
    | Persist | RoleChanged | Left


def completed(item: StateItem, known: CoordinatorState | None) -> CoordinatorState | None:
    """``item``'s full state when no page needs fetching (nothing blocked, or ``known``
    holds the same blocklist), else None."""
    if item.count == 0:
        return item.complete(())
    if known is not None and known.blocked and len(known.blocked) == item.count \
            and blocklist_digest(known.blocked) == item.blocklist:
        return item.complete(known.blocked)
    return None


@dataclass
class _Waiting:
    """What waits for the view read in flight."""

    fetch: bool = False
    start: bool = False
    leave: bool = False
    sends: list[Send] = field(default_factory=list)


class ControlCore:
    """One node's control plane, sans-IO. Feed :meth:`handle`; carry out what it returns."""

    def __init__(self, key: PeerKey, swarm_id: bytes, now: float, *,
                 timing: Timing | None = None, state: CoordinatorState | None = None,
                 ownership: Ownership | None = None, charter_floor: int = 0,
                 passive: bool = False, announce_ttl: float = ANNOUNCE_TTL,
                 check_evidence: EvidenceCheck = refuse_unchecked,
                 reads: Sync | None = None) -> None:
        self.key = key
        self.me = key.peer_id
        self.swarm_id = swarm_id
        self.passive = passive
        """A node that does not announce itself (a client) gets no heartbeats: it follows
        the coordinator through the DHT state items instead."""
        self.announce_ttl = announce_ttl
        timing = timing or Timing()
        self.controller = Controller(self.me, swarm_id, now, timing, state,
                                     check_evidence=check_evidence, passive=passive)
        self.controller.followed = self._followed
        self.sync = reads or Sync(now, SyncTiming(silence=timing.silence), passive=passive)
        """What to read from the DHT and when (heartbeat digests; fallback on silence, judged
        at :attr:`Timing.silence`)."""
        self.ownership = ownership
        """The verified charter commands are checked against."""
        self.charter_floor = charter_floor
        """The highest charter counter accepted here (persisted: no rollback on restart)."""
        self.commands = CommandGuard()
        self.addrs: dict[PeerId, tuple[str, int]] = {}
        self.records: dict[PeerId, MemberRecord] = {}
        self._seen: dict[PeerId, tuple[MemberRecord, float]] = {}
        self._byes: dict[PeerId, float] = {}
        """When members we hold said bye (wall time): their announcements made before it
        do not bring them back."""
        self._candidates: dict[PeerId, tuple[MemberRecord, float, Candidate]] = {}
        self._me_record: MemberRecord | None = None
        self._saved_peers: set[tuple[str, int]] = set()
        self.block_proofs: dict[PeerId, bytes] = {}
        """Signed owner/admin block commands we applied, forwarded if our state is replaced."""
        self.unblock_proofs: OrderedDict[PeerId, bytes] = OrderedDict()
        """Signed unblock commands we applied (the newest :data:`MAX_UNBLOCKED`), forwarded
        if the state that replaces ours still blocks those peers with older blocks."""
        self.pending_reports: deque[LiarReport] = deque(maxlen=MAX_PENDING_REPORTS)
        """Our own liar reports, sent again to each new coordinator (a dead one heard
        nothing)."""
        self._reports_told: PeerId | None = None
        self.judged: OrderedDict[bytes, None] = OrderedDict()
        """Evidence already judged (a receipt counts once, however often it arrives)."""
        self._judging: OrderedDict[PeerId, deque[float]] = OrderedDict()
        """When each reporter's recent pieces were judged (:data:`MAX_JUDGED_PER_REPORTER`)."""
        self.ignored: OrderedDict[PeerId, None] = OrderedDict()
        """Coordinators named by DHT state items that did not count, logged once each."""
        self._noted: set[PeerId] = set()
        """Suspects already reported to the DHT node (:meth:`_note_suspects`)."""
        self._pages_put: OrderedDict[bytes, None] = OrderedDict()
        self._put_members = 0
        """Members in our view when we last put our state item (see SPREAD_BELOW)."""
        self._pages_of: tuple[tuple, list[BlockPage]] = ((), [])
        self._rivals_after: PeerId | None = None
        """The last member the previous rival check read (the next batch starts after it)."""
        self._viewing = False
        self._unknown_read_at = float("-inf")
        self._reput: tuple[CoordinatorState, float] | None = None
        """Our state whose put failed, and when to put it again (doubling gaps)."""
        self._reput_gap = REPUT_MIN
        self._view_began = float("-inf")
        self._listed_at = float("-inf")
        """When our last topic read that got an answer began."""
        self._unlisted: OrderedDict[PeerId, float] = OrderedDict()
        """Workers that evidence named while our view did not list them: when it first did
        (a topic read after that decides whether they are members)."""
        self._told: tuple[int, PeerId] | None = None
        """The (term, coordinator) our record last said we follow."""
        self._bye_to: PeerId | None = None
        """The coordinator we said bye to (once each)."""
        self._waiting = _Waiting()
        self._starting = False
        """Our start read is in flight (heartbeats wait for it)."""
        self._cached_block = False
        """Our own saved state blocks us: a hint that the start read checks against the
        swarm's current state (an unblock we missed lifts it), not a verdict (finding 6)."""
        self._out: list[Action] = []
        self.now = now
        self.wall = 0.0

    # -- queries ---------------------------------------------------------------------------

    @property
    def role(self) -> Duty:
        return self.controller.role

    def blocked(self) -> frozenset[PeerId]:
        return self.controller.blocked()

    def address(self, peer: PeerId) -> tuple[str, int] | None:
        """``peer``'s DHT address as its announcement (or a heartbeat we follow) gave it."""
        return self.addrs.get(peer)

    def takes_evidence(self) -> bool:
        """Whether evidence sent here is judged here (we coordinate)."""
        return self.controller.role is Duty.COORDINATOR

    def evidence_coordinator(self) -> PeerId | None:
        """Where our runtime sends evidence (a client follows the DHT state)."""
        c = self.controller
        coord = c.coordinator
        if coord is None and c.state is not None:
            coord = c.state.coordinator
        return coord

    # -- the one entry point ---------------------------------------------------------------

    def handle(self, event: Event, now: float, wall: float) -> list[Action]:
        """Take one event (at ``now`` monotonic, ``wall`` Unix time); the actions to carry
        out. A :class:`CharterRead` below the floor raises :class:`CharterError`."""
        self.now, self.wall = now, wall
        handler = getattr(self, "_on_" + type(event).__name__)
        handler(event)
        return self.pump()

    def pump(self) -> list[Action]:
        """The actions produced so far, the controller's translated (drivers that poke the
        controller directly, like the simulator's owner commands, call this)."""
        self._drain()
        out, self._out = self._out, []
        return out

    # -- events ----------------------------------------------------------------------------

    def _on_Start(self, _: Start) -> None:
        st = self.controller.state
        self._cached_block = st is not None and self.me in st.blocked_ids
        self.controller.started(self.now)
        self._waiting.start = True
        self._starting = True
        self._read_view()

    def _on_Tick(self, _: Tick) -> None:
        for fetch in self.sync.due(self.now):
            self._fetch(fetch)
        if self._reput is not None and self.now >= self._reput[1]:
            failed, self._reput = self._reput[0], None
            st = self.controller.state
            if self.role is Duty.COORDINATOR and st is not None and st.seq == failed.seq \
                    and st.coordinator == self.me:  # (a newer state is put on its own)
                self._out.append(PutItem(st, False, self._pages(st, again=True)))
        self.controller.tick(self.now)
        self._note_suspects()  # before a claim's lookups start

    def _on_Leave(self, _: Leave) -> None:
        self._say_bye()
        if self.role is Duty.COORDINATOR:
            self._waiting.leave = True  # a fresh view: a member that just joined can take over
            self._read_view()
        else:
            self.controller.leave(self.now)

    def _say_bye(self) -> None:
        """Tell the coordinator we follow that we leave (it drops us now, not when our
        announcement expires), once. A coordinator that leaves says it to its successor,
        once handed off (it had nobody to tell before)."""
        c = self.controller
        coord = c.state.coordinator if c.state is not None else None
        if self.passive or coord in (None, self.me) or self._bye_to == coord:
            return
        self._bye_to = coord
        body = struct.pack(">d", self.wall)
        self._send(Send((coord,), seal(self.key, self.swarm_id, "bye", body)))

    def _on_ViewRead(self, ev: ViewRead) -> None:
        self._viewing = False
        self._me_record = ev.me
        if ev.members is not None:
            self._listed_at = self._view_began
            self._members(ev.members, ev.me)
        waiting, self._waiting = self._waiting, _Waiting()
        if waiting.fetch:
            self.sync.done(Fetch.VIEW, self.now, ev.members is not None)
        for send in waiting.sends:
            self._send(send, retry=False)
        if waiting.start:
            self._read(Purpose.START, tuple(self.records))
        if waiting.leave:
            self.controller.leave(self.now)

    def _on_StatesRead(self, ev: StatesRead) -> None:
        read, p = ev.read, ev.read.purpose
        states = [s for s in ev.states if s.swarm == self.swarm_id]
        if p is Purpose.START:
            self._starting = False
        if p in (Purpose.START, Purpose.STATE, Purpose.CLAIM_CAS) and self._check_blocked(states):
            if p is Purpose.START:
                self._out.append(Started())
            return
        if p is Purpose.START or p is Purpose.STATE:
            self._follow_newest(states)
            if p is Purpose.START:
                self._still_blocked()
                self.controller.started(self.now)
                self._hello()  # now, not after the first silent read: it lists us sooner
                self._out.append(Started())
        elif p is Purpose.CATCH_UP:
            self._caught_up(read.known, states)
        elif p is Purpose.RIVALS:
            for state in self._counted(states):
                self.controller.rival(state, self.now)
        elif p is Purpose.CLAIM_CAS:
            self._cas(read, states)
        if p is Purpose.STATE or p is Purpose.CATCH_UP:
            self._state_fetched()
        elif p is Purpose.RIVALS:
            self.sync.done(Fetch.RIVALS, self.now, True)

    def _on_ItemResolved(self, ev: ItemResolved) -> None:
        r = ev.read
        if ev.state is None:
            log.warning("bad %s message from %s: %s", r.message.kind, r.message.sender.short(),
                        ev.why)
        else:
            self._guarded(r.message, lambda: self._resolved(r.message, r.addr, ev.state))
        if r.then is not None:
            self._guarded(r.then, lambda: self._kick(r.then))

    def _on_CharterRead(self, ev: CharterRead) -> None:
        if ev.ownership is None:
            log.info("charter refresh failed: %s", ev.why)
            self.sync.done(Fetch.CHARTER, self.now, False)
            return
        try:
            self.accept_charter(ev.ownership)
        except CharterError as exc:
            log.warning("charter refused: %s", exc)
            self.sync.done(Fetch.CHARTER, self.now, False)
            return
        self.sync.done(Fetch.CHARTER, self.now, True)

    def _on_PutDone(self, ev: PutDone) -> None:
        act, c = ev.put, self.controller
        why = ev.why
        if ev.stored_seq is not None:
            c.note_seq(ev.stored_seq)
            why += f" (stored seq {ev.stored_seq}; the next claim numbers above it)"
        if not ev.ok:
            for page in act.pages:  # stored again with the next message that names them
                self._pages_put.pop(page.target, None)
            log.warning("coordinator state put (term %d) failed: %s", act.state.term, why)
            if not act.claim and (self._reput is None
                                  or act.state.seq >= self._reput[0].seq):
                # Put it again until it is stored: the DHT kept the state before it, so a
                # block in it reached no newcomer, no observer and no blocked peer that
                # missed its one notice (a failed put was never tried again).
                self._reput = (act.state, self.now + self._reput_gap)
                self._reput_gap = min(2 * self._reput_gap, REPUT_MAX)
        elif not act.claim and act.state == c.state:
            self._reput_gap = REPUT_MIN
        if act.claim:
            log.info("claim of term %d %s in %.2f s", act.state.term,
                     "stored" if ev.ok else "failed", self.now - act.began)
            c.claim_result(ev.ok, self.now, why)

    def _on_PagesLost(self, ev: PagesLost) -> None:
        for t in ev.targets:
            self._pages_put.pop(t, None)

    def _on_LiarCaught(self, ev: LiarCaught) -> None:
        report = LiarReport(ev.peer, ev.reason[:100], ev.evidence)
        self.pending_reports.append(report)
        self._report_liars([report])

    def _on_EvidenceReceived(self, ev: EvidenceReceived) -> None:
        self._out.append(AnswerEvidence(ev.evidence.key, ev.reporter, self._judge(ev)))

    def _judge(self, ev: EvidenceReceived) -> bool:
        """Start judging ``ev`` (a :class:`CheckEvidence`); whether it is taken here."""
        key, c = ev.evidence.key, self.controller
        if self.role is not Duty.COORDINATOR:
            return False
        if key in self.judged:
            return True
        worker = ev.evidence.receipt.worker
        if worker in c.blocked():
            log.info("evidence against %s not judged: blocked already", worker.short())
            return True
        if worker not in c.view:
            # Maybe a member that joined since our last topic read (a requester can reach
            # it first): read the topic soon and have the evidence sent again; once a read
            # since then still does not list it, it is no member (issue 33, finding 3).
            # At most one read per min_gap, however much evidence names keys we do not list.
            asked = self._unlisted.pop(worker, None)
            if asked is not None and self._listed_at > asked:
                log.info("evidence against %s counted for nothing: not a member here",
                         worker.short())
                return True
            self._unlisted[worker] = self.now if asked is None else asked
            while len(self._unlisted) > MAX_REPORTERS:
                self._unlisted.popitem(last=False)
            log.info("evidence against %s not judged yet: not in our member view; reading "
                     "the members again", worker.short())
            self.sync.nudged(self.now)
            return False
        reporter = ev.reporter or self.me
        times = self._judging.pop(reporter, deque())
        while times and times[0] < self.now - c.timing.liar_window:
            times.popleft()
        self._judging[reporter] = times
        while len(self._judging) > MAX_REPORTERS:
            self._judging.popitem(last=False)
        if len(times) >= MAX_JUDGED_PER_REPORTER:
            log.info("evidence from %s not judged: %d pieces judged for it in %.0f s already",
                     reporter.short(), len(times), c.timing.liar_window)
            return True
        times.append(self.now)
        self.judged[key] = None
        while len(self.judged) > MAX_JUDGED:
            self.judged.popitem(last=False)
        self._out.append(CheckEvidence(ev.evidence, ev.reporter))
        return True

    def _on_EvidenceChecked(self, ev: EvidenceChecked) -> None:
        worker = ev.evidence.receipt.worker
        if not ev.proven:
            log.info("evidence against %s not proven: %s", worker.short(), ev.why)
            return
        log.warning("proof that %s lied: %s", worker.short(), ev.why)
        self.controller.proven_liar(worker, ev.evidence.key, self.now, int(self.wall),
                                    ev.reporter)

    def _on_MessageReceived(self, ev: MessageReceived) -> None:
        try:
            env = unseal(self.swarm_id, ev.payload)
        except ProtocolError as exc:
            log.debug("ignoring message from %s: %s", ev.sender.short(), exc)
            return
        self._guarded(env, lambda: self._message(env, ev.addr))

    # -- the charter -----------------------------------------------------------------------

    def accept_charter(self, ownership: Ownership) -> None:
        """Take a verified charter (fetched with our floor) and raise the floor to its
        counter; :class:`CharterError` for one below the floor."""
        if ownership.counter < self.charter_floor:
            raise CharterError(f"charter counter {ownership.counter} is below "
                               f"{self.charter_floor}: rollback refused")
        self.ownership = ownership
        if ownership.counter > self.charter_floor:
            self.charter_floor = ownership.counter
            self._out.append(SaveFloor(ownership.counter))
        self.sync.have(charter=self.charter_floor)
        for cred, n in ownership.sign_counts.items():
            if n > self.commands.sign_counts.get(cred, 0):
                self.commands.sign_counts[cred] = n
        self.controller.charter_changed(
            [p for p, g in ownership.admins.items() if g.expires is None],
            {"require_hardware": ownership.policy.require_hardware}, self.now)

    # -- reads -----------------------------------------------------------------------------

    def _fetch(self, fetch: Fetch) -> None:
        """One read the sync core asked for (reported back to it however it ends)."""
        c = self.controller
        if fetch is Fetch.VIEW:
            self._waiting.fetch = True
            self._read_view()
        elif fetch is Fetch.CHARTER:
            self._out.append(ReadCharter(self.charter_floor))
        elif fetch is Fetch.STATE:
            # all members' items while we follow nobody (a newcomer counts the terms before
            # it follows; a passive client follows the DHT), else our coordinator's
            st = c.state
            if self.passive or st is None:
                self._read(Purpose.STATE, tuple(self.records))
            elif st.coordinator != self.me and self.role is not Duty.STOPPED:
                # and the successor we expect once ours went silent: its item is how we
                # learn a term (and a block of us) whose heartbeats never reached us
                heir = c.expected
                self._read(Purpose.CATCH_UP, (st.coordinator,) if heir in (
                    None, self.me, st.coordinator) else (st.coordinator, heir))
            else:
                self._state_fetched()
        elif self.role is Duty.COORDINATOR:  # RIVALS, in round-robin batches
            batch = rival_batch(self.records, self._rivals_after, self.sync.timing.rival_batch)
            self._rivals_after = batch[-1] if batch else None
            self._read(Purpose.RIVALS, tuple(batch))
        else:
            self.sync.done(Fetch.RIVALS, self.now, True)

    def _read(self, purpose: Purpose, peers: tuple[PeerId, ...], **kw) -> None:
        self._out.append(ReadStates(peers, purpose, self.controller.state, **kw))

    def _read_view(self) -> None:
        if not self._viewing:
            self._viewing = True
            self._view_began = self.now
            self._out.append(ReadView())

    def _state_fetched(self) -> None:
        self._hello()
        self.sync.done(Fetch.STATE, self.now, True)

    def _hello(self) -> None:
        """No heartbeats reach us (a newcomer, or dropped from the view) while the DHT names
        a coordinator: tell it, so that its next topic read comes now rather than at its
        idle period. Sent at the silent reads' backoff (1 s doubling to 8 s)."""
        c = self.controller
        coord = c.state.coordinator if c.state is not None else None
        if self.passive or self._me_record is None or coord in (None, self.me) \
                or self.sync.mode(self.now) is not Mode.SILENT:
            return
        self._send(Send((coord,), seal(self.key, self.swarm_id, "hello", b"")))

    def _members(self, members: Iterable[tuple[MemberRecord, float]],
                 me: MemberRecord | None) -> None:
        """Build the member view from a topic listing. A lookup that missed a slow node lists
        fewer members; an announcement stays valid until it expires, so the view keeps what
        it saw (silence is the controller's to judge). Blocked peers' announcements are
        refused."""
        c = self.controller
        for rec, expires in members:
            old = self._seen.get(rec.peer_id)
            bye = self._byes.get(rec.peer_id)
            if bye is not None and not rec.left and expires - self.announce_ttl <= bye:
                continue  # made before its bye: a rejoin announces after it
            if old is None or expires > old[1] or (expires == old[1] and not old[0].left):
                self._seen[rec.peer_id] = (rec, expires)
        blocked = c.blocked()
        view: list[Candidate] = []
        listed = False
        for peer, (rec, expires) in list(self._seen.items()):
            if expires < self.wall:
                del self._seen[peer]
                self._byes.pop(peer, None)
                self.records.pop(peer, None)
                self._candidates.pop(peer, None)
                continue
            if peer in blocked:
                continue
            if rec.left:  # it said so itself: dealt no work, picked as no successor
                self.records.pop(peer, None)
                self._candidates.pop(peer, None)
                continue
            self.records[peer] = rec
            if rec.dht is not None:
                self.addrs[peer] = rec.dht
            view.append(self._candidate(rec, expires))
            listed = listed or peer == self.me
        if not listed and me is not None:
            view.append(candidate(me, float("inf")))
        if len(view) != len(c.view):
            log.info("%d members in view", len(view))
        seen = {self.addrs[v.peer_id] for v in view if v.peer_id in self.addrs
                and v.peer_id != self.me}
        if seen != self._saved_peers:
            self._saved_peers = seen
            order = sorted(view, key=lambda v: -v.freshness)
            self._out.append(SavePeers(tuple(self.addrs[v.peer_id] for v in order
                                             if v.peer_id in self.addrs
                                             and v.peer_id != self.me)))
        c.members(view, self.now)
        self.sync.have(view=view_digest(c.view), members=len(c.view))
        if self.role is Duty.COORDINATOR and c.state is not None \
                and self._put_members < SPREAD_BELOW and len(c.view) > self._put_members:
            self._put_members = len(c.view)  # the same item again: a refresh where it is
            self._out.append(PutItem(c.state, False, self._pages(c.state)))

    def _candidate(self, rec: MemberRecord, expires: float) -> Candidate:
        """The election's view of an announcement (kept while the announcement is)."""
        had = self._candidates.get(rec.peer_id)
        if had is not None and had[0] is rec and had[1] == expires:
            return had[2]
        cand = candidate(rec, announced(expires, self.wall, self.now, self.announce_ttl))
        self._candidates[rec.peer_id] = (rec, expires, cand)
        return cand

    def _counted(self, found: list[CoordinatorState]) -> list[CoordinatorState]:
        """The items that count (the controller's rules), no term taken from them (only a
        claim's CAS does that: a term we merely read must not fence off the coordinator we
        follow). One that does not count (its signer may not coordinate, its term is out of
        reach, or it is blocked) is logged, once per coordinator it names: operators see the
        attempt (a member's term inflation), and tests wait for it."""
        c = self.controller
        floor = c.state.term if c.state is not None else None
        counted = counted_states((s for s in found if s.swarm == self.swarm_id), c.view,
                                 c.blocked(), floor)
        kept = {id(s) for s in counted}
        for s in found:
            if id(s) in kept or s.coordinator in self.ignored:
                continue
            self.ignored[s.coordinator] = None
            if len(self.ignored) > MAX_IGNORED:
                self.ignored.popitem(last=False)
            log.info("ignoring the DHT's state of term %d naming %s: it does not count (a "
                     "signer that may not coordinate, a term out of reach, or a blocked peer)",
                     s.term, s.coordinator.short())
        return counted

    def _followed(self, state: CoordinatorState) -> bool:
        """Whether a member other than its signer says it follows ``state``."""
        key = follows(state.term, state.coordinator)
        return any(r.follows == key and p != state.coordinator
                   for p, r in self.records.items())

    def _check_blocked(self, found: list[CoordinatorState]) -> bool:
        """Whether the state item that other members follow blocks us (read from every
        member's item at start, while we follow nobody, and before a claim): then we stop.
        Our own state may predate the block (we were offline), and our election, which
        does not know it, would make us claim and coordinate in a bubble (finding 4). A
        lone signer's item blocking us moves nothing (it is no one's state but its own),
        unless its signer is the only member left to say anything: every member but us and
        those we suspect follows it (a swarm of the coordinator and us, issue 48 attack 2;
        one more key, as many as the "followed" rule takes, could always say as much)."""
        c = self.controller
        if self.passive or not found:
            return False
        votes = followers(self.records.values())
        blocking = [s for s in counted_states(found, c.view, ())
                    if self.me in s.blocked_ids
                    and (self._followed(s) or self._all_follow(s))]
        top = max(blocking, key=lambda s: (votes[follows(s.term, s.coordinator)], s.term,
                                           s.seq), default=None)
        if top is None or (c.state is not None and top.term < c.state.term):
            return False
        c.blocked_by(top, self.now)
        return True

    def _all_follow(self, state: CoordinatorState) -> bool:
        """Whether every member's record but ours and our suspects' says it follows
        ``state`` (its signer's included; at least one)."""
        key = follows(state.term, state.coordinator)
        voters = [r for p, r in self.records.items()
                  if p != self.me and p not in self.controller.suspects and not r.left]
        return bool(voters) and all(r.follows == key for r in voters)

    def _follow_newest(self, found: list[CoordinatorState]) -> None:
        """Learn the current term and coordinator from the state items that count: the one
        most members follow (:func:`newest_counted`)."""
        votes = followers(self.records.values())
        state = max(self._counted(found), default=None,
                    key=lambda s: (votes[follows(s.term, s.coordinator)], s.term, s.seq))
        if state is not None:
            cur = self.controller.state
            if cur is None or state.term > cur.term or (
                    self._cached_block and state.term == cur.term and state.seq > cur.seq):
                try:
                    self.controller.heartbeat(state, state.coordinator, self.now, heard=False)
                except (StaleTerm, NotCoordinator, ProtocolError) as exc:
                    log.info("not following the DHT's state of term %d: %s", state.term, exc)

    def _still_blocked(self) -> None:
        """At start, after the swarm's state items were read: a block in our own saved state
        holds only if the state we now follow still has it (no item to check it against
        keeps it: we cannot tell it was lifted)."""
        st = self.controller.state
        if self._cached_block and st is not None and self.me in st.blocked_ids:
            self.controller.blocked_by(st, self.now)
        self._cached_block = False

    def _caught_up(self, st: CoordinatorState | None, found: list[CoordinatorState]) -> None:
        """Heartbeats are datagrams: our coordinator's DHT item shows anything missed (a
        block of this very peer is sent to it only once), and the item of the successor we
        expect since ours went silent shows a term we never heard of (adopted only if the
        election makes it ours: :meth:`Controller.heartbeat`)."""
        if st is None:
            return
        heir = self.controller.expected
        for newer in found:
            if (newer.coordinator == st.coordinator and newer.seq > st.seq) or (
                    newer.coordinator == heir != st.coordinator and newer.term > st.term):
                try:
                    self.controller.heartbeat(newer, newer.coordinator, self.now, heard=False)
                except (StaleTerm, NotCoordinator, ProtocolError) as exc:
                    log.info("not adopting %s's newer DHT state: %s", st.coordinator.short(),
                             exc)

    def _note_suspects(self) -> None:
        """Members the controller has just come to take for dead are not asked in DHT
        lookups either (a failover claim would otherwise wait on the dead coordinator's
        DHT node in each of its lookups)."""
        suspects = self.controller.suspects
        for peer in suspects.keys() - self._noted:
            rec = self.records.get(peer)
            if rec is not None and rec.dht is not None:
                self._out.append(NoteGone(peer, rec.dht))
        self._noted = set(suspects)

    # -- claims and puts -------------------------------------------------------------------

    def _put_state(self, act: control.PutState) -> None:
        if act.claim:
            self._claim_cas(act.state, self.now)
        else:
            # Only pages not put yet: a new block changes the last page alone (the DHT
            # re-puts what we stored; a claim puts every page once, see _claim_cas)
            self._put_members = len(self.controller.view)
            self._out.append(PutItem(act.state, False, self._pages(act.state)))

    def _claim_cas(self, claim: CoordinatorState, began: float) -> None:
        """The CAS across the swarm: nobody entitled may hold this term (or a later one).
        The same read catches a failover claim up (a handoff carries its own, newer state):
        the item of the coordinator we suspect shows what its heartbeats did not bring us.
        One read, not a catch-up read before it: each is a round of DHT lookups, and the
        members wait for the claim."""
        peers = tuple(self.records)
        st = self.controller.state
        if st is not None and claim.prev == st.digest() and st.coordinator not in self.records \
                and st.coordinator != self.me:
            peers += (st.coordinator,)
        self._read(Purpose.CLAIM_CAS, peers, claim=claim, began=began)

    def _cas(self, read: ReadStates, found: list[CoordinatorState]) -> None:
        c = self.controller
        st = read.known
        if c.role is Duty.CANDIDATE and st is not None and read.claim.prev == st.digest() \
                and st.coordinator != self.me:
            self._caught_up(st, found)  # a failover claim: what we missed first
        if c.role is not Duty.CANDIDATE:
            return  # what we missed settled it (a newer state, or our own block)
        top = c.claim_conflict(read.claim, found)
        if top is not None:
            c.claim_result(False, self.now, f"{top.coordinator.short()} holds term {top.term}",
                           beaten_by=top)
            return
        self._put_members = len(self.controller.view)
        c.claim_put()
        self._out.append(PutItem(read.claim, True, self._pages(read.claim, again=True),
                                 read.began))

    def _pages(self, state: CoordinatorState, again: bool = False) -> tuple[BlockPage, ...]:
        """``state``'s blocklist pages the DHT may lack (all of them with ``again``)."""
        if self._pages_of[0] is not state.blocked:
            self._pages_of = (state.blocked, state.pages())
        out = []
        for page in self._pages_of[1]:
            if again or page.target not in self._pages_put:
                out.append(page)
                self._pages_put[page.target] = None
                while len(self._pages_put) > MAX_PAGES_PUT:
                    self._pages_put.popitem(last=False)
        return tuple(out)

    # -- sends -----------------------------------------------------------------------------

    def _send(self, send: Send, retry: bool = True) -> None:
        """Send to the recipients whose address we know; the rest after a fresh view (a
        member that joined since the last listing), or dropped."""
        known = tuple(p for p in send.to if p in self.addrs)
        unknown = tuple(p for p in send.to if p not in self.addrs)
        if known or send.pages:
            self._out.append(Send(known, send.payload, send.pages))
        if unknown:
            if retry:
                self._waiting.sends.append(Send(unknown, send.payload))
                self._read_view()
            else:
                for p in unknown:
                    log.info("no DHT address for %s; message dropped", p.short())

    def _seal(self, kind: str, body: bytes, endorsement: bytes = b"",
              digest: bytes = b"") -> bytes:
        return seal(self.key, self.swarm_id, kind, body, endorsement, digest=digest)

    def _digest(self) -> Digest:
        """What our heartbeats say we hold (members fetch what differs from theirs)."""
        view = self.controller.view
        return Digest(view_digest(view), len(view), self.charter_floor)

    # -- translating the controller's actions ------------------------------------------------

    def _drain(self) -> None:
        c = self.controller
        while True:
            acts = c.actions()
            if not acts:
                break
            for act in acts:
                self._translate(act)
        if self.pending_reports and self._report_to() not in (None, self._reports_told):
            self._report_liars(list(self.pending_reports))
            for act in c.actions():
                self._translate(act)
        st = c.state
        if st is not None and not self.passive and c.role is not Duty.STOPPED \
                and self._told != (st.term, st.coordinator):
            self._told = (st.term, st.coordinator)
            self._out.append(Follow(st.term, st.coordinator))

    def _translate(self, act: control.Action) -> None:
        c = self.controller
        if isinstance(act, control.PutState):
            self._put_state(act)
        elif isinstance(act, control.SendHeartbeat):
            msg = self._seal("hb", act.state.encode_item(), act.endorsement,
                             self._digest().encode())
            self._send(Send(act.to, msg, self._pages(act.state)))
        elif isinstance(act, control.SendClaim):
            self._send(Send(act.to, self._seal("claim", struct.pack(">Q", act.term))),
                       retry=False)
        elif isinstance(act, control.SendHandoff):
            endorse = self._seal("endorse", Endorsement(act.state.term, act.to).encode())
            msg = self._seal("handoff", act.state.encode_item(), endorse)
            self._send(Send((act.to,), msg, self._pages(act.state)))
        elif isinstance(act, control.SendKick):
            # The kick carries our heartbeat, so a peer that has not heard us yet (a
            # newcomer) learns who we are before it judges the order.
            hb = c.state
            carried = self._seal("hb", hb.encode_item(), c.endorsement) if hb else b""
            self._send(Send(act.to, self._seal("kick", act.order.encode(), carried)))
        elif isinstance(act, control.ForwardBlocks):
            for entry in act.entries:
                proof = self.block_proofs.get(entry.peer)
                if proof is not None:  # an owner's or admin's signed command
                    msg = self._seal("fwd", proof)
                elif entry.by == "coordinator":  # our own (a repeat liar): our word
                    msg = self._seal("fwdauto", ForwardedBlock(entry, act.term).encode())
                else:
                    continue
                self._send(Send((act.to,), msg))
        elif isinstance(act, control.ForwardUnblocks):
            for peer in act.peers:
                if (proof := self.unblock_proofs.get(peer)) is not None:
                    self._send(Send((act.to,), self._seal("fwd", proof)))
        elif isinstance(act, control.RelayReport):
            self._send(Send((act.to,), self._seal("liar", act.report.encode())))
        elif isinstance(act, control.RoleChanged):
            self.sync.role(act.new is Duty.COORDINATOR, self.now)
            self._out.append(act)
        elif isinstance(act, control.Left):
            if c.leaving:  # handed off: our successor drops us now
                self._say_bye()
            self._out.append(act)
        else:  # Disconnect, Persist: the adapter's as they are
            self._out.append(act)

    # -- liar reports ----------------------------------------------------------------------

    def _report_to(self) -> PeerId | None:
        c = self.controller
        coord = c.coordinator
        if coord is None and self.passive and c.state is not None:
            coord = c.state.coordinator  # no heartbeats here to judge by
        return coord

    def _report_liars(self, reports: list[LiarReport]) -> None:
        """Tell the coordinator (sent again to a new one: a dead one heard nothing)."""
        coord = self._report_to()
        self._reports_told = coord
        for report in reports:
            if coord == self.me:
                self.controller.liar_report(report, coord, self.now, int(self.wall))
            elif coord is not None:
                self._send(Send((coord,), self._seal("liar", report.encode())))

    # -- messages --------------------------------------------------------------------------

    def _guarded(self, env: SignedMessage, handle) -> None:
        """Run a message's handler; a refusal or a malformed body is logged, never raised."""
        try:
            handle()
        except (StaleTerm, NotCoordinator) as exc:
            log.info("refused %s from %s: %s", env.kind, env.sender.short(), exc)
        except (ProtocolError, IdentityError, ValueError, KeyError, TypeError) as exc:
            log.warning("bad %s message from %s: %s", env.kind, env.sender.short(), exc)

    def _message(self, env: SignedMessage, addr: tuple[str, int],
                 then: SignedMessage | None = None) -> bool:
        """Dispatch one verified control message by its kind; True when it waits for its
        blocklist pages (:class:`ResolveItem`; ``then``, a kick it carried, waits too)."""
        c, now, wall = self.controller, self.now, self.wall
        kind = env.kind
        if (kind == "hb" or kind == "handoff") and self._starting:
            # Not before our start read has answered: with no state yet, the controller
            # would adopt any entitled member's heartbeat, and one that blocks us, sent
            # while the read is in flight, stopped us for good (issue 48, attack 1). The
            # coordinator's next heartbeat is judged against the state members follow.
            raise NotCoordinator(f"{kind} at term {StateItem.decode(env.body).head.term} "
                                 "before our start read answered")
        if kind == "hb" or kind == "handoff":
            item = StateItem.decode(env.body)
            if kind == "hb":
                if why := c.implausible(item.head):
                    if env.sender not in c.view and self.now >= self._unknown_read_at:
                        # joined since our last lookup, maybe; any key can send this, so
                        # it buys one listing per UNKNOWN_READ s, not one per datagram
                        self._unknown_read_at = self.now + UNKNOWN_READ
                        self._read_view()
                    raise NotCoordinator(f"heartbeat at term {item.head.term}: {why}")
                if env.digest:
                    Digest.decode(env.digest)  # malformed: refused before any page is read
            elif why := c.implausible(replace(item.head, coordinator=env.sender)):
                raise NotCoordinator(f"handoff offer refused: {why}")
            state = completed(item, c.state)
            if state is None:
                if kind == "hb" and item.head.coordinator == env.sender:
                    c.alive(env.sender, item.head.term, now)
                self._out.append(ResolveItem(item, c.state, env, addr, then))
                return True
            self._resolved(env, addr, state)
        elif kind == "kick":
            deferred = False
            if env.endorsement:
                inner = unseal(self.swarm_id, env.endorsement)
                if inner.kind != "hb":
                    raise ProtocolError("a kick carries only a heartbeat")

                def carried() -> None:
                    nonlocal deferred
                    deferred = self._message(inner, addr, then=env)
                self._guarded(inner, carried)
            if not deferred:
                self._kick(env)
        elif kind == "claim":  # the winner of a failover says its claim is under way
            if len(env.body) != 8:
                raise ProtocolError("a claim notice carries its term")
            c.claim_notice(env.sender, struct.unpack(">Q", env.body)[0], now)
        elif kind == "bye":
            self._bye(env)
        elif kind == "hello":  # a member we do not list yet: read the topic soon
            if c.role is Duty.COORDINATOR and env.sender not in c.view:
                self.sync.nudged(now)
        elif kind == "liar":
            c.liar_report(LiarReport.decode(env.body), env.sender, now, int(wall))
        elif kind == "cmd":
            self._command(Signed.decode(env.body))
        elif kind == "fwd":
            self._forwarded(Signed.decode(env.body), env.sender)
        elif kind == "fwdauto":
            fwd = ForwardedBlock.decode(env.body)
            c.forwarded_auto_block(fwd.entry, fwd.term, env.sender, now, wall)
        return False

    def _bye(self, env: SignedMessage) -> None:
        """The sender says it leaves (its own signature, so nobody else can say it for it):
        drop it from the view now. Fresh only: sent within :data:`BYE_WINDOW` s, and after
        the announcement we hold was made (an old bye does not undo a rejoin)."""
        if len(env.body) != 8:
            raise ProtocolError("a bye carries its send time")
        (sent,) = struct.unpack(">d", env.body)
        old = self._seen.get(env.sender)
        if not math.isfinite(sent) or abs(self.wall - sent) > BYE_WINDOW or old is None \
                or sent < old[1] - self.announce_ttl or old[0].left:
            return
        log.info("%s left", env.sender.short())
        self._seen[env.sender] = (replace(old[0], left=True), old[1])
        self._byes[env.sender] = sent  # one per member we hold (dropped with it)
        self._members((), self._me_record)

    def _resolved(self, env: SignedMessage, addr: tuple[str, int],
                  state: CoordinatorState) -> None:
        c, now = self.controller, self.now
        if env.kind == "hb":
            digest = Digest.decode(env.digest) if env.digest else None
            c.heartbeat(state, env.sender, now, self._endorser(env.endorsement, state))
            self.addrs.setdefault(env.sender, addr)  # only a coordinator we follow
            if c.coordinator == env.sender:
                self.sync.heard(digest, now)
        else:
            c.handoff_offer(state, env.sender, now, env.endorsement)

    def _kick(self, env: SignedMessage) -> None:
        self.controller.kick_order(KickOrder.decode(env.body), env.sender, self.now, self.wall)

    def _endorser(self, endorsement: bytes, state: CoordinatorState) -> PeerId | None:
        if not endorsement:
            return None
        try:
            env = unseal(self.swarm_id, endorsement)
            e = Endorsement.decode(env.body)
        except ProtocolError:
            return None
        if env.kind != "endorse" or e.term != state.term or e.successor != state.coordinator:
            return None
        return env.sender

    # -- operator commands -----------------------------------------------------------------

    def _command(self, signed: Signed) -> None:
        if self.ownership is None:
            raise NotCoordinator("this peer has no verified charter to check commands against")
        c, wall = self.controller, self.wall
        role = verify_command(signed, self.ownership, now=wall,
                              coordinator=c.coordinator, min_term=c.term)
        cmd = signed.statement
        if why := c.refuses_command():  # before the guard records it: a resend may apply
            raise NotCoordinator(why)
        self.admit(signed, wall)
        kind = COMMANDS[type(cmd)]
        c.command(CheckedCommand(kind, cmd.target, cmd.reason, role.value, int(wall), cmd.term),
                  self.now)
        if kind == "block":
            self.block_proofs[cmd.target] = signed.encode()
            self.unblock_proofs.pop(cmd.target, None)
        elif kind == "unblock":
            self.unblocked(cmd.target, signed)

    def unblocked(self, peer: PeerId, signed: Signed) -> None:
        """Keep the proof of an unblock we applied (forwarded after a heal)."""
        self.block_proofs.pop(peer, None)
        self.unblock_proofs.pop(peer, None)
        self.unblock_proofs[peer] = signed.encode()
        while len(self.unblock_proofs) > MAX_UNBLOCKED:
            self.unblock_proofs.popitem(last=False)

    def admit(self, signed: Signed, wall: float) -> None:
        """The replay guard: once, fresh, and an owner key's sign counter moving forward."""
        proof = signed.proofs[0]
        if isinstance(proof, OwnerProof):
            self.commands.admit(proof.credential_id, signed.statement.counter, wall,
                                AuthenticatorData(proof.authenticator_data).counter)
        else:
            self.commands.admit(proof.signer.raw, signed.statement.counter, wall)

    def _forwarded(self, signed: Signed, sender: PeerId) -> None:
        """A block or unblock with its owner's or admin's proof, from a coordinator our state
        replaced.

        Its term is below ours (it was issued on the losing side of a partition), so only the
        proof is checked here, not the fencing floor; the controller refuses replays (see
        :meth:`Controller.forwarded_block` and :meth:`Controller.forwarded_unblock`).
        """
        if self.ownership is None:
            raise NotCoordinator("this peer has no verified charter to check commands against")
        cmd = signed.statement
        if not isinstance(cmd, BlockCommand | UnblockCommand):
            raise ProtocolError("only block and unblock commands are forwarded")
        now, wall = self.now, self.wall
        role = verify_command(signed, self.ownership, now=wall)
        if role not in (Role.OWNER, Role.ADMIN):
            raise NotCoordinator("only owner and admin commands are forwarded")
        c = CheckedCommand(COMMANDS[type(cmd)], cmd.target, cmd.reason, role.value,
                    cmd.counter // 1000, cmd.term)
        if isinstance(cmd, UnblockCommand):
            self.controller.forwarded_unblock(c, sender, now, wall)
            self.unblocked(cmd.target, signed)
            return
        self.controller.forwarded_block(c, sender, now, wall)
        self.block_proofs[cmd.target] = signed.encode()


__all__ = ["Action", "AnswerEvidence", "CharterRead", "CheckEvidence", "ControlCore", "Event",
           "EvidenceChecked", "EvidenceReceived", "ItemResolved", "Leave", "LiarCaught", "MessageReceived",
           "Follow", "NoteGone", "PagesLost", "Purpose", "PutDone", "PutItem", "ReadCharter",
           "ReadStates", "ReadView", "ResolveItem", "SaveFloor", "SavePeers", "Send", "Start",
           "REREAD_PAUSE", "STATE_READS", "Started", "StatesRead", "TICK", "Tick", "ViewRead",
           "completed", "newest_counted", "rereads"]
