"""Member records: round trip, size, strict decoding of untrusted bytes."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from identity.keys import PeerKey
from swarm.errors import ProtocolError
from swarm.members import (
    MAX_HOSTED,
    MAX_MODELS,
    MAX_RECORD,
    MAX_SERVING,
    MAX_TASKS,
    MODEL_ID,
    Health,
    MemberRecord,
    membership_topic,
    read_health,
    swarm_id,
)


def record(**kw):
    base = dict(peer_id=PeerKey.generate().peer_id, tflops=0.25,
                links=(("127.0.0.1", 4000), ("2001:db8::1", 4001)), dht=("127.0.0.1", 5000),
                version="0.1.0", roles=("worker",), health=read_health())
    base.update(kw)
    return MemberRecord(**base)


def test_round_trip_and_size():
    r = record()
    data = r.encode()
    assert len(data) <= MAX_RECORD
    assert MemberRecord.decode(data, r.peer_id) == r


def test_record_of_another_peer_is_refused():
    r = record()
    with pytest.raises(ProtocolError, match="another peer"):
        MemberRecord.decode(r.encode(), PeerKey.generate().peer_id)


def test_oversized_record_refused_locally():
    with pytest.raises(ValueError, match="bytes"):
        record(links=tuple(("h" * 200, 1000 + i) for i in range(8))).encode()


@pytest.mark.parametrize("mutate", [
    lambda m: m.update(v=2), lambda m: m.update(id=b"short"), lambda m: m.update(tf=-1.0),
    lambda m: m.update(ln=[["h", 70000]]), lambda m: m.update(h=[None] * 4),
    lambda m: m.update(tf=float("nan")), lambda m: m.update(ro="worker"),
])
def test_bad_fields_are_protocol_errors(mutate):
    m = msgpack.unpackb(record().encode(), raw=False)
    mutate(m)
    with pytest.raises(ProtocolError):
        MemberRecord.decode(msgpack.packb(m, use_bin_type=True))


@given(st.binary(max_size=1200))
def test_decoder_never_crashes(data):
    try:
        MemberRecord.decode(data)
    except ProtocolError:
        pass


def test_ids_and_topics():
    sid = swarm_id(PeerKey.generate().public_bytes)
    assert len(sid) == 20 and membership_topic(sid).endswith(sid)
    assert isinstance(read_health(), Health)


def _requesters(n):
    return tuple((PeerKey.generate().peer_id, n - i) for i in range(n))


def test_running_work_round_trips_and_is_optional():
    busy = record(tasks=9, serving=_requesters(3))
    assert MemberRecord.decode(busy.encode(), busy.peer_id) == busy
    idle = record()
    m = msgpack.unpackb(idle.encode(), raw=False)
    assert "rt" not in m and "sv" not in m  # an idle record is byte-for-byte the old format
    assert MemberRecord.decode(idle.encode()).tasks == 0
    assert MemberRecord.decode(idle.encode()).serving == ()


def test_running_work_fits_the_size_bound():
    full = record(tasks=MAX_TASKS - 1, serving=_requesters(MAX_SERVING))
    assert len(full.encode()) <= MAX_RECORD
    assert MemberRecord.decode(full.encode()) == full
    # big addresses leave less room: the requester list is cut short, the count stays honest
    crowded = record(links=tuple(("h" * 60, 1000 + i) for i in range(8)), tasks=50,
                     serving=_requesters(MAX_SERVING))
    data = crowded.encode()
    assert len(data) <= MAX_RECORD
    back = MemberRecord.decode(data)
    assert back.tasks == 50 and 0 < len(back.serving) < MAX_SERVING
    assert back.serving == crowded.serving[:len(back.serving)]


@pytest.mark.parametrize("mutate", [
    lambda m: m.update(rt=-1), lambda m: m.update(rt="3"), lambda m: m.update(rt=1 << 40),
    lambda m: m.update(rt=True),
    lambda m: m.update(sv=[[b"x" * 32, 1]] * 9), lambda m: m.update(sv=[[b"short", 1]]),
    lambda m: m.update(sv=[[b"x" * 32, 0]]), lambda m: m.update(sv=[[b"x" * 32, 5]]),
    lambda m: m.update(sv=[[b"x" * 32, 1], [b"x" * 32, 1]]), lambda m: m.update(sv="many"),
])
def test_bad_running_work_is_a_protocol_error(mutate):
    m = msgpack.unpackb(record(tasks=2, serving=_requesters(1)).encode(), raw=False)
    mutate(m)
    with pytest.raises(ProtocolError):
        MemberRecord.decode(msgpack.packb(m, use_bin_type=True))


def _offer(hosted: int = MAX_HOSTED) -> dict:
    return dict(memory=(450 << 20, 123 << 20),
                models=tuple(bytes([i]) * MODEL_ID for i in range(MAX_MODELS)),
                hosted=tuple((bytes([i]) * MODEL_ID, 3 * i, 3) for i in range(hosted)))


def test_what_a_worker_offers_and_holds_round_trips_and_is_optional():
    full = record(**_offer())
    assert MemberRecord.decode(full.encode(), full.peer_id) == full
    assert full.hosted[0] == (b"\0" * MODEL_ID, 0, 3)
    m = msgpack.unpackb(record().encode(), raw=False)
    assert not {"mem", "md", "hs"} & set(m)  # a record without them is the old format
    back = MemberRecord.decode(record().encode())
    assert (back.memory, back.models, back.hosted) == (None, (), ())


def test_hosted_spans_are_cut_to_fit_the_size_bound():
    many = record(**_offer(hosted=3 * MAX_HOSTED))
    assert MemberRecord.decode(many.encode()).hosted == many.hosted[:MAX_HOSTED]
    crowded = record(links=tuple(("h" * 60, 1000 + i) for i in range(8)), tasks=50,
                     serving=_requesters(MAX_SERVING), **_offer())
    data = crowded.encode()
    assert len(data) <= MAX_RECORD
    back = MemberRecord.decode(data)
    assert back.memory == crowded.memory and back.models == crowded.models
    assert back.hosted == crowded.hosted[:len(back.hosted)]


@pytest.mark.parametrize("mutate", [
    lambda m: m.update(mem=[-1, 0]), lambda m: m.update(mem=[1]), lambda m: m.update(mem="4G"),
    lambda m: m.update(mem=[1.5, 0]), lambda m: m.update(md=[b"short"]),
    lambda m: m.update(md=[b"x" * MODEL_ID] * (MAX_MODELS + 1)),
    lambda m: m.update(hs=[[b"x" * MODEL_ID, 0, 0]]), lambda m: m.update(hs=[[b"x", 0, 1]]),
    lambda m: m.update(hs=[[b"x" * MODEL_ID, -1, 1]]),
    lambda m: m.update(hs=[[b"", 0, 1]] * (MAX_HOSTED + 1)),
])
def test_bad_offers_are_protocol_errors(mutate):
    m = msgpack.unpackb(record(**_offer(hosted=1)).encode(), raw=False)
    mutate(m)
    with pytest.raises(ProtocolError):
        MemberRecord.decode(msgpack.packb(m, use_bin_type=True))
