"""Authenticated datagrams between DHT nodes (``send_message``): the signaling channel.

A message is signed by the sender's peer key over the recipient's node id, a timestamp, a
random nonce and the payload, so it cannot be forged, redirected to another node or replayed:
the recipient keeps the nonces it saw within the accepted clock window.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from dataclasses import dataclass

from dht import errors
from dht.errors import ItemError
from dht.items import KEY_LEN, SIG_LEN, Signer
from identity import PeerId, verify

MAX_PAYLOAD = 4096
NONCE_LEN = 16
WINDOW_S = 60.0  # accepted clock skew either way; nonces are remembered this long
_DOMAIN = b"swarm-dht-message\x00"


def message_buffer(recipient: bytes, sent_at: float, nonce: bytes, payload: bytes) -> bytes:
    """The bytes a message's signature covers."""
    return _DOMAIN + recipient + struct.pack(">d", sent_at) + nonce + payload


@dataclass(frozen=True, slots=True)
class Envelope:
    """One signed message as it travels."""

    sender: bytes
    """The sender's 32-byte Ed25519 public key (its PeerId)."""
    recipient: bytes
    """The recipient's 20-byte DHT node id: a message for one node is refused by others."""
    sent_at: float
    """Sender's unix time; outside the recipient's window the message is refused."""
    nonce: bytes
    """16 random bytes; a repeat within the window is a replay."""
    payload: bytes
    """The application's bytes, at most 4 KiB."""
    signature: bytes
    """Ed25519 signature of :func:`message_buffer`."""

    @classmethod
    def seal(cls, key: Signer, sender: PeerId, recipient: bytes, payload: bytes,
             now: float) -> Envelope:
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"payload is {len(payload)} bytes; at most {MAX_PAYLOAD}")
        nonce = os.urandom(NONCE_LEN)
        sig = key.sign(message_buffer(recipient, now, nonce, payload))
        return cls(sender.raw, recipient, now, nonce, bytes(payload), sig)

    def to_wire(self) -> list:
        return [self.sender, self.recipient, self.sent_at, self.nonce, self.payload,
                self.signature]

    @classmethod
    def from_wire(cls, wire: object) -> Envelope:
        """Shape checks only; :class:`ReplayGuard` checks the rest."""
        if not isinstance(wire, list | tuple) or len(wire) != 6:
            raise ItemError(errors.PROTOCOL, "message must be a 6-element list")
        sender, recipient, sent_at, nonce, payload, sig = wire
        ok = (isinstance(sender, bytes) and len(sender) == KEY_LEN
              and isinstance(recipient, bytes) and len(recipient) == 20
              and isinstance(sent_at, float)
              and isinstance(nonce, bytes) and len(nonce) == NONCE_LEN
              and isinstance(payload, bytes) and len(payload) <= MAX_PAYLOAD
              and isinstance(sig, bytes) and len(sig) == SIG_LEN)
        if not ok:
            raise ItemError(errors.PROTOCOL, "malformed message")
        return cls(sender, recipient, sent_at, nonce, payload, sig)


class ReplayGuard:
    """Accepts each validly signed message once, within ``window_s`` of the local clock.

    Remembered nonces are bounded per sender (``max_per_sender``) and in total
    (``max_entries``), and a full table never refuses anyone (invariant 8): a sender over its
    quota forgets its own oldest nonce and raises its *floor* -- any message of its sent at or
    before the floor is refused as a possible replay. A full table forgets the least recently
    active sender whole and raises a global floor the same way. So a flooding key costs only
    itself, and a flood of fresh keys delays nobody whose clock is within the churn time.
    """

    def __init__(self, window_s: float = WINDOW_S, max_entries: int = 100_000,
                 max_per_sender: int | None = None) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self.max_per_sender = (max_per_sender if max_per_sender is not None
                               else max(16, max_entries // 64))
        # sender -> nonce -> (sent_at, seen_at), in arrival order; senders by last activity
        self._seen: OrderedDict[bytes, OrderedDict[bytes, tuple[float, float]]] = OrderedDict()
        self._floor: dict[bytes, float] = {}
        self._global_floor = float("-inf")
        self._total = 0
        self._admits = 0

    def __len__(self) -> int:
        return self._total

    def admit(self, env: Envelope, own_id: bytes, now: float) -> PeerId:
        """Return the sender's PeerId or raise :class:`ItemError` (forged, stale, replayed)."""
        if env.recipient != own_id:
            raise ItemError(errors.PROTOCOL, "message is addressed to another node")
        if not abs(now - env.sent_at) <= self.window_s:  # NaN fails too
            raise ItemError(errors.PROTOCOL, "message timestamp outside the accepted window")
        buf = message_buffer(env.recipient, env.sent_at, env.nonce, env.payload)
        if not verify(env.sender, env.signature, buf):
            raise ItemError(errors.BAD_SIGNATURE, "message signature does not verify")
        self._admits += 1
        if self._admits % max(1, self.max_entries // 4) == 0:
            self._sweep(now)
        sender = env.sender
        nonces = self._seen.get(sender)
        if nonces is not None:
            self._expire_sender(sender, now)
            nonces = self._seen.get(sender)
        if env.nonce in (nonces or ()):
            raise ItemError(errors.PROTOCOL, "replayed message")
        if env.sent_at <= max(self._global_floor, self._floor.get(sender, float("-inf"))):
            raise ItemError(errors.PROTOCOL, "replayed or reordered message (older than what "
                                             "this node can still tell apart)")
        if nonces is None:
            nonces = self._seen[sender] = OrderedDict()
        self._seen.move_to_end(sender)
        if len(nonces) >= self.max_per_sender:
            _, (sent_at, _) = nonces.popitem(last=False)
            self._floor[sender] = max(self._floor.get(sender, sent_at), sent_at)
            self._total -= 1
        while self._total >= self.max_entries:
            self._forget_quietest(sender)
        nonces[env.nonce] = (env.sent_at, now)
        self._total += 1
        return PeerId(sender)

    def _forget_quietest(self, keep: bytes) -> None:
        victim = next(s for s in self._seen if s != keep)
        nonces = self._seen.pop(victim)
        floor = max([sent for sent, _ in nonces.values()] + [self._floor.pop(victim, -1e300)])
        self._global_floor = max(self._global_floor, floor)
        self._total -= len(nonces)

    def _expire_sender(self, sender: bytes, now: float) -> None:
        # A nonce seen more than 2 windows ago can no longer pass the window check.
        nonces = self._seen[sender]
        while nonces:
            nonce, (_, seen_at) = next(iter(nonces.items()))
            if now - seen_at <= 2 * self.window_s:
                break
            del nonces[nonce]
            self._total -= 1
        if not nonces:
            del self._seen[sender]
            self._floor.pop(sender, None)

    def _sweep(self, now: float) -> None:
        for sender in list(self._seen):
            self._expire_sender(sender, now)
