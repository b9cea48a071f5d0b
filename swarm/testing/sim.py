"""A one-process simulation of a swarm's control plane at 100-1,000 members (sans-IO).

What is real: every member runs the real :class:`~swarm.control.core.ControlCore` (the one
:class:`swarm.control.plane.ControlPlane` drives: the same dispatch, claims, proofs and
reads) with its own ed25519 key; control messages are sealed with :func:`swarm.control.state.seal` and
wrapped in a per-recipient :class:`dht.messages.Envelope` (a real signature each), and the
recipient's :class:`dht.messages.ReplayGuard` and :func:`~swarm.control.state.unseal`
verify them; membership announcements are real signed :class:`dht.announce.Announcement` s
of real :class:`~swarm.members.MemberRecord` s; coordinator-state items are real
BEP 44 :class:`dht.items.MutableItem` s checked by the swarm's own DHT validators. Byte
counts are the lengths of those real encodings in the DHT's datagram framing.

What is modelled: the clock (a heap of events, no sleeping), the network (one-way latency
``latency + U(0, jitter)``, optional loss), and the DHT. The DHT is a shared in-memory store
(:class:`SimDHT`) that validates on store and on read with the real validators and charges
each lookup the traffic a Kademlia lookup would cost: ``alpha * ceil(log2 N)`` find
queries to seeded random nodes plus one query to each of the ``k`` nodes closest (XOR) to
the target, which answer with the value (a topic's announcements paged at the DHT's
``PEERS_PAGE_BYTES``, at most ``MAX_PER_TOPIC`` per node; the follow-up pages from
``MAX_PAGE_SOURCES`` replicas). The charter is modelled as a
counter in an item of :data:`CHARTER_BYTES` (its FIDO2 proof is not re-created here).

How each member decides its DHT reads is the one point to swap (the core's ``reads``):
:class:`SyncAdapter` gives each core the real :class:`swarm.control.sync.Sync` core, as the
plane does (heartbeats carry digests; members fetch what changed); :class:`PollingAdapter`
gives it :class:`Polling`, the policy before issue 19 (every member listed the whole
membership topic every second, read its coordinator's state item every second and the
charter every five) for the before figures.

Wall time: the DHT is charged arithmetically, so the cost is the cores and the signatures;
1,000 members run about as fast as real time on one core (``bench/scale_sim.py`` prints it).
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import msgpack
import numpy as np

from dht.announce import Announcement
from dht.core import PEERS_PAGE_BYTES
from dht.errors import ItemError
from dht.items import MutableItem, mutable_target
from dht.messages import Envelope, ReplayGuard
from dht.node import MAX_PAGE_SOURCES
from dht.store import MAX_PER_TOPIC
from dht.wire import announcement_to_wire, mutable_to_wire
from identity.keys import PeerId, PeerKey
from swarm.control import core as cc
from swarm.control.charter import state_salt, validate_state_item
from swarm.control.core import TICK, ControlCore
from swarm.control.machine import CheckedCommand, Controller, Duty, Timing
from swarm.control.state import CoordinatorState, StateItem, resolve
from swarm.control.sync import Digest, Fetch, Mode, Sync, SyncTiming
from swarm.errors import ProtocolError
from swarm.members import ANNOUNCE_TTL, MemberRecord, follows, membership_topic

EPOCH = 1_800_000_000.0
"""Unix time at simulated time 0 (announcement expiry and message windows use it)."""
CHARTER_BYTES = 1000
"""Modelled size of the charter item's value (a BEP 44 value is at most 1000 bytes)."""
HEADER = 21
"""Datagram framing of a request or reply: one type byte and a 20-byte message id."""
NODE_BYTES = 34
"""One contact in a ``nodes`` list (id, host, port, msgpack overhead)."""


KINDS = ("heartbeat", "membership", "state", "charter", "election")
"""What control traffic is for: the coordinator's heartbeats; listing and announcing members;
reading and writing coordinator-state items (and blocklist pages); the charter; term claims."""


def _packed(obj: object) -> int:
    return HEADER + len(msgpack.packb(obj, use_bin_type=True))


# -- the clock -------------------------------------------------------------------------------


class EventLoop:
    """Discrete events on a simulated clock (deterministic: ties run in scheduling order)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._n = 0

    def at(self, when: float, fn: Callable[[], None]) -> None:
        self._n += 1
        heapq.heappush(self._heap, (max(when, self.now), self._n, fn))

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        self.at(self.now + delay, fn)

    def run_until(self, end: float, stop: Callable[[], bool] = lambda: False) -> bool:
        """Run events up to ``end``; True when ``stop()`` held after some event."""
        while self._heap and self._heap[0][0] <= end:
            self.now, _, fn = heapq.heappop(self._heap)
            fn()
            if stop():
                return True
        self.now = max(self.now, end)
        return False


# -- traffic ---------------------------------------------------------------------------------


class Traffic:
    """Bytes and messages each node sent and received, by kind, since the last reset."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.since = 0.0
        self.reset(0.0)

    def count(self, src: int, dst: int, kind: str, nbytes: int) -> None:
        b, m = self.bytes[kind], self.msgs[kind]
        b[src] += nbytes
        b[dst] += nbytes
        m[src] += 1
        m[dst] += 1

    def reset(self, now: float) -> None:
        self.bytes = {k: np.zeros(self.nodes, dtype=np.int64) for k in KINDS}
        self.msgs = {k: np.zeros(self.nodes, dtype=np.int64) for k in KINDS}
        self.since = now

    def per_node(self, node: int, kinds: Iterable[str] = KINDS) -> tuple[int, int]:
        return (int(sum(self.bytes[k][node] for k in kinds)),
                int(sum(self.msgs[k][node] for k in kinds)))


# -- the network and the DHT model -----------------------------------------------------------


class Network:
    """Latency, loss and byte counting between node indices."""

    def __init__(self, loop: EventLoop, rng: random.Random, latency: float, jitter: float,
                 loss: float, traffic: Traffic) -> None:
        self.loop, self.rng, self.traffic = loop, rng, traffic
        self.latency, self.jitter, self.loss = latency, jitter, loss
        self.down: set[int] = set()

    def delay(self) -> float:
        return self.latency + self.rng.random() * self.jitter

    def send(self, src: int, dst: int, kind: str, nbytes: int,
             deliver: Callable[[], None] | None = None) -> None:
        """One datagram: counted at both ends, delivered after a latency unless lost."""
        self.traffic.count(src, dst, kind, nbytes)
        if deliver is None or dst in self.down or self.rng.random() < self.loss:
            return
        self.loop.after(self.delay(), lambda: None if dst in self.down else deliver())


class SimDHT:
    """The modelled DHT: one shared store, real validators, Kademlia-shaped traffic."""

    def __init__(self, net: Network, ids: list[bytes], k: int = 20, alpha: int = 3) -> None:
        self.net, self.ids, self.k, self.alpha = net, ids, k, alpha
        self.topics: dict[bytes, dict[PeerId, Announcement]] = defaultdict(dict)
        self.mutable: dict[bytes, MutableItem] = {}
        self.immutable: dict[bytes, bytes] = {}
        self._order: dict[bytes, list[int]] = {}
        self._close: dict[tuple[bytes, int], list[int]] = {}
        path = list(range(len(ids)))
        net.rng.shuffle(path)
        self._path = np.array(path + path, dtype=np.int64)  # twice: a window never wraps
        self._next = 0
        self._replicas: dict[tuple[bytes, int], np.ndarray] = {}
        self._ann_bytes: dict[bytes, int] = {}
        self._req = _packed(["find", [b"\0" * 20, b"\0" * 20]])
        self._found = _packed({"nodes": b"\0" * (NODE_BYTES * k), "token": b"\0" * 8})
        self.version = 0
        """Bumped when a topic changes (readers rebuild their decoded view then)."""

    def replicas(self, target: bytes) -> list[int]:
        """The ``k`` live nodes closest to ``target`` by XOR distance."""
        key = (target, len(self.net.down))
        if key not in self._close:
            if target not in self._order:
                t = int.from_bytes(target, "big")
                self._order[target] = sorted(
                    range(len(self.ids)), key=lambda i: int.from_bytes(self.ids[i], "big") ^ t)
            self._close[key] = [i for i in self._order[target]
                                if i not in self.net.down][:self.k]
        return self._close[key]

    def hops(self) -> int:
        return max(1, math.ceil(math.log2(max(2, len(self.ids)))))

    def lookup(self, me: int, target: bytes, kind: str,
               answer: Callable[[int], int] | int = 0) -> float:
        """Charge one lookup (``answer``: the bytes of each replica's value reply, or
        ``answer(replica)`` where they differ); returns its duration (one round trip per
        ``alpha`` queries in flight).

        The queries on the way go to nodes taken in turn from a seeded permutation (so the
        load spreads as over random routing paths) and are counted in bulk."""
        rf, n = self._req + self._found, len(self.ids)
        b, m = self.net.traffic.bytes[kind], self.net.traffic.msgs[kind]
        ways = min(n - 1, self.alpha * self.hops())
        on_way = self._path[self._next:self._next + ways]
        self._next = (self._next + ways) % n
        b[on_way] += rf
        m[on_way] += 2
        b[me] += ways * rf
        m[me] += 2 * ways
        if callable(answer):
            for r in self.replicas(target):
                nbytes = rf + answer(r)
                b[r] += nbytes
                m[r] += 2
                b[me] += nbytes
                m[me] += 2
        else:
            key = (target, len(self.net.down))
            reps = self._replicas.get(key)
            if reps is None:
                reps = self._replicas[key] = np.array(self.replicas(target), dtype=np.int64)
            b[reps] += rf + answer
            m[reps] += 2
            b[me] += len(reps) * (rf + answer)
            m[me] += 2 * len(reps)
        rounds = self.hops() // 2 + 2
        return rounds * 2 * (self.net.latency + self.net.jitter / 2)

    def store(self, me: int, target: bytes, kind: str, nbytes: int) -> float:
        """A lookup then a write of ``nbytes`` to each replica."""
        took = self.lookup(me, target, kind)
        for r in self.replicas(target):
            self.net.send(me, r, kind, HEADER + nbytes)
        return took

    # -- topics (membership) ---------------------------------------------------------------

    def announce(self, me: int, topic: bytes, ann: Announcement, now: float) -> float:
        """Store ``ann``: a topic lookup (each replica answers with the first page of its
        entries, as ``publish_announcement``'s lookup does), then a write to each replica."""
        ann.check(topic)  # what each storing node does with it (a real verify)
        wire = _packed(announcement_to_wire(ann))
        self._ann_bytes[ann.signature] = wire
        target = mutable_target(topic)
        held = [a for a in self.topics[topic].values() if a.expires_at > now][:MAX_PER_TOPIC]
        page = min(PEERS_PAGE_BYTES, sum(self._ann_bytes[a.signature] for a in held))
        took = self.lookup(me, target, "membership", page)
        for r in self.replicas(target):
            self.net.send(me, r, "membership", HEADER + wire)
        self.topics[topic][ann.peer_id] = ann
        self.version += 1
        return took

    def get_peers(self, me: int, topic: bytes, now: float) -> tuple[list[Announcement], float]:
        """Every live announcement under ``topic`` and the lookup's duration; each
        replica answers with its (at most ``MAX_PER_TOPIC``) entries in pages."""
        live = [a for a in self.topics[topic].values() if a.expires_at > now]
        held = live[:MAX_PER_TOPIC]
        size = sum(self._ann_bytes[a.signature] for a in held)
        pages = max(1, math.ceil(size / PEERS_PAGE_BYTES))
        req = _packed(["get_peers", [b"\0" * 20, topic, b""]])
        paging = set(self.replicas(mutable_target(topic))[:MAX_PAGE_SOURCES])

        def answer(r: int) -> int:
            if r not in paging:  # its first page only (dht.node.MAX_PAGE_SOURCES)
                return min(size, PEERS_PAGE_BYTES)
            for _ in range(pages - 1):  # the follow-up pages, one request each
                self.net.send(me, r, "membership", req)
            return size + HEADER * (pages - 1)
        return live, self.lookup(me, mutable_target(topic), "membership", answer)

    # -- items -------------------------------------------------------------------------------

    def put_mutable(self, me: int, item: MutableItem, kind: str) -> float:
        validate_state_item(item)
        old = self.mutable.get(item.target)
        if old is not None and old.seq > item.seq:
            raise ItemError(302, "sequence number less than current")
        self.mutable[item.target] = item
        return self.store(me, item.target, kind, _packed(mutable_to_wire(item)))

    def get_mutable(self, me: int, target: bytes, kind: str) -> tuple[MutableItem | None, float]:
        item = self.mutable.get(target)
        size = _packed(mutable_to_wire(item)) if item is not None else 0
        took = self.lookup(me, target, kind, size)
        if item is not None:
            validate_state_item(item)  # the reader's validators (a cached verdict)
        return item, took

    def put_immutable(self, me: int, target: bytes, value: bytes, kind: str) -> float:
        self.immutable[target] = value
        return self.store(me, target, kind, len(value) + HEADER)

    def get_immutable(self, me: int, target: bytes, kind: str) -> tuple[bytes | None, float]:
        value = self.immutable.get(target)
        took = self.lookup(me, target, kind, len(value or b""))
        return value, took


def _run(coro):
    """Run a coroutine that never suspends (a resolve whose fetches answer at once)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("a simulated coroutine suspended")


# -- members ---------------------------------------------------------------------------------


@dataclass
class SimCharter:
    """The modelled charter: a counter with the admins and policy it carries."""

    counter: int = 1
    admins: tuple[PeerId, ...] = ()
    policy: dict = field(default_factory=lambda: {"require_hardware": False})

    def ownership(self) -> SimpleNamespace:
        """What a verified charter gives the core (the fields it reads)."""
        return SimpleNamespace(
            counter=self.counter, sign_counts={},
            admins={p: SimpleNamespace(expires=None) for p in self.admins},
            policy=SimpleNamespace(require_hardware=self.policy["require_hardware"]))


class Member:
    """One simulated member: its key, its DHT id, its real control core."""

    def __init__(self, sim: Sim, index: int, key: PeerKey, tflops: float) -> None:
        self.sim, self.index, self.key = sim, index, key
        self.peer_id = key.peer_id
        self.node_id = mutable_target(key.public_bytes)[:20]
        self.record = MemberRecord(self.peer_id, tflops, dht=("10.0.0.1", 1 + index))
        self.core = ControlCore(key, sim.swarm_id, 0.0, timing=sim.timing)
        """Its control core (a fresh one each time it joins: :meth:`Sim.join`)."""
        self.replay = ReplayGuard()
        self.alive = True
        self.started = False

    @property
    def controller(self) -> Controller:
        return self.core.controller

    @property
    def charter(self) -> int:
        """The highest charter counter this member accepted."""
        return self.core.charter_floor

    def __repr__(self) -> str:
        return f"Member({self.index}, {self.peer_id.short()})"


class Polling:
    """The read policy before issue 19 (:mod:`swarm.control.plane` at that time), in the
    :class:`~swarm.control.sync.Sync` core's shape: every member lists the membership topic
    every :data:`VIEW_INTERVAL`, reads its coordinator's state item (all members' items while
    it follows nobody; a coordinator: all, for rivals) as often, and fetches the charter
    every :data:`CHARTER_REFRESH`; heartbeats' digests are ignored, no hello is sent."""

    VIEW_INTERVAL = 1.0
    CHARTER_REFRESH = 5.0

    def __init__(self, now: float, phase: float) -> None:
        self.timing = SyncTiming(rival_batch=1 << 30)
        self.coordinating = False
        self.counts: dict[Fetch, int] = dict.fromkeys(Fetch, 0)
        self._next = {Fetch.VIEW: now + phase, Fetch.STATE: now + phase + 0.5,
                      Fetch.CHARTER: now + phase * self.CHARTER_REFRESH}

    def heard(self, digest: Digest | None, now: float) -> None:
        """Polling finds changes on its own timers."""

    def have(self, view: bytes | None = None, charter: int | None = None,
             members: int | None = None) -> None:
        """Polling reads whatever it holds."""

    def role(self, coordinating: bool, now: float) -> None:
        self.coordinating = coordinating

    def nudged(self, now: float) -> None:
        """Polling reads the topic every second anyway."""

    def done(self, fetch: Fetch, now: float, ok: bool = True) -> None:
        """Polling's timers do not wait for reads."""

    def mode(self, now: float) -> Mode:
        return Mode.COORDINATING if self.coordinating else Mode.FOLLOWING

    def due(self, now: float) -> list[Fetch]:
        out = []
        for fetch, period in ((Fetch.VIEW, self.VIEW_INTERVAL),
                              (Fetch.STATE, self.VIEW_INTERVAL),
                              (Fetch.CHARTER, self.CHARTER_REFRESH)):
            if now >= self._next[fetch]:
                self._next[fetch] += period
                if fetch is Fetch.STATE and self.coordinating:
                    fetch = Fetch.RIVALS  # a coordinator's state check: every rival's item
                self.counts[fetch] += 1
                out.append(fetch)
        return out


class PollingAdapter:
    """Members read the DHT by the :class:`Polling` policy (the before figures)."""

    name = "poll"

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def reads(self, m: Member, now: float) -> Polling:
        return Polling(now, self.sim.rng.random())


class SyncAdapter:
    """Today's read policy: the sans-IO :class:`swarm.control.sync.Sync` core decides every
    DHT read (heartbeats carry its :class:`~swarm.control.sync.Digest`), timed as
    :class:`swarm.control.core.ControlCore` times it (silence at ``Timing.silence``)."""

    name = "sync"

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def reads(self, m: Member, now: float) -> Sync:
        s = self.sim
        return Sync(now, SyncTiming(silence=s.timing.silence),
                    rng=random.Random(s.rng.random()))


Adapter = PollingAdapter | SyncAdapter

MESSAGE_KINDS = {"hb": "heartbeat", "kick": "heartbeat", "hello": "membership",
                 "bye": "membership",
                 "handoff": "election", "claim": "election", "liar": "state", "fwd": "state",
                 "fwdauto": "state",
                 "cmd": "state"}
"""The traffic kind each control message counts under."""


# -- the simulation --------------------------------------------------------------------------


class Sim:
    """N members over a simulated network and DHT, each with a real :class:`ControlCore`
    (the one :class:`swarm.control.plane.ControlPlane` drives), its actions carried out
    here."""

    def __init__(self, members: int, *, seed: int = 1, latency: float = 0.02,
                 jitter: float = 0.03, loss: float = 0.0, timing: Timing | None = None,
                 adapter: Callable[[Sim], Adapter] = PollingAdapter,
                 k: int = 20, alpha: int = 3, announce_ttl: float = ANNOUNCE_TTL) -> None:
        self.rng = random.Random(seed)
        self.loop = EventLoop()
        self.traffic = Traffic(members)
        self.net = Network(self.loop, self.rng, latency, jitter, loss, self.traffic)
        self.timing = timing or Timing()
        self.announce_ttl = announce_ttl
        self.swarm_key = PeerKey.from_seed(self.rng.randbytes(32))
        self.swarm_id = mutable_target(self.swarm_key.public_bytes, b"swarm")
        self.topic = membership_topic(self.swarm_id)
        self.salt = state_salt(self.swarm_id)
        self.charter = SimCharter()
        self.adapter = adapter(self)
        keys = [PeerKey.from_seed(self.rng.randbytes(32)) for _ in range(members)]
        self.members = [Member(self, i, k, round(self.rng.uniform(0.5, 5.0), 3))
                        for i, k in enumerate(keys)]
        self.by_peer = {m.peer_id: m for m in self.members}
        self.dht = SimDHT(self.net, [m.node_id for m in self.members], k, alpha)
        self._listed: tuple[int, tuple[tuple[MemberRecord, float], ...]] = (-1, ())
        self._decoded: dict[bytes, MemberRecord] = {}
        """Each announcement's record, decoded (and its signature checked) once."""
        self._items: dict[bytes, StateItem] = {}
        self.watch: Callable[[Member], None] | None = None
        """Called after each event that may change a member's controller."""
        self.state_read_delay = 0.0
        """Simulated seconds before a :class:`~swarm.control.core.ReadStates` is answered
        (0: at once, as the figures in bench/ assume): the real reads take lookups, and
        messages that arrive meanwhile reach the core first (issue 48, attack 1)."""

    # -- plumbing ----------------------------------------------------------------------------

    def new_core(self, m: Member, now: float) -> ControlCore:
        return ControlCore(m.key, self.swarm_id, now, timing=self.timing,
                           announce_ttl=self.announce_ttl,
                           reads=self.adapter.reads(m, now))

    def wall(self) -> float:
        return EPOCH + self.loop.now

    def every(self, m: Member, period: float, first: float, fn: Callable[[], None]) -> None:
        def run() -> None:
            if m.alive:
                fn()
                self.loop.after(period, run)
        self.loop.at(self.loop.now + first, run)

    def live(self) -> list[Member]:
        return [m for m in self.members if m.alive and m.started
                and m.controller.role is not Duty.STOPPED]

    def feed(self, m: Member, event) -> None:
        """One event for ``m``'s core, now; its actions carried out."""
        if m.alive:
            self.do(m, m.core.handle(event, self.loop.now, self.wall()))

    # -- membership --------------------------------------------------------------------------

    def announce(self, m: Member) -> None:
        """Announce ``m`` (a real signed record) for the node's ``announce_ttl``."""
        ann = Announcement.create(m.key, m.peer_id, self.topic, m.record.encode(),
                                  self.wall() + self.announce_ttl)
        self.dht.announce(m.index, self.topic, ann, self.wall())

    def listed(self) -> tuple[tuple[MemberRecord, float], ...]:
        """The live announcements as a full listing decodes them (rebuilt once per change
        of the store: each announcement's record decoded and its signature checked once)."""
        if self._listed[0] != self.dht.version:
            out = []
            for ann in self.dht.topics[self.topic].values():
                rec = self._decoded.get(ann.signature)
                if rec is None:
                    ann.check(self.topic)
                    rec = self._decoded[ann.signature] = MemberRecord.decode(ann.record,
                                                                             ann.peer_id)
                out.append((rec, ann.expires_at))
            self._listed = (self.dht.version, tuple(out))
        wall = self.wall()
        return tuple(x for x in self._listed[1] if x[1] >= wall)

    # -- carrying out a core's actions ---------------------------------------------------------

    def do(self, m: Member, actions: list) -> None:
        """Carry out ``m``'s core's actions (what the plane's ``_do_now`` does, on the
        modelled network and DHT)."""
        for act in actions:
            if isinstance(act, cc.ReadView):
                _, took = self.dht.get_peers(m.index, self.topic, self.wall())
                listed = self.listed()
                self.loop.after(took, lambda listed=listed: self.feed(m, cc.ViewRead(listed, m.record)))
            elif isinstance(act, cc.ReadStates):
                kind = "election" if act.purpose is cc.Purpose.CLAIM_CAS else "state"
                found = (self.state_of(m, p, kind, act.known) for p in act.peers)
                read = cc.StatesRead(act, tuple(s for s in found if s is not None))
                if self.state_read_delay:
                    self.loop.after(self.state_read_delay, lambda read=read: self.feed(m, read))
                else:
                    self.feed(m, read)
            elif isinstance(act, cc.ResolveItem):
                self.resolve_item(m, act)
            elif isinstance(act, cc.ReadCharter):
                ch = self.charter.ownership()
                took = self.dht.lookup(m.index, mutable_target(self.swarm_key.public_bytes,
                                                               b"swarm"), "charter",
                                       CHARTER_BYTES)
                self.loop.after(took, lambda ch=ch: self.feed(m, cc.CharterRead(ch)))
            elif isinstance(act, cc.PutItem):
                self.put_item(m, act)
            elif isinstance(act, cc.Follow):  # the node re-announces at once
                m.record = replace(m.record, follows=follows(act.term, act.coordinator))
                if m.started:
                    self.announce(m)
            elif isinstance(act, cc.Send):
                for page in act.pages:
                    self.dht.put_immutable(m.index, page.target, page.encode(), "state")
                kind = MESSAGE_KINDS.get(msgpack.unpackb(act.payload)["k"], "state")
                for peer in act.to:
                    self.send(m, peer, kind, act.payload)
        if self.watch is not None:
            self.watch(m)

    def state_of(self, m: Member, peer: PeerId, kind: str,
                 known: CoordinatorState | None = None) -> CoordinatorState | None:
        item, _ = self.dht.get_mutable(m.index, mutable_target(peer.raw, self.salt), kind)
        if item is None:
            return None
        try:
            if item.signature not in self._items:  # decoded once for all readers
                self._items[item.signature] = StateItem.decode(item.value)
            return _run(self._resolve(m, self._items[item.signature], kind, known))
        except ProtocolError:
            return None

    async def _resolve(self, m: Member, item: StateItem, kind: str,
                       known: CoordinatorState | None,
                       took: list[float] | None = None) -> CoordinatorState:
        """The real :func:`~swarm.control.state.resolve`, its page reads from the modelled
        DHT (their lookup times added to ``took``)."""
        async def page(target: bytes) -> bytes | None:
            value, t = self.dht.get_immutable(m.index, target, kind)
            if took is not None:
                took.append(t)
            return value
        return await resolve(item, page, known)

    def resolve_item(self, m: Member, act: cc.ResolveItem) -> None:
        took: list[float] = []
        state, why = None, ""
        try:
            state = _run(self._resolve(m, act.item, "state", act.known, took))
        except ProtocolError as exc:
            why = str(exc)
        self.loop.after(sum(took), lambda: self.feed(m, cc.ItemResolved(act, state, why)))

    def put_item(self, m: Member, act: cc.PutItem) -> None:
        for page in act.pages:
            self.dht.put_immutable(m.index, page.target, page.encode(), "state")
        ok, why, took, stored = True, "", 0.0, None
        try:
            item = MutableItem.create(m.key, act.state.encode_item(), act.state.seq, self.salt)
            took = self.dht.put_mutable(m.index, item, "election" if act.claim else "state")
        except ItemError as exc:
            ok, why = False, str(exc)
            if act.claim and exc.code == 302:
                held = self.dht.mutable.get(mutable_target(m.key.public_bytes, self.salt))
                stored = held.seq if held is not None else None
        self.loop.after(took, lambda: self.feed(m, cc.PutDone(act, ok, why, stored)))

    def send(self, m: Member, peer: PeerId, kind: str, msg: bytes) -> None:
        """A control message in a per-recipient signed envelope (the DHT's messages)."""
        dst = self.by_peer.get(peer)
        if dst is None:
            return
        env = Envelope.seal(m.key, m.peer_id, dst.node_id, msg, self.wall())
        nbytes = _packed(["message", [b"\0" * 20, env.to_wire()]])
        self.net.send(m.index, dst.index, kind, nbytes,
                      lambda: self.receive(dst, env, m.peer_id, m.record.dht))
        self.net.send(dst.index, m.index, kind, _packed({"ok": True}))

    def receive(self, m: Member, env: Envelope, sender: PeerId, addr: tuple[str, int]) -> None:
        """The recipient's side: the DHT's replay guard, then the core."""
        if not m.alive or not m.started:
            return
        try:
            m.replay.admit(env, m.node_id, self.wall())
        except ItemError:
            return
        self.feed(m, cc.MessageReceived(sender, addr, env.payload))

    # -- scenarios ---------------------------------------------------------------------------

    def start(self, window: float = 1.0, hold: int = 0) -> None:
        """Every member but the last ``hold`` (see :meth:`join`) starts at a random moment
        within ``window`` s."""
        for m in self.members[:len(self.members) - hold]:
            self.loop.at(self.rng.random() * window, lambda m=m: self.join(m))

    def join(self, m: Member) -> None:
        """``m`` starts now: it announces itself (and again before a third of the lifetime
        has passed, less up to a fifth at random, as nodes do), its core starts and ticks."""
        m.started = True
        m.core = self.new_core(m, self.loop.now)
        self.every(m, self.announce_ttl / 3 * self.rng.uniform(0.8, 1.0), 0.0,
                   lambda: self.announce(m))
        self.feed(m, cc.Start())
        self.every(m, TICK, self.rng.random() * TICK, lambda: self.feed(m, cc.Tick()))

    def restart(self, m: Member, state: CoordinatorState | None, tflops: float | None = None,
                ) -> None:
        """``m`` (killed) starts again from its old data dir (``state``), its benchmark
        maybe faster now (``tflops``)."""
        m.alive = True
        self.net.down.discard(m.index)
        if tflops is not None:
            m.record = replace(m.record, tflops=tflops)
        m.started = True
        m.core = ControlCore(m.key, self.swarm_id, self.loop.now, timing=self.timing,
                             state=state, announce_ttl=self.announce_ttl,
                             reads=self.adapter.reads(m, self.loop.now))
        period = self.announce_ttl / 3 * self.rng.uniform(0.8, 1.0)
        self.announce(m)  # a node announces before its control plane starts
        self.every(m, period, period, lambda: self.announce(m))
        self.feed(m, cc.Start())
        self.every(m, TICK, self.rng.random() * TICK, lambda: self.feed(m, cc.Tick()))

    def coordinator(self) -> Member | None:
        """The member every live member follows, when they all agree."""
        live = self.live()
        coords = {m.controller.coordinator for m in live}
        if len(coords) != 1 or None in coords:
            return None
        m = self.by_peer.get(next(iter(coords)))
        return m if m is not None and m.alive and m.controller.role is Duty.COORDINATOR \
            else None

    def converge(self, limit: float, step: float = 0.05) -> float | None:
        """Run until one coordinator is followed by all (checked every ``step`` simulated
        seconds); the simulated time it took."""
        t0 = self.loop.now
        while self.loop.now < t0 + limit:
            self.loop.run_until(self.loop.now + step)
            if self.coordinator() is not None:
                return self.loop.now - t0
        return None

    def kill(self, m: Member) -> None:
        m.alive = False
        self.net.down.add(m.index)

    def block(self, target: Member, limit: float = 30.0) -> float | None:
        """An owner's block applied by the coordinator: simulated seconds until every live
        member refuses ``target``."""
        coord = self.coordinator()
        assert coord is not None, "no coordinator to apply the block"
        t0 = self.loop.now
        waiting = {m.index for m in self.live() if m is not target}
        self.watch = lambda m: waiting.discard(m.index) \
            if target.peer_id in m.controller.blocked() else None
        coord.controller.command(CheckedCommand("block", target.peer_id, "sim", "owner",
                                         int(self.wall()), coord.controller.term), t0)
        self.do(coord, coord.core.pump())
        try:
            done = self.loop.run_until(t0 + limit, lambda: not waiting)
        finally:
            self.watch = None
        return self.loop.now - t0 if done else None

    def change_charter(self, limit: float = 30.0) -> float | None:
        """The owner publishes a charter with a new policy: simulated seconds until every
        live member has it and follows a coordinator state that carries it."""
        t0 = self.loop.now
        self.charter = SimCharter(self.charter.counter + 1, (),
                               {"require_hardware": True})
        want = self.charter.counter
        pol = self.charter.policy

        def has(m: Member) -> bool:
            st = m.controller.state
            return m.charter >= want and st is not None and st.policy == pol
        waiting = {m.index for m in self.live()}
        self.watch = lambda m: waiting.discard(m.index) if has(m) \
            or m.controller.role is Duty.STOPPED else None
        try:
            done = self.loop.run_until(t0 + limit, lambda: not waiting)
        finally:
            self.watch = None
        return self.loop.now - t0 if done else None

    def measure(self, seconds: float) -> dict:
        """Steady-state control traffic per node per second over ``seconds``."""
        self.traffic.reset(self.loop.now)
        self.loop.run_until(self.loop.now + seconds)
        coord = self.coordinator()
        return traffic_summary(self.traffic, [m.index for m in self.live()],
                               coord.index if coord else None, seconds)


def traffic_summary(t: Traffic, nodes: list[int], coord: int | None, seconds: float) -> dict:
    """Median, mean and max bytes and messages per node per second (members apart from the
    coordinator), by kind and in total. The mean is the swarm's total cost per member; it
    is also the fair figure for a window shorter than a timer's period (each member's
    timer runs at its own phase, so the median can miss it)."""
    out: dict = {}
    members = [n for n in nodes if n != coord]
    for label, kinds in [("total", KINDS)] + [(k, (k,)) for k in KINDS]:
        per = [t.per_node(n, kinds) for n in members]
        b = [x[0] / seconds for x in per] or [0.0]
        m = [x[1] / seconds for x in per] or [0.0]
        row = {"bytes_median": statistics.median(b), "bytes_mean": statistics.fmean(b),
               "bytes_max": max(b),
               "msgs_median": statistics.median(m), "msgs_max": max(m)}
        if coord is not None:
            cb, cm = t.per_node(coord, kinds)
            row.update(coord_bytes=cb / seconds, coord_msgs=cm / seconds)
        out[label] = row
    return out


def scenario(members: int, *, seed: int = 1, window: float = 10.0,
             adapter: Callable[[Sim], Adapter] = PollingAdapter, churn: float = 0.0,
             **kw) -> dict:
    """The figures for one swarm size: cold-start election, traffic over ``window`` s
    (while ``churn`` members a minute join, held back from the cold start), a block, a
    charter change, failover after the coordinator dies."""
    import time
    started = time.perf_counter()
    sim = Sim(members, seed=seed, adapter=adapter, **kw)
    joins = min(members // 2, round(churn * window / 60))
    sim.start(hold=joins)
    cold = sim.converge(60.0)
    out: dict = {"members": members, "adapter": sim.adapter.name, "seed": seed,
                 "loss": sim.net.loss, "churn_per_min": churn, "cold_start_s": cold}
    if cold is None:
        return out
    sim.loop.run_until(sim.loop.now + 3.0)
    for i, m in enumerate(sim.members[members - joins:]):
        sim.loop.after((i + 0.5) * window / joins, lambda m=m: sim.join(m))
    out["traffic"] = sim.measure(window)
    coord = sim.coordinator()
    victim = next(m for m in sim.live() if coord is not None and m is not coord)
    out["block_s"] = sim.block(victim)
    out["charter_s"] = sim.change_charter()
    coord = sim.coordinator()
    if coord is not None:
        sim.kill(coord)
        out["failover_s"] = sim.converge(60.0)
    out["wall_s"] = round(time.perf_counter() - started, 2)
    return out


__all__ = ["EventLoop", "Network", "PollingAdapter", "Sim", "SimDHT", "SyncAdapter", "Traffic",
           "adapters", "scenario"]


def adapters() -> dict[str, Callable[[Sim], Adapter]]:
    """The refresh policies the simulation can drive, by name."""
    return {PollingAdapter.name: PollingAdapter, SyncAdapter.name: SyncAdapter}
