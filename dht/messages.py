"""Authenticated datagrams between DHT nodes (``send_message``): the signaling channel.

A message is signed by the sender's peer key over the recipient's node id, a timestamp, a
random nonce and the payload, so it cannot be forged, redirected to another node or replayed:
the recipient keeps the nonces it saw within the accepted clock window.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from dht import errors
from dht.errors import ItemError
from dht.items import KEY_LEN, SIG_LEN, Signer
from identity import PeerId, verify
from identity.replay import NonceWindow, Replayed

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
    """Accepts each validly signed message once, within ``window_s`` of the local clock;
    the nonces are kept per sender and in total by :class:`identity.replay.NonceWindow` (a
    flooding key, or a flood of fresh keys, locks nobody else out)."""

    def __init__(self, window_s: float = WINDOW_S, max_entries: int = 100_000,
                 max_per_sender: int | None = None) -> None:
        self.window = NonceWindow(window_s, max_entries, max_per_sender)

    def __len__(self) -> int:
        return len(self.window)

    def admit(self, env: Envelope, own_id: bytes, now: float) -> PeerId:
        """Return the sender's PeerId or raise :class:`ItemError` (forged, stale, replayed)."""
        if env.recipient != own_id:
            raise ItemError(errors.PROTOCOL, "message is addressed to another node")
        try:
            self.window.check_time(env.sent_at, now)
            buf = message_buffer(env.recipient, env.sent_at, env.nonce, env.payload)
            if not verify(env.sender, env.signature, buf):
                raise ItemError(errors.BAD_SIGNATURE, "message signature does not verify")
            self.window.admit(env.sender, env.nonce, env.sent_at, now)
        except Replayed as exc:
            raise ItemError(errors.PROTOCOL, f"message {exc}") from None
        return PeerId(env.sender)
