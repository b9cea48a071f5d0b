"""Coordinator state and control messages: round trips, limits, forged signatures, persistence."""

from __future__ import annotations

import stat

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from identity.keys import PeerId, PeerKey
from swarm.control.state import (
    BlockEntry,
    CoordinatorState,
    KickOrder,
    StateItem,
    load_state,
    save_state,
    seal,
    state_path,
    unseal,
)
from swarm.errors import ProtocolError

SWARM = bytes(range(20))
KEY = PeerKey.from_seed(b"k" * 32)


def _state() -> CoordinatorState:
    s = CoordinatorState(SWARM, 3, 7, KEY.peer_id, admins=(PeerId(b"\x02" * 32),),
                         policy={"max_workers": 5, "open": True})
    return s.with_block(BlockEntry(PeerId(b"\x01" * 32), "liar", "coordinator", 123))


def test_state_round_trip_and_chain():
    s = _state()
    assert CoordinatorState.decode(s.encode()) == s

    nxt = s.successor(term=4)
    assert nxt.seq == s.seq + 1 and nxt.prev == s.digest() and nxt.blocked == s.blocked
    assert PeerId(b"\x01" * 32) not in nxt.without_block(PeerId(b"\x01" * 32)).blocked_ids


@pytest.mark.parametrize("mutate", [
    lambda o: o.update(v=2),
    lambda o: o.update(sw=b"short"),
    lambda o: o.update(t=-1),
    lambda o: o.update(q="1"),
    lambda o: o.update(c=b"\x00" * 31),
    lambda o: o.update(b=[[b"\x01" * 32, "r", 7, 1]]),
    lambda o: o.update(b=[[b"\x01" * 32, "r" * 201, 0, 1]]),
    lambda o: o.update(p={"k": [1, 2]}),
    lambda o: o.update(pr=b"x"),
    lambda o: o.pop("a"),
])
def test_malformed_state_is_a_protocol_error(mutate):
    o = _state().to_obj()
    mutate(o)
    with pytest.raises(ProtocolError, match="malformed coordinator state"):
        CoordinatorState.decode(msgpack.packb(o, use_bin_type=True))


@given(st.binary(max_size=300))
def test_garbage_never_crashes(data):
    for fn in (CoordinatorState.decode, KickOrder.decode, lambda d: unseal(SWARM, d)):
        try:
            fn(data)
        except ProtocolError:
            pass


def test_oversized_is_refused_before_decoding():
    with pytest.raises(ProtocolError, match="over"):
        unseal(SWARM, b"\x00" * 8000)


def test_envelope_signature_binds_sender_kind_swarm_and_body():
    msg = seal(KEY, SWARM, "hb", _state().encode())
    env = unseal(SWARM, msg)
    assert env.sender == KEY.peer_id and env.kind == "hb"
    with pytest.raises(ProtocolError, match="bad signature"):
        unseal(bytes(20), msg)  # replayed into another swarm
    o = msgpack.unpackb(msg)
    for field, value in (("k", "handoff"), ("b", o["b"] + b"x"),
                         ("f", PeerKey.from_seed(b"m" * 32).public_bytes)):
        forged = dict(o, **{field: value})
        with pytest.raises(ProtocolError, match="bad signature"):
            unseal(SWARM, msgpack.packb(forged, use_bin_type=True))
    with pytest.raises(ProtocolError, match="malformed"):
        unseal(SWARM, msgpack.packb(dict(o, k="exec"), use_bin_type=True))


def test_kick_order_round_trip():
    k = KickOrder(4, PeerId(b"\x05" * 32), "maintenance", 99)
    assert KickOrder.decode(k.encode()) == k


def test_persisted_state_is_0600_and_scoped_to_its_swarm(tmp_path):
    s = _state()
    save_state(tmp_path, s)
    assert stat.S_IMODE(state_path(tmp_path, SWARM).stat().st_mode) == 0o600
    assert load_state(tmp_path, SWARM) == s
    assert load_state(tmp_path, bytes(20)) is None
    state_path(tmp_path, SWARM).write_text("{garbage")
    assert load_state(tmp_path, SWARM) is None


def test_largest_state_item_fits_one_dht_item_and_one_message():
    from dht.items import MAX_VALUE
    from swarm.control.state import MAX_ADMINS, MAX_MESSAGE, MAX_REASON, MAX_UNBLOCKS

    s = CoordinatorState(SWARM, 2**40, 2**40, KEY.peer_id,
                         admins=tuple(PeerId(bytes([i]) * 32) for i in range(MAX_ADMINS)),
                         policy={f"k{i}": "v" * 24 for i in range(4)}, prev=b"p" * 32)
    for i in range(40):
        s = s.with_block(BlockEntry(PeerId(bytes([100 + i]) * 32), "r" * MAX_REASON,
                                    "coordinator", 2**33))
    for i in range(MAX_UNBLOCKS + 3):  # the newest unblocks are carried inline
        s = s.without_block(s.blocked[0].peer, at=2**40 + i)
    assert len(s.unblocked) == MAX_UNBLOCKS
    assert len(s.encode_item()) <= MAX_VALUE - 20
    assert StateItem.decode(s.encode_item()).head.unblocked == s.unblocked
    assert CoordinatorState.decode(s.encode()) == s
    env = seal(KEY, SWARM, "hb", s.encode_item(), seal(KEY, SWARM, "endorse", b"x" * 60))
    assert len(env) <= MAX_MESSAGE


def test_the_data_dir_keeps_the_states_unblocks(tmp_path):
    s = CoordinatorState(SWARM, 3, 5, KEY.peer_id, (BlockEntry(PeerId(b"x" * 32)),))
    s = s.without_block(PeerId(b"x" * 32), at=1_800_000_000)
    save_state(tmp_path, s)
    assert load_state(tmp_path, SWARM) == s and s.unblocked_after(PeerId(b"x" * 32), 1)


def test_a_liar_report_carries_whatever_evidence_its_control_message_fits():
    """The report's own bound is its message (MAX_MESSAGE); a second, smaller evidence
    limit (3000 bytes on main) refused reports that sealed fine."""
    from swarm.control.state import MAX_MESSAGE, LiarReport, unseal

    evidence = bytes(range(256)) * 13  # 3328 bytes
    env = seal(KEY, SWARM, "liar", LiarReport(KEY.peer_id, "wrong", evidence).encode())
    assert len(env) <= MAX_MESSAGE
    assert LiarReport.decode(unseal(SWARM, env).body).evidence == evidence
