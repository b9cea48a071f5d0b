"""The declared record codec (:mod:`swarm.records`): member records keep the byte layout
the hand-written codec had (signed records from older members still read), and any map a
stranger signs decodes to a record or to a ProtocolError, never to anything else."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from identity.keys import PeerId
from swarm.errors import ProtocolError
from swarm.members import Health, MemberRecord

A, B, C = PeerId(bytes(range(32))), PeerId(bytes(range(1, 33))), PeerId(b"\x07" * 32)
RECORDS = [
    MemberRecord(A, 1.5),
    MemberRecord(A, 0.25, links=(("10.0.0.1", 4000), ("::1", 5)), dht=("127.0.0.1", 7),
                 version="0.1.0", roles=("worker", "requester"),
                 health=Health(0.5, 80.0, True, 41.5, 1024), actors=("matmul", "llama_span"),
                 tasks=5, serving=((B, 3), (C, 2)), follows=(9, C.raw[:12]), left=True),
    MemberRecord(A, 2.0, kind="browser", via=B, health=Health(None, None, False, None, None)),
]
GOLDEN = [
    bytes.fromhex(
        "89a17601a26964c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e"
        "1fa27466cb3ff8000000000000a26c6e90a3646874c0a3766572a0a2726f91a6776f726b6572a261"
        "6391a66d61746d756ca16895c0c0c0c0c0"
    ),
    bytes.fromhex(
        "8da17601a26964c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e"
        "1fa27466cb3fd0000000000000a26c6e9292a831302e302e302e31cd0fa092a33a3a3105a3646874"
        "92a93132372e302e302e3107a3766572a5302e312e30a2726f92a6776f726b6572a9726571756573"
        "746572a2616392a66d61746d756caa6c6c616d615f7370616ea16895cb3fe0000000000000cb4054"
        "000000000000c3cb4044c00000000000cd0400a2666f9209c40c070707070707070707070707a26c"
        "66c3a2727405a273769292c4200102030405060708090a0b0c0d0e0f101112131415161718191a1b"
        "1c1d1e1f200392c42007070707070707070707070707070707070707070707070707070707070707"
        "0702"
    ),
    bytes.fromhex(
        "8ba17601a26964c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e"
        "1fa27466cb4000000000000000a26c6e90a3646874c0a3766572a0a2726f91a6776f726b6572a261"
        "6391a66d61746d756ca16895c0c0c2c0c0a16ba762726f77736572a3766961c42001020304050607"
        "08090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20"
    ),
]
"""Their encodings by the hand-written codec before the declared one (main at 5671ce7)."""


@pytest.mark.parametrize(("record", "golden"), list(zip(RECORDS, GOLDEN, strict=True)))
def test_member_records_keep_their_byte_layout(record, golden):
    assert record.encode() == golden
    assert MemberRecord.decode(golden, A) == record


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                     st.text(max_size=40), st.binary(max_size=40))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=6), max_leaves=12)
_KEYS = st.sampled_from(["v", "id", "tf", "ln", "dht", "ver", "ro", "ac", "h", "k", "via",
                         "fo", "lf", "rt", "sv", "zz"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=16), st.sampled_from(RECORDS))
def test_any_map_decodes_to_a_record_or_a_protocol_error(changes, base):
    m = msgpack.unpackb(base.encode(), raw=False)
    m.update(changes)
    data = msgpack.packb(m, use_bin_type=True)
    if len(data) > 1000:
        return
    try:
        got = MemberRecord.decode(data)
    except ProtocolError:
        return
    assert isinstance(got, MemberRecord)
    assert MemberRecord.decode(got.encode()) == got


def _state_messages():
    from swarm.control.state import (
        BlockEntry,
        CoordinatorState,
        Endorsement,
        ForwardedBlock,
        KickOrder,
        LiarReport,
        StateItem,
    )

    st = CoordinatorState(bytes(20), 5, 9, A, admins=(C, B), policy={"x": "y"}, prev=b"p" * 32)
    st = st.with_block(BlockEntry(B, "why", "owner", 7)).without_block(B, at=9)
    st = st.with_block(BlockEntry(C, "why", "admin", 8))
    return [(StateItem.decode, st.encode_item()), (CoordinatorState.decode, st.encode()),
            (Endorsement.decode, Endorsement(7, B).encode()),
            (KickOrder.decode, KickOrder(7, B, "r", 1234).encode()),
            (LiarReport.decode, LiarReport(B, "why", b"e", True).encode()),
            (ForwardedBlock.decode, ForwardedBlock(BlockEntry(C, "x", "coordinator", 5),
                                                   3).encode())]


_STATE_KEYS = st.sampled_from(["v", "sw", "t", "q", "c", "a", "p", "pr", "u", "b", "bn", "bd",
                               "bh", "e", "r", "f", "at", "zz"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_STATE_KEYS, _VALUES, max_size=12), st.integers(0, 5))
def test_any_control_map_decodes_or_is_a_protocol_error(changes, which):
    decode, data = _state_messages()[which]
    m = msgpack.unpackb(data, raw=False)
    m.update(changes)
    try:
        decode(msgpack.packb(m, use_bin_type=True))
    except ProtocolError:
        pass
