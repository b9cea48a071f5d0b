"""Membership records: who is in a swarm, how to reach them, how healthy they are.

Each peer announces its own :class:`MemberRecord` under :func:`membership_topic` with
``DHTNode.announce`` (signed by the peer's key, with an expiry) and re-announces before it
runs out; ``DHTNode.get_peers`` lists the live ones. A record is msgpack, at most
:data:`MAX_RECORD` bytes, decoded strictly (it is untrusted input): a record whose
``peer_id`` differs from the announcing key is refused.

``tasks`` and ``serving`` say what a worker is running at announce time (for ``swarm
status``): a worker re-announces within :data:`ACTIVITY_INTERVAL` seconds of a change, so
an observer's view of running work is at most that stale (plus one DHT lookup). Both are
optional on the wire (absent = idle), so records without them still decode.

``memory``, ``models`` and ``hosted`` say what a worker offers for model spans and holds
(swarm.placement places spans by them; ``swarm status`` shows them): its own word, signed by
its key like the rest. A worker that over-claims memory fails the span it is given and is
dropped like a dead one; nothing else trusts the figures.

``tflops`` is the peer's *own* benchmark: the control plane uses it for the election, the
scheduler does not (it weights shards by rates it observed itself).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from dht.announce import MAX_RECORD
from dht.items import mutable_target
from identity.files import write_private
from identity.keys import PeerId
from swarm.errors import ProtocolError
from swarm.records import Bool, Bytes, Field, Int, Maybe, Num, OneOf, Peer, Row, Schema, Seq, Str

log = logging.getLogger("swarm.members")

RECORD_VERSION = 1
SWARM_SALT = b"swarm"
ROLES = ("worker", "requester", "coordinator", "owner")
MAX_SERVING = 8
"""Requesters listed in one record (the busiest; ``tasks`` still counts all)."""
MAX_TASKS = 1 << 31
KINDS = ("native", "browser")
"""What a member is: a swarm process, or a browser tab relayed by a node."""
MODEL_ID = 12
"""Bytes of a model's content address a record carries (as :data:`FOLLOW_ID`)."""
MAX_MODELS = 4
"""Model files one record lists."""
MAX_HOSTED = 8
"""Spans one record lists (the first ones; cut further when the record would not fit)."""
MAX_BLOCK = 4096
ACTIVITY_INTERVAL = 2.0
"""Least seconds between two announcements caused by a change in running work."""


def swarm_id(swarm_pubkey: bytes) -> bytes:
    """A swarm's 20-byte id: the BEP 44 mutable target of its public key with salt b"swarm"."""
    if not isinstance(swarm_pubkey, bytes) or len(swarm_pubkey) != 32:
        raise ValueError("a swarm public key is 32 bytes")
    return mutable_target(swarm_pubkey, SWARM_SALT)


def membership_topic(sid: bytes) -> bytes:
    """The DHT topic members of swarm ``sid`` announce under."""
    if not isinstance(sid, bytes) or len(sid) != 20:
        raise ValueError("a swarm id is 20 bytes")
    return b"swarm/members/" + sid


@dataclass(frozen=True, slots=True)
class Health:
    """Figures for successor choice and scheduling; None where the platform cannot tell."""

    load: float | None = None
    """1-minute load average divided by the CPU count (1.0 = fully busy)."""
    battery: float | None = None
    """Battery charge in percent; None on mains-only machines."""
    plugged: bool | None = None
    """On mains power."""
    thermal: float | None = None
    """Hottest temperature sensor in degrees Celsius."""
    mem_free: int | None = None
    """Available memory in MiB."""


def read_health() -> Health:
    """This machine's health through psutil (each figure optional)."""

    import psutil

    load = battery = thermal = None
    plugged = None
    try:
        load = round(os.getloadavg()[0] / (os.cpu_count() or 1), 3)
    except (OSError, AttributeError):
        pass
    try:
        bat = psutil.sensors_battery()
        if bat is not None:
            battery, plugged = round(float(bat.percent), 1), bool(bat.power_plugged)
    except (AttributeError, OSError, RuntimeError):
        pass
    try:
        temps = getattr(psutil, "sensors_temperatures", lambda: {})()
        values = [t.current for ts in temps.values() for t in ts if t.current is not None]
        thermal = round(max(values), 1) if values else None
    except (AttributeError, OSError, RuntimeError):
        pass
    mem = psutil.virtual_memory().available // (1 << 20)
    return Health(load, battery, plugged, thermal, int(mem))


FOLLOW_ID = 12
"""Bytes of the coordinator's id a record's ``follows`` carries: enough that nobody can
make a key that shares them (2^96 tries), short enough to keep listings small."""


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One peer's announcement of itself in a swarm."""

    peer_id: PeerId
    """Who (must equal the announcing key)."""
    tflops: float
    """The peer's own measured matmul throughput (its claim; for elections)."""
    links: tuple[tuple[str, int], ...] = ()
    """TLS link addresses (host, port); empty for a peer that takes no incoming links."""
    dht: tuple[str, int] | None = None
    """Its DHT node's UDP address."""
    version: str = ""
    """swarm software version."""
    roles: tuple[str, ...] = ("worker",)
    """What it does here: worker, requester, coordinator, owner."""
    health: Health = field(default_factory=Health)
    """Load, battery, thermal, memory."""
    actors: tuple[str, ...] = ("matmul",)
    """Actor classes installed on it."""
    tasks: int = 0
    """Tasks queued or running on it when it announced."""
    serving: tuple[tuple[PeerId, int], ...] = ()
    """Requesters with tasks on it and how many each, busiest first (at most
    :data:`MAX_SERVING`; their counts sum to at most ``tasks``)."""
    kind: str = "native"
    """"native" (a swarm process) or "browser" (a tab, reached through ``via``)."""
    via: PeerId | None = None
    """For a browser tab: the node that relays links to it (``links`` are that node's relay
    listener; a requester dials it expecting ``via``'s key, then asks for this peer)."""
    follows: tuple[int, bytes] | None = None
    """The term and coordinator this member follows (its own word; :func:`follows` makes
    it): a reader with no state of its own (a newcomer, ``swarm status``) takes the state
    item most members follow, not the highest one any eligible signer put (issue 33,
    finding 1)."""
    memory: tuple[int, int] | None = None
    """Bytes it offers to hold for others (``--max-memory``) and bytes it holds now; None
    for a peer that serves no tasks."""
    models: tuple[bytes, ...] = ()
    """Model files it holds (``--model``): the first :data:`MODEL_ID` bytes of each content
    address (at most :data:`MAX_MODELS`)."""
    hosted: tuple[tuple[bytes, int, int], ...] = ()
    """Spans of model blocks it hosts: (model id: :data:`MODEL_ID` bytes, or empty when the
    requester did not say; first block; block count)."""
    left: bool = False
    """The member has left (its last announcement, signed by its own key and expiring later
    than any before, so it replaces them): readers drop it at once rather than when its
    live announcement expires (issue 33, finding 7)."""

    def encode(self) -> bytes:
        """msgpack of at most MAX_RECORD bytes; ``serving`` is cut short to fit if need be."""
        m = {"v": RECORD_VERSION} | RECORD.pack(self)
        serving = [[p.raw, n] for p, n in self.serving[:MAX_SERVING]]
        hosted = m.pop("hs", [])[:MAX_HOSTED]
        while True:
            if self.tasks:
                m["rt"], m["sv"] = self.tasks, serving
            if hosted:
                m["hs"] = hosted
            data = msgpack.packb(m, use_bin_type=True)
            if len(data) <= MAX_RECORD or not (serving or hosted):
                break
            (serving or hosted).pop()
            if not hosted:
                m.pop("hs", None)
        if len(data) > MAX_RECORD:
            raise ValueError(f"member record is {len(data)} bytes (> {MAX_RECORD}); "
                             "announce fewer addresses")
        return data

    @classmethod
    def decode(cls, data: bytes, announcer: PeerId | None = None) -> MemberRecord:
        """Parse an untrusted record (its fields checked as :data:`RECORD` declares them);
        ProtocolError says what is wrong."""
        if not isinstance(data, bytes) or len(data) > MAX_RECORD:
            raise ProtocolError(f"member record must be bytes of at most {MAX_RECORD}")
        try:
            m = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=MAX_RECORD,
                                max_str_len=MAX_RECORD, max_array_len=64, max_map_len=32)
        except Exception as exc:
            raise ProtocolError(f"member record is not msgpack: {exc}") from None
        if not isinstance(m, dict) or m.get("v") != RECORD_VERSION:
            raise ProtocolError("member record: unknown version")
        f = RECORD.unpack(m)
        if announcer is not None and f["peer_id"] != announcer:
            raise ProtocolError("member record names another peer than its announcer")
        tasks, serving = _activity(m.get("rt", 0), m.get("sv", []))
        if (f["kind"] == "browser") != (f["via"] is not None):
            raise ProtocolError("member record: a browser member names its relay (via), "
                                "a native one does not")
        return cls(**f, tasks=tasks, serving=serving)


_ADDR = Row((Str(253, least=1), Int(1, 65536)))
"""A host and port: [host, port]."""

RECORD = Schema("member record", (
    Field("id", "peer_id", Peer()),
    Field("tf", "tflops", Num(lo=0.0)),
    Field("ln", "links", Seq(_ADDR, 8), (), null_is_default=True),
    Field("dht", "dht", Maybe(_ADDR), None),
    Field("ver", "version", Str(32), ""),
    Field("ro", "roles", Seq(Str(32), 64), (), null_is_default=True),
    Field("ac", "actors", Seq(Str(64), 64), (), null_is_default=True),
    Field("h", "health", Row((Maybe(Num()), Maybe(Num()), Maybe(Bool()), Maybe(Num()),
                              Maybe(Int())), make=Health,
                             parts=lambda h: (h.load, h.battery, h.plugged, h.thermal,
                                              h.mem_free)),
          Health(), null_is_default=True),
    Field("k", "kind", OneOf(KINDS), "native", omit=lambda k: k == "native"),
    Field("via", "via", Maybe(Peer()), None, omit=lambda v: v is None),
    Field("fo", "follows", Maybe(Row((Int(1), Bytes((FOLLOW_ID,))))), None,
          omit=lambda v: v is None),
    Field("lf", "left", Bool(), False, omit=lambda v: not v),
    Field("mem", "memory", Maybe(Row((Int(), Int()))), None, omit=lambda v: v is None),
    Field("md", "models", Seq(Bytes((MODEL_ID,)), MAX_MODELS), (), omit=lambda v: not v),
    Field("hs", "hosted", Seq(Row((Bytes((0, MODEL_ID)), Int(0, MAX_BLOCK),
                                   Int(1, MAX_BLOCK + 1))), MAX_HOSTED), (),
          omit=lambda v: not v),
))
"""A member record as it travels (after ``"v"``; ``rt`` and ``sv``, its running work, are
cut to fit and checked together by :func:`_activity`)."""


def model_id(address: str) -> bytes:
    """What a record carries of a model's content address (a hex digest)."""
    return bytes.fromhex(address)[:MODEL_ID]


def _activity(tasks: object, serving: object) -> tuple[int, tuple[tuple[PeerId, int], ...]]:
    if type(tasks) is not int or not 0 <= tasks < MAX_TASKS:
        raise ProtocolError("member record: tasks must be an int >= 0")
    if not isinstance(serving, list) or len(serving) > MAX_SERVING:
        raise ProtocolError(f"member record: serving must be a list of at most {MAX_SERVING}")
    out = []
    for entry in serving:
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], bytes)
                or len(entry[0]) != 32 or type(entry[1]) is not int or entry[1] < 1):
            raise ProtocolError("member record: serving entries are [peer id, tasks >= 1]")
        out.append((PeerId(entry[0]), entry[1]))
    if sum(n for _, n in out) > tasks or len({p for p, _ in out}) != len(out):
        raise ProtocolError("member record: serving does not add up to its tasks")
    return tasks, tuple(out)


async def announce(dht_node, sid: bytes, record: MemberRecord, ttl: float = 120.0) -> None:
    """Announce ``record`` (this node's own) in swarm ``sid`` for ``ttl`` seconds."""
    await dht_node.announce(membership_topic(sid), record.encode(), ttl)


async def live_members(dht_node, sid: bytes) -> list[MemberRecord]:
    """Live members of swarm ``sid``, by PeerId; malformed records are skipped (logged), and
    so are members that said they left."""
    out = []
    for ann in await dht_node.get_peers(membership_topic(sid)):
        try:
            rec = MemberRecord.decode(ann.record, ann.peer_id)
        except ProtocolError as exc:
            log.info("ignoring member record from %s: %s", ann.peer_id.short(), exc)
            continue
        if not rec.left:
            out.append(rec)
    return out


NO_COORDINATE = "no-coordinate"
"""A member role: serves tasks, never coordinates."""


ANNOUNCE_TTL = 120.0
"""Seconds an announcement lasts (``NodeConfig.announce_ttl``'s default, which members use;
a member re-announces before a third of it has passed)."""




def follows(term: int, coordinator: PeerId) -> tuple[int, bytes]:
    """What a record says it follows: ``term`` and a prefix of ``coordinator``'s id."""
    return term, coordinator.raw[:FOLLOW_ID]


def announced(expires_at: float, wall: float, now: float, ttl: float = ANNOUNCE_TTL) -> float:
    """When an announcement that expires at Unix time ``expires_at`` was made, on the clock
    whose reading is ``now`` at Unix time ``wall``, taking it to have been made for ``ttl``
    seconds (a :attr:`swarm.control.election.Candidate.freshness`). Only an announcement made after a suspicion is
    a sign of life: a newer one made before it (read late, from a view that lagged) is not."""
    return now - (wall - (expires_at - ttl))


MAX_SEEN_PEERS = 32
"""DHT addresses of members kept in the data dir to start from next time."""


def _seen_path(data_dir: Path, sid: bytes) -> Path:
    return Path(data_dir) / f"peers-{sid.hex()}.json"


def save_seen_peers(data_dir: Path, sid: bytes, addrs: list[tuple[str, int]]) -> None:
    """Keep the members' DHT addresses we saw (freshest first) so that a restart joins
    through them even when every peer the URI names is gone (0600, atomic)."""
    kept = [[h, p] for h, p in dict.fromkeys(addrs)][:MAX_SEEN_PEERS]
    write_private(_seen_path(data_dir, sid), json.dumps(kept).encode())


def load_seen_peers(data_dir: Path, sid: bytes) -> list[tuple[str, int]]:
    """The addresses :func:`save_seen_peers` kept (bad entries skipped)."""
    from swarm.errors import URIError
    from swarm.uri import parse_peer

    try:
        raw = json.loads(_seen_path(data_dir, sid).read_text())
    except (OSError, ValueError):
        return []
    out: list[tuple[str, int]] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            host, port = item
            out.append(parse_peer(f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"))
        except (TypeError, ValueError, URIError):
            continue
    return out[:MAX_SEEN_PEERS]
