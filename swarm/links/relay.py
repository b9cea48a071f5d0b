"""Signaling relayed by a member both sides can reach, sealed so the relay can neither read
nor forge it.

A peer behind a NAT cannot be sent a datagram it did not ask for, but it can keep a link
(TLS, outbound) to a reachable member. Such a member runs a :class:`SignalRelay`: a peer
sends it :class:`RelaySignal` naming the receiver, and the relay passes the payload on, as
:class:`RelayedSignal` naming the link-authenticated sender, over the receiver's own link to
it. It answers :class:`RelayRefused` when it holds no link to the receiver (so the dialer
learns "unreachable" at once instead of waiting for a timeout) or when the sender is over its
rate.

End to end: the payload is a signed signal (:func:`swarm.links.signaling.seal`, the
receiver checks the signature) sealed to the receiver's key with :func:`box`: an ephemeral
X25519 key, the receiver's Ed25519 key in its X25519 form, HKDF-SHA256, ChaCha20-Poly1305.
A relay sees who talks to whom and when, nothing else; it can drop or delay, not read, alter,
redirect or replay (the signed nonce and timestamp catch replays).

Bounded: payloads of at most :data:`MAX_BOXED` bytes, a token bucket per sender, and no state
kept per message.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from identity.keys import PeerId, PeerKey
from swarm import wire
from swarm.errors import AuthenticationError, ProtocolError
from swarm.links.base import PeerLink
from swarm.links.signaling import MAX_SIGNAL

log = logging.getLogger(__name__)

_BOX_INFO = b"swarm relay box v1"
_P = 2**255 - 19
MAX_BOXED = MAX_SIGNAL + 32 + 16
"""Largest sealed payload a relay passes on (a signed signal + ephemeral key + tag)."""
RELAY_ADDR = ("relay", 0)
MAX_LINKS_PER_PEER = 4
"""Links to one peer a relay remembers (the newest is used, older ones stand by)."""
"""The address a relayed signal is reported from (there is no network address to answer)."""


# -- sealing to a peer key -------------------------------------------------------------


def _x25519_public(peer: PeerId) -> X25519PublicKey:
    """The X25519 form of an Ed25519 public key (u = (1 + y) / (1 - y) mod p)."""
    y = int.from_bytes(peer.raw, "little") & ((1 << 255) - 1)
    if y >= _P or y == 1:
        raise AuthenticationError("not a usable peer key for sealing")
    u = (1 + y) * pow(1 - y, _P - 2, _P) % _P
    return X25519PublicKey.from_public_bytes(u.to_bytes(32, "little"))


def _x25519_private(key: PeerKey) -> X25519PrivateKey:
    """The X25519 form of an Ed25519 private key (its clamped SHA-512 scalar)."""
    return X25519PrivateKey.from_private_bytes(hashlib.sha512(key.seed()).digest()[:32])


def _box_key(shared: bytes, ephemeral: bytes, receiver: PeerId) -> ChaCha20Poly1305:
    okm = HKDF(hashes.SHA256(), 32, salt=None,
               info=_BOX_INFO + ephemeral + receiver.raw).derive(shared)
    return ChaCha20Poly1305(okm)


def box(receiver: PeerId, plaintext: bytes) -> bytes:
    """Seal ``plaintext`` so that only ``receiver`` can open it (one fresh key per box)."""
    eph = X25519PrivateKey.generate()
    eph_pub = eph.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    aead = _box_key(eph.exchange(_x25519_public(receiver)), eph_pub, receiver)
    return eph_pub + aead.encrypt(b"\0" * 12, plaintext, eph_pub)


def unbox(key: PeerKey, data: bytes) -> bytes:
    """Open a box sealed to ``key`` (AuthenticationError if altered or not for us)."""
    if len(data) < 48 or len(data) > MAX_BOXED:
        raise ProtocolError(f"sealed payload of {len(data)} bytes is out of range")
    eph_pub = data[:32]
    try:
        shared = _x25519_private(key).exchange(X25519PublicKey.from_public_bytes(eph_pub))
        return _box_key(shared, eph_pub, key.peer_id).decrypt(b"\0" * 12, data[32:], eph_pub)
    except (InvalidTag, ValueError):
        raise AuthenticationError("sealed payload altered or not for us") from None


# -- messages ----------------------------------------------------------------------------


@wire.message("relay.signal")
class RelaySignal(wire.Message):
    """Peer -> relay: pass ``payload`` on to ``to``."""

    to: PeerId
    """The receiver; the relay must hold a link to it."""
    payload: bytes
    """A signed signal sealed to ``to`` (at most :data:`MAX_BOXED` bytes)."""


@wire.message("relay.relayed")
class RelayedSignal(wire.Message):
    """Relay -> peer: ``sender`` (authenticated by its link to the relay) sent this."""

    sender: PeerId
    """Who handed it to the relay; the signed signal inside must agree."""
    payload: bytes
    """As sent."""


@wire.message("relay.refused")
class RelayRefused(wire.Message):
    """Relay -> peer: a RelaySignal was not passed on."""

    to: PeerId
    """The receiver named in it."""
    reason: str
    """Why, in words ("no link to ...", "rate ...")."""


# -- the relay ---------------------------------------------------------------------------


@dataclass
class _Bucket:
    tokens: float
    at: float


class SignalRelay:
    """Passes sealed signals between the peers it holds links to.

    ``links`` maps each attached peer to its link (the owner adds and removes them, usually
    every authenticated link it holds); :meth:`handle` takes a message read from one of them.
    Per sender at most ``rate`` signals a second (bursts of ``burst``); ``clock`` is injected
    for tests.
    """

    def __init__(self, rate: float = 20.0, burst: int = 40,
                 clock: Callable[[], float] = time.monotonic, max_senders: int = 4096) -> None:
        self.links: dict[PeerId, PeerLink] = {}
        self._all: dict[PeerId, list[PeerLink]] = {}  # every attached link still open, oldest first
        self.rate, self.burst, self.clock = rate, burst, clock
        self.max_senders = max_senders
        self._buckets: dict[PeerId, _Bucket] = {}
        self.passed = 0
        self.refused = 0

    def attach(self, link: PeerLink) -> None:
        """Make ``link``'s peer reachable through this relay until the link closes.

        The newest link to a peer is the one used; when it closes, an older one still open
        takes over (issue 34: a replayed circuit that died of silence had dropped a peer
        whose real link was open)."""
        older = self._all.setdefault(link.remote, [])
        older[:] = [x for x in older if not x.closed][-(MAX_LINKS_PER_PEER - 1):]
        older.append(link)
        self.links[link.remote] = link
        link.add_close_callback(lambda _: self._detach(link))

    def _detach(self, link: PeerLink) -> None:
        alive = [x for x in self._all.get(link.remote, []) if x is not link and not x.closed]
        if alive:
            self._all[link.remote] = alive
            if self.links.get(link.remote) is link:
                self.links[link.remote] = alive[-1]
            return
        self._all.pop(link.remote, None)
        if self.links.get(link.remote) is link:
            del self.links[link.remote]
        self._buckets.pop(link.remote, None)

    def _take(self, sender: PeerId) -> bool:
        now = self.clock()
        b = self._buckets.get(sender)
        if b is None:
            if len(self._buckets) >= self.max_senders:
                self._buckets = {p: x for p, x in self._buckets.items() if p in self.links}
            b = self._buckets[sender] = _Bucket(float(self.burst), now)
        b.tokens = min(float(self.burst), b.tokens + (now - b.at) * self.rate)
        b.at = now
        if b.tokens < 1.0:
            return False
        b.tokens -= 1.0
        return True

    def route(self, sender: PeerId, msg: RelaySignal) -> tuple[PeerLink, RelayedSignal] | str:
        """Where ``msg`` goes and as what, or why it does not (sans-IO decision)."""
        if len(msg.payload) > MAX_BOXED:
            return f"payload of {len(msg.payload)} bytes exceeds {MAX_BOXED}"
        if msg.to == sender:
            return "a signal to oneself"
        if not self._take(sender):
            return f"rate: at most {self.rate:g} signals/s"
        target = self.links.get(msg.to)
        if target is None or target.closed:
            return f"no link to {msg.to.short()} (unreachable through this relay)"
        return target, RelayedSignal(sender, msg.payload)

    async def handle(self, link: PeerLink, msg: wire.Message) -> bool:
        """Act on ``msg`` read from ``link``; False if it is not a relay message."""
        if not isinstance(msg, RelaySignal):
            return False
        routed = self.route(link.remote, msg)
        try:
            if isinstance(routed, str):
                self.refused += 1
                await link.send(RelayRefused(msg.to, routed))
            else:
                target, out = routed
                await target.send(out)
                self.passed += 1
        except ConnectionError as exc:
            log.info("relay: could not pass a signal on: %s", exc)
        return True


# -- the client side ---------------------------------------------------------------------


Inbox = Callable[[PeerId, tuple[str, int], bytes], object]


class RelaySignaler:
    """A :class:`~swarm.links.webrtc.Signaler` through the relays we hold links to.

    ``relays(to)`` names the links to try for receiver ``to`` (every member link but the
    one to ``to``, say); a signal goes out through all of them (a duplicate is refused by
    the receiver's replay guard). The owner passes each message read from those links to
    :meth:`handle`. Once every relay tried has refused, ``on_unreachable(peer, reason)``
    hears it (the WebRTC endpoint's :meth:`~swarm.links.webrtc.WebRTCEndpoint.unreachable`),
    so a dial fails at once instead of at its timeout.
    """

    def __init__(self, key: PeerKey, relays: Callable[[PeerId], list[PeerLink]],
                 on_unreachable: Callable[[PeerId, str], None] | None = None) -> None:
        self.key = key
        self.relays = relays
        self.on_unreachable = on_unreachable
        self._callbacks: list[Inbox] = []
        self._waiting: dict[PeerId, set[PeerLink]] = {}
        """Per receiver, the relay links a signal went through that have not refused it."""

    async def send(self, to: PeerId, addr: tuple[str, int], payload: bytes) -> None:
        links = [link for link in self.relays(to) if not link.closed and link.remote != to]
        if not links:
            self._unreachable(to, "no relay to reach it through")
            return
        self._waiting[to] = set(links)
        sealed = box(to, payload)
        for link in links:
            try:
                await link.send(RelaySignal(to, sealed))
            except ConnectionError as exc:
                self._refused(link, to, f"relay {link.remote.short()} gone: {exc}")

    def on_message(self, callback: Inbox) -> Inbox:
        self._callbacks.append(callback)
        return callback

    def _unreachable(self, to: PeerId, reason: str) -> None:
        if self.on_unreachable is not None:
            self.on_unreachable(to, reason)

    def _refused(self, link: PeerLink, to: PeerId, reason: str) -> None:
        """``link``'s relay refused our signal to ``to``. Each relay counts once, and only
        one the signal went through (issue 34: one relay answering with as many refusals
        as there were relays had failed the dial and marked the peer unreachable)."""
        left = self._waiting.get(to)
        if left is None or link not in left:
            return
        left.discard(link)
        if left:
            return
        self._waiting.pop(to, None)
        self._unreachable(to, reason)

    async def handle(self, link: PeerLink, msg: wire.Message) -> bool:
        """Act on a message read from a relay link; False if it is not ours."""
        if isinstance(msg, RelayRefused):
            log.info("relay %s refused a signal to %s: %s", link.remote.short(),
                     msg.to.short(), msg.reason)
            self._refused(link, msg.to, msg.reason)
            return True
        if not isinstance(msg, RelayedSignal):
            return False
        try:
            payload = unbox(self.key, msg.payload)
        except (AuthenticationError, ProtocolError) as exc:
            log.warning("relayed signal from %s refused: %s", msg.sender.short(), exc)
            return True
        self._waiting.pop(msg.sender, None)
        for callback in self._callbacks:
            result = callback(msg.sender, RELAY_ADDR, payload)
            if inspect.isawaitable(result):
                await result
        return True


__all__ = ["MAX_BOXED", "RelaySignaler", "RelayRefused", "RelaySignal", "RelayedSignal",
           "SignalRelay", "box", "unbox"]
