"""The asyncio adapter around :class:`swarm.control.core.ControlCore` for one running node.

An aioquic-style loop: it feeds the core the clock (a :class:`~swarm.control.core.Tick`
every :data:`~swarm.control.core.TICK` s), control datagrams (signed envelopes over the DHT's
direct messages), evidence and liar reports from the node's runtime, and the answers to the
reads the core asked for; it carries out the core's actions: DHT reads and puts, datagrams,
disconnects through the node's hooks, and the copies kept in the data dir. Every decision
is the core's; what stays here is how each action is done (and an action's I/O errors
turned into the failed answer the core expects).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from dht.errors import DHTError, ItemError, LookupFailed
from dht.node import DHTNode, node_id_of
from identity import Ownership, PeerId, PeerKey
from swarm.control import core as cc
from swarm.control.charter import (
    CharterError,
    fetch_state,
    load_floor,
    register_validators,
    save_floor,
    state_salt,
)
from swarm.control.charter import fetch as fetch_charter
from swarm.control.machine import Duty, EvidenceCheck, Timing, refuse_unchecked
from swarm.control.state import load_state, resolve, save_state
from swarm.errors import LinkClosed, ProtocolError
from swarm.members import ANNOUNCE_TTL, MemberRecord, membership_topic, save_seen_peers
from swarm.runtime.evidence import Evidence, check_evidence
from swarm.runtime.objects import ObjectId
from swarm.runtime.protocol import EvidenceAck, EvidenceMsg

log = logging.getLogger("swarm.control")

VIEW_WAIT = 10.0
"""Seconds a member lookup may take before the core hears that it failed."""
SEND_WAIT = 2.0
"""Seconds a leaving member waits for its last sends (its bye) to go out."""


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("control-plane task failed", exc_info=task.exception())


class ControlledNode(Protocol):
    """What the plane uses of the node it runs on (:class:`swarm.node.Node` is one): its key,
    config and DHT node, its own member record (and whom it says it follows), its links and
    object store; and the two ways in, :meth:`attach_control` (the node calls back through
    :class:`swarm.node.ControlHooks`, which this plane is) and :meth:`on_control`."""

    key: PeerKey
    config: Any
    """Its ``NodeConfig`` (``swarm_id``, ``announce``, ``announce_ttl``)."""
    dht: DHTNode
    record: MemberRecord | None
    host: Any
    """Its actor host (None on a client), whose object store holds evidence arrays."""

    def link_to(self, peer: PeerId) -> Any: ...

    def follow(self, term: int, coordinator: PeerId) -> None:
        """Our member record says whom we follow from its next announcement on."""
        ...

    def attach_control(self, plane: Any) -> None: ...

    def on_control(self, message_type: type, handler: Callable) -> None: ...


class ControlPlane:
    """Runs the control plane for one node until it leaves."""

    def __init__(self, node: ControlledNode, swarm_pubkey: bytes, data_dir: Path, *,
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
        self.owner_pin = owner_pin
        self.core = cc.ControlCore(
            self.key, self.swarm_id, clock(), timing=timing,
            state=load_state(self.data_dir, self.swarm_id), ownership=ownership,
            charter_floor=load_floor(self.data_dir, swarm_pubkey),
            passive=not getattr(node.config, "announce", True),
            announce_ttl=getattr(node.config, "announce_ttl", ANNOUNCE_TTL),
            check_evidence=check_evidence)
        self.left = asyncio.Event()
        self.left_reason = ""
        self.role_changes: list[tuple[float, Duty, int]] = []
        self._started = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._page_puts: set[asyncio.Future] = set()
        self._sends: set[asyncio.Task] = set()
        """Sends in flight: a leaving member lets them go out (its bye) before it closes."""
        self._loop_task: asyncio.Task | None = None
        self._view_task: asyncio.Task | None = None
        register_validators(node.dht)
        node.attach_control(self)
        node.on_control(EvidenceMsg, self._on_evidence)
        node.dht.on_message(self._on_message)

    # -- public --------------------------------------------------------------------------

    @property
    def controller(self):
        """The core's coordinator state machine (read it; feed the core)."""
        return self.core.controller

    @property
    def role(self) -> Duty:
        return self.core.role

    @property
    def ownership(self) -> Ownership | None:
        return self.core.ownership

    @ownership.setter
    def ownership(self, value: Ownership | None) -> None:
        self.core.ownership = value

    @property
    def charter_floor(self) -> int:
        return self.core.charter_floor

    @property
    def addrs(self):
        return self.core.addrs

    @property
    def records(self):
        return self.core.records

    def accept_peer(self, peer) -> bool:
        """The node's hook: refuse blocked peers' links and keep shards off them."""
        return peer not in self.core.blocked()

    def accept_charter(self, ownership: Ownership) -> None:
        """Take a verified charter (from :func:`swarm.control.charter.fetch` with our floor);
        :class:`CharterError` for a rollback."""
        self.core.now, self.core.wall = self.clock(), self.wall()
        self.core.accept_charter(ownership)
        self._do_now(self.core.pump())

    async def start(self) -> None:
        self._do_now(self._feed(cc.Start()))
        await self._started.wait()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self._loop_task.add_done_callback(_log_crash)

    async def leave(self, timeout: float = 10.0) -> str:
        """Leave gracefully (a coordinator hands off first); returns why we left."""
        if not self.left.is_set():
            self._do_now(self._feed(cc.Leave()))
            try:
                await asyncio.wait_for(self.left.wait(), timeout)
            except TimeoutError:
                log.warning("handoff did not finish in %.0f s; leaving anyway", timeout)
            if self._sends:
                await asyncio.wait(list(self._sends), timeout=SEND_WAIT)
        await self.close()
        return self.left_reason

    async def close(self) -> None:
        tasks = [t for t in [self._loop_task, self._view_task, *self._tasks, *self._page_puts]
                 if t is not None and t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self.left.is_set():
            await self._do(self._feed(cc.Tick()))
            await asyncio.sleep(cc.TICK)

    def _feed(self, event: cc.Event) -> list[cc.Action]:
        return self.core.handle(event, self.clock(), self.wall())

    def _spawn(self, coro, send: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_crash)
        if send:
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _do(self, actions: list[cc.Action]) -> None:
        self._do_now(actions)

    def _do_now(self, actions: list[cc.Action]) -> None:
        """Carry out actions: I/O in tasks (their answers fed back), the rest at once."""
        for act in actions:
            if isinstance(act, cc.ReadView):
                self._spawn(self._read_view())
            elif isinstance(act, cc.ReadStates):
                self._spawn(self._read_states(act))
            elif isinstance(act, cc.ResolveItem):
                self._spawn(self._resolve(act))
            elif isinstance(act, cc.ReadCharter):
                self._spawn(self._read_charter(act))
            elif isinstance(act, cc.PutItem):  # its pages held here before anything sends
                self._spawn(self._put_item(act, self._hold_pages(act.pages)))
            elif isinstance(act, cc.Send):
                self._spawn(self._send_all(act, self._hold_pages(act.pages)), send=True)
            elif isinstance(act, cc.CheckEvidence):
                self._spawn(self._check(act, self._stored_array))
            elif isinstance(act, cc.NoteGone):
                self.node.dht.note_gone(act.addr, node_id_of(act.peer.raw))
            elif isinstance(act, cc.SavePeers):
                try:
                    save_seen_peers(self.data_dir, self.swarm_id, list(act.addrs))
                except OSError as exc:
                    log.info("cannot keep the peers seen in the data dir: %s", exc)
            elif isinstance(act, cc.SaveFloor):
                save_floor(self.data_dir, self.swarm_pubkey, act.counter)
            elif isinstance(act, cc.Persist):
                save_state(self.data_dir, act.state)
            elif isinstance(act, cc.Disconnect):
                self._spawn(self._disconnect(act))
            elif isinstance(act, cc.RoleChanged):
                self.role_changes.append((self.wall(), act.new, act.term))
                log.info("%s: %s -> %s at term %d", self.key.peer_id.short(),
                        act.old.value, act.new.value, act.term)
            elif isinstance(act, cc.Left):
                self.left_reason = act.reason
                self.left.set()
            elif isinstance(act, cc.Follow):
                self.node.follow(act.term, act.coordinator)
            elif isinstance(act, cc.Started):
                self._started.set()

    # -- carrying out reads ----------------------------------------------------------------

    async def _read_view(self) -> None:
        """List the membership topic (one lookup at a time; the core asks for one)."""
        members: tuple[tuple[MemberRecord, float], ...] | None = None
        try:
            anns = await asyncio.wait_for(
                self.node.dht.get_peers(membership_topic(self.swarm_id)), VIEW_WAIT)
        except (DHTError, TimeoutError, OSError) as exc:
            log.info("member lookup failed: %s", exc or "timed out")
        else:
            out = []
            for ann in anns:
                try:
                    out.append((MemberRecord.decode(ann.record, ann.peer_id), ann.expires_at))
                except ProtocolError as exc:
                    log.info("ignoring member record of %s: %s", ann.peer_id.short(), exc)
            members = tuple(out)
        self._do_now(self._feed(cc.ViewRead(members, self.node.record)))

    async def _read_states(self, act: cc.ReadStates) -> None:
        found = await asyncio.gather(*(fetch_state(self.node.dht, p, self.swarm_id, act.known)
                                       for p in act.peers))
        self._do_now(self._feed(cc.StatesRead(act, tuple(s for s in found if s is not None))))

    async def _resolve(self, act: cc.ResolveItem) -> None:
        """A message's state, its pages asked of its sender's node first (it holds them
        before it sends: :meth:`_hold_pages`), then of the DHT."""
        async def page(target: bytes) -> bytes | None:
            value = await self.node.dht.get_immutable_from(act.addr, target)
            if not isinstance(value, bytes):
                value = await self.node.dht.get_immutable(target)
            return value if isinstance(value, bytes) else None

        state, why = None, ""
        try:
            state = await resolve(act.item, page, act.known)
        except (ProtocolError, DHTError) as exc:
            why = str(exc)
        self._do_now(self._feed(cc.ItemResolved(act, state, why)))

    async def _read_charter(self, act: cc.ReadCharter) -> None:
        try:
            rec = await fetch_charter(self.node.dht, self.swarm_pubkey, self.owner_pin,
                                      now=self.wall(), floor=act.floor)
        except (CharterError, DHTError) as exc:
            self._do_now(self._feed(cc.CharterRead(None, str(exc))))
            return
        self._do_now(self._feed(cc.CharterRead(rec.ownership)))

    # -- carrying out puts and sends -------------------------------------------------------

    async def _put_item(self, act: cc.PutItem, pages: list[asyncio.Future]) -> None:
        dht, salt = self.node.dht, state_salt(self.swarm_id)
        ok, why, stored = True, "", None
        try:
            await asyncio.gather(*pages)  # the item pins its pages: they go first
            await dht.put_mutable(self.key, act.state.encode_item(), salt=salt,
                                  seq=act.state.seq)
        except ItemError as exc:
            ok, why = False, str(exc)
            if act.claim and exc.code == 302:  # our own item from an older chain is ahead
                item = await dht.get_mutable(self.key.public_bytes, salt)
                stored = item.seq if item is not None else None
        except (LookupFailed, DHTError) as exc:
            ok, why = False, str(exc)
        self._do_now(self._feed(cc.PutDone(act, ok, why, stored)))

    def _hold_pages(self, pages) -> list[asyncio.Future]:
        """Keep blocklist pages in our own DHT node at once, where a recipient of a message
        naming them asks first, and spread them in the DHT in the background. Messages do
        not wait for the spreading: it waits a lookup's grace (up to the RPC timeout) for
        each node that died since it was listed, and heartbeats held that long made every
        member take a live coordinator for dead (and the peer it had just blocked claim
        the role before its one notice came)."""
        for p in pages:
            try:
                self.node.dht.hold_immutable(p.encode())
            except ItemError as exc:  # the DHT put below reports it too
                log.info("blocklist page not kept here: %s", exc)
        puts = [asyncio.ensure_future(self.node.dht.put_immutable(p.encode())) for p in pages]
        for put in puts:
            self._page_puts.add(put)
            put.add_done_callback(self._page_puts.discard)
        return puts

    async def _send_all(self, act: cc.Send, pages: list[asyncio.Future]) -> None:
        """Send the message to every recipient; the pages it names are held here already
        (a recipient asks us for them) and spread in the DHT meanwhile."""
        if pages:
            self._spawn(self._spread(act.pages, pages))
        await asyncio.gather(*(self._send(peer, act.payload) for peer in act.to))

    async def _spread(self, pages, puts: list[asyncio.Future]) -> None:
        """Report pages that did not reach the DHT (the core puts them again)."""
        done = await asyncio.gather(*puts, return_exceptions=True)
        lost = tuple(p.target for p, r in zip(pages, done, strict=True)
                     if isinstance(r, (ItemError, LookupFailed, DHTError)))
        if lost:
            log.info("blocklist pages not stored in the DHT (%s)", next(
                r for r in done if isinstance(r, Exception)))
            self._do_now(self._feed(cc.PagesLost(lost)))

    async def _send(self, peer, msg: bytes) -> None:
        addr = self.core.address(peer)
        if addr is None:
            return
        for attempt in range(2):  # one retry: a lost datagram must not lose a kick
            try:
                await self.node.dht.send_message(addr, msg)
                return
            except (DHTError, OSError) as exc:
                log.debug("control message to %s failed (try %d): %s", peer.short(),
                          attempt + 1, exc)

    async def _disconnect(self, act: cc.Disconnect) -> None:
        link = self.node.link_to(act.peer)
        log.warning("%s %s: %s", "blocking" if act.blocked else "kicking", act.peer.short(),
                    act.reason)
        if link is not None:
            await link.close(act.reason)

    # -- evidence ------------------------------------------------------------------------

    async def find_coordinator(self) -> PeerId | None:
        """The node's hook: where our runtime's evidence goes."""
        return self.core.evidence_coordinator()

    def _stored_array(self, oid: bytes):
        store = self.node.host.store if self.node.host is not None else None
        return store.get(ObjectId(oid)) if store is not None else None

    async def _on_evidence(self, link, msg: EvidenceMsg) -> None:
        """Evidence from a requester; its arrays came before it, into our object store."""
        try:
            evidence = Evidence.decode(msg.evidence)
        except ValueError as exc:
            log.warning("bad evidence from %s: %s", link.remote.short(), exc)
            return
        await self._judge(evidence, self._stored_array, link)

    async def judge_evidence(self, evidence: Evidence, fetch_array) -> bool:
        """The node's hook for our own runtime's evidence: block on proof alone (the core has
        the signed result re-checked, issue 13). False when it is not taken here (we do not
        coordinate, or do not list the worker yet): the node delivers it again later."""
        return await self._judge(evidence, fetch_array, None)

    async def _judge(self, evidence: Evidence, fetch_array, link) -> bool:
        """Feed the evidence to the core; answer the sender as the core says (first: judging
        takes a while, and a refusal sends the evidence on to whoever coordinates next),
        then run the check it asks for."""
        taken = False
        checks = []
        for act in self._feed(cc.EvidenceReceived(evidence, link.remote if link else None)):
            if isinstance(act, cc.AnswerEvidence):
                taken = act.taken
                if link is not None:
                    await self._answer(link, act)
            elif isinstance(act, cc.CheckEvidence):
                checks.append(act)
            else:
                await self._do([act])
        for act in checks:
            await self._check(act, fetch_array)
        return taken

    async def _answer(self, link, act: cc.AnswerEvidence) -> None:
        try:
            await link.send(EvidenceAck(act.key, act.taken))
        except (LinkClosed, OSError) as exc:
            log.info("evidence from %s not answered: %s", link.remote.short(), exc)
        if not act.taken:
            log.info("evidence from %s refused for now (%s)", link.remote.short(),
                     self.core.role.value)

    async def _check(self, act: cc.CheckEvidence, fetch_array) -> None:
        verdict = await asyncio.to_thread(check_evidence, act.evidence, fetch_array)
        await self._do(self._feed(cc.EvidenceChecked(act.evidence, verdict.proven, verdict.why,
                                                     act.reporter)))

    # -- incoming --------------------------------------------------------------------------

    def lying_peer(self, peer: PeerId, reason: str, evidence: bytes = b"") -> None:
        """The node's hook: it caught ``peer`` returning a wrong result (``evidence``: the
        runtime's proof, checked by the coordinator before it acts)."""
        self._do_now(self._feed(cc.LiarCaught(peer, reason, evidence)))

    async def _on_message(self, sender, addr: tuple[str, int], payload: bytes) -> None:
        await self._do(self._feed(cc.MessageReceived(sender, addr, payload)))
