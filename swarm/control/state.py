"""The coordinator's state and the signed control messages that carry it (sans-IO).

A :class:`CoordinatorState` is what survives a change of coordinator: the term (fencing
token), the blocklist, the admins and the policy. Each coordinator signs its own copy into
the DHT (under its peer key) and sends it in every heartbeat; followers keep the latest one
in their data dir, so the blocklist outlives the coordinator and a full restart.

The blocklist has no fixed cap: the signed item (:meth:`CoordinatorState.encode_item`,
at most one BEP 44 value) carries the number of blocked peers, a digest of the whole list
and the target of its last :class:`BlockPage`; pages are immutable DHT items, each naming
the page before it, so the signed item pins every page. Blocks are kept in the order they
were made and pages fill from the first, so a new block changes the last page alone (or
starts a new one): a follower that holds the previous list fetches that one page
(:func:`resolve`), and a coordinator puts it alone.

Control messages are :class:`SignedMessage` s: msgpack, size-limited, signed by the
sender's peer key over a domain tag and the swarm id (so nothing replays into another
swarm). Every body has one typed codec here: :class:`CoordinatorState` (hb, handoff),
:class:`Endorsement`, :class:`KickOrder`, :class:`LiarReport`, :class:`ForwardedBlock`;
``cmd`` and ``fwd`` carry an :class:`identity.Signed` command.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import msgpack

from dht.items import MAX_VALUE, immutable_target
from identity.files import write_private
from identity.keys import PeerId, PeerKey, verify
from identity.statements import MAX_REASON, cut_reason
from swarm.errors import ProtocolError
from swarm.records import Blob, Bool, Bytes, Field, Int, OneOf, Peer, Row, Scalars, Schema, Seq, Str

MAX_MESSAGE = 3800  # fits one DHT message (4096 bytes) with room for its envelope
MAX_BLOCKLIST = 1 << 20
"""Sanity bound on a decoded blocklist (about 900 pages), not a cap a swarm meets."""
PAGE_BYTES = 900  # one page's msgpack; bencoding and the DHT item fit in 1000 bytes
MAX_ADMINS = 4
MAX_POLICY = 4
BY = ("owner", "admin", "coordinator")  # on the wire as the index
MAX_UNBLOCKS = 8
"""Recent unblocks a state carries (:class:`UnblockEntry`, newest kept): every coordinator
that continues the chain refuses a forwarded block issued before one of them."""
DOMAIN = b"swarm-control/v1\0"
KINDS = ("hb", "handoff", "endorse", "kick", "cmd", "liar", "fwd", "fwdauto", "hello",
         "bye", "claim")


@dataclass(frozen=True)
class BlockEntry:
    """One blocked peer."""

    peer: PeerId
    """The blocked peer."""
    reason: str = ""
    """Why, for operators (at most ``MAX_REASON`` UTF-8 bytes)."""
    by: str = "coordinator"
    """Which role blocked it: owner, admin or coordinator."""
    at: int = 0
    """Unix time of the block."""


@dataclass(frozen=True)
class UnblockEntry:
    """An owner's or admin's unblock the chain applied: the order every later coordinator
    checks a forwarded block against (issue 33, finding 8)."""

    peer: PeerId
    """The unblocked peer."""
    at: int
    """Unix time the unblock was issued (signed in the command)."""


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
    """Blocked peers, oldest block first (a peer at most once)."""
    admins: tuple[PeerId, ...] = ()
    """Admin peers (from the owner's delegations), sorted."""
    policy: dict[str, str | int | float | bool] = field(default_factory=dict)
    """Swarm policy knobs (small scalars)."""
    prev: bytes = b""
    """SHA-256 of the previous state's encoding: the chain a successor continues."""
    unblocked: tuple[UnblockEntry, ...] = ()
    """The latest unblocks (at most :data:`MAX_UNBLOCKS`, oldest first), copied forward like
    the blocklist: a block forwarded by a former coordinator that was issued before one of
    them is a replay, also for a coordinator that never saw the unblock itself."""

    @property
    def blocked_ids(self) -> frozenset[PeerId]:
        return frozenset(b.peer for b in self.blocked)

    def successor(self, **changes) -> CoordinatorState:
        """The next state in the chain (seq + 1, prev = this one's digest)."""
        return replace(self, seq=self.seq + 1, prev=self.digest(), **changes)

    def with_block(self, entry: BlockEntry) -> CoordinatorState:
        kept = [b for b in self.blocked if b.peer != entry.peer]
        if len(kept) >= MAX_BLOCKLIST:
            raise ProtocolError(f"blocklist over {MAX_BLOCKLIST} entries")
        return self.successor(blocked=(*kept, entry))

    def without_block(self, peer: PeerId, at: int | None = None,
                      since: float = float("-inf")) -> CoordinatorState:
        """The next state without ``peer``'s block; with ``at`` (the unblock's issue time)
        it also remembers the unblock, dropping remembered ones issued before ``since``."""
        unblocked = self.unblocked
        if at is not None:
            unblocked = (*(u for u in unblocked if u.peer != peer and u.at >= since),
                         UnblockEntry(peer, at))[-MAX_UNBLOCKS:]
        return self.successor(blocked=tuple(b for b in self.blocked if b.peer != peer),
                              unblocked=unblocked)

    def unblocked_after(self, peer: PeerId, at: int) -> bool:
        """Whether the chain applied an unblock of ``peer`` issued at ``at`` or later."""
        return any(u.peer == peer and u.at >= at for u in self.unblocked)

    # -- encoding ------------------------------------------------------------------------

    def to_obj(self) -> dict:
        """The whole state (any number of blocks) as a msgpack-ready map: the data dir's
        copy and the input of :meth:`digest`."""
        return {"v": 1} | HEAD.pack(self) | {"b": _BLOCKS.pack(self.blocked)}

    def encode(self) -> bytes:
        """The whole state, for hashing and the data dir (no size bound)."""
        return msgpack.packb(self.to_obj(), use_bin_type=True)

    def pages(self) -> list[BlockPage]:
        """The blocklist as chained pages, first page first (empty for no blocks). Pages
        fill greedily from the first, so a list's pages are a prefix of the pages of the
        same list with more blocks appended, but for its last page."""
        return list(self._pages)

    @cached_property
    def _pages(self) -> tuple[BlockPage, ...]:
        chunks: list[list[BlockEntry]] = [[]]
        size = 0
        for entry in self.blocked:
            n = len(msgpack.packb(_ENTRY.pack(entry), use_bin_type=True))
            if chunks[-1] and size + n > PAGE_BYTES - 40:
                chunks.append([])
                size = 0
            chunks[-1].append(entry)
            size += n
        if not chunks[-1]:
            return ()
        out: list[BlockPage] = []
        before = b""
        for chunk in chunks:
            page = BlockPage(tuple(chunk), before)
            before = page.target
            out.append(page)
        return tuple(out)

    def encode_item(self) -> bytes:
        """The signed item stored in the DHT and sent in heartbeats (one BEP 44 value): the
        state with the blocklist replaced by its size, digest and last page's target.
        Computed once per state (heartbeats resend it every half second)."""
        return self._item

    @cached_property
    def _item(self) -> bytes:
        pages = self._pages
        data = msgpack.packb({"v": 3} | HEAD.pack(self) | REFERENCE.pack(
            None, count=len(self.blocked), blocklist=blocklist_digest(self.blocked),
            last_page=pages[-1].target if pages else b""), use_bin_type=True)
        if len(data) > MAX_VALUE - 20:  # bencoding adds a length prefix
            raise ProtocolError(f"coordinator state item is {len(data)} bytes")
        return data

    def digest(self) -> bytes:
        return self._digest

    @cached_property
    def _digest(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()

    @classmethod
    def from_obj(cls, o: object) -> CoordinatorState:
        """The whole state (version 1, with its blocklist inline)."""
        if not isinstance(o, dict) or o.get("v") != 1:
            raise ProtocolError("malformed coordinator state: not a version-1 state")
        try:
            blocked = _BLOCKS.unpack(o.get("b"))
        except ValueError as exc:
            raise ProtocolError(f"malformed coordinator state: blocked must be {exc}") from None
        return _head_from(o, blocked)

    @classmethod
    def decode(cls, data: bytes) -> CoordinatorState:
        return cls.from_obj(_unpack(data, unbounded=True))


@dataclass(frozen=True)
class StateItem:
    """A decoded signed item: the state without its blocklist, and how to fetch it."""

    head: CoordinatorState
    """The state, ``blocked`` left empty."""
    count: int
    """How many peers are blocked."""
    blocklist: bytes
    """:func:`blocklist_digest` of the full blocklist."""
    last_page: bytes
    """Target of the last :class:`BlockPage` (empty when nothing is blocked)."""

    @classmethod
    def decode(cls, data: bytes) -> StateItem:
        o = _unpack(data)
        if not isinstance(o, dict) or o.get("v") != 3:
            raise ProtocolError("malformed coordinator state: not a version-3 state item")
        ref = REFERENCE.unpack(o)
        if (ref["count"] == 0) != (ref["last_page"] == b""):
            raise ProtocolError("malformed coordinator state: a blocklist of no entries "
                                "has no pages, and one of some has")
        return cls(_head_from(o, ()), **ref)

    def complete(self, blocked: tuple[BlockEntry, ...]) -> CoordinatorState:
        """The full state, given the blocklist its pages hold (checked against the item)."""
        if len(blocked) != self.count or blocklist_digest(blocked) != self.blocklist:
            raise ProtocolError("blocklist pages do not match the signed state item")
        return replace(self.head, blocked=blocked)


@dataclass(frozen=True)
class BlockPage:
    """One page of a blocklist: an immutable DHT item (``<= PAGE_BYTES``) naming the page
    before it."""

    entries: tuple[BlockEntry, ...]
    """Blocks on this page, in blocklist order."""
    before: bytes = b""
    """Target of the page before this one; empty on the first."""

    def encode(self) -> bytes:
        return msgpack.packb(PAGE.pack(self), use_bin_type=True)

    @property
    def target(self) -> bytes:
        """Its DHT target (SHA-1 of the bencoded value, as BEP 44 computes it)."""
        return immutable_target(self.encode())

    @classmethod
    def decode(cls, data: object) -> BlockPage:
        if not isinstance(data, bytes) or len(data) > PAGE_BYTES:
            raise ProtocolError("blocklist page is not bytes or too long")
        page = cls(**_fields(PAGE, _unpack(data)))
        if not page.entries:
            raise ProtocolError("malformed blocklist page: no entries")
        return page


def blocklist_digest(blocked: tuple[BlockEntry, ...]) -> bytes:
    return hashlib.sha256(msgpack.packb(_BLOCKS.pack(blocked), use_bin_type=True)).digest()


async def resolve(item: StateItem, fetch, known: CoordinatorState | None = None,
                  ) -> CoordinatorState:
    """The full state of ``item``, its pages fetched with ``fetch(target) -> bytes | None``
    (a DHT get) from the last back to the first one that ``known``'s blocklist also has
    (pages are immutable: from there on the lists agree), so a follower fetches only what
    changed; :class:`ProtocolError` when a page is missing or does not match."""
    if known is not None and known.blocked and len(known.blocked) == item.count \
            and blocklist_digest(known.blocked) == item.blocklist:
        return item.complete(known.blocked)
    held: dict[bytes, int] = {}  # a page of ``known`` -> how many entries end with it
    for page in known.pages() if known is not None else ():
        held[page.target] = len(page.entries) + (held[page.before] if page.before else 0)
    tail: list[tuple[BlockEntry, ...]] = []
    prefix: tuple[BlockEntry, ...] = ()
    target, seen, count = item.last_page, set(), 0
    while target:
        if target in held:
            prefix = known.blocked[:held[target]] if known is not None else ()
            break
        if target in seen or count > item.count:
            raise ProtocolError("blocklist pages loop or run past the count")
        seen.add(target)
        data = await fetch(target)
        if data is None:
            raise ProtocolError(f"blocklist page {target.hex()[:12]} not found")
        page = BlockPage.decode(data)
        if page.target != target:
            raise ProtocolError("blocklist page does not match its target")
        tail.append(page.entries)
        count += len(page.entries)
        target = page.before
    return item.complete(prefix + tuple(e for chunk in reversed(tail) for e in chunk))


_ENTRY = Row((Peer(), Str(MAX_REASON, utf8=True), OneOf(BY, index=True),
              Int(-(1 << 63), 1 << 64)),
             make=BlockEntry, parts=lambda b: (b.peer, b.reason, b.by, b.at))
"""A block entry as a row: [peer, reason, role index, issue time]."""
_BLOCKS = Seq(_ENTRY, MAX_BLOCKLIST)

HEAD = Schema("malformed coordinator state", (
    Field("sw", "swarm", Bytes((20,))),
    Field("t", "term", Int(0, 1 << 62)),
    Field("q", "seq", Int(0, 1 << 62)),
    Field("c", "coordinator", Peer()),
    Field("a", "admins", Seq(Peer(), MAX_ADMINS)),
    Field("p", "policy", Scalars(MAX_POLICY)),
    Field("pr", "prev", Bytes((0, 32))),
    Field("u", "unblocked", Seq(Row((Peer(), Int(0)), make=UnblockEntry,
                                    parts=lambda u: (u.peer, u.at)), MAX_UNBLOCKS),
          (), omit=lambda u: not u),
))
"""A coordinator state without its blocklist (after ``"v"``): the data dir's copy adds
``"b"``, the entries; the signed item adds :data:`REFERENCE`."""

REFERENCE = Schema("malformed coordinator state", (
    Field("bn", "count", Int(0, MAX_BLOCKLIST + 1)),
    Field("bd", "blocklist", Bytes((32,))),
    Field("bh", "last_page", Bytes((0, 20))),
))
"""The signed item's reference to its blocklist pages."""

PAGE = Schema("malformed blocklist page", (
    Field("e", "entries", _BLOCKS),
    Field("p", "before", Bytes((0, 20))),
))

ENDORSEMENT = Schema("malformed endorsement", (
    Field("t", "term", Int(-(1 << 63), 1 << 64)),
    Field("c", "successor", Peer()),
))

KICK = Schema("malformed kick order", (
    Field("t", "term", Int(-(1 << 63), 1 << 64)),
    Field("p", "target", Peer()),
    Field("r", "reason", Str(MAX_REASON, utf8=True)),
    Field("at", "at", Int(-(1 << 63), 1 << 64)),
))

LIAR = Schema("malformed liar report", (
    Field("p", "peer", Peer()),
    Field("r", "reason", Str(MAX_REASON, utf8=True)),
    Field("e", "evidence", Blob(MAX_MESSAGE)),
    Field("f", "relayed", Bool()),
))

FORWARDED = Schema("malformed forwarded block", (
    Field("b", "entry", _ENTRY),
    Field("t", "term", Int(0, 1 << 64)),
))


def _head_from(o: dict, blocked: tuple[BlockEntry, ...]) -> CoordinatorState:
    f = HEAD.unpack(o)
    if len({b.peer for b in blocked}) != len(blocked):
        raise ProtocolError("malformed coordinator state: a peer blocked twice")
    return CoordinatorState(**(f | {"admins": tuple(sorted(f["admins"]))}), blocked=blocked)


def _fields(schema: Schema, o: object) -> dict:
    """``schema``'s fields of a decoded control message (a map)."""
    if not isinstance(o, dict):
        raise ProtocolError(f"{schema.name}: not a map")
    return schema.unpack(o)


def _unpack(data: bytes, unbounded: bool = False) -> object:
    if not isinstance(data, bytes) or (len(data) > MAX_MESSAGE and not unbounded):
        raise ProtocolError(f"control message over {MAX_MESSAGE} bytes or not bytes")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True,
                               use_list=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"undecodable control message: {exc}") from None


# -- control messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class SignedMessage:
    """A signed control message between peers."""

    kind: str
    """One of KINDS: hb, handoff, endorse, kick, cmd, liar, fwd/fwdauto (forwarded blocks),
    hello, bye, claim (a failover claim under way)."""
    sender: PeerId
    """Who signed it."""
    body: bytes
    """The kind's payload (msgpack)."""
    endorsement: bytes = b""
    """For a new coordinator's heartbeats: the handoff envelope its predecessor signed."""
    digest: bytes = b""
    """A heartbeat's :class:`swarm.control.sync.Digest` (signed with the body)."""


def _signed_part(swarm: bytes, kind: str, body: bytes, digest: bytes = b"") -> bytes:
    if not digest:
        return DOMAIN + swarm + kind.encode() + b"\0" + body
    return DOMAIN + swarm + kind.encode() + b"\1" + len(body).to_bytes(4, "big") + body + digest


def seal(key: PeerKey, swarm: bytes, kind: str, body: bytes, endorsement: bytes = b"",
         digest: bytes = b"") -> bytes:
    """Sign and encode a control message (``digest``: a heartbeat's sync digest)."""
    if kind not in KINDS:
        raise ValueError(f"unknown control message kind {kind!r}")
    sig = key.sign(_signed_part(swarm, kind, body, digest))
    fields = {"k": kind, "f": key.peer_id.raw, "b": body, "s": sig, "e": endorsement}
    if digest:
        fields["d"] = digest
    out = msgpack.packb(fields, use_bin_type=True)
    if len(out) > MAX_MESSAGE:
        raise ProtocolError(f"control message of {len(out)} bytes is over {MAX_MESSAGE}")
    return out


def unseal(swarm: bytes, data: bytes) -> SignedMessage:
    """Decode and verify a control message; :class:`ProtocolError` when it is bad."""
    o = _unpack(data)
    try:
        kind, sender, body, sig, endorsement = o["k"], PeerId(o["f"]), o["b"], o["s"], o["e"]
        digest = o.get("d", b"")
        if kind not in KINDS or not isinstance(body, bytes) or not isinstance(sig, bytes) \
                or not isinstance(endorsement, bytes) or not isinstance(digest, bytes):
            raise ValueError("bad fields")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed control message: {exc}") from None
    if not verify(sender, sig, _signed_part(swarm, kind, body, digest)):
        raise ProtocolError(f"bad signature on {kind!r} message from {sender.short()}")
    return SignedMessage(kind, sender, body, endorsement, digest)


@dataclass(frozen=True)
class Endorsement:
    """A leaving coordinator's word that ``successor`` coordinates at ``term``."""

    term: int
    """The successor's term."""
    successor: PeerId
    """Who takes over."""

    def encode(self) -> bytes:
        return msgpack.packb(ENDORSEMENT.pack(self), use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> Endorsement:
        return cls(**_fields(ENDORSEMENT, _unpack(data)))


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
        return msgpack.packb(KICK.pack(self, reason=cut_reason(self.reason)),
                             use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> KickOrder:
        return cls(**_fields(KICK, _unpack(data)))


@dataclass(frozen=True)
class LiarReport:
    """A requester's report that ``peer`` returned a wrong result, with its evidence."""

    peer: PeerId
    """The accused peer."""
    reason: str = ""
    """For operators."""
    evidence: bytes = b""
    """Opaque proof for the coordinator's evidence check, bounded by the one control message
    it travels in (:data:`MAX_MESSAGE`). A runtime's signed receipts, up to
    :data:`swarm.runtime.evidence.MAX_EVIDENCE`, travel by ``EvidenceMsg`` instead."""
    relayed: bool = False
    """Passed on once by a peer that is not the coordinator (never passed on again)."""

    def encode(self) -> bytes:
        return msgpack.packb(LIAR.pack(self, reason=cut_reason(self.reason)),
                             use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> LiarReport:
        return cls(**_fields(LIAR, _unpack(data)))


@dataclass(frozen=True)
class ForwardedBlock:
    """A deposed coordinator's own block (of a liar), forwarded to its successor."""

    entry: BlockEntry
    """The block as it stood in the sender's state."""
    term: int
    """The term in which the sender applied it."""

    def encode(self) -> bytes:
        return msgpack.packb(FORWARDED.pack(self), use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> ForwardedBlock:
        return cls(**_fields(FORWARDED, _unpack(data)))


# -- the copy in each node's data dir --------------------------------------------------------


def state_path(data_dir: Path, swarm: bytes) -> Path:
    return Path(data_dir) / f"control-{swarm.hex()}.json"


def save_state(data_dir: Path, state: CoordinatorState) -> None:
    """Persist the latest state (0600, atomic) so a full restart keeps the blocklist."""
    obj = state.to_obj()
    text = json.dumps({k: (v.hex() if isinstance(v, bytes) else v) for k, v in obj.items()
                       if k not in ("b", "a", "u")} | {
        "b": [[p.hex(), r, by, at] for p, r, by, at in obj["b"]],
        "a": [a.hex() for a in obj["a"]],
        "u": [[p.hex(), at] for p, at in obj.get("u", [])]}, sort_keys=True)
    write_private(state_path(data_dir, state.swarm), text.encode())


def load_state(data_dir: Path, swarm: bytes) -> CoordinatorState | None:
    """The persisted state for ``swarm``, or None (missing, unreadable or another swarm's)."""
    path = state_path(data_dir, swarm)
    try:
        o = json.loads(path.read_text())
        obj = {k: (bytes.fromhex(o[k]) if k in ("sw", "c", "pr") else o[k])
               for k in ("v", "sw", "t", "q", "c", "p", "pr")}
        obj["b"] = [[bytes.fromhex(p), r, by, at] for p, r, by, at in o["b"]]
        obj["a"] = [bytes.fromhex(a) for a in o["a"]]
        if o.get("u"):  # absent from states saved before unblocks were kept
            obj["u"] = [[bytes.fromhex(p), at] for p, at in o["u"]]
        state = CoordinatorState.from_obj(obj)
    except (OSError, ValueError, KeyError, TypeError, ProtocolError):
        return None
    return state if state.swarm == swarm else None
