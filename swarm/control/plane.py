"""The asyncio adapter around :class:`swarm.control.machine.Controller` for one running node.

It feeds the controller the member view (DHT announcements), control messages (signed
envelopes over the DHT's direct messages) and the clock, and carries out its actions:
coordinator-state puts in the DHT, heartbeats, handoff offers, kick orders, disconnects
through the node's hooks, and the copy of the state in the data dir.

Operator commands (``swarm kick|block|unblock``) arrive as ``cmd`` messages carrying an
:class:`identity.Signed` command; they are checked against the verified charter and the
roles table (:func:`identity.verify_command`) before the controller sees them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from dht.errors import DHTError, ItemError, LookupFailed
from dht.node import node_id_of
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
from swarm.control.charter import (
    CharterError,
    load_floor,
    register_validators,
    save_floor,
    state_salt,
)
from swarm.control.charter import fetch as fetch_charter
from swarm.control.election import Candidate
from swarm.control.machine import (
    MAX_UNBLOCKED,
    Command,
    Controller,
    Duty,
    EvidenceCheck,
    Timing,
    refuse_unchecked,
)
from swarm.control.membership import (
    ANNOUNCE_TTL,
    MemberRecord,
    announced,
    candidate,
    membership_topic,
    save_seen_peers,
)
from swarm.control.replay import CommandGuard
from swarm.control.state import (
    CoordinatorState,
    Endorsement,
    ForwardedBlock,
    KickOrder,
    LiarReport,
    StateItem,
    load_state,
    resolve,
    save_state,
    seal,
    unseal,
)
from swarm.control.sync import (
    Digest,
    Fetch,
    Mode,
    Sync,
    SyncTiming,
    rival_batch,
    view_digest,
)
from swarm.errors import LinkClosed, NotCoordinator, ProtocolError, StaleTerm
from swarm.runtime.evidence import Evidence, check_evidence
from swarm.runtime.objects import ObjectId
from swarm.runtime.protocol import EvidenceAck, EvidenceMsg

log = logging.getLogger("swarm.control")

TICK = 0.1
MAX_JUDGED = 4096
"""Evidence keys remembered (so replays of one receipt count once)."""
COMMANDS = {KickCommand: "kick", BlockCommand: "block", UnblockCommand: "unblock"}
MAX_PENDING_REPORTS = 64
"""Our own liar reports kept to resend to a new coordinator (oldest dropped)."""
MAX_IGNORED = 256
"""Coordinators named by ignored DHT state items, logged once each (oldest forgotten)."""


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("control-plane task failed", exc_info=task.exception())


class ControlPlane:
    """Runs the control plane for one node until it leaves."""

    def __init__(self, node, swarm_pubkey: bytes, data_dir: Path, *,
                 timing: Timing | None = None, ownership: Ownership | None = None,
                 owner_pin: bytes | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 check_evidence: EvidenceCheck = refuse_unchecked) -> None:
        self.node = node
        self.key: PeerKey = node.key
        self.swarm_pubkey = swarm_pubkey
        self.swarm_id: bytes = node.config.swarm_id
        self.data_dir = Path(data_dir)
        self.clock = clock
        self.wall = wall
        """Unix time, for issue times and record expiry (injected: tests fake it)."""
        self.ownership = ownership
        self.owner_pin = owner_pin
        self.passive = not getattr(node.config, "announce", True)
        """A node that does not announce itself (a client) gets no heartbeats: it follows
        the coordinator through the DHT state items instead."""
        persisted = load_state(self.data_dir, self.swarm_id)
        timing = timing or Timing()
        self.controller = Controller(self.key.peer_id, self.swarm_id, clock(),
                                     timing, persisted, check_evidence=check_evidence)
        self.sync = Sync(clock(), SyncTiming(silence=timing.failover / 2), passive=self.passive)
        """What to read from the DHT and when (heartbeat digests; fallback on silence). Silence
        is judged at half the failover time, so that the view the election runs on is fresh
        (a stale copy of the dead coordinator's announcement would un-suspect it when the
        fresher one arrives)."""
        self.commands = CommandGuard()
        self.charter_floor = load_floor(self.data_dir, swarm_pubkey)
        """The highest charter counter accepted here (persisted: no rollback on restart)."""
        self.addrs: dict[PeerId, tuple[str, int]] = {}
        self.records: dict[PeerId, MemberRecord] = {}
        self._seen: dict[PeerId, tuple[MemberRecord, float]] = {}
        self.left = asyncio.Event()
        self.left_reason = ""
        self.role_changes: list[tuple[float, Duty, int]] = []
        self._block_proofs: dict[PeerId, bytes] = {}
        """Signed owner/admin block commands we applied, forwarded if our state is replaced."""
        self._noted: set[PeerId] = set()
        """Suspects already reported to the DHT node (:meth:`_note_suspects`)."""
        self._unblock_proofs: OrderedDict[PeerId, bytes] = OrderedDict()
        """Signed unblock commands we applied (the newest :data:`MAX_UNBLOCKED`), forwarded
        if the state that replaces ours still blocks those peers with older blocks."""
        self._pending_reports: deque[LiarReport] = deque(maxlen=MAX_PENDING_REPORTS)
        """Our own liar reports, sent again to each new coordinator (a dead one heard
        nothing)."""
        self._reports_told: PeerId | None = None
        self._pages_put: deque[bytes] = deque(maxlen=4096)
        self._saved_peers: list[tuple[str, int]] = []
        self._pages_of: tuple[tuple, list] = ((), [])
        self._rivals_after: PeerId | None = None
        """The last member the previous rival check read (the next batch starts after it)."""
        self._tasks: set[asyncio.Task] = set()
        self._ignored: OrderedDict[PeerId, None] = OrderedDict()
        """Coordinators named by DHT state items that did not count, logged once each."""
        self._loop_task: asyncio.Task | None = None
        self._view_task: asyncio.Task | None = None
        register_validators(node.dht)
        node.accept_peer = self.accept_peer
        node.on_lying_peer(self._on_liar)
        node.find_coordinator = self._evidence_coordinator
        node.judge_evidence = self.judge_evidence
        node.on_control(EvidenceMsg, self._on_evidence)
        self._judged: OrderedDict[bytes, None] = OrderedDict()
        """Evidence already judged (a receipt counts once, however often it arrives)."""
        node.dht.on_message(self._on_message)

    # -- public --------------------------------------------------------------------------

    @property
    def role(self) -> Duty:
        return self.controller.role

    def accept_peer(self, peer: PeerId) -> bool:
        """The node's hook: refuse blocked peers' links and keep shards off them."""
        return peer not in self.controller.blocked()

    def live_peers(self) -> list[tuple[str, int]]:
        """DHT addresses of live, unblocked members (for a fresh join URI)."""
        blocked = self.controller.blocked()
        return [self.addrs[p] for p in self.controller.view if p in self.addrs
                and p not in blocked]

    async def start(self) -> None:
        if self.controller.state is not None and \
                self.key.peer_id in self.controller.state.blocked_ids:
            raise NotCoordinator("this peer is blocked from the swarm")
        await self._refresh_view()
        await self._read_states()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self._loop_task.add_done_callback(_log_crash)

    async def leave(self, timeout: float = 10.0) -> str:
        """Leave gracefully (a coordinator hands off first); returns why we left."""
        if not self.left.is_set():
            if self.role is Duty.COORDINATOR:
                await self._fresh_view()  # so that a member that just joined can take over
            self.controller.leave(self.clock())
            await self._do(self.controller.actions())
            try:
                await asyncio.wait_for(self.left.wait(), timeout)
            except TimeoutError:
                log.warning("handoff did not finish in %.0f s; leaving anyway", timeout)
        await self.close()
        return self.left_reason

    async def close(self) -> None:
        for task in [self._loop_task, self._view_task, *self._tasks]:
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*(t for t in [self._loop_task, self._view_task, *self._tasks]
                               if t is not None and t is not asyncio.current_task()),
                             return_exceptions=True)

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self.left.is_set():
            now = self.clock()
            for fetch in self.sync.due(now):
                self._spawn(self._fetch(fetch))
            self.controller.tick(now)
            self._note_suspects()  # before a claim's lookups start
            await self._do(self.controller.actions())
            await asyncio.sleep(TICK)

    def _note_suspects(self) -> None:
        """Members the controller has just come to take for dead are not asked in DHT
        lookups either (a failover claim would otherwise wait on the dead coordinator's
        DHT node in each of its lookups)."""
        suspects = self.controller.suspects
        for peer in suspects.keys() - self._noted:
            rec = self.records.get(peer)
            if rec is not None and rec.dht is not None:
                self.node.dht.note_gone(rec.dht, node_id_of(peer.raw))
        self._noted = set(suspects)

    async def _fetch(self, fetch: Fetch) -> None:
        """One read the sync core asked for; reported back to it however it ends."""
        ok = False
        try:
            if fetch is Fetch.VIEW:
                ok = await self._fresh_view()
            elif fetch is Fetch.CHARTER:
                ok = await self._refresh_charter()
            elif fetch is Fetch.STATE:
                ok = await self._check_state()
            else:
                ok = await self._check_rivals()
        finally:
            self.sync.done(fetch, self.clock(), ok)

    def _digest(self) -> Digest:
        """What our heartbeats say we hold (members fetch what differs from theirs)."""
        view = self.controller.view
        return Digest(view_digest(view), len(view), self.charter_floor)

    async def _refresh_view(self) -> bool:
        try:
            anns = await self.node.dht.get_peers(membership_topic(self.swarm_id))
        except DHTError as exc:
            log.info("member lookup failed: %s", exc)
            return False
        blocked = self.controller.blocked()
        for ann in anns:
            try:
                rec = MemberRecord.decode(ann.record, ann.peer_id)
            except ProtocolError as exc:
                log.info("ignoring member record of %s: %s", ann.peer_id.short(), exc)
                continue
            old = self._seen.get(rec.peer_id)
            if old is None or ann.expires_at >= old[1]:
                self._seen[rec.peer_id] = (rec, ann.expires_at)
        # A lookup that missed a slow node lists fewer members; an announcement stays valid
        # until it expires, so the view keeps what it saw (silence is the controller's to judge).
        wall, now = self.wall(), self.clock()
        ttl = getattr(self.node.config, "announce_ttl", ANNOUNCE_TTL)
        view: list[Candidate] = []
        for peer, (rec, expires) in list(self._seen.items()):
            if expires < wall:
                del self._seen[peer]
                self.records.pop(peer, None)
                continue
            if peer in blocked:
                continue  # a blocked peer's announcement is refused here
            self.records[peer] = rec
            if rec.dht is not None:
                self.addrs[peer] = rec.dht
            view.append(candidate(rec, announced(expires, wall, now, ttl)))
        me = self.key.peer_id
        if me not in {c.peer_id for c in view} and self.node.record is not None:
            view.append(candidate(self.node.record, float("inf")))
        if len(view) != len(self.controller.view):
            log.info("%d members in view", len(view))
        seen = [self.addrs[c.peer_id] for c in sorted(view, key=lambda c: -c.freshness)
                if c.peer_id in self.addrs and c.peer_id != me]
        if sorted(seen) != sorted(self._saved_peers):
            self._saved_peers = seen
            try:
                save_seen_peers(self.data_dir, self.swarm_id, seen)
            except OSError as exc:
                log.info("cannot keep the peers seen in the data dir: %s", exc)
        self.controller.members(view, self.clock())
        self.sync.have(view=view_digest(self.controller.view))
        await self._do(self.controller.actions())
        return True

    async def _check_state(self) -> bool:
        """Read the state items: all members' while we follow nobody (a newcomer counts the
        terms before it follows; a passive client follows the DHT), else our coordinator's."""
        if self.passive or self.controller.state is None:
            await self._read_states()
        else:
            await self._catch_up()
        self._hello()
        return True

    def _hello(self) -> None:
        """No heartbeats reach us (a newcomer, or dropped from the view) while the DHT names
        a coordinator: tell it, so that its next topic read comes now rather than at its
        idle period. Sent at the silent reads' backoff (1 s doubling to 8 s)."""
        c, now = self.controller, self.clock()
        coord = c.state.coordinator if c.state is not None else None
        if self.passive or self.node.record is None or coord in (None, self.key.peer_id) \
                or self.sync.mode(now) is not Mode.SILENT:
            return
        self._spawn(self._send(coord, seal(self.key, self.swarm_id, "hello", b"")))

    async def _check_rivals(self) -> bool:
        """A coordinator's look for a rival's state item (after a partition healed), in
        round-robin batches of the members."""
        if self.role is Duty.COORDINATOR:
            batch = rival_batch(self.records, self._rivals_after, self.sync.timing.rival_batch)
            self._rivals_after = batch[-1] if batch else None
            for state in await self._counted_states(batch):
                self.controller.rival(state, self.clock())
            await self._do(self.controller.actions())
        return True

    async def _page(self, target: bytes) -> bytes | None:
        value = await self.node.dht.get_immutable(target)
        return value if isinstance(value, bytes) else None

    async def _state_of(self, peer: PeerId) -> CoordinatorState | None:
        """``peer``'s coordinator-state item, blocklist pages resolved; None if unusable."""
        try:
            raw = await self.node.dht.get_mutable(peer.raw, state_salt(self.swarm_id))
            if raw is None:
                return None
            return await resolve(StateItem.decode(raw.value), self._page,
                                 self.controller.state)
        except (DHTError, ProtocolError, ValueError) as exc:
            log.debug("state item of %s unusable: %s", peer.short(), exc)
            return None

    async def _catch_up(self) -> None:
        """Heartbeats are datagrams: read our coordinator's DHT item for anything missed
        (a block of this very peer is sent to it only once)."""
        st = self.controller.state
        if st is None or st.coordinator == self.key.peer_id or self.role is Duty.STOPPED:
            return
        newer = await self._state_of(st.coordinator)
        if newer is not None and newer.coordinator == st.coordinator and newer.seq > st.seq:
            try:
                self.controller.heartbeat(newer, newer.coordinator, self.clock(), heard=False)
            except (StaleTerm, NotCoordinator, ProtocolError) as exc:
                log.info("not adopting %s's newer DHT state: %s", st.coordinator.short(), exc)
            await self._do(self.controller.actions())

    async def _refresh_charter(self) -> bool:
        """Pick up ownership changes (new admins, policy, owner) from the DHT; never an
        older charter than one already accepted (the floor survives restarts)."""
        try:
            rec = await fetch_charter(self.node.dht, self.swarm_pubkey, self.owner_pin,
                                      now=self.wall(), floor=self.charter_floor)
        except (CharterError, DHTError) as exc:
            log.info("charter refresh failed: %s", exc)
            return False
        self.accept_charter(rec.ownership)
        await self._do(self.controller.actions())
        return True

    def accept_charter(self, ownership: Ownership) -> None:
        """Take a verified charter (from :func:`swarm.control.charter.fetch` with our floor)
        and raise the floor to its counter."""
        if ownership.counter < self.charter_floor:
            raise CharterError(f"charter counter {ownership.counter} is below "
                               f"{self.charter_floor}: rollback refused")
        self.ownership = ownership
        if ownership.counter > self.charter_floor:
            self.charter_floor = ownership.counter
            save_floor(self.data_dir, self.swarm_pubkey, ownership.counter)
        self.sync.have(charter=self.charter_floor)
        for cred, n in ownership.sign_counts.items():
            if n > self.commands.sign_counts.get(cred, 0):
                self.commands.sign_counts[cred] = n
        self.controller.charter_changed(
            [p for p, g in ownership.admins.items() if g.expires is None],
            {"require_hardware": ownership.policy.require_hardware}, self.clock())

    async def _dht_states(self, peers: Iterable[PeerId] | None = None
                          ) -> list[CoordinatorState]:
        """The members' (or ``peers``') coordinator-state items in the DHT (validated on the
        way)."""
        found = await asyncio.gather(*(self._state_of(p) for p in
                                       (self.records if peers is None else peers)))
        return [s for s in found if s is not None and s.swarm == self.swarm_id]

    async def _read_states(self) -> None:
        """Learn the current term and coordinator from the state items in the DHT that
        count (entitled signers, terms within the bound: the controller's rules)."""
        counted = await self._counted_states()
        for state in sorted(counted, key=lambda s: (s.term, s.seq), reverse=True)[:1]:
            cur = self.controller.state
            if cur is None or state.term > cur.term:
                try:
                    self.controller.heartbeat(state, state.coordinator, self.clock(),
                                              heard=False)
                except (StaleTerm, NotCoordinator, ProtocolError) as exc:
                    log.info("not following the DHT's state of term %d: %s", state.term, exc)
        await self._do(self.controller.actions())

    async def _counted_states(self, peers: Iterable[PeerId] | None = None
                              ) -> list[CoordinatorState]:
        """The members' (or ``peers``') state items that count (the controller's rules).
        One that does not (its signer may not coordinate, its term is out of reach, or it is
        blocked) is logged, once per coordinator it names: operators see the attempt (a
        member's term inflation), and tests wait for it."""
        found = await self._dht_states(peers)
        counted = self.controller.dht_states(found)
        kept = {id(s) for s in counted}
        for s in found:
            if id(s) in kept or s.coordinator in self._ignored:
                continue
            self._ignored[s.coordinator] = None
            if len(self._ignored) > MAX_IGNORED:
                self._ignored.popitem(last=False)
            log.info("ignoring the DHT's state of term %d naming %s: it does not count (a "
                     "signer that may not coordinate, a term out of reach, or a blocked peer)",
                     s.term, s.coordinator.short())
        return counted

    # -- actions ---------------------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_crash)

    async def _do(self, actions: list[control.Action]) -> None:
        for act in actions:
            if isinstance(act, control.PutState):
                self._spawn(self._put_state(act))
            elif isinstance(act, control.SendHeartbeat):
                msg = seal(self.key, self.swarm_id, "hb", act.state.encode_item(),
                           act.endorsement, digest=self._digest().encode())
                self._spawn(self._send_state(act.state, act.to, msg))
            elif isinstance(act, control.SendHandoff):
                endorse = seal(self.key, self.swarm_id, "endorse",
                               Endorsement(act.state.term, act.to).encode())
                msg = seal(self.key, self.swarm_id, "handoff", act.state.encode_item(),
                           endorse)
                self._spawn(self._send_state(act.state, (act.to,), msg))
            elif isinstance(act, control.SendKick):
                # The kick carries our heartbeat, so a peer that has not heard us yet (a
                # newcomer) learns who we are before it judges the order.
                hb = self.controller.state
                carried = seal(self.key, self.swarm_id, "hb", hb.encode_item(),
                               self.controller.endorsement) if hb else b""
                msg = seal(self.key, self.swarm_id, "kick", act.order.encode(), carried)
                for peer in act.to:
                    self._spawn(self._send(peer, msg))
            elif isinstance(act, control.ForwardBlocks):
                for entry in act.entries:
                    proof = self._block_proofs.get(entry.peer)
                    if proof is not None:  # an owner's or admin's signed command
                        msg = seal(self.key, self.swarm_id, "fwd", proof)
                    elif entry.by == "coordinator":  # our own (a repeat liar): our word
                        msg = seal(self.key, self.swarm_id, "fwdauto",
                                   ForwardedBlock(entry, act.term).encode())
                    else:
                        continue
                    self._spawn(self._send(act.to, msg))
            elif isinstance(act, control.ForwardUnblocks):
                for peer in act.peers:
                    if (proof := self._unblock_proofs.get(peer)) is not None:
                        self._spawn(self._send(act.to, seal(self.key, self.swarm_id, "fwd",
                                                            proof)))
            elif isinstance(act, control.RelayReport):
                self._spawn(self._send(act.to, seal(self.key, self.swarm_id, "liar",
                                                    act.report.encode())))
            elif isinstance(act, control.Disconnect):
                self._spawn(self._disconnect(act))
            elif isinstance(act, control.Persist):
                save_state(self.data_dir, act.state)
            elif isinstance(act, control.RoleChanged):
                self.sync.role(act.new is Duty.COORDINATOR, self.clock())
                self.role_changes.append((self.wall(), act.new, act.term))
                log.info("%s: %s -> %s at term %d", self.key.peer_id.short(),
                        act.old.value, act.new.value, act.term)
            elif isinstance(act, control.Left):
                self.left_reason = act.reason
                self.left.set()
        if self._pending_reports and self._report_to() not in (None, self._reports_told):
            self._report_liars(list(self._pending_reports))

    async def _put_state(self, act: control.PutState) -> None:
        dht, began = self.node.dht, self.clock()
        salt = state_salt(self.swarm_id)
        ok, why = True, ""
        st = self.controller.state
        if act.claim and st is not None and act.state.prev == st.digest():
            # A failover claim (a handoff carries its own, newer state): catch up first.
            await self._catch_up()
            if self.role is not Duty.CANDIDATE:
                return  # what we missed settled it (a newer state, or our own block)
        if act.claim:
            # The CAS across the swarm: nobody entitled may hold this term (or a later one).
            top = self.controller.claim_conflict(act.state, await self._dht_states())
            if top is not None:
                self.controller.claim_result(False, self.clock(),
                                             f"{top.coordinator.short()} holds term {top.term}",
                                             beaten_by=top)
                await self._do(self.controller.actions())
                return
        try:
            # The blocklist first (the item pins its pages), stored again with every change:
            # a page put during a partition reached only that side's nodes.
            await self._put_pages(act.state, again=True)
            await dht.put_mutable(self.key, act.state.encode_item(), salt=salt,
                                  seq=act.state.seq)
        except ItemError as exc:
            ok, why = False, str(exc)
            if act.claim and exc.code == 302:  # our own item from an older chain is ahead
                item = await dht.get_mutable(self.key.public_bytes, salt)
                if item is not None:
                    self.controller.note_seq(item.seq)
                    why += f" (stored seq {item.seq}; the next claim numbers above it)"
        except (LookupFailed, DHTError) as exc:
            ok, why = False, str(exc)
        if not ok:
            log.warning("coordinator state put (term %d) failed: %s", act.state.term, why)
        if act.claim:
            log.info("claim of term %d %s in %.2f s", act.state.term,
                     "stored" if ok else "failed", self.clock() - began)
            self.controller.claim_result(ok, self.clock(), why)
            await self._do(self.controller.actions())

    async def _put_pages(self, state: CoordinatorState, again: bool = False) -> None:
        """Store ``state``'s blocklist pages in the DHT before anything that names them is
        put or sent (once per page for heartbeats; ``again`` with every state put)."""
        if self._pages_of[0] is not state.blocked:
            self._pages_of = (state.blocked, state.pages())
        for page in self._pages_of[1]:
            if again or page.target not in self._pages_put:
                await self.node.dht.put_immutable(page.encode())
                self._pages_put.append(page.target)

    async def _send_state(self, state: CoordinatorState, to: tuple[PeerId, ...],
                          msg: bytes) -> None:
        """Send a message carrying ``state``'s item once its pages can be fetched."""
        try:
            await self._put_pages(state)
        except (ItemError, LookupFailed, DHTError) as exc:
            log.info("blocklist pages not stored (%s); sending anyway", exc)
        await asyncio.gather(*(self._send(peer, msg) for peer in to))

    async def _fresh_view(self) -> bool:
        """Refresh the member view now (sharing a refresh already under way); False if the
        lookup failed or took over 10 s."""
        if self._view_task is None or self._view_task.done():
            self._view_task = asyncio.get_running_loop().create_task(self._refresh_view())
        try:
            return await asyncio.wait_for(asyncio.shield(self._view_task), 10.0)
        except TimeoutError:
            return False

    async def _send(self, peer: PeerId, msg: bytes) -> None:
        addr = self.addrs.get(peer)
        if addr is None:
            await self._fresh_view()  # a member that joined since the last refresh
            addr = self.addrs.get(peer)
        if addr is None:
            log.info("no DHT address for %s; message dropped", peer.short())
            return
        for attempt in range(2):  # one retry: a lost datagram must not lose a kick
            try:
                await self.node.dht.send_message(addr, msg)
                return
            except (DHTError, OSError) as exc:
                log.debug("control message to %s failed (try %d): %s", peer.short(),
                          attempt + 1, exc)

    async def _disconnect(self, act: control.Disconnect) -> None:
        link = self.node.link_to(act.peer)
        log.warning("%s %s: %s", "blocking" if act.blocked else "kicking", act.peer.short(),
                    act.reason)
        if link is not None:
            await link.close(act.reason)

    # -- evidence ------------------------------------------------------------------------

    async def _evidence_coordinator(self) -> PeerId | None:
        coord = self.controller.coordinator
        if coord is None and self.controller.state is not None:
            coord = self.controller.state.coordinator  # a client follows the DHT state
        return coord

    async def _on_evidence(self, link, msg: EvidenceMsg) -> None:
        """Evidence from a requester; its arrays came before it, into our object store."""
        try:
            evidence = Evidence.decode(msg.evidence)
        except ValueError as exc:
            log.warning("bad evidence from %s: %s", link.remote.short(), exc)
            return
        # Answer first (judging can take a while): a peer that does not coordinate says so,
        # and the sender tries whoever does next, instead of losing the evidence here.
        taken = self.controller.role is Duty.COORDINATOR
        try:
            await link.send(EvidenceAck(evidence.key, taken))
        except (LinkClosed, OSError) as exc:
            log.info("evidence from %s not answered: %s", link.remote.short(), exc)
        if not taken:
            log.info("evidence from %s refused: not coordinating (%s)", link.remote.short(),
                     self.controller.role.value)
            return
        store = self.node.host.store if self.node.host is not None else None
        await self.judge_evidence(
            evidence, lambda oid: store.get(ObjectId(oid)) if store is not None else None)

    async def judge_evidence(self, evidence: Evidence, fetch_array) -> bool:
        """Block on proof alone: re-check the signed result ourselves (issue 13). False when
        this peer does not coordinate (the evidence must go elsewhere)."""
        c = self.controller
        if c.role is not Duty.COORDINATOR:
            return False
        if evidence.key in self._judged:
            return True
        self._judged[evidence.key] = None
        while len(self._judged) > MAX_JUDGED:
            self._judged.popitem(last=False)
        verdict = await asyncio.to_thread(check_evidence, evidence, fetch_array)
        worker = evidence.receipt.worker
        if not verdict.proven:
            log.info("evidence against %s not proven: %s", worker.short(), verdict.why)
            return True
        log.warning("proof that %s lied: %s", worker.short(), verdict.why)
        c.proven_liar(worker, evidence.key, self.clock(), int(self.wall()))
        await self._do(c.actions())
        return True

    # -- incoming --------------------------------------------------------------------------

    def _on_liar(self, peer: PeerId, reason: str, evidence: bytes = b"") -> None:
        """The node caught ``peer`` returning a wrong result (``evidence``: the runtime's
        proof, checked by the coordinator before it acts)."""
        report = LiarReport(peer, reason[:100], evidence)
        self._pending_reports.append(report)
        self._report_liars([report])

    def _report_to(self) -> PeerId | None:
        coord = self.controller.coordinator
        if coord is None and self.passive and self.controller.state is not None:
            coord = self.controller.state.coordinator  # no heartbeats here to judge by
        return coord

    def _report_liars(self, reports: list[LiarReport]) -> None:
        """Tell the coordinator (sent again to a new one: a dead one heard nothing)."""
        coord = self._report_to()
        self._reports_told = coord
        for report in reports:
            if coord == self.key.peer_id:
                self.controller.liar_report(report, coord, self.clock(), int(self.wall()))
            elif coord is not None:
                self._spawn(self._send(coord, seal(self.key, self.swarm_id, "liar",
                                                   report.encode())))
        self._spawn(self._do(self.controller.actions()))

    async def _on_message(self, sender: PeerId, addr: tuple[str, int], payload: bytes) -> None:
        try:
            env = unseal(self.swarm_id, payload)
        except ProtocolError as exc:
            log.debug("ignoring message from %s: %s", sender.short(), exc)
            return
        now = self.clock()
        c = self.controller
        try:
            if env.kind == "kick" and env.endorsement and \
                    unseal(self.swarm_id, env.endorsement).kind != "hb":
                raise ProtocolError("a kick carries only a heartbeat")
            if env.kind == "hb":
                item = StateItem.decode(env.body)
                if why := c.implausible(item.head):
                    if env.sender not in c.view:  # joined since our last lookup, maybe
                        self._spawn(self._fresh_view())
                    raise NotCoordinator(f"heartbeat at term {item.head.term}: {why}")
                digest = Digest.decode(env.digest) if env.digest else None
                state = await resolve(item, self._page, c.state)
                c.heartbeat(state, env.sender, now, self._endorser(env.endorsement, state))
                self.addrs.setdefault(env.sender, addr)  # only a coordinator we follow
                if c.coordinator == env.sender:
                    self.sync.heard(digest, self.clock())
            elif env.kind == "handoff":
                item = StateItem.decode(env.body)
                if why := c.implausible(replace(item.head, coordinator=env.sender)):
                    raise NotCoordinator(f"handoff offer refused: {why}")
                state = await resolve(item, self._page, c.state)
                c.handoff_offer(state, env.sender, now, env.endorsement)
            elif env.kind == "kick":
                if env.endorsement:
                    await self._on_message(sender, addr, env.endorsement)
                c.kick_order(KickOrder.decode(env.body), env.sender, now, self.wall())
            elif env.kind == "hello":  # a member we do not list yet: read the topic soon
                if c.role is Duty.COORDINATOR and env.sender not in c.view:
                    self.sync.nudged(now)
            elif env.kind == "liar":
                c.liar_report(LiarReport.decode(env.body), env.sender, now, int(self.wall()))
            elif env.kind == "cmd":
                self._command(Signed.decode(env.body), now)
            elif env.kind == "fwd":
                self._forwarded(Signed.decode(env.body), env.sender, now)
            elif env.kind == "fwdauto":
                fwd = ForwardedBlock.decode(env.body)
                c.forwarded_auto_block(fwd.entry, fwd.term, env.sender, now, self.wall())
        except (StaleTerm, NotCoordinator) as exc:
            log.info("refused %s from %s: %s", env.kind, env.sender.short(), exc)
        except (ProtocolError, IdentityError, ValueError, KeyError, TypeError) as exc:
            log.warning("bad %s message from %s: %s", env.kind, env.sender.short(), exc)
        await self._do(c.actions())

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

    def _command(self, signed: Signed, now: float) -> None:
        if self.ownership is None:
            raise NotCoordinator("this peer has no verified charter to check commands against")
        c = self.controller
        wall = self.wall()
        role = verify_command(signed, self.ownership, now=wall,
                              coordinator=c.coordinator, min_term=c.term)
        cmd = signed.statement
        self._admit(signed, wall)
        kind = COMMANDS[type(cmd)]
        c.command(Command(kind, cmd.target, cmd.reason, role.value, int(wall), cmd.term), now)
        if kind == "block":
            self._block_proofs[cmd.target] = signed.encode()
            self._unblock_proofs.pop(cmd.target, None)
        elif kind == "unblock":
            self._unblocked(cmd.target, signed)

    def _unblocked(self, peer: PeerId, signed: Signed) -> None:
        self._block_proofs.pop(peer, None)
        self._unblock_proofs.pop(peer, None)
        self._unblock_proofs[peer] = signed.encode()
        while len(self._unblock_proofs) > MAX_UNBLOCKED:
            self._unblock_proofs.popitem(last=False)

    def _admit(self, signed: Signed, wall: float) -> None:
        """The replay guard: once, fresh, and an owner key's sign counter moving forward."""
        proof = signed.proofs[0]
        if isinstance(proof, OwnerProof):
            self.commands.admit(proof.credential_id, signed.statement.counter, wall,
                                AuthenticatorData(proof.authenticator_data).counter)
        else:
            self.commands.admit(proof.signer.raw, signed.statement.counter, wall)

    def _forwarded(self, signed: Signed, sender: PeerId, now: float) -> None:
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
        wall = self.wall()
        role = verify_command(signed, self.ownership, now=wall)
        if role not in (Role.OWNER, Role.ADMIN):
            raise NotCoordinator("only owner and admin commands are forwarded")
        c = Command(COMMANDS[type(cmd)], cmd.target, cmd.reason, role.value,
                    cmd.counter // 1000, cmd.term)
        if isinstance(cmd, UnblockCommand):
            self.controller.forwarded_unblock(c, sender, now, wall)
            self._unblocked(cmd.target, signed)
            return
        self.controller.forwarded_block(c, sender, now, wall)
        self._block_proofs[cmd.target] = signed.encode()
