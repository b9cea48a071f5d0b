"""Signed statements: the charter, delegations, transfers, revocations and commands.

Each statement is a canonical CBOR map with small integer keys (0: type, 1: swarm id,
2: counter, then the type's own fields), so it has exactly one encoding, which is what
gets hashed and signed. The swarm id is the swarm's Ed25519 public key (32 bytes); the
counter increases with every statement, so an old statement cannot be replayed.

An owner signs with a FIDO2 assertion (:class:`OwnerProof`, challenge = SHA-256 of the
encoding); admins and coordinators sign with their peer key (:class:`PeerSignature`, over
``PEER_SIGNING_PREFIX`` + the encoding, so a peer signature on a statement can never be
mistaken for one on a DHT record or anything else the key signs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from identity.ceremony import OwnerCredential, OwnerProof, digest
from identity.encoding import decode, encode
from identity.errors import MalformedStatement
from identity.keys import PeerId, PeerKey, verify
from identity.roles import PERMISSIONS, Action, Role

PEER_SIGNING_PREFIX = b"swarm statement v1\x00"
MAX_NAME = 24
MAX_REASON = 200
"""UTF-8 bytes of a reason (a block's, a kick's, a liar report's): one limit everywhere."""
MAX_OWNER_KEYS = 2
MAX_CHARTER_ADMINS = 3
MAX_PROOFS = 4
MAX_UINT = 2**53
ADMIN_ACTIONS = PERMISSIONS[Role.ADMIN]


def cut_reason(text: str) -> str:
    """``text`` cut to at most :data:`MAX_REASON` UTF-8 bytes, never inside a character."""
    return text.encode()[:MAX_REASON].decode(errors="ignore")


# -- field codecs: each turns a CBOR value into a checked Python value or refuses it ----


@dataclass(frozen=True)
class _Codec:
    enc: Callable[[Any], Any]
    dec: Callable[[Any, str], Any]


def _fail(where: str, why: str) -> MalformedStatement:
    return MalformedStatement(f"{where}: {why}")


def _dec_uint(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < MAX_UINT:
        raise _fail(where, "expected an unsigned integer")
    return v


def _dec_text(limit: int) -> Callable[[Any, str], str]:
    def dec(v: Any, where: str) -> str:
        if not isinstance(v, str) or len(v.encode()) > limit or not v.isprintable():
            raise _fail(where, f"expected printable text of at most {limit} bytes")
        return v
    return dec


def _dec_bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise _fail(where, "expected true or false")
    return v


def _dec_swarm(v: Any, where: str) -> bytes:
    if not isinstance(v, bytes) or len(v) != 32:
        raise _fail(where, "a swarm id is a 32-byte Ed25519 public key")
    return v


def _dec_peer(v: Any, where: str) -> PeerId:
    if not isinstance(v, bytes) or len(v) != 32:
        raise _fail(where, "a PeerId is 32 bytes")
    return PeerId(v)


def _dec_peers(v: Any, where: str) -> tuple[PeerId, ...]:
    if not isinstance(v, list) or len(v) > MAX_CHARTER_ADMINS:
        raise _fail(where, f"expected a list of at most {MAX_CHARTER_ADMINS} PeerIds")
    peers = tuple(_dec_peer(p, where) for p in v)
    if list(peers) != sorted(set(peers)):
        raise _fail(where, "PeerIds must be sorted and distinct")
    return peers


def _dec_scope(v: Any, where: str) -> tuple[Action, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(a, str) for a in v):
        raise _fail(where, "expected a non-empty list of action names")
    if v != sorted(set(v)):
        raise _fail(where, "actions must be sorted and distinct")
    bad = [a for a in v if a not in {x.value for x in ADMIN_ACTIONS}]
    if bad:
        raise _fail(where, f"an admin cannot be given {bad} (admins may do "
                           f"{sorted(a.value for a in ADMIN_ACTIONS)})")
    return tuple(Action(a) for a in v)


def _dec_owners(v: Any, where: str) -> tuple[OwnerCredential, ...]:
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_OWNER_KEYS:
        raise _fail(where, f"expected 1 to {MAX_OWNER_KEYS} owner keys")
    owners = tuple(OwnerCredential.from_cbor(c) for c in v)
    if len({c.credential_id for c in owners}) != len(owners):
        raise _fail(where, "owner keys must be distinct")
    return owners


def _dec_role(v: Any, where: str) -> Role:
    if v not in (Role.OWNER.value, Role.ADMIN.value, Role.COORDINATOR.value):
        raise _fail(where, "a command is issued as owner, admin or coordinator")
    return Role(v)


def _dec_revocable(v: Any, where: str) -> str:
    if v not in ("admin", "owner_key"):
        raise _fail(where, "revocation kind is 'admin' or 'owner_key'")
    return v


def _dec_target(v: Any, where: str) -> bytes:
    if not isinstance(v, bytes) or not 1 <= len(v) <= 255:
        raise _fail(where, "expected a PeerId or credential id")
    return v


def _same(v: Any) -> Any:
    return v


UINT = _Codec(_same, _dec_uint)
BOOL = _Codec(_same, _dec_bool)
SWARM = _Codec(_same, _dec_swarm)
NAME = _Codec(_same, _dec_text(MAX_NAME))
REASON = _Codec(_same, _dec_text(MAX_REASON))
PEER = _Codec(lambda p: p.raw, _dec_peer)
PEERS = _Codec(lambda ps: [p.raw for p in ps], _dec_peers)
SCOPE = _Codec(lambda s: [a.value for a in s], _dec_scope)
OWNER = _Codec(lambda c: c.to_cbor(), lambda v, w: OwnerCredential.from_cbor(v))
OWNERS = _Codec(lambda cs: [c.to_cbor() for c in cs], _dec_owners)
ROLE = _Codec(lambda r: r.value, _dec_role)
REVOCABLE = _Codec(_same, _dec_revocable)
TARGET = _Codec(_same, _dec_target)


def _f(key: int, codec: _Codec) -> Any:
    return field(metadata={"key": key, "codec": codec})


@dataclass(frozen=True)
class Policy:
    """Swarm-wide rules the owner sets in the charter."""

    require_hardware: bool = False
    """Owner keys must be vendor-attested security keys (refuses the software key)."""

    def to_cbor(self) -> dict[int, Any]:
        return {1: self.require_hardware}

    @classmethod
    def from_cbor(cls, v: Any, where: str = "policy") -> Policy:
        if not isinstance(v, dict) or set(v) != {1}:
            raise _fail(where, "expected exactly the field require_hardware (1)")
        return cls(_dec_bool(v[1], where + ".require_hardware"))


POLICY = _Codec(lambda p: p.to_cbor(), Policy.from_cbor)


# -- statements ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """Fields every statement has. Subclasses add theirs with keys 3 and up."""

    TYPE: ClassVar[int] = 0
    ACTION: ClassVar[Action | None] = None
    """What the statement does, in the roles table's terms."""

    swarm: bytes = _f(1, SWARM)
    """The swarm's id: its Ed25519 public key (32 bytes)."""
    counter: int = _f(2, UINT)
    """Strictly increasing across the issuer's statements: replays are refused."""

    def __post_init__(self) -> None:
        """Refuse to build a statement that would not decode: same rules both ways."""
        if type(self).TYPE not in STATEMENT_TYPES:
            raise TypeError(f"{type(self).__name__} is not a concrete statement type")
        for f in fields(self):
            value = getattr(self, f.name)
            codec = f.metadata["codec"]
            try:
                codec.dec(codec.enc(value), f"{type(self).__name__}.{f.name}")
            except (AttributeError, TypeError) as exc:
                raise MalformedStatement(f"{type(self).__name__}.{f.name}: wrong type "
                                         f"{type(value).__name__}") from exc

    def to_cbor(self) -> dict[int, Any]:
        m: dict[int, Any] = {0: self.TYPE}
        for f in fields(self):
            m[f.metadata["key"]] = f.metadata["codec"].enc(getattr(self, f.name))
        return m

    def encode(self) -> bytes:
        """The canonical encoding: what is hashed and signed."""
        return encode(self.to_cbor())

    def digest(self) -> bytes:
        """The FIDO2 challenge for this statement."""
        return digest(self)

    def peer_signing_bytes(self) -> bytes:
        return PEER_SIGNING_PREFIX + self.encode()

    @classmethod
    def from_cbor(cls, m: dict[int, Any]) -> Statement:
        name = cls.__name__
        keys = {f.metadata["key"]: f for f in fields(cls)}
        if set(m) != {0, *keys}:
            raise _fail(name, f"expected fields {sorted({0, *keys})}, got {sorted(m)}")
        return cls(**{f.name: f.metadata["codec"].dec(m[k], f"{name}.{f.name}")
                      for k, f in keys.items()})


@dataclass(frozen=True)
class Charter(Statement):
    """The swarm's founding (or updated) charter: who owns it, its name, policy and admins."""

    TYPE: ClassVar[int] = 1
    ACTION: ClassVar[Action | None] = Action.CHANGE_POLICY

    name: str = _f(3, NAME)
    """Human-readable swarm name (at most 24 bytes)."""
    owners: tuple[OwnerCredential, ...] = _f(4, OWNERS)
    """The owner's keys, 1-2: the second is the recovery key for a lost first one."""
    policy: Policy = _f(5, POLICY)
    """Swarm-wide rules."""
    admins: tuple[PeerId, ...] = _f(6, PEERS)
    """Peers with full admin rights and no expiry (sorted; at most 3; more by delegation)."""


@dataclass(frozen=True)
class AdminDelegation(Statement):
    """The owner appoints an admin peer, for some actions, until a time."""

    TYPE: ClassVar[int] = 2
    ACTION: ClassVar[Action | None] = Action.APPOINT_ADMINS

    admin: PeerId = _f(3, PEER)
    """The appointed peer."""
    scope: tuple[Action, ...] = _f(4, SCOPE)
    """What it may do (sorted; a subset of the admin role's actions)."""
    expires: int = _f(5, UINT)
    """Unix time (seconds) after which the delegation is void."""


@dataclass(frozen=True)
class OwnershipTransfer(Statement):
    """The current owner names a new owner key; the new key signs it too, accepting."""

    TYPE: ClassVar[int] = 3
    ACTION: ClassVar[Action | None] = Action.TRANSFER_OWNERSHIP

    new_owner: OwnerCredential = _f(3, OWNER)
    """The key that owns the swarm once this is accepted (it replaces all owner keys)."""


@dataclass(frozen=True)
class Revocation(Statement):
    """The owner withdraws an admin, or one of its own keys (a lost or stolen one)."""

    TYPE: ClassVar[int] = 4
    ACTION: ClassVar[Action | None] = Action.APPOINT_ADMINS

    kind: str = _f(3, REVOCABLE)
    """``admin`` (target = PeerId) or ``owner_key`` (target = credential id)."""
    target: bytes = _f(4, TARGET)
    """What is revoked."""
    reason: str = _f(5, REASON)
    """Why, for the log (at most 200 bytes)."""


@dataclass(frozen=True)
class Command(Statement):
    """A control-plane command against one peer, made under a role and a term."""

    target: PeerId = _f(3, PEER)
    """The peer kicked, blocked or unblocked."""
    reason: str = _f(4, REASON)
    """Why, shown to operators (at most 200 bytes)."""
    role: Role = _f(5, ROLE)
    """Which role the issuer acts under: owner, admin or coordinator."""
    term: int = _f(6, UINT)
    """The coordinator term it was issued in (the fencing token)."""


@dataclass(frozen=True)
class KickCommand(Command):
    """Disconnect the target now; it may rejoin."""

    TYPE: ClassVar[int] = 5
    ACTION: ClassVar[Action | None] = Action.KICK


@dataclass(frozen=True)
class BlockCommand(Command):
    """Keep the target out until unblocked, across coordinator changes and restarts."""

    TYPE: ClassVar[int] = 6
    ACTION: ClassVar[Action | None] = Action.BLOCK


@dataclass(frozen=True)
class UnblockCommand(Command):
    """Lift a block."""

    TYPE: ClassVar[int] = 7
    ACTION: ClassVar[Action | None] = Action.UNBLOCK


STATEMENT_TYPES: dict[int, type[Statement]] = {
    cls.TYPE: cls for cls in (Charter, AdminDelegation, OwnershipTransfer, Revocation,
                              KickCommand, BlockCommand, UnblockCommand)}


def decode_statement(data: bytes) -> Statement:
    """Parse a statement's canonical encoding, or raise :class:`MalformedStatement`."""
    m = decode(data)
    return _statement_from_cbor(m)


def _statement_from_cbor(m: Any) -> Statement:
    if not isinstance(m, dict) or 0 not in m:
        raise MalformedStatement("statement: expected a map with a type (field 0)")
    cls = STATEMENT_TYPES.get(m[0]) if isinstance(m[0], int) else None
    if cls is None:
        raise MalformedStatement(f"statement: unknown type {m[0]!r}")
    return cls.from_cbor(m)


# -- peer signatures and the signed envelope -----------------------------------------------


@dataclass(frozen=True)
class PeerSignature:
    """An admin's or coordinator's Ed25519 signature over a statement."""

    signer: PeerId
    """Who signed."""
    signature: bytes
    """Ed25519 over ``PEER_SIGNING_PREFIX`` + the statement's encoding."""

    KIND = 1

    def to_cbor(self) -> dict[int, Any]:
        return {0: self.KIND, 1: self.signer.raw, 2: self.signature}

    @classmethod
    def from_cbor(cls, m: Any) -> PeerSignature:
        if not isinstance(m, dict) or set(m) != {0, 1, 2} or m[0] != cls.KIND:
            raise MalformedStatement("peer signature: expected fields 0-2")
        if not isinstance(m[2], bytes) or len(m[2]) != 64:
            raise MalformedStatement("peer signature: an Ed25519 signature is 64 bytes")
        return cls(_dec_peer(m[1], "peer signature.signer"), m[2])

    def verifies(self, statement: Statement) -> bool:
        return verify(self.signer, self.signature, statement.peer_signing_bytes())


def sign_as_peer(statement: Statement, key: PeerKey) -> PeerSignature:
    """Sign ``statement`` with a peer key (admins and coordinators)."""
    return PeerSignature(key.peer_id, key.sign(statement.peer_signing_bytes()))


Proof = OwnerProof | PeerSignature


@dataclass(frozen=True)
class Signed:
    """A statement with its proofs, as stored and sent: ``{1: statement, 2: [proofs]}``."""

    statement: Statement
    """What is claimed."""
    proofs: tuple[Proof, ...]
    """Who vouches for it (a transfer carries two owner proofs: old key, then new key)."""

    def encode(self) -> bytes:
        return encode({1: self.statement.to_cbor(),
                       2: [p.to_cbor() for p in self.proofs]})

    @classmethod
    def decode(cls, data: bytes) -> Signed:
        """Parse a signed statement, or raise :class:`MalformedStatement` saying why."""
        m = decode(data, what="signed statement")
        if not isinstance(m, dict) or set(m) != {1, 2}:
            raise MalformedStatement("signed statement: expected fields 1 (statement) and "
                                     "2 (proofs)")
        proofs = m[2]
        if not isinstance(proofs, list) or not 1 <= len(proofs) <= MAX_PROOFS:
            raise MalformedStatement(f"signed statement: expected 1-{MAX_PROOFS} proofs")
        parsed: list[Proof] = []
        for p in proofs:
            kind = p.get(0) if isinstance(p, dict) else None
            if kind == OwnerProof.KIND:
                parsed.append(OwnerProof.from_cbor(p))
            elif kind == PeerSignature.KIND:
                parsed.append(PeerSignature.from_cbor(p))
            else:
                raise MalformedStatement("signed statement: unknown proof kind")
        return cls(_statement_from_cbor(m[1]), tuple(parsed))
