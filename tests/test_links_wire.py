"""The wire codec: round trips, limits, and every kind of malformed frame."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from identity.keys import PeerKey
from swarm import wire
from swarm.errors import ProtocolError


@wire.message("test.inner")
class Inner(wire.Message):
    """A nested struct."""

    name: str
    weights: dict[str, float]


@wire.message("test.task")
class Task(wire.Message):
    """A message using every supported field type."""

    task_id: int
    op: str
    payload: bytes
    urgent: bool
    scale: float
    peer: wire.PeerId
    inputs: list[np.ndarray]
    inner: Inner
    note: str | None = None
    tags: list[str] = ()


PEER = PeerKey.from_seed(bytes(32)).peer_id


def _task(*arrays: np.ndarray, **kw) -> Task:
    fields = dict(task_id=7, op="matmul", payload=b"\x00\x01", urgent=True, scale=0.5,
                  peer=PEER, inputs=list(arrays),
                  inner=Inner("w", {"a": 1.0}), tags=["x"])
    fields.update(kw)
    return Task(**fields)


def _frames(msg, **kw) -> list[bytes]:
    """Frames as they arrive: joined (links other than TLS join a chunk's head and data)."""
    return [bytes(f) for f in wire.encode(msg, **kw)]


def test_a_chunk_frame_leaves_the_array_bytes_where_they_lie():
    """Joining a chunk's head and data cost the sender a copy of every array byte."""
    arr = np.arange(300_000, dtype=np.float32)
    header, *chunks = wire.encode(_task(arr))
    assert isinstance(header, bytes) and len(chunks) == -(-arr.nbytes // wire.CHUNK_SIZE) > 1
    assert all(isinstance(c, wire.Chunk) and len(c.head) == wire.CHUNK_HEAD for c in chunks)
    assert np.shares_memory(np.frombuffer(chunks[0].data, np.uint8), arr)
    assert len(chunks[0]) == len(bytes(chunks[0])) == wire.MAX_FRAME
    assert b"".join(c.data for c in chunks) == arr.tobytes()


def _decode_all(frames, decoder=None):
    decoder = decoder or wire.Decoder()
    out = []
    for f in frames:
        out += decoder.feed(f)
    return out


def _header(body, type_name="test.task", msg_id=1) -> bytes:
    return bytes((wire.PROTOCOL_VERSION, wire.KIND_HEADER)) + msgpack.packb(
        [msg_id, type_name, body], use_bin_type=True)


def _valid_body() -> dict:
    return msgpack.unpackb(_frames(_task())[0][2:], raw=False)[2]


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint8", "bool",
                                   "complex64", ">f4"])
def test_round_trip_arrays_of_each_dtype(dtype):
    arr = (np.arange(300_000) % 7).astype(dtype).reshape(600, 500)
    small = np.ones((3, 2), dtype=dtype)
    frames = _frames(_task(arr, small, np.zeros((0, 4), dtype=dtype)))
    assert all(len(f) <= wire.MAX_FRAME for f in frames)
    assert len(frames) > 2  # the big array was chunked
    (msg,) = _decode_all(frames)
    assert [a.shape for a in msg.inputs] == [(600, 500), (3, 2), (0, 4)]
    assert np.array_equal(msg.inputs[0], arr) and np.array_equal(msg.inputs[1], small)
    assert msg.inputs[0].flags.writeable
    assert msg.inner == Inner("w", {"a": 1.0}) and msg.note is None and msg.tags == ["x"]


@wire.message("test.named")
class Named(wire.Message):
    """Arrays in a map (a model's named weights)."""

    tensors: dict[str, np.ndarray]
    shapes: dict[int, list[int]]


def test_arrays_in_a_map_round_trip_inline_and_chunked():
    """A map's values are encoded with the message's array list (the map once shadowed it)."""
    big = np.arange(200_000, dtype=np.float32)
    frames = _frames(Named({"w": big, "b": np.ones(3, np.float32)}, {1: [2, 3]}))
    assert len(frames) > 2
    (msg,) = _decode_all(frames)
    assert np.array_equal(msg.tensors["w"], big) and msg.tensors["b"].tolist() == [1, 1, 1]
    assert msg.shapes == {1: [2, 3]}
    with pytest.raises(TypeError, match=r"Named.tensors: key 1 is not str"):
        _frames(Named({1: big}, {}))


def test_chunks_may_arrive_in_any_order_and_messages_interleave():
    a = np.random.default_rng(1).random((700, 700))
    b = np.random.default_rng(2).random((500, 300)).astype(np.float32)
    fa, fb = _frames(_task(a), msg_id=1), _frames(_task(b), msg_id=2)
    frames = [fa[0], fb[0]] + fa[:0:-1] + fb[1:]
    dec = wire.Decoder()
    out = _decode_all(frames, dec)
    assert [m.inputs[0].shape for m in out] == [(700, 700), (500, 300)]
    assert np.array_equal(out[0].inputs[0], a) and np.array_equal(out[1].inputs[0], b)
    assert dec.pending_messages == 0


def test_small_message_is_one_frame():
    assert len(_frames(_task(np.ones(100)))) == 1


def test_encode_refuses_local_mistakes():
    with pytest.raises(TypeError, match="not a registered"):
        _frames(object())
    with pytest.raises(TypeError, match="expected int"):
        _frames(_task(task_id="7"))
    with pytest.raises(TypeError, match="does not travel"):
        _frames(_task(np.array(["a"], dtype=object)))
    with pytest.raises(ValueError, match="header is"):
        _frames(_task(payload=b"x" * (wire.MAX_FRAME + 1)))
    with pytest.raises(TypeError, match="cannot travel"):
        @wire.message("test.bad")
        class Bad(wire.Message):
            x: set[int]


def test_unknown_fields_are_ignored_and_defaults_fill_missing_optional_ones():
    body = _valid_body()
    body["added_by_a_newer_peer"] = [1, 2, 3]
    del body["note"]
    (msg,) = wire.Decoder().feed(_header(body))
    assert msg.task_id == 7 and msg.note is None


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda b: b.pop("op"), "missing field 'op'"),
    (lambda b: b.update(task_id="7"), r"Task.task_id: expected int, got str"),
    (lambda b: b.update(urgent=1), "expected bool"),
    (lambda b: b.update(peer=b"short"), "32-byte PeerId"),
    (lambda b: b.update(inputs=[5]), r"inputs\[\]: expected an array"),
    (lambda b: b.update(inner={"name": "x", "weights": {"a": "heavy"}}), "expected float"),
    (lambda b: b.update(inner={"weights": {}}), "missing field 'name'"),
    (lambda b: b.update(tags="x"), "expected a list"),
])
def test_missing_or_mistyped_fields_are_refused(mutate, match):
    body = _valid_body()
    mutate(body)
    with pytest.raises(ProtocolError, match=match):
        wire.Decoder().feed(_header(body))


@pytest.mark.parametrize(("frame", "match"), [
    (b"", "too short"),
    (bytes((9, 1)) + b"\x90", "protocol version 9"),
    (bytes((1, 7)) + b"\x90", "unknown frame kind"),
    (bytes((1, 1)) + b"\xc1\xff", "malformed header"),
    (bytes((1, 1)) + b"\x93\x01", "malformed header"),
    (bytes((1, 1)) + msgpack.packb([1, "no.such.type", {}]), "unknown message type"),
    (bytes((1, 1)) + msgpack.packb({"a": 1}), r"not \[msg_id, type"),
    (bytes((1, 1)) + msgpack.packb([1, "test.task", {}, msgpack.ExtType(9, b"")]),
     "unknown msgpack ext"),
    (b"\x01\x01" + b"\x00" * wire.MAX_FRAME, "exceeds"),
    (struct.pack("<BBIHI", 1, 2, 5, 0, 0) + b"xx", "not being received"),
])
def test_malformed_frames_are_refused_with_a_clear_error(frame, match):
    dec = wire.Decoder()
    with pytest.raises(ProtocolError, match=match):
        dec.feed(frame)
    with pytest.raises(ProtocolError, match="already failed"):
        dec.feed(_frames(_task())[0])


def _array_ext(index, dtype, shape, data=None):
    return msgpack.ExtType(wire.EXT_ARRAY, msgpack.packb([index, dtype, shape, data]))


@pytest.mark.parametrize(("ext", "match"), [
    (_array_ext(0, "float32", [1 << 30]), "exceeds"),          # claims 4 GiB
    (_array_ext(0, "object", [1]), "dtype 'object' is not allowed"),
    (_array_ext(0, "float32", [-1]), "bad array shape"),
    (_array_ext(0, "float32", [2], b"\x00"), "inline array has 1 bytes"),
    (_array_ext(3, "float32", [2]), "indices"),
])
def test_bad_array_headers_are_refused(ext, match):
    body = _valid_body()
    body["inputs"] = [ext]
    with pytest.raises(ProtocolError, match=match):
        wire.Decoder().feed(_header(body))


def test_configured_limits_apply():
    frames = _frames(_task(np.zeros(1000, dtype=np.float64)))
    with pytest.raises(ProtocolError, match="exceeds 4000"):
        _decode_all(frames, wire.Decoder(wire.Limits(max_array_bytes=4000)))


def test_chunk_out_of_range_duplicated_or_wrong_size_is_refused():
    frames = _frames(_task(np.zeros(200_000)), msg_id=3)   # 1.6 MB: 7 chunks
    head = struct.Struct("<BBIHI")
    cases = [
        (head.pack(1, 2, 3, 0, 99) + b"x", "chunk 99 out of range"),
        (head.pack(1, 2, 3, 1, 0) + b"x", "array 1"),
        (frames[1], "arrived twice"),
        (frames[1][:-1], "expected"),
    ]
    for bad, match in cases:
        dec = wire.Decoder()
        dec.feed(frames[0])
        if match == "arrived twice":
            dec.feed(frames[1])
        with pytest.raises(ProtocolError, match=match):
            dec.feed(bad)


def test_a_chunk_lands_in_place_and_only_the_chunk_just_checked():
    """chunk_target names the slot of the array for a transport to write into; the head
    alone then completes it. A head-only frame that was not just checked is a short chunk."""
    x = np.arange(100_000, dtype=np.float64)  # 4 chunks
    frames = _frames(_task(x), msg_id=5)
    dec = wire.Decoder()
    assert dec.feed(frames[0]) == [] and dec.fed == 1
    got = []
    for f in frames[1:]:
        head, data = f[:wire.CHUNK_HEAD], memoryview(f)[wire.CHUNK_HEAD:]
        slot = dec.chunk_target(head, len(data))
        assert slot is not None and len(slot) == len(data)
        slot[:] = data
        got += dec.feed(head)
    assert dec.fed == len(frames)
    np.testing.assert_array_equal(got[0].inputs[0], x)

    dec = wire.Decoder()
    dec.feed(frames[0])
    assert dec.chunk_target(frames[1][:wire.CHUNK_HEAD], 7) is None  # wrong size
    assert dec.chunk_target(b"\x01\x02" + bytes(10), len(frames[1]) - 12) is None  # no msg
    with pytest.raises(ProtocolError, match="has 0 bytes"):
        dec.feed(frames[1][:wire.CHUNK_HEAD])  # nothing was checked for it
    dec = wire.Decoder()
    dec.feed(frames[0])
    assert dec.chunk_target(frames[1][:wire.CHUNK_HEAD], len(frames[1]) - 12) is not None
    dec.feed(frames[1])  # the whole frame after all: copied as usual
    with pytest.raises(ProtocolError, match="has 0 bytes"):
        dec.feed(frames[2][:wire.CHUNK_HEAD])  # the check was for chunk 0, used up


def test_too_many_messages_in_flight():
    dec = wire.Decoder(wire.Limits(max_pending_messages=2))
    for i in range(2):
        dec.feed(_frames(_task(np.zeros(100_000)), msg_id=i)[0])
    with pytest.raises(ProtocolError, match="too many messages"):
        dec.feed(_frames(_task(np.zeros(100_000)), msg_id=9)[0])


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
def test_transfer_precision_round_trip(precision):
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    wired = wire.cast_for_transfer(x, precision)
    assert wire.precision_of(wired) == precision
    (msg,) = _decode_all(_frames(_task(wired)))
    back = wire.restore_precision(msg.inputs[0])
    assert back.dtype == np.float32
    tol = {"f32": 0, "f16": 1e-3, "bf16": 8e-3}[precision]
    assert np.allclose(back, x, rtol=tol, atol=tol)
    if precision != "f32":
        assert wired.nbytes == x.nbytes // 2


def test_bf16_rounds_to_nearest_and_keeps_specials():
    x = np.array([1.0, 1.00390625, 1.01171875, np.inf, -np.inf, np.nan, 3e38], np.float32)
    back = wire.restore_precision(wire.cast_for_transfer(x, "bf16"))
    assert back[0] == 1.0 and back[1] == 1.0 and back[2] == 1.015625  # ties go to even
    assert np.isinf(back[3]) and np.isinf(back[4]) and np.isnan(back[5])
    with pytest.raises(ValueError, match="precision"):
        wire.cast_for_transfer(x, "f8")


# -- property tests --------------------------------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=600), max_size=6))
def test_fuzz_decoder_raises_only_protocol_errors(frames):
    dec = wire.Decoder()
    for frame in frames:
        try:
            dec.feed(frame)
        except ProtocolError:
            return


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzz_mutated_valid_frames(data):
    arr = np.arange(70_000, dtype=np.float32)  # 280 KB: two chunks
    frames = list(_frames(_task(arr), msg_id=1))
    i = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[i])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, min(len(frame) - 1, 300)))
        frame[pos] = data.draw(st.integers(0, 255))
    frames[i] = bytes(frame)
    dec = wire.Decoder()
    try:
        out = _decode_all(frames, dec)
    except ProtocolError:
        return
    for msg in out:  # whatever survives mutation is still well-typed
        assert isinstance(msg, Task) and all(isinstance(a, np.ndarray) for a in msg.inputs)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 700_000), min_size=1, max_size=3), seed=st.integers(0, 99))
def test_reassembly_in_shuffled_order_is_exact(sizes, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 255, n, dtype=np.uint8) for n in sizes]
    frames = _frames(_task(*arrays))
    body = frames[1:]
    rng.shuffle(body)
    (msg,) = _decode_all([frames[0], *body])
    assert all(np.array_equal(a, b) for a, b in zip(msg.inputs, arrays, strict=True))
