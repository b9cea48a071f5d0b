"""Signed signaling envelopes: every way to forge, misdirect or replay one is refused."""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from identity.keys import PeerKey
from identity.replay import NonceWindow, Replayed
from swarm.errors import AuthenticationError, ProtocolError
from swarm.links.signaling import (
    MAX_SKEW,
    Signal,
    SignedSignal,
    Tuning,
    open_signal,
    sdp_fingerprint,
    seal,
)
from swarm.wire import encode

A, B, M = PeerKey.generate(), PeerKey.generate(), PeerKey.generate()
FP = "AB:" * 31 + "CD"
SDP = (f"v=0\r\na=fingerprint:sha-256 {FP}\r\na=fingerprint:sha-384 11:22\r\n"
       "a=candidate:1 1 udp 1 127.0.0.1 5000 typ host\r\n")


def _signal(**kw) -> Signal:
    fields = dict(kind="offer", sender=A.peer_id, receiver=B.peer_id, session=b"s" * 16,
                  nonce=PeerKey.generate().public_bytes[:16], timestamp=time.time(), sdp=SDP,
                  fingerprint=f"sha-256 {FP}", tuning={"sctp_chunk": 16000})
    fields.update(kw)
    return Signal(**fields)


def test_a_good_signal_opens_once():
    guard = NonceWindow(MAX_SKEW)
    data = seal(A, _signal())
    got = open_signal(data, B.peer_id, guard, sender=A.peer_id)
    assert got.sender == A.peer_id and got.tuning == {"sctp_chunk": 16000}
    with pytest.raises(AuthenticationError, match="replayed"):
        open_signal(data, B.peer_id, guard)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: seal(M, _signal(sender=M.peer_id, receiver=A.peer_id)), "not for us"),
    (lambda: seal(A, _signal(timestamp=time.time() - MAX_SKEW - 5)), "stale or replayed"),
    (lambda: seal(A, _signal(timestamp=time.time() + MAX_SKEW + 5)), "stale or replayed"),
    (lambda: seal(A, _signal(fingerprint="sha-256 " + "EE:" * 31 + "EE")),
     "not the one in the SDP"),
    (lambda: seal(A, _signal(sdp="v=0\r\n")), "0 sha-256 DTLS fingerprints"),
    (lambda: seal(A, _signal(kind="hello")), "malformed"),
    (lambda: seal(A, _signal(nonce=b"short")), "malformed"),
])
def test_bad_signals_are_refused(make, match):
    with pytest.raises((AuthenticationError, ProtocolError), match=match):
        open_signal(make(), B.peer_id, NonceWindow(MAX_SKEW))


def test_a_forged_signature_is_refused():
    signed = _signal()
    (body,) = encode(signed, msg_id=0)
    forged = encode(SignedSignal(body, M.sign(body)), msg_id=0)[0]
    with pytest.raises(AuthenticationError, match="bad signature"):
        open_signal(forged, B.peer_id, NonceWindow(MAX_SKEW))
    # swapping the SDP (say, to a MITM's fingerprint) under A's signature breaks it too
    good = seal(A, signed)
    tampered = good.replace(FP.encode(), ("EE:" * 31 + "EE").encode())
    with pytest.raises(AuthenticationError, match="bad signature"):
        open_signal(tampered, B.peer_id, NonceWindow(MAX_SKEW))


def test_a_relay_claiming_another_sender_is_refused():
    with pytest.raises(AuthenticationError, match="relayed as from"):
        open_signal(seal(A, _signal()), B.peer_id, NonceWindow(MAX_SKEW), sender=M.peer_id)


def test_sealing_refuses_oversized_or_foreign_signals():
    with pytest.raises(ValueError, match="too many candidates"):
        seal(A, _signal(sdp=SDP + "a=x\r\n" * 1000))
    with pytest.raises(ValueError, match="own sender"):
        seal(M, _signal())


def test_sdp_fingerprint_picks_sha256():
    assert sdp_fingerprint(SDP) == f"sha-256 {FP}"


def test_tuning_is_only_accepted_within_bounds():
    assert Tuning.accept(Tuning().offer()) == Tuning()
    assert Tuning.accept({}) is None
    assert Tuning.accept({"sctp_chunk": 60000, "dtls_buffer": 65536}) is None
    assert Tuning.accept({"sctp_chunk": 16000, "dtls_buffer": 1000}) is None


def test_the_signal_window_forgets_old_nonces_when_full():
    guard = NonceWindow(MAX_SKEW, 3)
    for i in range(3):
        guard.admit(A.peer_id.raw, bytes([i]) * 16, 1000.0, 1000.0)
    guard.admit(A.peer_id.raw, b"x" * 16, 1200.0, 1200.0)  # the old ones expired and were pruned
    with pytest.raises(Replayed, match="replayed"):
        guard.admit(A.peer_id.raw, b"x" * 16, 1200.0, 1200.0)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000))
def test_fuzz_open_signal_raises_only_clear_errors(data):
    with pytest.raises((ProtocolError, AuthenticationError)):
        open_signal(data, B.peer_id, NonceWindow(MAX_SKEW))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_fuzz_a_bit_flip_never_changes_what_is_accepted(data):
    signal = dataclasses.replace(_signal(), nonce=b"n" * 16)
    good = bytearray(seal(A, signal))
    pos = data.draw(st.integers(0, len(good) - 1))
    good[pos] ^= 1 << data.draw(st.integers(0, 7))
    try:
        got = open_signal(bytes(good), B.peer_id, NonceWindow(MAX_SKEW))
    except (ProtocolError, AuthenticationError):
        return
    assert got == signal  # only unsigned framing (the outer msg id) may change unnoticed


@pytest.mark.parametrize(("candidates", "local"), [
    (["1 1 udp 2130706431 127.0.0.1 5000 typ host"], True),
    (["1 1 udp 2130706431 192.168.1.4 5000 typ host", "2 1 udp 1 10.0.0.2 7 typ host"], True),
    (["1 1 udp 2130706431 8.8.8.8 5000 typ host"], False),
    (["1 1 udp 1 192.168.1.4 5000 typ srflx raddr 0.0.0.0 rport 0"], False),
    (["1 1 udp 1 abcd.local 5000 typ host"], False),
    ([], False),
])
def test_tuning_is_only_for_lan_local_paths(candidates, local):
    from swarm.links.signaling import local_path_only
    sdp = "v=0\r\n" + "".join(f"a=candidate:{c}\r\n" for c in candidates)
    assert local_path_only(SDP.replace("127.0.0.1", "10.1.1.1"), sdp) is local


def test_one_flooding_sender_does_not_lock_other_senders_out():
    """Nonces are bounded per sender: a key that floods fresh signals fills only its own
    share, and a full table never refuses an honest sender (invariant 8). The flooder's
    forgotten nonces still cannot be replayed."""
    guard = NonceWindow(MAX_SKEW, 200)
    now = time.time()
    first = seal(M, _signal(sender=M.peer_id, timestamp=now))
    open_signal(first, B.peer_id, guard, now=now)
    for i in range(1, 400):
        open_signal(seal(M, _signal(sender=M.peer_id, timestamp=now + i / 1000)), B.peer_id,
                    guard, now=now + i / 1000)
    got = open_signal(seal(A, _signal(timestamp=now + 1)), B.peer_id, guard, now=now + 1)
    assert got.sender == A.peer_id
    with pytest.raises(AuthenticationError, match="replayed"):
        open_signal(first, B.peer_id, guard, now=now + 1)
