"""Signed membership announcements: each peer writes only its own entry under a topic.

An entry is signed by the announcing peer's key over the topic, its expiry and its record, so
no node (and no other peer) can forge, extend or move it; a newer entry from the same peer
replaces the older one.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections import OrderedDict
from dataclasses import dataclass

from dht import errors
from dht.errors import ItemError
from dht.items import KEY_LEN, SIG_LEN, Signer
from identity import PeerId, verify

MAX_RECORD = 900
"""Bytes of a record: with its signature and expiry (93 bytes bencoded, see :func:`entry_value`)
it still fits one BEP 44 value (:data:`dht.items.MAX_VALUE`). Member records keep to it."""
MAX_TOPIC = 64
MAX_TTL = 2 * 3600.0  # a node keeps an entry at most this long, whatever it claims
_DOMAIN = b"swarm-dht-announce\x00"
VERIFIED = 4096
"""Announcements whose signature verified, remembered (per process): a node serving a topic
re-reads its entries from the store for every get_peers, and a swarm's members re-serve the
same few hundred entries all day."""
_verified: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()


def topic_target(topic: bytes) -> bytes:
    """Where a topic lives in the DHT keyspace (domain-separated from BEP 44 targets)."""
    return hashlib.sha1(_DOMAIN + bytes(topic)).digest()


def announcement_buffer(topic: bytes, expires_at: float, record: bytes) -> bytes:
    """The bytes an announcement's signature covers."""
    return _DOMAIN + struct.pack(">B", len(topic)) + topic + struct.pack(">d", expires_at) + record


def check_topic(topic: object) -> bytes:
    if not isinstance(topic, bytes) or not 0 < len(topic) <= MAX_TOPIC:
        raise ItemError(errors.PROTOCOL, f"topic must be 1..{MAX_TOPIC} bytes")
    return topic


@dataclass(frozen=True, slots=True)
class Announcement:
    """One peer's live entry under a topic."""

    peer_id: PeerId
    """The announcing peer (its Ed25519 public key), which signed the entry."""
    record: bytes
    """Opaque bytes the peer publishes about itself (callers put msgpack here)."""
    expires_at: float
    """Unix time after which the entry is dropped."""
    signature: bytes
    """Ed25519 signature of :func:`announcement_buffer`."""

    @classmethod
    def create(cls, key: Signer, peer_id: PeerId, topic: bytes, record: bytes,
               expires_at: float) -> Announcement:
        check_topic(topic)
        if len(record) > MAX_RECORD:
            raise ItemError(errors.VALUE_TOO_BIG,
                            f"record is {len(record)} bytes; at most {MAX_RECORD}")
        sig = key.sign(announcement_buffer(topic, float(expires_at), bytes(record)))
        return cls(peer_id, bytes(record), float(expires_at), sig)

    @classmethod
    def from_wire(cls, topic: bytes, peer: object, record: object, expires_at: object,
                  signature: object) -> Announcement:
        """Build and check an entry that came from a peer; raises :class:`ItemError`."""
        if not isinstance(peer, bytes) or len(peer) != KEY_LEN:
            raise ItemError(errors.PROTOCOL, "peer must be a 32-byte public key")
        if not isinstance(record, bytes) or len(record) > MAX_RECORD:
            raise ItemError(errors.VALUE_TOO_BIG, f"record must be bytes, at most {MAX_RECORD}")
        if (isinstance(expires_at, bool) or not isinstance(expires_at, int | float)
                or not math.isfinite(expires_at)):
            raise ItemError(errors.PROTOCOL, "expires_at must be a number")
        if not isinstance(signature, bytes) or len(signature) != SIG_LEN:
            raise ItemError(errors.BAD_SIGNATURE, "signature must be 64 bytes")
        ann = cls(PeerId(peer), record, float(expires_at), signature)
        ann.check(topic)
        return ann

    def check(self, topic: bytes) -> None:
        """Verify the signature, once per (peer, signature, signed bytes): the key holds the
        whole signed content, so a borrowed signature on other bytes is checked afresh."""
        buf = announcement_buffer(topic, self.expires_at, self.record)
        key = (self.peer_id.raw, self.signature, hashlib.sha256(buf).digest())
        if key in _verified:
            _verified.move_to_end(key)
            return
        if not verify(self.peer_id, self.signature, buf):
            raise ItemError(errors.BAD_SIGNATURE, "announcement signature does not verify")
        _verified[key] = None
        while len(_verified) > VERIFIED:
            _verified.popitem(last=False)


def entry_value(ann: Announcement) -> dict[bytes, bytes]:
    """An announcement as the value of its peer's BEP 44 mutable item (salt = the topic):
    the copy a reader fetches by the peer's key when the peer cannot be asked directly.
    Mainline nodes check the item's signature; the reader also checks the entry's own."""
    return {b"r": ann.record, b"s": ann.signature, b"x": struct.pack(">d", ann.expires_at)}


def entry_from_value(topic: bytes, pubkey: bytes, value: object) -> Announcement:
    """The announcement in a BEP 44 value written by :func:`entry_value`, checked against
    the topic and the item's key; raises :class:`ItemError`."""
    if not isinstance(value, dict) or not isinstance(value.get(b"x"), bytes) \
            or len(value[b"x"]) != 8:
        raise ItemError(errors.PROTOCOL, "not a membership entry")
    (expires_at,) = struct.unpack(">d", value[b"x"])
    return Announcement.from_wire(topic, pubkey, value.get(b"r"), expires_at,
                                  value.get(b"s"))
