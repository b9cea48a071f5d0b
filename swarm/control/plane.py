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
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import msgpack

from dht.errors import DHTError, ItemError, LookupFailed
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
from identity.roles import Role as AuthRole
from swarm.control import machine as control
from swarm.control.charter import CharterError, register_validators, state_salt
from swarm.control.charter import fetch as fetch_charter
from swarm.control.election import Candidate, Health
from swarm.control.machine import Command, Controller, Role, Timing
from swarm.control.membership import MemberRecord, membership_topic
from swarm.control.state import (
    BlockEntry,
    CoordinatorState,
    Endorsement,
    KickOrder,
    load_state,
    save_state,
    seal,
    unseal,
)
from swarm.errors import NotCoordinator, ProtocolError, StaleTerm
from swarm.runtime.evidence import Evidence, check_evidence
from swarm.runtime.objects import ObjectId
from swarm.runtime.protocol import EvidenceMsg

log = logging.getLogger("swarm.control")

TICK = 0.1
NO_COORDINATE = "no-coordinate"  # a member role: serves tasks, never coordinates
VIEW_INTERVAL = 1.0
MAX_JUDGED = 4096
"""Evidence keys remembered (so replays of one receipt count once)."""
CHARTER_REFRESH = 5.0
COMMAND_AGE = 120_000  # ms: older (or future) commands are refused as replays
COMMANDS = {KickCommand: "kick", BlockCommand: "block", UnblockCommand: "unblock"}


def candidate(record: MemberRecord, freshness: float) -> Candidate:
    """A member record as the election sees it."""
    h = record.health
    return Candidate(
        record.peer_id, record.tflops,
        Health(load=h.load or 0.0, battery=h.battery,
               plugged=True if h.plugged is None else h.plugged, thermal=h.thermal),
        eligible=("worker" in record.roles or "coordinator" in record.roles)
        and NO_COORDINATE not in record.roles,
        freshness=freshness)


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("control-plane task failed", exc_info=task.exception())


class ControlPlane:
    """Runs the control plane for one node until it leaves."""

    def __init__(self, node, swarm_pubkey: bytes, data_dir: Path, *,
                 timing: Timing | None = None, ownership: Ownership | None = None,
                 owner_pin: bytes | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.key: PeerKey = node.key
        self.swarm_pubkey = swarm_pubkey
        self.swarm_id: bytes = node.config.swarm_id
        self.data_dir = Path(data_dir)
        self.clock = clock
        self.ownership = ownership
        self.owner_pin = owner_pin
        self.passive = not getattr(node.config, "announce", True)
        """A node that does not announce itself (a client) gets no heartbeats: it follows
        the coordinator through the DHT state items instead."""
        persisted = load_state(self.data_dir, self.swarm_id)
        self.controller = Controller(self.key.peer_id, self.swarm_id, clock(),
                                     timing or Timing(), persisted)
        self.addrs: dict[PeerId, tuple[str, int]] = {}
        self.records: dict[PeerId, MemberRecord] = {}
        self._seen: dict[PeerId, tuple[MemberRecord, float]] = {}
        self.left = asyncio.Event()
        self.left_reason = ""
        self.role_changes: list[tuple[float, Role, int]] = []
        self._seen_commands: set[tuple[bytes, int]] = set()
        self._block_proofs: dict[PeerId, bytes] = {}
        """Signed owner/admin block commands we applied, forwarded if our state is replaced."""
        self._liars: list[tuple[PeerId, str, float]] = []
        self._liars_told: PeerId | None = None
        self._tasks: set[asyncio.Task] = set()
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
    def role(self) -> Role:
        return self.controller.role

    def accept_peer(self, peer: PeerId) -> bool:
        """The node's hook: refuse blocked peers' links and keep shards off them."""
        return peer not in self.controller.blocked()

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
            if self.role is Role.COORDINATOR:
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
        next_view = self.clock() + VIEW_INTERVAL
        next_charter = next_check = self.clock()
        check: asyncio.Task | None = None
        while not self.left.is_set():
            now = self.clock()
            if now >= next_view and (self._view_task is None or self._view_task.done()):
                self._view_task = asyncio.get_running_loop().create_task(self._refresh_view())
                next_view = now + VIEW_INTERVAL
            if now >= next_charter:
                self._spawn(self._refresh_charter())
                next_charter = now + CHARTER_REFRESH
            if now >= next_check and (check is None or check.done()):
                check = asyncio.get_running_loop().create_task(self._check_dht())
                check.add_done_callback(_log_crash)
                self._tasks.add(check)
                check.add_done_callback(self._tasks.discard)
                next_check = now + VIEW_INTERVAL
            self.controller.tick(now)
            await self._do(self.controller.actions())
            await asyncio.sleep(TICK)

    async def _refresh_view(self) -> None:
        try:
            anns = await self.node.dht.get_peers(membership_topic(self.swarm_id))
        except DHTError as exc:
            log.info("member lookup failed: %s", exc)
            return
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
        wall = time.time()
        view: list[Candidate] = []
        for peer, (rec, expires) in list(self._seen.items()):
            if expires < wall:
                del self._seen[peer]
                continue
            if peer in blocked:
                continue  # a blocked peer's announcement is refused here
            self.records[peer] = rec
            if rec.dht is not None:
                self.addrs[peer] = rec.dht
            view.append(candidate(rec, expires))
        me = self.key.peer_id
        if me not in {c.peer_id for c in view} and self.node.record is not None:
            view.append(candidate(self.node.record, float("inf")))
        if len(view) != len(self.controller.view):
            log.info("%d members in view", len(view))
        self.controller.members(view, self.clock())
        await self._do(self.controller.actions())

    async def _check_dht(self) -> None:
        """Slower checks against the DHT, apart from the view so they never delay it."""
        if self.passive:
            await self._read_states()
            return
        await self._catch_up()
        if self.role is Role.COORDINATOR:
            for state in await self._dht_states():
                self.controller.rival(state, self.clock())
            await self._do(self.controller.actions())

    async def _catch_up(self) -> None:
        """Heartbeats are datagrams: read our coordinator's DHT item for anything missed
        (a block of this very peer is sent to it only once)."""
        st = self.controller.state
        if st is None or st.coordinator == self.key.peer_id or self.role is Role.STOPPED:
            return
        try:
            item = await self.node.dht.get_mutable(st.coordinator.raw,
                                                   state_salt(self.swarm_id))
            newer = CoordinatorState.decode(item.value) if item is not None else None
        except (DHTError, ProtocolError):
            return
        if newer is not None and newer.coordinator == st.coordinator and newer.seq > st.seq:
            try:
                self.controller.heartbeat(newer, newer.coordinator, self.clock())
            except (StaleTerm, NotCoordinator, ProtocolError) as exc:
                log.info("not adopting %s's newer DHT state: %s", st.coordinator.short(), exc)
            await self._do(self.controller.actions())

    async def _refresh_charter(self) -> None:
        """Pick up ownership changes (new admins, policy, owner) from the DHT."""
        try:
            rec = await fetch_charter(self.node.dht, self.swarm_pubkey, self.owner_pin)
        except (CharterError, DHTError) as exc:
            log.info("charter refresh failed: %s", exc)
            return
        self.ownership = rec.ownership
        self.controller.charter_changed(
            [p for p, g in rec.ownership.admins.items() if g.expires is None],
            {"require_hardware": rec.ownership.policy.require_hardware}, self.clock())
        await self._do(self.controller.actions())

    async def _dht_states(self) -> list[CoordinatorState]:
        """The members' coordinator-state items in the DHT (validated on the way)."""
        async def one(peer: PeerId) -> CoordinatorState | None:
            try:
                item = await self.node.dht.get_mutable(peer.raw, state_salt(self.swarm_id))
                return CoordinatorState.decode(item.value) if item is not None else None
            except (DHTError, ProtocolError):
                return None

        found = await asyncio.gather(*(one(p) for p in self.records))
        return [s for s in found if s is not None and s.swarm == self.swarm_id]

    async def _read_states(self) -> None:
        """Learn the current term and coordinator from members' state items in the DHT."""
        states = await self._dht_states()
        for s in states:
            self.controller.note_term(s.term)
        for state in sorted(states, key=lambda s: (s.term, s.seq), reverse=True)[:1]:
            cur = self.controller.state
            if cur is None or state.term > cur.term:
                try:
                    self.controller.heartbeat(state, state.coordinator, self.clock())
                except (StaleTerm, NotCoordinator, ProtocolError) as exc:
                    log.info("not following the DHT's state of term %d: %s", state.term, exc)
        await self._do(self.controller.actions())

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
                msg = seal(self.key, self.swarm_id, "hb", act.state.encode(), act.endorsement)
                for peer in act.to:
                    self._spawn(self._send(peer, msg))
            elif isinstance(act, control.SendHandoff):
                endorse = seal(self.key, self.swarm_id, "endorse",
                               Endorsement(act.state.term, act.to).encode())
                msg = seal(self.key, self.swarm_id, "handoff", act.state.encode(), endorse)
                self._spawn(self._send(act.to, msg))
            elif isinstance(act, control.SendKick):
                # The kick carries our heartbeat, so a peer that has not heard us yet (a
                # newcomer) learns who we are before it judges the order.
                hb = self.controller.state
                carried = seal(self.key, self.swarm_id, "hb", hb.encode(),
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
                        msg = seal(self.key, self.swarm_id, "fwdauto", msgpack.packb(
                            {"p": entry.peer.raw, "r": entry.reason[:100], "a": entry.at},
                            use_bin_type=True))
                    else:
                        continue
                    self._spawn(self._send(act.to, msg))
            elif isinstance(act, control.Disconnect):
                self._spawn(self._disconnect(act))
            elif isinstance(act, control.Persist):
                save_state(self.data_dir, act.state)
            elif isinstance(act, control.RoleChanged):
                self.role_changes.append((time.time(), act.new, act.term))
                level = logging.WARNING if act.new is Role.COORDINATOR else logging.INFO
                log.log(level, "%s: %s -> %s at term %d", self.key.peer_id.short(),
                        act.old.value, act.new.value, act.term)
            elif isinstance(act, control.Left):
                self.left_reason = act.reason
                self.left.set()
        st = self.controller.state
        now_coord = self.controller.coordinator or (st.coordinator if self.passive and st
                                                    else None)
        if self._liars and now_coord not in (None, self._liars_told):
            self._report_liars(self._liars)

    async def _put_state(self, act: control.PutState) -> None:
        dht = self.node.dht
        salt = state_salt(self.swarm_id)
        ok, why = True, ""
        st = self.controller.state
        if act.claim and st is not None and act.state.prev == st.digest():
            # A failover claim (a handoff carries its own, newer state): catch up first.
            await self._catch_up()
            if self.role is not Role.CANDIDATE:
                return  # what we missed settled it (a newer state, or our own block)
        if act.claim:
            # The CAS across the swarm: nobody may hold this term (or a later one) already.
            higher = [s for s in await self._dht_states()
                      if s.term >= act.state.term and s.coordinator != self.key.peer_id]
            if higher:
                top = max(higher, key=lambda s: s.term)
                self.controller.note_term(top.term)
                self.controller.claim_result(False, self.clock(),
                                             f"{top.coordinator.short()} holds term {top.term}")
                await self._do(self.controller.actions())
                return
        try:
            await dht.put_mutable(self.key, act.state.encode_compact(), salt=salt,
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
            self.controller.claim_result(ok, self.clock(), why)
            await self._do(self.controller.actions())

    async def _fresh_view(self) -> None:
        """Refresh the member view now (sharing a refresh already under way)."""
        if self._view_task is None or self._view_task.done():
            self._view_task = asyncio.get_running_loop().create_task(self._refresh_view())
        try:
            await asyncio.wait_for(asyncio.shield(self._view_task), 10.0)
        except TimeoutError:
            pass

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
        store = self.node.host.store if self.node.host is not None else None
        await self.judge_evidence(
            evidence, lambda oid: store.get(ObjectId(oid)) if store is not None else None)

    async def judge_evidence(self, evidence: Evidence, fetch_array) -> None:
        """Block on proof alone: re-check the signed result ourselves (issue 13)."""
        c = self.controller
        if c.role is not Role.COORDINATOR or evidence.key in self._judged:
            return
        self._judged[evidence.key] = None
        while len(self._judged) > MAX_JUDGED:
            self._judged.popitem(last=False)
        verdict = await asyncio.to_thread(check_evidence, evidence, fetch_array)
        worker = evidence.receipt.worker
        if not verdict.proven:
            log.info("evidence against %s not proven: %s", worker.short(), verdict.why)
            return
        log.warning("proof that %s lied: %s", worker.short(), verdict.why)
        c.liar_report(worker, self.clock(), int(time.time()))
        await self._do(c.actions())

    # -- incoming --------------------------------------------------------------------------

    def _on_liar(self, peer: PeerId, reason: str) -> None:
        self._liars.append((peer, reason, self.clock()))
        self._report_liars(self._liars[-1:])

    def _report_liars(self, reports: list[tuple[PeerId, str, float]]) -> None:
        """Tell the coordinator (sent again to a new one: a dead one heard nothing)."""
        coord = self.controller.coordinator
        if coord is None and self.passive and self.controller.state is not None:
            coord = self.controller.state.coordinator  # no heartbeats here to judge by
        self._liars_told = coord
        now = self.clock()
        for peer, reason, at in reports:
            if now - at > self.controller.timing.liar_window:
                continue
            if coord == self.key.peer_id:
                continue  # our own word is no proof either: evidence goes through the node
            if coord is not None:
                body = msgpack.packb({"p": peer.raw, "r": reason[:100]}, use_bin_type=True)
                self._spawn(self._send(coord, seal(self.key, self.swarm_id, "liar", body)))
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
                state = CoordinatorState.decode(env.body)
                self.addrs.setdefault(env.sender, addr)
                c.heartbeat(state, env.sender, now, self._endorser(env.endorsement, state))
            elif env.kind == "handoff":
                c.handoff_offer(CoordinatorState.decode(env.body), env.sender, now,
                                env.endorsement)
            elif env.kind == "kick":
                if env.endorsement:
                    await self._on_message(sender, addr, env.endorsement)
                c.kick_order(KickOrder.decode(env.body), env.sender, now, time.time())
            elif env.kind == "liar":
                # Trusted from any signed peer (clients need not announce themselves); the
                # owner can unblock a worker that a lying requester got blocked.
                o = msgpack.unpackb(env.body, raw=False)
                if isinstance(o, dict) and env.sender not in c.blocked():
                    liar = PeerId(o["p"])
                    if c.role is Role.COORDINATOR:
                        # A claim is not evidence (issue 13): blocks follow judge_evidence.
                        log.info("liar claim about %s from %s: ignored without evidence",
                                 liar.short(), env.sender.short())
                    elif not o.get("f") and c.coordinator not in (None, self.key.peer_id,
                                                                   env.sender):
                        # The reporter's view of the coordinator is stale (a handoff just
                        # happened, or a client reads the DHT): pass it on, once.
                        body = msgpack.packb({"p": liar.raw, "r": str(o.get("r", ""))[:100],
                                              "f": 1}, use_bin_type=True)
                        self._spawn(self._send(c.coordinator,
                                               seal(self.key, self.swarm_id, "liar", body)))
            elif env.kind == "cmd":
                self._command(Signed.decode(env.body), now)
            elif env.kind == "fwd":
                self._forwarded(Signed.decode(env.body), now)
            elif env.kind == "fwdauto":
                o = msgpack.unpackb(env.body, raw=False)
                if not isinstance(o, dict) or not isinstance(o.get("a"), int):
                    raise ProtocolError("forwarded block without a peer and a time")
                entry = BlockEntry(PeerId(o["p"]), str(o.get("r", ""))[:100], "coordinator",
                                   o["a"])
                c.forwarded_auto_block(entry, env.sender, now)
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
        role = verify_command(signed, self.ownership, now=time.time(),
                              coordinator=c.coordinator, min_term=c.term)
        cmd = signed.statement
        issuer = bytes(getattr(signed.proofs[0], "credential_id", b"")) or \
            signed.proofs[0].signer.raw
        key = (issuer, cmd.counter)
        if key in self._seen_commands or abs(time.time() * 1000 - cmd.counter) > COMMAND_AGE:
            raise StaleTerm("replayed or stale command (its counter is the issue time in ms)")
        kind = COMMANDS[type(cmd)]
        c.command(Command(kind, cmd.target, cmd.reason, role.value, int(time.time())), now)
        self._seen_commands.add(key)
        if kind == "block":
            self._block_proofs[cmd.target] = signed.encode()
        elif kind == "unblock":
            self._block_proofs.pop(cmd.target, None)

    def _forwarded(self, signed: Signed, now: float) -> None:
        """A block with its owner's or admin's proof, from a coordinator our state replaced.

        Its term is below ours (it was issued on the losing side of a partition), so only the
        proof is checked, not the fencing floor; the controller drops it if we unblocked the
        peer after it was issued.
        """
        if self.ownership is None:
            raise NotCoordinator("this peer has no verified charter to check commands against")
        cmd = signed.statement
        if not isinstance(cmd, BlockCommand):
            raise ProtocolError("only block commands are forwarded")
        role = verify_command(signed, self.ownership, now=time.time())
        if role not in (AuthRole.OWNER, AuthRole.ADMIN):
            raise NotCoordinator("only owner and admin blocks are forwarded")
        self.controller.forwarded_block(
            Command("block", cmd.target, cmd.reason, role.value, cmd.counter // 1000), now)
        self._block_proofs[cmd.target] = signed.encode()
