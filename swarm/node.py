"""One peer process: identity, DHT node, TLS links, membership, actor host, requester.

A :class:`Node` is what ``swarm join`` runs (worker role) and what a client embeds
(requester role). It wires the sans-IO parts to the network:

- its :class:`~identity.keys.PeerKey` comes from the data dir (``peer.key``, 0600);
- a :class:`~dht.DHTNode` joins through bootstrap addresses; the node announces its
  :class:`~swarm.members.MemberRecord` under the swarm's topic and re-announces it;
- a worker listens for TLS links and serves tasks on them with an
  :class:`~swarm.runtime.host.ActorHost`; a requester dials workers found in the member list
  and runs jobs with a :class:`~swarm.runtime.requester.Requester`;
- behind a NAT: every node relays signals between the peers it holds links to
  (:class:`~swarm.links.relay.SignalRelay`) and keeps links to up to ``relays`` reachable
  members; a worker the requester cannot dial directly is reached over WebRTC, signaled
  through those members (sealed and signed end to end), through STUN/TURN where configured.
  Members that opt in (``relay_data``) carry the bytes where nothing else works
  (:mod:`swarm.links.circuit`, end to end encrypted). A worker with no path at all is
  reported unreachable and not dialed again for :data:`UNREACHABLE_BACKOFF` seconds.

Hooks for the control plane (all optional, all on the instance; a control plane sets
``accept_peer``, ``find_coordinator``, ``judge_evidence`` and a liar callback at once through
:meth:`Node.attach_control`, typed by :class:`ControlHooks`):

``accept_peer(peer_id) -> bool``
    consulted for every incoming link (after the TLS handshake) and before any shard is
    scheduled on a peer: return False for kicked or blocked peers.
``on_control(message_type, handler)``
    route a wire message type arriving on any link to ``handler(link, msg)`` (sync or async).
``on_lying_peer(callback)``
    ``callback(peer_id, reason)`` runs whenever a peer's result fails verification
    (:meth:`report_lying_peer` runs them).
``find_coordinator()``, ``judge_evidence(evidence, fetch_array)``
    set by whoever knows the coordinator (the control plane on members, the client API):
    evidence of a wrong result (a signed receipt, see :mod:`swarm.runtime.evidence`) is
    delivered to the coordinator with its arrays, and :meth:`stop` waits for that delivery,
    so a one-shot requester's evidence outlives it. The coordinator judges on proof alone.
``members()``, ``send_control(peer, msg)``, ``link_to(peer)``
    the live member list, and a way to reach any member over a link.

A plain worker process (no control plane): ``python -m swarm.processes.worker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from dht import DHTNode, LookupFailed
from dht.validators import Validator
from identity.keys import PeerId, PeerKey
from swarm import __version__, wire
from swarm.errors import ConfigError, LinkClosed
from swarm.links import tls
from swarm.links.base import PeerLink
from swarm.links.circuit import (
    CircuitAccept,
    CircuitClose,
    CircuitData,
    CircuitEndpoint,
    CircuitIncoming,
    CircuitOpen,
    DataRelay,
)
from swarm.links.relay import RelayedSignal, RelayRefused, RelaySignal, RelaySignaler, SignalRelay
from swarm.loop import Supervisor
from swarm.members import (
    ACTIVITY_INTERVAL,
    ANNOUNCE_TTL,
    MAX_MODELS,
    MemberRecord,
    announce,
    follows,
    live_members,
    model_id,
    read_health,
)
from swarm.runtime.chaos import ChaosSpec
from swarm.runtime.evidence import DeliveredEvidence, Evidence, check_evidence
from swarm.runtime.host import ActorHost
from swarm.runtime.kernels import KERNEL_TIME_LIMIT
from swarm.runtime.local_bundles import LocalBundles
from swarm.runtime.protocol import EvidenceAck, EvidenceMsg, PutObject
from swarm.runtime.requester import EvidencePackage, Requester

log = logging.getLogger("swarm.node")
KEY_FILE = "peer.key"
STATS_ENV = "SWARM_STATS"
"""``SWARM_STATS=path``: keep the DHT socket's byte and request counters in ``path`` (JSON)."""
STATS_EVERY = 2.0
EVIDENCE_WAIT = 15.0
"""Seconds :meth:`Node.stop` waits for evidence still on its way to the coordinator."""
MAX_PROVEN_LIARS = 4096
"""Most workers one node keeps as proven liars (each one a signed wrong result)."""
EVIDENCE_RETRY = 60.0
"""Seconds a node keeps retrying to deliver one piece of evidence (coordinator failover)."""
EVIDENCE_ACK_WAIT = 5.0
"""Seconds to wait for the receiver's :class:`EvidenceAck` before trying again."""
UNREACHABLE_BACKOFF = 60.0
"""Seconds a worker with no path at all is left alone before the next dial."""
REDIAL_DELAYS = (0.5, 2.0, 5.0, 10.0)
"""Seconds before each redial of a worker whose link was lost (not closed by either side):
a NAT mapping that disappeared costs a new ICE session, not the worker."""
CIRCUIT_WAIT = 5.0
"""Seconds to wait for a member to open a circuit (all members are asked at once)."""
WITHDRAW_WAIT = 3.0
"""Seconds a leaving node waits for its withdrawn announcement to be stored, on top of twice
its DHT RPC timeout (:meth:`Node.withdraw`): the announcement's lookup holds for a close
contact that died since it was listed (a one-shot requester that just left) up to its grace,
``GRACE * slow_after`` <= the RPC timeout, and its writes as long again. 3 s alone cut a
blocked member's withdrawal short and its record stayed listed for its whole TTL: both liar-test
failures in 16 runs on a lightly loaded machine (the block right after the submits exited)
logged the withdrawal timed out; none of the 36 passing runs did."""
RELAY_FRESH = 8.0
"""A member link used as a relay must have carried something within this many seconds
(keepalive pings come every 5 s)."""
RELAY_INTERVAL = 10.0
"""Seconds between checks that the node still holds links to ``relays`` reachable members."""
RELAY_DIAL = 3.0
"""Seconds a TLS dial to a would-be relay member may take."""
RELAY_AGAIN = 0.5
"""Seconds after a relay link closed before the next look for one (a NAT mapping that
vanished: through this link other peers signal us, so a requester re-dialing us waits)."""
ControlHandler = Callable[[PeerLink, wire.Message], Awaitable[None] | None]


@dataclass

class NodeConfig:
    """How to run one node."""

    data_dir: Path
    """Keys and DHT state (created 0700)."""
    swarm_id: bytes
    """The 20-byte swarm id (see :func:`swarm.members.swarm_id`)."""
    roles: tuple[str, ...] = ("worker",)
    """"worker" serves tasks; "requester" submits them."""
    host: str = "127.0.0.1"
    """Address to bind and announce."""
    dht_port: int = 0
    """UDP port of the DHT node (0 = any free one)."""
    link_port: int = 0
    """TCP port of the TLS listener (0 = any free one)."""
    bootstrap: tuple[tuple[str, int], ...] = ()
    """DHT nodes to join through (one of them must answer)."""
    hints: tuple[tuple[str, int], ...] = ()
    """More DHT nodes to try, not required to answer (peers seen on an earlier run)."""
    backend: str = "auto"
    """Compute backend name for a worker (see ``compute.get_backend``)."""
    threads: int | None = None
    """BLAS threads for a numpy backend (None = library default)."""
    store_capacity: int = 4 << 30
    models: tuple[str, ...] = ()
    """Content addresses of the model files this worker holds (``--model``; announced)."""
    model_files: tuple[str, ...] = ()
    """Their paths, in the same order: span bundles are made from them rather than received
    (swarm.runtime.local_bundles)."""
    kernel_time_limit: float = KERNEL_TIME_LIMIT
    """Seconds one user WGSL kernel dispatch may run before it is stopped."""
    """Object store cap in bytes."""
    chaos: ChaosSpec = field(default_factory=ChaosSpec)
    """Fault injection (``SWARM_CHAOS``)."""
    announce_ttl: float = ANNOUNCE_TTL
    """Membership announcement lifetime; re-announced at a third of it."""
    announce: bool = True
    """Announce a member record (a transient requester such as ``swarm submit`` does not)."""
    dht_rpc_timeout: float = 5.0
    """Seconds a DHT request waits for an answer (a dead node costs this per lookup)."""
    dht_read_only: bool = False
    """A read-only DHT node (BEP 43, :class:`dht.DHTNode`): for a transient requester
    (``swarm submit``), which nobody must keep as a contact after it exits; never for a
    member."""
    bench_sizes: tuple[int, ...] | None = None
    """Matrix sizes of the start-up benchmark behind the announced TFLOPS (None: compute's
    quick set, ~3 s)."""
    bench_budget_s: float = 3.0
    """Time budget of that benchmark."""
    listen: bool | None = None
    """Take incoming TLS links (None: when a worker). A non-worker that listens serves only
    control messages on them (a coordinator that is not a worker, say)."""
    ice_servers: tuple[object, ...] = ()
    """STUN/TURN servers (aiortc ``RTCIceServer``) for WebRTC links (:mod:`swarm.links.ice`)."""
    relays: int = 0
    """Reachable members to keep a link to, so that peers can signal us behind a NAT
    (``swarm join``, ``publish`` and ``submit`` keep 3)."""
    relay_data: int = 0
    """Carry other members' links (circuits) at up to this many bytes/s when they have no
    other path (0: do not; opt-in, ``--relay-data``)."""
    webrtc: bool = True
    """Fall back to WebRTC (signaled through member relays) when a worker cannot be dialed."""
    validators: Mapping[bytes, Validator] = field(kw_only=True)
    """DHT item validators by salt, installed before the node serves anything: every node
    refuses forged swarm items (pass :func:`swarm.control.charter.validators`; required so
    that no caller forgets it)."""


class ControlHooks(Protocol):
    """What a control plane gives the node it runs on (:meth:`Node.attach_control`); the
    node calls these and nothing else of it, and the plane drives the node only through its
    public methods."""

    def accept_peer(self, peer: PeerId) -> bool:
        """False for a kicked or blocked peer: its links are refused, no shard goes to it."""
        ...

    async def find_coordinator(self) -> PeerId | None:
        """Where evidence of a wrong result goes (None: nobody coordinates now)."""
        ...

    async def judge_evidence(self, evidence: Evidence,
                             fetch_array: Callable[[bytes], Any]) -> bool:
        """Re-check evidence when this node coordinates (False when it is not taken here:
        it does not coordinate, or does not list the worker yet; delivered again later)."""
        ...

    def lying_peer(self, peer: PeerId, reason: str) -> None:
        """A result from ``peer`` failed verification here."""
        ...


class Node:
    """One peer (see module docstring for the hooks)."""

    clock = staticmethod(time.monotonic)
    """The node's timers (backoffs, retry deadlines, re-announce periods): injectable, like
    DHTNode.clock. Link freshness and the stats file stay on time.monotonic(), the clock the
    links and the processes reading the file use."""

    def __init__(self, config: NodeConfig, key: PeerKey | None = None) -> None:
        if len(config.swarm_id) != 20:
            raise ConfigError("a swarm id is 20 bytes")
        self.config = config
        if config.webrtc:  # aiortc's import (half a second, seconds on loaded cores) here,
            import swarm.links.webrtc  # noqa: F401  before start(): there it stalled the
            # running loop and counted against the start's timeout
        data = Path(config.data_dir)
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.key = key or PeerKey.load_or_create(data / KEY_FILE)
        self.peer_id: PeerId = self.key.peer_id
        self.dht = DHTNode(self.key, data / "dht", maintenance_interval=30.0,
                           rpc_timeout=config.dht_rpc_timeout,
                           read_only=config.dht_read_only)
        for salt, validator in config.validators.items():
            self.dht.register_validator(salt, validator)  # refuse forged swarm items
        self.accept_peer: Callable[[PeerId], bool] = lambda peer: True
        self._control: dict[type, ControlHandler] = {}
        self._liar_callbacks: list[Callable[[PeerId, str], None]] = []
        self.find_coordinator: Callable[[], Awaitable[PeerId | None]] | None = None
        """Where evidence goes (None: nowhere; it is logged and dropped)."""
        self.judge_evidence: Callable[[Evidence, Callable[[bytes], Any]], Awaitable[bool]] \
            | None = None
        """Re-checks evidence when this node is the coordinator (the control plane's); False
        when it does not coordinate."""
        self.proven_liars: set[PeerId] = set()
        """Workers this node holds proof against (a wrong result they signed, re-checked
        here with :func:`check_evidence`): it schedules nothing more on them, whatever any
        coordinator says. Bounded: each entry cost its peer a signed lie (and a cap)."""
        self._deliveries = Supervisor(log, "evidence delivery")
        self._evidence_acks: dict[bytes, tuple[PeerId, asyncio.Future[bool]]] = {}
        """Evidence sent and not answered yet: key -> (the peer asked, its answer)."""
        self._delivered_evidence = DeliveredEvidence()
        """Evidence coordinators took, for the coordinators after them."""
        self.requester = Requester(self.peer_id, accept_peer=self._accepts,
                                   on_rejected=self.report_lying_peer)
        self.host: ActorHost | None = None
        self.server: tls.TLSServer | None = None
        self.tflops = 0.0
        self._incoming: dict[PeerId, PeerLink] = {}
        self._tasks = Supervisor(log, "node task")
        self._stopping = False
        self._evidence_closed = False
        """Set once :meth:`stop` has waited for the requester's reports: evidence that comes
        later is not sent."""
        self.record: MemberRecord | None = None
        self.worker_records: dict[PeerId, MemberRecord] = {}
        """The live workers' records, as the last member listing gave them (their offers:
        memory, speed, models held)."""
        self._follows: tuple[int, bytes] | None = None
        self._announce_now = asyncio.Event()
        self._withdrawn = False
        self.relay = SignalRelay()
        self.webrtc = None  # a WebRTCEndpoint once started (aiortc is imported lazily)
        self.signaler: RelaySignaler | None = None
        self.unreachable: dict[PeerId, tuple[float, str]] = {}
        """Workers with no path: peer -> (monotonic time to retry, why)."""
        self._relay_links: dict[PeerId, PeerLink] = {}
        self._relay_lost = asyncio.Event()
        for kind in (RelaySignal, RelayedSignal, RelayRefused):
            self.on_control(kind, self._relay_message)
        self.data_relay = DataRelay(self.relay.links, config.relay_data)
        self.circuits = CircuitEndpoint(self.key, on_link=self._serve, accept=self._accepts)
        for kind in (CircuitOpen, CircuitIncoming, CircuitAccept, CircuitData, CircuitClose):
            self.on_control(kind, self._circuit_message)
        self.on_control(EvidenceAck, self._on_evidence_ack)

    # -- hooks ----------------------------------------------------------------------------

    def _accepts(self, peer: PeerId) -> bool:
        if peer in self.proven_liars:
            return False
        try:
            return bool(self.accept_peer(peer))
        except Exception:
            log.exception("accept_peer hook failed; refusing %s", peer.short())
            return False

    def attach_control(self, plane: ControlHooks) -> None:
        """The control plane this node runs under: its hooks replace the defaults (admit
        everyone, deliver evidence nowhere), and it hears of every caught liar."""
        self.accept_peer = plane.accept_peer
        self.find_coordinator = plane.find_coordinator
        self.judge_evidence = plane.judge_evidence
        self.on_lying_peer(plane.lying_peer)

    def on_control(self, message_type: type, handler: ControlHandler) -> None:
        """Send messages of ``message_type`` arriving on any link to ``handler(link, msg)``."""
        self._control[message_type] = handler

    def on_lying_peer(self, callback: Callable[[PeerId, str], None]) -> None:
        """Call ``callback(peer, reason)`` for each result that failed verification."""
        self._liar_callbacks.append(callback)

    def report_lying_peer(self, peer: PeerId, reason: str,
                          evidence: EvidencePackage | None = None) -> None:
        """A peer returned a wrong result: tell every registered callback, and deliver the
        evidence (if any) to the coordinator."""
        for cb in self._liar_callbacks:
            try:
                cb(peer, reason)
            except Exception:
                log.exception("on_lying_peer callback failed")
        if evidence is not None and peer not in self.proven_liars \
                and self.find_coordinator is None:
            # no control plane to judge it (swarm.local()): this node keeps its own proof;
            # with one, the coordinator judges and blocks (two pieces), as the demo shows
            self._start_proof(peer, evidence)
        if evidence is not None and self.find_coordinator is None:
            log.info("evidence against %s kept nowhere: no control plane to deliver it to",
                     peer.short())
        elif evidence is not None:
            self._start_delivery(evidence)

    def _start_proof(self, peer: PeerId, package: EvidencePackage) -> None:
        async def prove() -> None:
            verdict = await asyncio.to_thread(check_evidence, package.evidence,
                                              package.arrays.get)
            if verdict.proven and len(self.proven_liars) < MAX_PROVEN_LIARS:
                log.warning("%s signed a wrong result (%s): no more work for it from here",
                            peer.short(), verdict.why)
                self.proven_liars.add(peer)

        self._tasks.spawn(prove())

    def _start_delivery(self, package: EvidencePackage) -> None:
        if self._evidence_closed:
            return
        self._deliveries.spawn(self._deliver(package))

    def _delivered(self, package: EvidencePackage, coord: PeerId) -> None:
        """``coord`` took ``package``: it also gets the earlier evidence against the same
        worker that it has not had (a coordinator that took over counts from zero)."""
        ev = package.evidence
        for older in self._delivered_evidence.delivered(
                ev.receipt.worker, ev.key, package,
                sum(a.nbytes for a in package.arrays.values()), coord, self.clock()):
            self._start_delivery(older)

    async def _deliver(self, package: EvidencePackage) -> None:
        """Send the arrays (by content address), then the evidence, to the coordinator;
        retried while no coordinator is reachable (one may be failing over right now)."""
        worker = package.evidence.receipt.worker
        delay, deadline = 0.25, self.clock() + EVIDENCE_RETRY
        while True:
            why = await self._deliver_once(package)
            if why is None:
                return
            if self.clock() + delay > deadline:
                log.warning("evidence against %s not delivered: %s", worker.short(), why)
                return
            log.info("evidence against %s not delivered yet (%s); retrying", worker.short(),
                     why)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)

    async def _deliver_once(self, package: EvidencePackage) -> str | None:
        """One delivery attempt; None when done, else why not."""
        worker = package.evidence.receipt.worker
        coord = await self.find_coordinator() if self.find_coordinator else None
        if coord is None:
            return "no coordinator known"
        if coord == worker:
            return "the accused is the coordinator"
        if coord == self.peer_id:
            if self.judge_evidence is None or \
                    await self.judge_evidence(package.evidence, package.arrays.get):
                self._delivered(package, coord)
                return None
            return "not taken here (not coordinating, or the worker not listed yet)"
        key = package.evidence.key
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._evidence_acks[key] = (coord, answer)
        try:
            for oid, arr in package.arrays.items():
                await self.send_control(coord, PutObject(oid, arr))
            await self.send_control(coord, EvidenceMsg(package.evidence.encode()))
            taken = await asyncio.wait_for(answer, EVIDENCE_ACK_WAIT)
        except (LinkClosed, OSError, TimeoutError) as exc:
            return f"{coord.short()}: {exc or 'no answer'}"
        finally:
            self._evidence_acks.pop(key, None)
        if not taken:  # a stale DHT state named it, it is handing off right now, or it
            # does not list the worker yet (it reads the members again)
            return f"{coord.short()} did not take it (not coordinating, or the worker not " \
                   "listed there yet)"
        log.info("evidence against %s delivered to coordinator %s", worker.short(),
                 coord.short())
        self._delivered(package, coord)
        return None

    def _on_evidence_ack(self, link: PeerLink, msg: EvidenceAck) -> None:
        """The answer to evidence we sent; only the peer we asked can give it."""
        asked, answer = self._evidence_acks.get(msg.key, (None, None))
        if answer is not None and asked == link.remote and not answer.done():
            answer.set_result(msg.taken)

    async def _dispatch(self, link: PeerLink, msg: wire.Message) -> None:
        handler = self._control.get(type(msg))
        if handler is None:
            log.debug("no handler for %s from %s", type(msg).__name__, link.remote.short())
            return
        result = handler(link, msg)
        if inspect.isawaitable(result):
            await result

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        await self.dht.listen(cfg.dht_port, cfg.host)
        if cfg.bootstrap or cfg.hints:
            try:
                await self.dht.bootstrap(list(dict.fromkeys([*cfg.bootstrap, *cfg.hints])))
            except LookupFailed:
                if cfg.bootstrap:
                    raise
                log.info("none of the %d peers seen before answered", len(cfg.hints))
        links: tuple[tuple[str, int], ...] = ()
        if "worker" in cfg.roles:
            import compute

            backend = await asyncio.to_thread(compute.get_backend, cfg.backend,
                                              threads=cfg.threads)
            result = await asyncio.to_thread(
                compute.benchmark, cfg.bench_sizes, cfg.bench_budget_s,
                quick=cfg.bench_sizes is None, backends=[backend.name], threads=cfg.threads)
            self.tflops = compute.measured_tflops(result)
            held = {model_id(a): p for a, p in zip(cfg.models, cfg.model_files, strict=True)}
            self.host = ActorHost(backend, store_capacity=cfg.store_capacity, chaos=cfg.chaos,
                                  key=self.key, kernel_time_limit=cfg.kernel_time_limit,
                                  local_bundles=LocalBundles(held) if held else None)
        if cfg.listen or (cfg.listen is None and "worker" in cfg.roles):
            self.server = await tls.listen(self.key, cfg.host, cfg.link_port,
                                           on_link=self._serve, accept=self._accepts)
            links = ((cfg.host, self.server.port),)
        self.record = MemberRecord(self.peer_id, self.tflops, links, self.dht.address,
                                   __version__, tuple(cfg.roles), read_health(),
                                   **self._offer())
        if cfg.announce:
            await announce(self.dht, cfg.swarm_id, self.record, cfg.announce_ttl)
            self._spawn(self._reannounce())
        if cfg.webrtc:
            from swarm.links.webrtc import WebRTCEndpoint

            self.signaler = RelaySignaler(self.key, self._relays_for)
            self.webrtc = WebRTCEndpoint(
                self.key, self.signaler, on_link=self._serve, accept=self._accepts,
                ice_servers=list(cfg.ice_servers),
                host_addresses=None if cfg.host in ("0.0.0.0", "::") else [cfg.host])
            self.signaler.on_unreachable = self.webrtc.unreachable
        if cfg.relays > 0:
            self._spawn(self._keep_relays())
        if os.environ.get(STATS_ENV):
            self._spawn(self._dump_stats(Path(os.environ[STATS_ENV])))
        log.info("node %s up: dht %s, links %s, roles %s", self.peer_id.short(),
                 self.dht.address, links, ",".join(cfg.roles))

    def _spawn(self, coro) -> None:
        self._tasks.spawn(coro)

    async def _dump_stats(self, path: Path) -> None:
        """Write the DHT socket's counters to ``path`` every STATS_EVERY s (benchmarks read
        them from outside the process)."""
        tmp = path.with_name(path.name + ".tmp")
        while True:
            s = self.dht.stats
            tmp.write_text(json.dumps({"t": time.monotonic(), "bytes_in": s.bytes_in,
                                       "bytes_out": s.bytes_out, "requests": s.requests,
                                       "lookups": s.lookups, "listings": s.listings}))
            os.replace(tmp, path)
            await asyncio.sleep(STATS_EVERY)

    async def _reannounce(self) -> None:
        """Re-announce every ``announce_ttl / 3`` s (less up to a fifth, at random: members
        that joined together do not re-announce together), and within ACTIVITY_INTERVAL s of a
        change in the work this worker runs, so status shows running jobs. The work is looked
        at every ACTIVITY_INTERVAL s, on a timer: a wake-up per task change cost a worker
        answering small tasks two waits per task (~25 us of a ~0.4 ms task)."""
        period = self.config.announce_ttl / 3 * random.uniform(0.8, 1.0)  # noqa: S311
        last = self.clock()
        while True:
            left = last + period - self.clock()
            wait = left if self.host is None else min(ACTIVITY_INTERVAL, left)
            try:
                await asyncio.wait_for(self._announce_now.wait(), max(0.0, wait))
            except TimeoutError:
                pass
            if self.host is not None and not self._announce_now.is_set() \
                    and self.clock() < last + period \
                    and self._activity() == (self.record.tasks, self.record.serving) \
                    and self._hosted() == self.record.hosted:
                continue
            self._announce_now.clear()
            if self._withdrawn:
                return
            try:
                tasks, serving = self._activity()
                self.record = MemberRecord(self.peer_id, self.tflops, self.record.links,
                                           self.dht.address, __version__,
                                           self.record.roles, read_health(),
                                           tasks=tasks, serving=serving,
                                           follows=self._follows, **self._offer())
                await announce(self.dht, self.config.swarm_id, self.record,
                               self.config.announce_ttl)
            except Exception as exc:  # the DHT may be unreachable for a while
                log.warning("re-announce failed: %s", exc)
            last = self.clock()
            period = self.config.announce_ttl / 3 * random.uniform(0.8, 1.0)  # noqa: S311

    async def withdraw(self, timeout: float | None = None) -> None:
        """Say that we leave: announce our record marked ``left`` (signed by our key and
        expiring later than any announcement before, so it replaces them), so that readers
        deal us no more work now rather than when our last announcement expires."""
        if self.record is None or not self.config.announce or self._withdrawn:
            return
        self._withdrawn = True
        self.record = replace(self.record, left=True)
        if timeout is None:
            timeout = 2 * self.config.dht_rpc_timeout + WITHDRAW_WAIT
        try:
            await asyncio.wait_for(announce(self.dht, self.config.swarm_id, self.record,
                                            self.config.announce_ttl), timeout)
        except Exception as exc:  # the DHT may be unreachable: the record then expires
            log.info("withdrawing our announcement failed: %s", str(exc) or type(exc).__name__)

    def follow(self, term: int, coordinator: PeerId) -> None:
        """The control plane's hook: we now follow ``coordinator`` at ``term``; our record
        says so at the next announcement, made now (readers count whom members follow)."""
        if self._follows != follows(term, coordinator):
            self._follows = follows(term, coordinator)
            self._announce_now.set()

    def _hosted(self) -> tuple[tuple[bytes, int, int], ...]:
        return () if self.host is None else tuple(self.host.core.hosted())

    def _offer(self) -> dict:
        """What the record says of the memory offered and the models held (workers only)."""
        if self.host is None:
            return {}
        store = self.host.store
        offered = store.capacity if self.config.chaos.claim is None else self.config.chaos.claim
        return {"memory": (offered, store.used + store.reserved),
                "models": tuple(model_id(a) for a in self.config.models[:MAX_MODELS]),
                "hosted": self._hosted()}

    def _activity(self) -> tuple[int, tuple[tuple[PeerId, int], ...]]:
        if self.host is None:
            return 0, ()
        tasks, per = self.host.activity()
        return tasks, tuple(per)

    async def _serve(self, link: PeerLink) -> None:
        self._incoming[link.remote] = link
        self.relay.attach(link)
        try:
            if self.host is not None:
                await self.host.serve(link, fallback=self._dispatch)
            else:
                async for msg in link:
                    await self._dispatch(link, msg)
        finally:
            if self._incoming.get(link.remote) is link:
                del self._incoming[link.remote]

    async def stop(self, graceful: bool = True, timeout: float = 30.0) -> None:
        """Leave: finish the running task (graceful) and hand queued ones back, then close."""
        if self._stopping:
            return
        self._stopping = True
        # evidence outlives a one-shot requester: reports still asking for a receipt, then
        # their deliveries to the coordinator
        await self.requester.reported(EVIDENCE_WAIT)
        self._evidence_closed = True
        if self._deliveries:
            await asyncio.wait(list(self._deliveries), timeout=EVIDENCE_WAIT)
            self._deliveries.cancel()
        if self.host is not None and graceful:
            await self.host.drain(timeout)
        if self.server is not None:
            await self.server.close()
        self._tasks.cancel()
        if self.webrtc is not None:
            await self.webrtc.close()
        await self.circuits.close()
        for link in list(self._relay_links.values()):
            await link.close("node stopping")
        await self.requester.close()
        for link in list(self._incoming.values()):
            await link.close("node stopping")
        if self.host is not None:
            await self.host.close()
        await self.dht.stop()

    # -- members and links ----------------------------------------------------------------

    async def members(self) -> list[MemberRecord]:
        """Live members of the swarm (this node included once it announced)."""
        return await live_members(self.dht, self.config.swarm_id)

    async def connect_workers(self, records: Sequence[MemberRecord] | None = None
                              ) -> list[PeerId]:
        """Dial every live, accepted worker we have no link to; returns the linked workers."""
        if records is None:
            records = await self.members()
        self.worker_records = {r.peer_id: r for r in records if "worker" in r.roles}
        now = self.clock()
        dials = [r for r in records if "worker" in r.roles and r.links
                 and r.peer_id != self.peer_id and self._accepts(r.peer_id)
                 and (r.via is None or self._accepts(r.via))
                 and r.peer_id not in self.requester.links
                 and self.unreachable.get(r.peer_id, (0.0, ""))[0] <= now]

        why: dict[PeerId, list[str]] = {r.peer_id: [] for r in dials}

        async def dial(r: MemberRecord, step) -> bool:
            """True when this step settled ``r`` (linked, or refused us)."""
            try:
                link = await step(r, why[r.peer_id])  # its own link, with its own reader
            except Exception as exc:  # AuthenticationError, ProtocolError
                log.warning("refusing %s: %s", r.peer_id.short(), exc)
                return True
            if link is not None:
                self._use_worker(r, link)
            return link is not None

        # Direct links first: the signals and circuits to the others go through them (a
        # dial begun beside them would find no relay yet and give up for a whole backoff).
        settled = await asyncio.gather(*(dial(r, self._dial_direct) for r in dials))
        await asyncio.gather(*(dial(r, self._dial_indirect)
                               for r, done in zip(dials, settled, strict=True) if not done))
        return self.requester.workers()

    async def wait_for_workers(self, count: int, timeout: float) -> list[PeerId]:
        """Poll the member list until ``count`` workers are linked (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            delay = 0.05
            while True:
                linked = await self.connect_workers()
                if len(linked) >= count:
                    return linked
                await asyncio.sleep(delay)  # members appear through the DHT: poll, backing off
                delay = min(delay * 2, 1.0)

    def _use_worker(self, r: MemberRecord, link: PeerLink) -> None:
        """Send shards over ``link``; dial ``r`` again if the link is lost."""
        self.unreachable.pop(r.peer_id, None)
        self.requester.attach(link, fallback=self._dispatch)
        self.relay.attach(link)
        link.add_close_callback(lambda lost: self._lost(r, lost))

    def _lost(self, r: MemberRecord, link: PeerLink) -> None:
        reason = getattr(link, "_closed", None)
        text = reason.reason if isinstance(reason, LinkClosed) else ""
        if self._stopping or text.startswith(("closed by peer", "closed locally")) \
                or not self._accepts(r.peer_id):  # blocked or a proven liar: it may go
            return
        log.info("link to worker %s lost (%s); dialing it again", r.peer_id.short(), text)
        self._spawn(self._redial(r))

    async def _redial(self, r: MemberRecord) -> None:
        afters = (*REDIAL_DELAYS[1:], UNREACHABLE_BACKOFF)  # then the member view's backoff
        for delay, after in zip(REDIAL_DELAYS, afters, strict=True):
            await asyncio.sleep(delay)
            current = self.requester.links.get(r.peer_id)
            if self._stopping or not self._accepts(r.peer_id):  # refused since it was lost
                return
            if current is not None and not current.closed:  # linked again another way
                log.info("worker %s reached again over %s", r.peer_id.short(), current.kind)
                return
            try:
                link = await self._dial(r, next_try=after)
            except Exception as exc:  # AuthenticationError, ProtocolError
                log.warning("refusing %s: %s", r.peer_id.short(), exc)
                return
            if link is not None:
                log.info("worker %s reached again over %s", r.peer_id.short(), link.kind)
                self._use_worker(r, link)
                return

    async def _dial(self, r: MemberRecord, next_try: float = UNREACHABLE_BACKOFF
                    ) -> PeerLink | None:
        """A link to member ``r``: TLS to an announced address, else WebRTC signaled through
        the members we hold links to; None (and ``r`` marked unreachable; the log says when
        the caller tries again, ``next_try`` seconds) if neither.
        Raises AuthenticationError/ProtocolError when the peer refuses us or is not ``r``."""
        why: list[str] = []
        return await self._dial_direct(r, why) or await self._dial_indirect(r, why, next_try)

    async def _dial_direct(self, r: MemberRecord, why: list[str]) -> PeerLink | None:
        """TLS to an address ``r`` announced (through its node for a browser tab); what
        failed goes to ``why``."""
        for host, port in r.links:
            try:
                if r.via is not None:  # a browser tab: through the node that serves it
                    from swarm.links.tabs import dial as relay_dial

                    return await relay_dial(self.key, host, port, r.via, r.peer_id)
                return await tls.connect(self.key, host, port, r.peer_id)
            except (OSError, TimeoutError, LinkClosed) as exc:
                log.info("cannot reach %s at %s:%d: %s", r.peer_id.short(), host, port, exc)
                why.append(f"tls {host}:{port}: {exc or type(exc).__name__}")
        return None

    async def _dial_indirect(self, r: MemberRecord, why: list[str],
                             next_try: float = UNREACHABLE_BACKOFF) -> PeerLink | None:
        """WebRTC signaled through the members we hold links to, else a circuit through a
        member that relays data; None (and ``r`` marked unreachable, with ``why``) if
        neither."""
        if self.webrtc is not None:
            from swarm.links.relay import RELAY_ADDR

            try:
                return await self.webrtc.connect(r.peer_id, RELAY_ADDR)
            except (OSError, TimeoutError, LinkClosed) as exc:
                why.append(f"webrtc: {exc or type(exc).__name__}")
        relays = self._relays_for(r.peer_id)  # members that opted in carry the bytes
        tries = [asyncio.ensure_future(self.circuits.connect(relay, r.peer_id, CIRCUIT_WAIT))
                 for relay in relays]
        link = None
        try:
            for done in asyncio.as_completed(tries):
                try:
                    link = await done
                    break
                except (OSError, TimeoutError, LinkClosed) as exc:
                    why.append(f"member relay: {exc or type(exc).__name__}")
        finally:
            for t in tries:
                t.cancel()
            for t in tries:  # two members both opened a circuit: keep one
                if t.done() and not t.cancelled() and t.exception() is None \
                        and t.result() is not link:
                    await t.result().close("a circuit through another member is in use")
        if link is not None:
            return link
        reason = "; ".join(why) or "no address"
        # warned once; until it is reached again, later failures are INFO (a worker that
        # died keeps failing at each redial)
        told = log.info if r.peer_id in self.unreachable else log.warning
        self.unreachable[r.peer_id] = (self.clock() + UNREACHABLE_BACKOFF, reason)
        told("worker %s unreachable (no direct, relayed or TURN path; next try in %g s): %s",
             r.peer_id.short(), next_try, reason)
        return None

    # -- reachability behind NATs ---------------------------------------------------------

    def _relays_for(self, peer: PeerId) -> list[PeerLink]:
        """Links a signal to ``peer`` may be relayed through: every open member link that
        was heard from lately (a link cut by a partition answers nothing: asking through it
        would only wait out the timeout)."""
        links = {**self._incoming, **self.requester.links, **self._relay_links}
        fresh = time.monotonic() - RELAY_FRESH
        return [link for p, link in links.items() if p != peer and not link.closed
                and getattr(link, "_last_rx", fresh) >= fresh]

    async def _relay_message(self, link: PeerLink, msg: wire.Message) -> None:
        if isinstance(msg, RelaySignal):
            await self.relay.handle(link, msg)
        elif self.signaler is not None:
            await self.signaler.handle(link, msg)

    async def _serve_relay(self, link: PeerLink) -> None:
        """Read a link we opened to a member to be reachable through it: only relay and
        control messages travel on it, and it is not offered to :meth:`link_to` (control
        messages to that member go on their own link, which fails fast when cut)."""
        self.relay.attach(link)
        try:
            async for msg in link:
                await self._dispatch(link, msg)
        except LinkClosed:
            pass

    async def _circuit_message(self, link: PeerLink, msg: wire.Message) -> None:
        if not await self.data_relay.handle(link, msg):
            await self.circuits.handle(link, msg)

    async def _keep_relays(self) -> None:
        """Hold TLS links to up to ``relays`` reachable members (outbound, so they work from
        behind a NAT): through them other peers signal us, and they keep our mapping open."""
        while True:
            try:
                open_ = {p for p, link in self._relay_links.items() if not link.closed}
                want = self.config.relays - len(open_)
                if want > 0:
                    for r in await self.members():
                        if want <= 0:
                            break
                        if r.peer_id == self.peer_id or r.peer_id in open_ or not r.links:
                            continue
                        if not self._accepts(r.peer_id):
                            continue
                        link = self.link_to(r.peer_id)
                        if link is None:
                            try:
                                link = await tls.connect(self.key, *r.links[0], r.peer_id,
                                                         timeout=RELAY_DIAL)
                            except Exception as exc:
                                log.debug("no relay link to %s: %s", r.peer_id.short(), exc)
                                continue
                            self._spawn(self._serve_relay(link))
                        self._relay_links[r.peer_id] = link
                        link.add_close_callback(lambda _: self._relay_lost.set())
                        want -= 1
            except Exception as exc:  # the DHT may be unreachable for a while
                log.info("relay links: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._relay_lost.wait(), RELAY_INTERVAL)
                await asyncio.sleep(RELAY_AGAIN)  # at most two looks a second
            self._relay_lost.clear()

    def link_to(self, peer: PeerId) -> PeerLink | None:
        """An open link to ``peer`` in either direction, if any."""
        for link in (self.requester.links.get(peer), self._incoming.get(peer)):
            if link is not None and not link.closed:
                return link
        return None

    async def send_control(self, peer: PeerId, msg: wire.Message) -> None:
        """Send a control message to a member, dialing it if no link is open."""
        link = self.link_to(peer)
        if link is None:
            records = [r for r in await self.members() if r.peer_id == peer]
            if not records or not records[0].links:
                raise LinkClosed(f"{peer.short()} is not a reachable member")
            link = await self._dial(records[0])
            if link is None:
                raise LinkClosed(f"{peer.short()} is unreachable: "
                                 f"{self.unreachable.get(peer, (0, '?'))[1]}")
            self.requester.attach(link, fallback=self._dispatch)
            self.relay.attach(link)
        await link.send(msg)
