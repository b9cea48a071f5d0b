"""Ed25519 peer keys and PeerIds.

A PeerId *is* the peer's raw 32-byte Ed25519 public key, so anything signed by a peer can be
checked from its PeerId alone, and the election tiebreak is a plain bytes comparison.
"""

from __future__ import annotations

import base64
import stat
from dataclasses import dataclass
from functools import total_ordering
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from identity.errors import KeyFileError
from identity.files import write_private

_PREFIX = "p"  # printable form: "p" + base32 (lowercase, no padding) of the 32 key bytes
SHORT_LEN = 12


@total_ordering
@dataclass(frozen=True, slots=True)
class PeerId:
    """A peer's identity: its raw Ed25519 public key. Ordered as bytes."""

    raw: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes) or len(self.raw) != 32:
            raise ValueError("a PeerId is exactly 32 bytes (an Ed25519 public key)")

    # written out: the generated ones build a tuple per call, and peers key the scheduler's
    # and the links' dicts (tens of lookups per task)
    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.raw == other.raw  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.raw)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, PeerId):
            return NotImplemented
        return self.raw < other.raw

    def __str__(self) -> str:
        return _PREFIX + base64.b32encode(self.raw).decode().rstrip("=").lower()

    def __repr__(self) -> str:
        return f"PeerId({self.short()})"

    def short(self) -> str:
        """A short printable form for logs and tables (not unique in a huge swarm)."""
        return str(self)[:SHORT_LEN]

    def hex(self) -> str:
        return self.raw.hex()

    @classmethod
    def parse(cls, text: str) -> PeerId:
        """Parse the printable form (``p`` + base32) or 64 hex digits."""
        text = text.strip()
        if len(text) == 64:
            try:
                return cls(bytes.fromhex(text))
            except ValueError:
                pass
        if text.startswith(_PREFIX) and len(text) == 53:
            body = text[1:].upper()
            try:
                return cls(base64.b32decode(body + "=" * (-len(body) % 8)))
            except (ValueError, base64.binascii.Error):
                pass
        raise ValueError(f"not a PeerId: {text[:70]!r} (expected 'p' + 52 base32 chars or 64 hex)")

    def public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.raw)


def verify(public: bytes | PeerId, signature: bytes, data: bytes) -> bool:
    """True when ``signature`` is ``public``'s Ed25519 signature of ``data``."""
    raw = public.raw if isinstance(public, PeerId) else public
    try:
        Ed25519PublicKey.from_public_bytes(raw).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


class PeerKey:
    """A peer's Ed25519 private key. Its repr never shows the secret."""

    __slots__ = ("_key", "peer_id")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        raw = key.public_key().public_bytes(serialization.Encoding.Raw,
                                            serialization.PublicFormat.Raw)
        self.peer_id = PeerId(raw)

    def __repr__(self) -> str:
        return f"PeerKey({self.peer_id.short()})"

    @classmethod
    def generate(cls) -> PeerKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> PeerKey:
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def public_bytes(self) -> bytes:
        return self.peer_id.raw

    @property
    def private_key(self) -> Ed25519PrivateKey:
        """The ``cryptography`` key object, for APIs that sign on our behalf (TLS, DHT)."""
        return self._key

    def seed(self) -> bytes:
        return self._key.private_bytes(serialization.Encoding.Raw,
                                       serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption())

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    # -- files ---------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Write the key as PEM (PKCS#8), created 0600 without a window of looser mode."""
        pem = self._key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
        write_private(path, pem)

    @classmethod
    def load(cls, path: Path) -> PeerKey:
        """Load a key file; refuse one that group or others can read."""
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError as exc:
            raise KeyFileError(f"no key file at {path}") from exc
        if mode & 0o077:
            raise KeyFileError(
                f"key file {path} has mode {mode:o}; it must be 600 (run: chmod 600 {path})"
            )
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except ValueError as exc:
            raise KeyFileError(f"key file {path} is not a PEM private key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"key file {path} is not an Ed25519 key")
        return cls(key)

    @classmethod
    def load_or_create(cls, path: Path) -> PeerKey:
        """The peer's key at ``path``, created on first run."""
        if path.exists():
            return cls.load(path)
        key = cls.generate()
        key.save(path)
        return key
