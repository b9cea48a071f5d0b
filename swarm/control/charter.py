"""The swarm charter in the DHT, and the validators every DHT node runs on swarm items.

The charter is a BEP 44 mutable item under the swarm key (salt ``b"swarm"``). Its value is
``{h: head, p: [history targets]}``: ``head`` is the current :class:`identity.Charter`
with the owner's FIDO2 proof; ``p`` lists, oldest first, the immutable items holding the
statements before it (the founding charter, transfers, delegations), so a peer can verify
the whole chain with :func:`identity.verify_chain` and the owner pin from the join URI.

Every DHT node refuses (on store and on get) a charter item whose head is not a charter
signed by an owner key it lists, and a coordinator-state item not signed by the
coordinator it names; BEP 44 itself refuses stale seqs and bad item signatures.

A charter's counter only moves forward: :func:`fetch` refuses one below the ``floor`` the
caller saw before (a validly signed but older charter, e.g. from before a revocation), and
:func:`load_floor` / :func:`save_floor` keep that floor in the data dir across restarts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dht import errors as dht_errors
from dht.errors import DHTError, ItemError
from dht.items import MutableItem
from identity import (
    ChainError,
    Charter,
    IdentityError,
    MalformedStatement,
    Ownership,
    PeerKey,
    SignatureError,
    Signed,
    genesis,
    verify_chain,
)
from identity.files import write_private
from swarm.control.state import StateItem, resolve
from swarm.errors import CharterError, ProtocolError

log = logging.getLogger("swarm.control.charter")

CHARTER_SALT = b"swarm"
STATE_SALT = b"swarm/state/"  # + the 20-byte swarm id: each coordinator's own state item
MAX_HISTORY = 16
VERDICTS = 4096
"""Validator verdicts cached (per process), so a swarm of hundreds re-serving the same items
verifies each one once."""


def state_salt(swarm_id: bytes) -> bytes:
    return STATE_SALT + swarm_id


# -- DHT validators ------------------------------------------------------------------------


def _refuse(code: int, why: str) -> ItemError:
    return ItemError(code, why)


_verdicts: OrderedDict[tuple, ItemError | None] = OrderedDict()


def _cached(check: Callable[[MutableItem], None]) -> Callable[[MutableItem], None]:
    """Run ``check`` once per (target, seq, signature, value digest): the value is part of
    the key, so an item with a borrowed signature cannot poison the verdict of the real
    one. Bounded LRU of :data:`VERDICTS` entries."""
    def cached(item: MutableItem) -> None:
        key = (check.__name__, item.target, item.seq, item.signature,
               hashlib.sha256(item.encoded_value).digest())
        if key in _verdicts:
            _verdicts.move_to_end(key)
            verdict = _verdicts[key]
        else:
            try:
                check(item)
                verdict = None
            except ItemError as exc:
                verdict = exc
            _verdicts[key] = verdict
            while len(_verdicts) > VERDICTS:
                _verdicts.popitem(last=False)
        if verdict is not None:
            raise ItemError(verdict.code, verdict.message)
    cached.__name__ = check.__name__
    cached.__doc__ = check.__doc__
    return cached


@_cached
def validate_charter_item(item: MutableItem) -> None:
    """Refuse a charter item whose head lacks a valid owner proof (runs on every DHT node)."""
    if item.salt != CHARTER_SALT:
        return  # another item under a "swarm..." salt: not ours to judge here
    value = item.value
    if not isinstance(value, dict) or set(value) != {b"h", b"p"}:
        raise _refuse(dht_errors.PROTOCOL, "charter item: expected {h, p}")
    head, hist = value[b"h"], value[b"p"]
    if not isinstance(head, bytes) or not isinstance(hist, list) or len(hist) > MAX_HISTORY \
            or not all(isinstance(t, bytes) and len(t) == 20 for t in hist):
        raise _refuse(dht_errors.PROTOCOL, "charter item: malformed head or history")
    try:
        signed = Signed.decode(head)
        genesis(signed, swarm=item.pubkey)
    except (IdentityError, ValueError) as exc:
        raise _refuse(dht_errors.BAD_SIGNATURE, f"charter refused: {exc}") from None


@_cached
def validate_state_item(item: MutableItem) -> None:
    """Refuse a coordinator-state item not signed by the coordinator it names."""
    if not item.salt.startswith(STATE_SALT):
        return
    if not isinstance(item.value, bytes):
        raise _refuse(dht_errors.PROTOCOL, "coordinator state must be bytes")
    try:
        state = StateItem.decode(item.value).head
    except ProtocolError as exc:
        raise _refuse(dht_errors.PROTOCOL, str(exc)) from None
    if state.coordinator.raw != item.pubkey:
        raise _refuse(dht_errors.BAD_SIGNATURE, "coordinator state signed by another key")
    if item.salt != state_salt(state.swarm) or item.seq != state.seq:
        raise _refuse(dht_errors.PROTOCOL, "coordinator state salt or seq does not match it")


def validators() -> dict[bytes, Callable[[MutableItem], None]]:
    """The swarm's DHT item validators by salt (every node installs them)."""
    return {CHARTER_SALT: validate_charter_item, STATE_SALT: validate_state_item}


def register_validators(dht_node) -> None:
    """Install the swarm validators on a bare DHT node (``swarm dht serve``, observers)."""
    for salt, validator in validators().items():
        dht_node.register_validator(salt, validator)


# -- publish and fetch ---------------------------------------------------------------------


@dataclass(frozen=True)
class CharterRecord:
    """A verified charter as fetched from the DHT."""

    ownership: Ownership
    """Who owns and administers the swarm (the whole chain verified)."""
    head: Signed
    """The current charter with its owner proof."""
    history: tuple[bytes, ...]
    """Immutable-item targets of earlier statements, oldest first."""
    seq: int
    """The item's BEP 44 seq."""

    @property
    def charter(self) -> Charter:
        return self.head.statement  # type: ignore[return-value]


async def publish(dht_node, swarm_key: PeerKey, head: Signed,
                  history: tuple[bytes, ...] = ()) -> int:
    """Put the charter item (validated locally first, as every node will); its seq."""
    value = {b"h": head.encode(), b"p": list(history)}
    item = await dht_node.put_mutable(swarm_key, value, salt=CHARTER_SALT)
    return item.seq


async def append_history(dht_node, signed: Signed) -> bytes:
    """Store an earlier statement as an immutable item; its target."""
    return await dht_node.put_immutable(signed.encode())


async def fetch(dht_node, swarm_pubkey: bytes, owner_pin: bytes | None = None,
                now: float | None = None, floor: int = 0) -> CharterRecord:
    """Fetch and verify the charter chain; :class:`CharterError` says what is wrong,
    including a chain whose counter is below ``floor`` (a rollback)."""
    item = await dht_node.get_mutable(swarm_pubkey, CHARTER_SALT)
    if item is None:
        raise CharterError("no charter found in the DHT for this swarm (is any member "
                           "online? check the bootstrap peers in the URI)")
    validate_charter_item(item)  # our own validators ran already; be explicit anyway
    value = item.value
    chain: list[bytes] = []
    for target in value[b"p"]:
        stmt = await dht_node.get_immutable(target)
        if not isinstance(stmt, bytes):
            raise CharterError(f"charter history item {target.hex()[:12]} is missing")
        chain.append(stmt)
    chain.append(value[b"h"])
    try:
        ownership = verify_chain(chain, swarm_pubkey=swarm_pubkey,
                                 now=time.time() if now is None else now, owner_pin=owner_pin)
    except (ChainError, SignatureError, MalformedStatement) as exc:
        raise CharterError(f"charter chain does not verify: {exc}") from None
    if ownership.counter < floor:
        raise CharterError(f"charter counter {ownership.counter} is below {floor}, already "
                           "seen: an old charter (rollback) refused")
    head = Signed.decode(value[b"h"])
    return CharterRecord(ownership, head, tuple(value[b"p"]), item.seq)


async def fetch_state(dht_node, peer, swarm_id: bytes, known=None):
    """``peer``'s coordinator-state item with its blocklist pages (pages ``known``, a state
    held already, has are not fetched); None when it is missing or unusable. The one read
    of a state item that members, observers and clients share."""
    async def page(target: bytes) -> bytes | None:
        value = await dht_node.get_immutable(target)
        return value if isinstance(value, bytes) else None

    try:
        raw = await dht_node.get_mutable(peer.raw, state_salt(swarm_id))
        if raw is None:
            return None
        return await resolve(StateItem.decode(raw.value), page, known)
    except (DHTError, ProtocolError, ValueError) as exc:
        log.debug("state item of %s unusable: %s", peer.short(), exc)
        return None


def _floor_path(data_dir: Path, swarm_pubkey: bytes) -> Path:
    return Path(data_dir) / f"charter-floor-{swarm_pubkey.hex()[:40]}.json"


def load_floor(data_dir: Path, swarm_pubkey: bytes) -> int:
    """The highest charter counter this data dir has accepted for the swarm (0 if none)."""
    try:
        n = json.loads(_floor_path(data_dir, swarm_pubkey).read_text())["counter"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return n if type(n) is int and n >= 0 else 0


def save_floor(data_dir: Path, swarm_pubkey: bytes, counter: int) -> None:
    """Raise the persisted floor to ``counter`` (never lowers it; 0600, atomic)."""
    if counter <= load_floor(data_dir, swarm_pubkey):
        return
    write_private(_floor_path(data_dir, swarm_pubkey), json.dumps({"counter": counter}).encode())
