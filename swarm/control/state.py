"""The coordinator's state and the signed control messages that carry it (sans-IO).

A :class:`CoordinatorState` is what survives a change of coordinator: the term (fencing
token), the blocklist, the admins and the policy. Each coordinator signs its own copy into
the DHT (under its peer key) and sends it in every heartbeat; followers keep the latest one
in their data dir, so the blocklist outlives the coordinator and a full restart.

Control messages are :class:`Envelope` s: msgpack, size-limited, signed by the sender's
peer key over a domain tag and the swarm id (so nothing replays into another swarm).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgpack

from identity.keys import PeerId, PeerKey, verify
from swarm.errors import ProtocolError

MAX_MESSAGE = 3800  # fits one DHT message (4096 bytes) with room for its envelope
MAX_REASON = 100
MAX_BLOCKED = 12  # the compact form must fit one BEP 44 item (1000 bytes)
MAX_ADMINS = 4
MAX_POLICY = 4
BY = ("owner", "admin", "coordinator")  # on the wire as the index
MAX_ITEM = 1000
DOMAIN = b"swarm-control/v1\0"
KINDS = ("hb", "handoff", "endorse", "kick", "cmd", "liar", "fwd", "fwdauto")


@dataclass(frozen=True)
class BlockEntry:
    """One blocked peer."""

    peer: PeerId
    """The blocked peer."""
    reason: str = ""
    """Why, for operators (at most 100 characters)."""
    by: str = "coordinator"
    """Which role blocked it: owner, admin or coordinator."""
    at: int = 0
    """Unix time of the block."""


@dataclass(frozen=True)
class CoordinatorState:
    """The control-plane state a coordinator holds and hands forward."""

    swarm: bytes
    """The swarm id (BEP 44 target of the charter, 20 bytes)."""
    term: int
    """Fencing token: grows by one at each change of coordinator."""
    seq: int
    """Version along the whole chain of states (also the BEP 44 seq of the DHT item)."""
    coordinator: PeerId
    """Who coordinates at this term."""
    blocked: tuple[BlockEntry, ...] = ()
    """Blocked peers, sorted by id."""
    admins: tuple[PeerId, ...] = ()
    """Admin peers (from the owner's delegations), sorted."""
    policy: dict[str, str | int | float | bool] = field(default_factory=dict)
    """Swarm policy knobs (small scalars)."""
    prev: bytes = b""
    """SHA-256 of the previous state's encoding: the chain a successor continues."""

    @property
    def blocked_ids(self) -> frozenset[PeerId]:
        return frozenset(b.peer for b in self.blocked)

    def successor(self, **changes) -> CoordinatorState:
        """The next state in the chain (seq + 1, prev = this one's digest)."""
        return replace(self, seq=self.seq + 1, prev=self.digest(), **changes)

    def with_block(self, entry: BlockEntry) -> CoordinatorState:
        kept = [b for b in self.blocked if b.peer != entry.peer]
        if len(kept) >= MAX_BLOCKED:
            raise ProtocolError(f"blocklist full ({MAX_BLOCKED} entries)")
        return self.successor(blocked=tuple(sorted([*kept, entry], key=lambda b: b.peer.raw)))

    def without_block(self, peer: PeerId) -> CoordinatorState:
        return self.successor(blocked=tuple(b for b in self.blocked if b.peer != peer))

    # -- encoding ------------------------------------------------------------------------

    def to_obj(self, compact: bool = False) -> dict:
        """As a msgpack-ready map; ``compact`` leaves out block reasons (the DHT copy)."""
        return {
            "v": 1, "sw": self.swarm, "t": self.term, "q": self.seq, "c": self.coordinator.raw,
            "b": [[b.peer.raw, "" if compact else b.reason, BY.index(b.by), b.at]
                  for b in self.blocked],
            "a": [a.raw for a in self.admins], "p": dict(sorted(self.policy.items())),
            "pr": self.prev,
        }

    def encode(self) -> bytes:
        return msgpack.packb(self.to_obj(), use_bin_type=True)

    def encode_compact(self) -> bytes:
        """The form stored in the DHT: at most MAX_ITEM bytes."""
        data = msgpack.packb(self.to_obj(compact=True), use_bin_type=True)
        if len(data) > MAX_ITEM - 20:  # bencoding adds a length prefix
            raise ProtocolError(f"coordinator state is {len(data)} bytes compacted")
        return data

    def digest(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()

    @classmethod
    def from_obj(cls, o: object) -> CoordinatorState:
        try:
            if not isinstance(o, dict) or o.get("v") != 1:
                raise ValueError("not a version-1 state")
            sw, t, q, c, pr = o["sw"], o["t"], o["q"], o["c"], o["pr"]
            _need(isinstance(sw, bytes) and len(sw) == 20, "swarm id")
            _need(type(t) is int and 0 <= t < 2**62 and type(q) is int and 0 <= q < 2**62,
                  "term/seq")
            _need(isinstance(pr, bytes) and len(pr) in (0, 32), "prev")
            blocked = []
            _need(isinstance(o["b"], list) and len(o["b"]) <= MAX_BLOCKED, "blocklist")
            for item in o["b"]:
                _need(isinstance(item, list) and len(item) == 4, "block entry")
                peer, reason, by, at = item
                _need(isinstance(reason, str) and len(reason) <= MAX_REASON
                      and type(by) is int and 0 <= by < len(BY) and type(at) is int,
                      "block entry")
                blocked.append(BlockEntry(PeerId(peer), reason, BY[by], at))
            _need(isinstance(o["a"], list) and len(o["a"]) <= MAX_ADMINS, "admins")
            policy = o["p"]
            _need(isinstance(policy, dict) and len(policy) <= MAX_POLICY and all(
                isinstance(k, str) and len(k) <= 24 and isinstance(v, str | int | float | bool)
                and (not isinstance(v, str) or len(v) <= 24) for k, v in policy.items()),
                "policy")
            return cls(swarm=sw, term=t, seq=q, coordinator=PeerId(c),
                       blocked=tuple(sorted(blocked, key=lambda b: b.peer.raw)),
                       admins=tuple(sorted(PeerId(a) for a in o["a"])), policy=dict(policy),
                       prev=pr)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed coordinator state: {exc}") from None

    @classmethod
    def decode(cls, data: bytes) -> CoordinatorState:
        return cls.from_obj(_unpack(data))


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"bad {what}")


def _unpack(data: bytes) -> object:
    if not isinstance(data, bytes) or len(data) > MAX_MESSAGE:
        raise ProtocolError(f"control message over {MAX_MESSAGE} bytes or not bytes")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True,
                               use_list=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"undecodable control message: {exc}") from None


# -- control messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """A signed control message between peers."""

    kind: str
    """One of KINDS: hb, handoff, endorse, kick, cmd, liar, fwd/fwdauto (forwarded blocks)."""
    sender: PeerId
    """Who signed it."""
    body: bytes
    """The kind's payload (msgpack)."""
    endorsement: bytes = b""
    """For a new coordinator's heartbeats: the handoff envelope its predecessor signed."""


def _signed_part(swarm: bytes, kind: str, body: bytes) -> bytes:
    return DOMAIN + swarm + kind.encode() + b"\0" + body


def seal(key: PeerKey, swarm: bytes, kind: str, body: bytes, endorsement: bytes = b"") -> bytes:
    """Sign and encode a control message."""
    if kind not in KINDS:
        raise ValueError(f"unknown control message kind {kind!r}")
    sig = key.sign(_signed_part(swarm, kind, body))
    out = msgpack.packb({"k": kind, "f": key.peer_id.raw, "b": body, "s": sig,
                         "e": endorsement}, use_bin_type=True)
    if len(out) > MAX_MESSAGE:
        raise ProtocolError(f"control message of {len(out)} bytes is over {MAX_MESSAGE}")
    return out


def unseal(swarm: bytes, data: bytes) -> Envelope:
    """Decode and verify a control message; :class:`ProtocolError` when it is bad."""
    o = _unpack(data)
    try:
        kind, sender, body, sig, endorsement = o["k"], PeerId(o["f"]), o["b"], o["s"], o["e"]
        if kind not in KINDS or not isinstance(body, bytes) or not isinstance(sig, bytes) \
                or not isinstance(endorsement, bytes):
            raise ValueError("bad fields")
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed control message: {exc}") from None
    if not verify(sender, sig, _signed_part(swarm, kind, body)):
        raise ProtocolError(f"bad signature on {kind!r} message from {sender.short()}")
    return Envelope(kind, sender, body, endorsement)


@dataclass(frozen=True)
class Endorsement:
    """A leaving coordinator's word that ``successor`` coordinates at ``term``."""

    term: int
    """The successor's term."""
    successor: PeerId
    """Who takes over."""

    def encode(self) -> bytes:
        return msgpack.packb({"t": self.term, "c": self.successor.raw}, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> Endorsement:
        o = _unpack(data)
        try:
            _need(type(o["t"]) is int, "endorsement")
            return cls(o["t"], PeerId(o["c"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed endorsement: {exc}") from None


@dataclass(frozen=True)
class KickOrder:
    """A coordinator's order to disconnect a peer (its shards are reassigned)."""

    term: int
    """The coordinator's term (fencing token)."""
    target: PeerId
    """The peer to disconnect."""
    reason: str = ""
    """Why, for operators."""
    at: int = 0
    """Unix time of the order; old orders are ignored."""

    def encode(self) -> bytes:
        return msgpack.packb({"t": self.term, "p": self.target.raw, "r": self.reason[:MAX_REASON],
                              "at": self.at}, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> KickOrder:
        o = _unpack(data)
        try:
            _need(type(o["t"]) is int and type(o["at"]) is int and isinstance(o["r"], str)
                  and len(o["r"]) <= MAX_REASON, "kick order")
            return cls(o["t"], PeerId(o["p"]), o["r"], o["at"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed kick order: {exc}") from None


# -- the copy in each node's data dir --------------------------------------------------------


def state_path(data_dir: Path, swarm: bytes) -> Path:
    return Path(data_dir) / f"control-{swarm.hex()}.json"


def save_state(data_dir: Path, state: CoordinatorState) -> None:
    """Persist the latest state (0600, atomic) so a full restart keeps the blocklist."""
    obj = state.to_obj()
    text = json.dumps({k: (v.hex() if isinstance(v, bytes) else v) for k, v in obj.items()
                       if k not in ("b", "a")} | {
        "b": [[p.hex(), r, by, at] for p, r, by, at in obj["b"]],
        "a": [a.hex() for a in obj["a"]]}, sort_keys=True)
    path = state_path(data_dir, state.swarm)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def load_state(data_dir: Path, swarm: bytes) -> CoordinatorState | None:
    """The persisted state for ``swarm``, or None (missing, unreadable or another swarm's)."""
    path = state_path(data_dir, swarm)
    try:
        o = json.loads(path.read_text())
        obj = {k: (bytes.fromhex(o[k]) if k in ("sw", "c", "pr") else o[k])
               for k in ("v", "sw", "t", "q", "c", "p", "pr")}
        obj["b"] = [[bytes.fromhex(p), r, by, at] for p, r, by, at in o["b"]]
        obj["a"] = [bytes.fromhex(a) for a in o["a"]]
        state = CoordinatorState.from_obj(obj)
    except (OSError, ValueError, KeyError, TypeError, ProtocolError):
        return None
    return state if state.swarm == swarm else None
