"""The swarm charter in the DHT, and the validators every DHT node runs on swarm items.

The charter is a BEP 44 mutable item under the swarm key (salt ``b"swarm"``). Its value is
``{h: head, p: [history targets]}``: ``head`` is the current :class:`identity.Charter`
with the owner's FIDO2 proof; ``p`` lists, oldest first, the immutable items holding the
statements before it (the founding charter, transfers, delegations), so a peer can verify
the whole chain with :func:`identity.verify_chain` and the owner pin from the join URI.

Every DHT node refuses (on store and on get) a charter item whose head is not a charter
signed by an owner key it lists, and a coordinator-state item not signed by the
coordinator it names; BEP 44 itself refuses stale seqs and bad item signatures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from dht import errors as dht_errors
from dht.errors import ItemError
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
from swarm.control.state import CoordinatorState
from swarm.errors import CharterError, ProtocolError

log = logging.getLogger("swarm.control.charter")

CHARTER_SALT = b"swarm"
STATE_SALT = b"swarm/state/"  # + the 20-byte swarm id: each coordinator's own state item
MAX_HISTORY = 16


def state_salt(swarm_id: bytes) -> bytes:
    return STATE_SALT + swarm_id


# -- DHT validators ------------------------------------------------------------------------


def _refuse(code: int, why: str) -> ItemError:
    return ItemError(code, why)


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


def validate_state_item(item: MutableItem) -> None:
    """Refuse a coordinator-state item not signed by the coordinator it names."""
    if not item.salt.startswith(STATE_SALT):
        return
    if not isinstance(item.value, bytes):
        raise _refuse(dht_errors.PROTOCOL, "coordinator state must be bytes")
    try:
        state = CoordinatorState.decode(item.value)
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
                now: float | None = None) -> CharterRecord:
    """Fetch and verify the charter chain; :class:`CharterError` says what is wrong."""
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
    head = Signed.decode(value[b"h"])
    return CharterRecord(ownership, head, tuple(value[b"p"]), item.seq)
