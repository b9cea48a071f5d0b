"""Signed signaling envelopes for WebRTC: who offers what to whom, and nothing replayed.

An SDP offer or answer travels inside a :class:`Signal` signed by the sender's peer key. The
signature binds sender, receiver, session, a fresh nonce and timestamp, the SDP and the DTLS
certificate fingerprint in it, so a relay (a DHT node, a UDP path) can drop or delay
signaling but cannot forge, redirect, replay or re-key it. The checks are sans-IO
(:func:`open_signal` takes ``now`` and a :class:`~identity.replay.NonceWindow` of
:data:`MAX_SKEW`) so they are tested without a network.
"""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass, field

from dht.messages import MAX_PAYLOAD
from identity.keys import PeerId, PeerKey, verify
from identity.replay import NonceWindow, Replayed
from swarm import wire
from swarm.errors import AuthenticationError, ProtocolError

_DOMAIN = b"swarm webrtc signal v1\x00"
MAX_SKEW = 60.0
"""Seconds a signal's timestamp (a WebRTC signal, a circuit dialer's hello) may differ from
our clock; within that each is taken once."""
MAX_SIGNAL = MAX_PAYLOAD
"""Largest signed signal in bytes (the DHT's datagram message limit)."""
KINDS = ("offer", "answer")
_FINGERPRINT = re.compile(r"^a=fingerprint:(\S+) (\S+)\s*$", re.MULTILINE)
_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) \d+ typ (\S+)", re.MULTILINE)


@wire.message("signal.body")
class Signal(wire.Message):
    """One signaling step; signed as a whole by ``sender``."""

    kind: str
    """"offer" or "answer"."""
    sender: PeerId
    """Who made and signed it."""
    receiver: PeerId
    """Who it is for; anybody else refuses it."""
    session: bytes
    """16 random bytes chosen by the offerer; the answer repeats them."""
    nonce: bytes
    """16 fresh random bytes; a receiver refuses a nonce it saw before."""
    timestamp: float
    """Sender's Unix time; refused when more than :data:`MAX_SKEW` away from ours."""
    sdp: str
    """The SDP offer or answer."""
    fingerprint: str
    """The DTLS certificate fingerprint in ``sdp`` ("sha-256 AB:CD:..."): the link's key."""
    tuning: dict[str, int] = field(default_factory=dict)
    """Swarm-only transport tuning: offered in an offer, accepted subset in an answer."""


@wire.message("signal.signed")
class SignedSignal(wire.Message):
    """A :class:`Signal` frame and the sender's Ed25519 signature over it."""

    body: bytes
    """The encoded Signal (one wire frame)."""
    signature: bytes
    """``sender``'s signature over the domain tag and ``body``."""


def sdp_fingerprint(sdp: str) -> str:
    """The SDP's sha-256 DTLS fingerprint as "sha-256 AB:CD:..." (ProtocolError if not one).

    SDPs may list one certificate under several hashes; WebRTC stacks check every listed
    one, and the whole SDP is signed, so the sha-256 entry names the certificate.
    """
    found = {value.upper() for alg, value in _FINGERPRINT.findall(sdp) if alg.lower() == "sha-256"}
    if len(found) != 1:
        raise ProtocolError(f"the SDP carries {len(found)} sha-256 DTLS fingerprints, "
                            "expected one")
    return f"sha-256 {found.pop()}"


def seal(key: PeerKey, signal: Signal) -> bytes:
    """Sign ``signal`` (whose sender must be ``key``) into bytes for the signaler."""
    if signal.sender != key.peer_id:
        raise ValueError("a signal is signed by its own sender")
    (body,) = wire.encode(signal, msg_id=0)
    (frame,) = wire.encode(SignedSignal(body, key.sign(_DOMAIN + body)), msg_id=0)
    if len(frame) > MAX_SIGNAL:
        raise ValueError(f"signal is {len(frame)} bytes (> {MAX_SIGNAL}); too many candidates?")
    return frame


def open_signal(data: bytes, me: PeerId, guard: NonceWindow,
                now: float | None = None, sender: PeerId | None = None) -> Signal:
    """Verify signed signal bytes addressed to ``me``; ``sender`` is the relay's claim.

    Raises ProtocolError (malformed) or AuthenticationError (forged, not for us, stale,
    replayed, fingerprint not the SDP's).
    """
    if len(data) > MAX_SIGNAL:
        raise ProtocolError(f"signal of {len(data)} bytes exceeds {MAX_SIGNAL}")
    signed = _decode_one(data, SignedSignal)
    signal = _decode_one(signed.body, Signal)
    if not verify(signal.sender, signed.signature, _DOMAIN + signed.body):
        raise AuthenticationError(f"bad signature on a signal claiming to be from "
                                  f"{signal.sender.short()}")
    if sender is not None and sender != signal.sender:
        raise AuthenticationError(f"signal from {signal.sender.short()} relayed as from "
                                  f"{sender.short()}")
    if signal.receiver != me:
        raise AuthenticationError(f"signal for {signal.receiver.short()}, not for us")
    if signal.kind not in KINDS or len(signal.session) != 16 or len(signal.nonce) != 16:
        raise ProtocolError("signal kind, session or nonce malformed")
    if sdp_fingerprint(signal.sdp) != signal.fingerprint:
        raise AuthenticationError("the signed fingerprint is not the one in the SDP")
    try:  # each sender's nonces are bounded on their own: one flooding key locks nobody out
        guard.admit(signal.sender.raw, signal.nonce, signal.timestamp,
                    time.time() if now is None else now)
    except Replayed as exc:
        raise AuthenticationError(f"signal {exc}") from None
    return signal


def _decode_one(data: bytes, cls: type) -> wire.Message:
    msgs = wire.Decoder(wire.Limits(max_frame=MAX_SIGNAL, max_arrays=0)).feed(data)
    if len(msgs) != 1 or not isinstance(msgs[0], cls):
        raise ProtocolError(f"expected a {cls.__name__}")
    return msgs[0]


@dataclass(frozen=True)
class Tuning:
    """Transport tuning only swarm peers understand; both must agree before it is used.

    Larger SCTP DATA chunks mean UDP datagrams of ~16 KB (fine on loopback and LANs with
    fragmentation, not something a browser expects) and DTLS reads of matching size.
    """

    sctp_chunk: int = 16_000
    """User data bytes per SCTP DATA chunk (aiortc's default is 1176)."""
    dtls_buffer: int = 65_536
    """DTLS record read/write buffer in bytes (aiortc's default is 1500)."""

    def offer(self) -> dict[str, int]:
        return {"sctp_chunk": self.sctp_chunk, "dtls_buffer": self.dtls_buffer}

    @classmethod
    def accept(cls, offered: dict[str, int]) -> Tuning | None:
        """What we agree to from an offer (None: run standard)."""
        chunk, buf = offered.get("sctp_chunk"), offered.get("dtls_buffer")
        if chunk is None or buf is None:
            return None
        if not (1176 <= chunk <= 16_000 and chunk + 64 <= buf <= 1 << 17):
            return None
        return cls(chunk, buf)


def local_path_only(*sdps: str) -> bool:
    """Whether every ICE candidate in ``sdps`` is a host candidate on a loopback or private
    address: the only paths where tuning's large UDP datagrams are known to be fine."""
    for sdp in sdps:
        candidates = _CANDIDATE.findall(sdp)
        if not candidates:
            return False
        for address, kind in candidates:
            if kind != "host":
                return False
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:  # an mDNS name: we cannot tell where it is
                return False
            if not (ip.is_loopback or ip.is_private):
                return False
    return True
