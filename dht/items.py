"""BEP 44 items: targets, the signed buffer, signatures and the limits every node enforces.

Pure functions and frozen dataclasses; nothing here does I/O. The byte layouts follow BEP 44
exactly (its published test vectors are in ``tests/test_dht_items.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dht import errors
from dht.bencode import Value, bdecode, bencode
from dht.errors import BencodeError, ItemError
from identity import verify

MAX_VALUE = 1000  # bytes of the bencoded value
MAX_SALT = 64
MAX_SEQ = 2**63 - 1
KEY_LEN = 32
SIG_LEN = 64


class Signer(Protocol):
    """Anything with ``sign(data) -> signature``: an ``identity.PeerKey`` or a cryptography key."""

    def sign(self, data: bytes) -> bytes: ...


def mutable_target(pubkey: bytes, salt: bytes = b"") -> bytes:
    """BEP 44: SHA-1 of the public key followed by the salt."""
    return hashlib.sha1(bytes(pubkey) + bytes(salt)).digest()


def immutable_target(value: object) -> bytes:
    """BEP 44: SHA-1 of the bencoded value."""
    return hashlib.sha1(bencode(value)).digest()


def _buffer(encoded: bytes, seq: int, salt: bytes) -> bytes:
    head = b"4:salt" + bencode(salt) if salt else b""
    return head + b"3:seqi%de1:v" % seq + encoded


def signature_buffer(value: object, seq: int, salt: bytes = b"") -> bytes:
    """BEP 44's signed bytes: ``4:salt<salt>`` (only when non-empty) ``3:seqi<seq>e1:v<value>``."""
    return _buffer(bencode(value), seq, bytes(salt))


def verify_mutable(pubkey: bytes, signature: bytes, value: object, seq: int,
                   salt: bytes = b"") -> bool:
    """True when ``signature`` is ``pubkey``'s Ed25519 signature of the BEP 44 buffer."""
    if len(pubkey) != KEY_LEN or len(signature) != SIG_LEN:
        return False
    try:
        buf = signature_buffer(value, seq, salt)
    except BencodeError:
        return False
    return verify(bytes(pubkey), bytes(signature), buf)


def public_bytes_of(key: Signer) -> bytes:
    """The raw public key of a PeerKey or a cryptography Ed25519 private key."""
    if isinstance(key, Ed25519PrivateKey):
        return key.public_key().public_bytes(serialization.Encoding.Raw,
                                             serialization.PublicFormat.Raw)
    pub = getattr(key, "public_bytes", None)
    if not isinstance(pub, bytes):
        raise TypeError("expected an identity.PeerKey or an Ed25519PrivateKey")
    return pub


def encode_value(value: object) -> bytes:
    """The bencoded value, refused with 205 when over BEP 44's 1000 bytes."""
    encoded = bencode(value)
    if len(encoded) > MAX_VALUE:
        raise ItemError(errors.VALUE_TOO_BIG,
                        f"value is {len(encoded)} bytes bencoded; at most {MAX_VALUE}")
    return encoded


def check_seq(seq: object) -> int:
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
        raise ItemError(errors.PROTOCOL, f"seq must be an integer in 0..2^63-1, not {seq!r}")
    return seq


def check_salt(salt: object) -> bytes:
    if not isinstance(salt, bytes):
        raise ItemError(errors.PROTOCOL, "salt must be bytes")
    if len(salt) > MAX_SALT:
        raise ItemError(errors.SALT_TOO_BIG, f"salt is {len(salt)} bytes; at most {MAX_SALT}")
    return salt


@dataclass(frozen=True, slots=True)
class MutableItem:
    """A BEP 44 mutable item, as signed by its owner."""

    pubkey: bytes
    """The owner's raw 32-byte Ed25519 public key."""
    salt: bytes
    """Up to 64 bytes naming one of the owner's items (b"" for none)."""
    seq: int
    """Sequence number; a higher one replaces a lower one."""
    value: Value
    """The decoded value (bytes, int, list or dict with bytes keys)."""
    signature: bytes
    """Ed25519 signature of :func:`signature_buffer` (64 bytes)."""

    @property
    def target(self) -> bytes:
        return mutable_target(self.pubkey, self.salt)

    @property
    def encoded_value(self) -> bytes:
        return bencode(self.value)

    @classmethod
    def create(cls, key: Signer, value: object, seq: int, salt: bytes = b"") -> MutableItem:
        """Sign ``value`` at ``seq`` under ``salt`` with ``key`` (a PeerKey or Ed25519 key)."""
        salt = check_salt(bytes(salt))
        seq = check_seq(seq)
        encoded = encode_value(value)
        sig = key.sign(_buffer(encoded, seq, salt))
        return cls(public_bytes_of(key), salt, seq, bdecode(encoded), sig)

    @classmethod
    def from_wire(cls, pubkey: object, salt: object, seq: object, encoded: object,
                  signature: object) -> MutableItem:
        """Build and fully check an item whose value arrives bencoded (from a peer or disk)."""
        if not isinstance(pubkey, bytes) or len(pubkey) != KEY_LEN:
            raise ItemError(errors.PROTOCOL, "public key must be 32 bytes")
        if not isinstance(signature, bytes) or len(signature) != SIG_LEN:
            raise ItemError(errors.BAD_SIGNATURE, "signature must be 64 bytes")
        if not isinstance(encoded, bytes):
            raise ItemError(errors.PROTOCOL, "value must arrive bencoded")
        if len(encoded) > MAX_VALUE:
            raise ItemError(errors.VALUE_TOO_BIG,
                            f"value is {len(encoded)} bytes bencoded; at most {MAX_VALUE}")
        try:
            value = bdecode(encoded)
        except BencodeError as exc:
            raise ItemError(errors.PROTOCOL, f"value is not canonical bencode: {exc}") from exc
        item = cls(pubkey, check_salt(salt), check_seq(seq), value, signature)
        item.check_signature()
        return item

    def check_signature(self) -> None:
        buf = _buffer(self.encoded_value, self.seq, self.salt)
        if not verify(self.pubkey, self.signature, buf):
            raise ItemError(errors.BAD_SIGNATURE, "signature does not verify")

    def check(self) -> None:
        """Every BEP 44 limit plus the signature; raises :class:`ItemError`."""
        if len(self.pubkey) != KEY_LEN:
            raise ItemError(errors.PROTOCOL, "public key must be 32 bytes")
        check_salt(self.salt)
        check_seq(self.seq)
        encode_value(self.value)
        if len(self.signature) != SIG_LEN:
            raise ItemError(errors.BAD_SIGNATURE, "signature must be 64 bytes")
        self.check_signature()


def decide_mutable_store(stored: MutableItem | None, new: MutableItem,
                         cas: int | None) -> bool:
    """BEP 44's rules for a put on top of ``stored``.

    Returns True to store ``new``, False when it equals ``stored`` (only refresh the expiry);
    raises 301 when ``cas`` is given and differs from the stored seq, 302 when the seq does
    not move forward. ``new`` must already be checked.
    """
    if stored is None:
        return True
    if cas is not None and cas != stored.seq:
        raise ItemError(errors.CAS_MISMATCH, f"CAS mismatch: stored seq is {stored.seq}, not {cas}")
    if new.seq == stored.seq and new.encoded_value == stored.encoded_value:
        return False
    if new.seq <= stored.seq:
        raise ItemError(errors.SEQ_TOO_LOW,
                        f"seq {new.seq} is not higher than the stored {stored.seq}")
    return True
