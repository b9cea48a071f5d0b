"""The swarm wire protocol: typed messages as msgpack frames, arrays as raw chunks.

Why this shape: links (TLS, WebRTC data channels, in-memory pairs) move *frames* of at most
:data:`MAX_FRAME` bytes (256 KiB, which browsers accept as one data-channel message). A
message becomes one header frame plus, for large arrays, chunk frames of raw bytes, so a
tensor never passes through msgpack or pickle and is reassembled straight into its final
buffer. The codec is sans-IO: :func:`encode` returns frames and :class:`Decoder` is fed
frames, so it is tested and fuzzed without sockets.

Frame layout (every frame starts with the protocol version and a kind byte)::

    header: u8 version | u8 KIND_HEADER | msgpack [msg_id, type_name, {field: value}]
    chunk:  u8 version | u8 KIND_CHUNK  | u32 msg_id | u16 array | u32 chunk | raw bytes

Arrays inside the header are msgpack ext type :data:`EXT_ARRAY` holding
``[index, dtype, shape, inline_bytes_or_nil]``; little-endian C order; the dtype must be in
:data:`DTYPES`. Array ``i`` with no inline bytes arrives as chunks ``0..n-1`` of
:data:`CHUNK_SIZE` bytes (the last one shorter), in any order, each exactly once. On a link
that negotiated shared memory (:mod:`swarm.links.shm`) the header may instead hold
``[index, dtype, shape, nil, segment]``: the bytes are in the sender's segment number
``segment`` and no chunks follow; a decoder without a ``resolve`` refuses such a header.

Schemas: ``@message("type-name")`` registers a frozen dataclass. Field types: ``int``,
``float``, ``str``, ``bytes``, ``bool``, ``PeerId``, ``numpy.ndarray``, nested dataclasses,
``list[T]``, ``dict[K, V]`` (K is str or int) and ``T | None``. On decode unknown fields are
ignored (newer peers may add some), a missing field without a default or a mistyped one is a
:class:`~swarm.errors.ProtocolError`.

Transfer precision: :func:`cast_for_transfer` turns a float array into f32, f16 or bf16 for
the wire (bf16 travels as raw uint16 under the dtype tag ``"bf16"``, numpy has no bfloat16);
:func:`restore_precision` turns it back into float32 on arrival.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack
import numpy as np

from identity.keys import PeerId
from swarm.errors import ProtocolError

PROTOCOL_VERSION = 1
MAX_FRAME = 256 * 1024
KIND_HEADER = 1
KIND_CHUNK = 2
EXT_ARRAY = 1
_CHUNK_HEAD = struct.Struct("<BBIHI")
CHUNK_HEAD = _CHUNK_HEAD.size
"""Bytes of a chunk frame before its data."""
CHUNK_SIZE = MAX_FRAME - CHUNK_HEAD
INLINE_MAX = 64 * 1024
"""Arrays up to this many bytes ride inside the header frame (one frame for small messages)."""

BF16 = np.dtype([("bf16", "<u2")])
"""numpy stand-in for bfloat16: the upper 16 bits of a float32, tagged so it is not uint16."""

DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                 "uint64", "float16", "float32", "float64", "complex64", "complex128")
}
DTYPES["bf16"] = BF16
_DTYPE_NAMES = {dt: name for name, dt in DTYPES.items()}
PRECISIONS = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class Limits:
    """What a :class:`Decoder` accepts from a peer; everything beyond is a ProtocolError."""

    max_frame: int = MAX_FRAME
    """Largest frame in bytes (header or chunk)."""
    max_array_bytes: int = 1 << 30
    """Largest single array in bytes."""
    max_message_bytes: int = 2 << 30
    """Largest message (all its arrays together) in bytes."""
    max_pending_bytes: int = 2 << 30
    """Bytes held for messages whose chunks are still arriving."""
    max_pending_messages: int = 8
    """Messages whose chunks may be arriving at the same time."""
    max_ndim: int = 16
    """Most dimensions an array may have."""
    max_arrays: int = 1024
    """Most arrays in one message."""


class Message:
    """Base class of wire messages; subclasses are registered with :func:`message`."""

    TYPE: ClassVar[str] = ""


_REGISTRY: dict[str, type] = {}
_SCHEMAS: dict[type, dict[str, tuple[Any, bool]]] = {}


def message(type_name: str) -> Callable[[type], type]:
    """Register a frozen dataclass (made one if it is not) as the wire type ``type_name``."""

    def register(cls: type) -> type:
        if not isinstance(type_name, str) or not type_name or len(type_name) > 64:
            raise ValueError("a message type name is a non-empty str of at most 64 chars")
        if type_name in _REGISTRY and _REGISTRY[type_name].__qualname__ != cls.__qualname__:
            raise ValueError(f"message type {type_name!r} is already {_REGISTRY[type_name]}")
        if not dataclasses.is_dataclass(cls):
            cls = dataclass(frozen=True)(cls)
        elif not cls.__dataclass_params__.frozen:
            raise TypeError(f"{cls.__name__}: wire messages must be frozen dataclasses")
        cls.TYPE = type_name
        # compiling the codecs checks every field's type, nested ones included
        _ENCODERS[cls] = _encoder(cls, cls.__name__)
        _DECODERS[cls] = _decoder(cls, cls.__name__)
        _REGISTRY[type_name] = cls
        return cls

    return register


# -- schemas ---------------------------------------------------------------------------

def _schema(cls: type) -> dict[str, tuple[Any, bool]]:
    """Field name -> (type, required) for a dataclass (its types are checked when the
    codecs are compiled, at registration)."""
    if cls in _SCHEMAS:
        return _SCHEMAS[cls]
    hints = typing.get_type_hints(cls)
    schema = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        schema[f.name] = (tp, required)
    _SCHEMAS[cls] = schema
    return schema


def _optional_of(tp: Any) -> Any:
    """T for ``T | None`` / ``Optional[T]``, else None."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


# -- encoding --------------------------------------------------------------------------

_ids = itertools.count(1)


Spill = Callable[[memoryview], int | None]
"""Puts a large array's bytes in shared memory: its segment number, or None to chunk it."""
Resolve = Callable[[int, int], np.ndarray]
"""``resolve(segment, nbytes)``: the peer's shared segment as a uint8 array (no copy)."""


@dataclass
class _Out:
    """What encoding one message collects besides its header body."""

    arrays: list[memoryview | None]
    """Per array index: bytes still to send as chunks, or None (inline or spilled)."""
    budget: int
    """Inline bytes left for this message's header."""
    spill: Spill | None
    """Where arrays too large to inline go first (shared memory), if anywhere."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk frame not yet joined: its head and a view of the array's bytes. A TLS link
    writes the two as they are; other links join them (``bytes(chunk)``). Joining cost the
    sender a copy of every array byte (TLS one way, four A/B sets: +3% to +21%)."""

    head: bytes
    data: memoryview

    def __len__(self) -> int:
        return len(self.head) + len(self.data)

    def __bytes__(self) -> bytes:
        return self.head + self.data


Frame = bytes | Chunk
"""What :func:`encode` returns per frame."""


def encode(msg: Any, msg_id: int | None = None, spill: Spill | None = None) -> list[Frame]:
    """Frames for ``msg``: one header frame, then chunk frames for its large arrays (the
    array's data not copied: see :class:`Chunk`).

    ``spill`` (a shared-memory link's) takes arrays larger than the inline budget first;
    an array it declines is chunked as usual.

    Raises TypeError/ValueError for a local mistake (unregistered type, wrong field type,
    a header over :data:`MAX_FRAME`, a dtype the wire does not carry).
    """
    cls = type(msg)
    if _REGISTRY.get(getattr(cls, "TYPE", None)) is not cls:
        raise TypeError(f"{cls.__name__} is not a registered wire message (use @wire.message)")
    if msg_id is None:
        msg_id = next(_ids) & 0xFFFFFFFF
    out = _Out([], INLINE_MAX, spill)
    body = _ENCODERS[cls](msg, out)
    header = bytes((PROTOCOL_VERSION, KIND_HEADER)) + msgpack.packb(
        [msg_id, cls.TYPE, body], use_bin_type=True)
    if len(header) > MAX_FRAME:
        raise ValueError(f"{cls.__name__}: header is {len(header)} bytes (> {MAX_FRAME}); "
                         "send large payloads as ndarray fields")
    frames = [header]
    for index, data in enumerate(out.arrays):
        if data is None:
            continue
        for chunk, start in enumerate(range(0, len(data), CHUNK_SIZE)):
            frames.append(Chunk(_CHUNK_HEAD.pack(PROTOCOL_VERSION, KIND_CHUNK, msg_id, index,
                                                 chunk), data[start:start + CHUNK_SIZE]))
    return frames


Encode = Callable[[Any, _Out], Any]
"""A field's encoder: value -> msgpack-ready value (arrays noted in the ``_Out``)."""
_ENCODERS: dict[type, Encode] = {}
"""Each registered message class's encoder, compiled once: what to check is decided per
field then, not by inspecting type hints for every value sent."""


def _encoder(tp: Any, where: str) -> Encode:
    inner = _optional_of(tp)
    if inner is not None:
        enc = _encoder(inner, where)
        return lambda v, out: None if v is None else enc(v, out)
    if tp is int or tp is str or tp is bytes or tp is bool:
        def scalar(v: Any, out: _Out) -> Any:
            if type(v) is not tp:
                raise TypeError(f"{where}: expected {tp.__name__}, got {type(v).__name__}")
            return v
        return scalar
    if tp is float:
        def real(v: Any, out: _Out) -> float:
            if type(v) is not float and type(v) is not int:
                raise TypeError(f"{where}: expected float, got {type(v).__name__}")
            return float(v)
        return real
    if tp is PeerId:
        def peer(v: Any, out: _Out) -> bytes:
            if not isinstance(v, PeerId):
                raise TypeError(f"{where}: expected PeerId, got {type(v).__name__}")
            return v.raw
        return peer
    if tp is np.ndarray:
        return lambda v, out: _array_to_wire(v, out, where)
    if dataclasses.is_dataclass(tp):
        fields = [(name, _encoder(ftp, f"{where}.{name}"))
                  for name, (ftp, _) in _schema(tp).items()]

        def record(v: Any, out: _Out) -> dict[str, Any]:
            if not isinstance(v, tp):
                raise TypeError(f"{where}: expected {tp.__name__}, got {type(v).__name__}")
            return {name: enc(getattr(v, name), out) for name, enc in fields}
        return record
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and len(args) == 1:
        item = _encoder(args[0], f"{where}[]")

        def seq(v: Any, out: _Out) -> list[Any]:
            if not isinstance(v, list | tuple):
                raise TypeError(f"{where}: expected list, got {type(v).__name__}")
            return [item(x, out) for x in v]
        return seq
    if origin is dict and len(args) == 2 and args[0] in (str, int):
        key, val = args[0], _encoder(args[1], f"{where}[]")

        def mapping(v: Any, out: _Out) -> dict[Any, Any]:
            if not isinstance(v, dict):
                raise TypeError(f"{where}: expected dict, got {type(v).__name__}")
            res = {}
            for k, x in v.items():
                if type(k) is not key:
                    raise TypeError(f"{where}: key {k!r} is not {key.__name__}")
                res[k] = val(x, out)
            return res
        return mapping
    raise TypeError(f"{where}: type {tp!r} cannot travel on the wire")


def _array_to_wire(arr: Any, out: _Out, where: str) -> msgpack.ExtType:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{where}: expected numpy.ndarray, got {type(arr).__name__}")
    dt = arr.dtype if arr.dtype == BF16 else arr.dtype.newbyteorder("<")
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        raise TypeError(f"{where}: dtype {arr.dtype} does not travel on the wire "
                        f"(allowed: {', '.join(DTYPES)})")
    arr = np.ascontiguousarray(arr, dtype=dt)
    data = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b"")
    index = len(out.arrays)
    fields = [index, name, list(arr.shape), None]
    if len(data) <= out.budget:
        out.budget -= len(data)
        out.arrays.append(None)
        fields[3] = bytes(data)
    elif out.spill is not None and (segment := out.spill(data)) is not None:
        out.arrays.append(None)
        fields.append(segment)
    else:
        out.arrays.append(data)
    meta = msgpack.packb(fields, use_bin_type=True)
    return msgpack.ExtType(EXT_ARRAY, meta)


# -- decoding --------------------------------------------------------------------------


@dataclass
class _ArrayRef:
    """An array announced in a header, before its bytes arrived."""

    index: int
    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int
    inline: bytes | None
    segment: int | None = None
    buffer: np.ndarray | None = None
    chunks: int = 0
    seen: set[int] = dataclasses.field(default_factory=set)


@dataclass
class _Pending:
    """A message whose header arrived and whose chunks are still coming."""

    msg: Any
    arrays: list[_ArrayRef]
    missing: int
    nbytes: int


class Decoder:
    """Sans-IO frame decoder: ``feed(frame) -> [messages completed by this frame]``.

    Any violation raises :class:`~swarm.errors.ProtocolError`; the decoder is then broken
    for good (the link closes), which keeps a half-read stream from being misparsed.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.resolve: Resolve | None = None
        """Maps a shared segment named in a header (set once a link negotiated it)."""
        self._pending: dict[int, _Pending] = {}
        self._pending_bytes = 0
        self._error: ProtocolError | None = None
        self.fed = 0
        """Frames fed so far: a transport that runs ahead of its reader compares it with the
        frames it handed out before it asks :meth:`chunk_target` anything."""
        self._landing: tuple[int, int, int] | None = None

    @property
    def pending_messages(self) -> int:
        """Messages whose chunks are still expected."""
        return len(self._pending)

    def chunk_target(self, head: bytes | bytearray | memoryview, nbytes: int
                     ) -> memoryview | None:
        """Where the ``nbytes`` of raw data after this chunk frame ``head`` belong, checked
        as :meth:`feed` checks the whole frame; None if they do not fit (then feed the whole
        frame, which says why).

        A transport writes the data there itself (no copy of its own), then feeds the head
        alone, as the very next frame. Only the frame just checked is taken so."""
        self._landing = None
        if self._error is not None or len(head) != CHUNK_HEAD \
                or head[0] != PROTOCOL_VERSION or head[1] != KIND_CHUNK:
            return None
        key = _CHUNK_HEAD.unpack_from(head)[2:]
        try:
            _, ref, start = self._chunk_slot(*key, nbytes)
        except ProtocolError:
            return None
        self._landing = key
        return memoryview(ref.buffer)[start:start + nbytes]

    def feed(self, frame: bytes | bytearray | memoryview) -> list[Any]:
        self.fed += 1
        if self._error is not None:
            raise ProtocolError(f"decoder already failed: {self._error}")
        try:
            return self._feed(frame)
        except ProtocolError as exc:
            self._error = exc
            self._pending.clear()
            raise

    def _feed(self, frame: bytes | bytearray | memoryview) -> list[Any]:
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise ProtocolError(f"a frame is bytes, not {type(frame).__name__}")
        size = len(frame)
        if size > self.limits.max_frame:
            raise ProtocolError(f"frame of {size} bytes exceeds {self.limits.max_frame}")
        if size < 2:
            raise ProtocolError("frame too short")
        if frame[0] != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {frame[0]} (we speak {PROTOCOL_VERSION})")
        if frame[1] == KIND_HEADER:
            self._landing = None
            return self._header(frame)
        if frame[1] == KIND_CHUNK:
            return self._chunk(frame)
        raise ProtocolError(f"unknown frame kind {frame[1]}")

    def _header(self, frame: bytes | bytearray | memoryview) -> list[Any]:
        refs: list[_ArrayRef] = []
        try:
            decoded = msgpack.unpackb(
                memoryview(frame)[2:], raw=False, use_list=True, strict_map_key=False,
                ext_hook=lambda code, data: self._ext(code, data, refs), timestamp=0)
        except ProtocolError:
            raise
        except Exception as exc:  # msgpack raises many kinds; all mean "malformed"
            raise ProtocolError(f"malformed header frame: {type(exc).__name__}: {exc}") from None
        if not (isinstance(decoded, list) and len(decoded) == 3 and type(decoded[0]) is int
                and 0 <= decoded[0] <= 0xFFFFFFFF
                and isinstance(decoded[1], str) and isinstance(decoded[2], dict)):
            raise ProtocolError("header is not [msg_id, type, {fields}]")
        msg_id, type_name, body = decoded
        cls = _REGISTRY.get(type_name)
        if cls is None:
            raise ProtocolError(f"unknown message type {type_name[:64]!r}")
        if msg_id in self._pending:
            raise ProtocolError(f"message id {msg_id} is already being received")
        if [r.index for r in refs] != list(range(len(refs))):
            raise ProtocolError("array indices in the header are not 0..n-1 in order")
        total = sum(r.nbytes for r in refs)
        if total > self.limits.max_message_bytes:
            raise ProtocolError(f"message of {total} bytes exceeds "
                                f"{self.limits.max_message_bytes}")
        chunked = [r for r in refs if r.inline is None and r.segment is None]
        held = sum(r.nbytes for r in chunked)
        if chunked:
            if len(self._pending) >= self.limits.max_pending_messages:
                raise ProtocolError("too many messages in flight")
            if self._pending_bytes + held > self.limits.max_pending_bytes:
                raise ProtocolError("too many bytes in flight")
        if self.resolve is None and any(r.segment is not None for r in refs):
            raise ProtocolError("a shared-memory array on a link that did not negotiate it")
        for r in refs:
            if r.inline is not None:
                r.buffer = np.frombuffer(bytearray(r.inline), dtype=np.uint8)
            elif r.segment is not None:
                r.buffer = self.resolve(r.segment, r.nbytes)  # zero-copy; ProtocolError if bad
            else:
                r.buffer = np.empty(r.nbytes, dtype=np.uint8)  # pages are committed on write
                r.chunks = -(-r.nbytes // CHUNK_SIZE)
        msg = _DECODERS[cls](body, refs)
        missing = sum(r.chunks for r in chunked)
        if missing == 0:
            return [msg]
        self._pending[msg_id] = _Pending(msg, refs, missing, held)
        self._pending_bytes += held
        return []

    def _ext(self, code: int, data: bytes, refs: list[_ArrayRef]) -> _ArrayRef:
        if code != EXT_ARRAY:
            raise ProtocolError(f"unknown msgpack ext type {code}")
        if len(refs) >= self.limits.max_arrays:
            raise ProtocolError(f"more than {self.limits.max_arrays} arrays in one message")
        try:
            meta = msgpack.unpackb(data, raw=False, use_list=True)
        except Exception as exc:
            raise ProtocolError(f"malformed array header: {exc}") from None
        if not (isinstance(meta, list) and len(meta) in (4, 5) and type(meta[0]) is int
                and isinstance(meta[1], str) and isinstance(meta[2], list)
                and (meta[3] is None or isinstance(meta[3], bytes))
                and (len(meta) == 4 or meta[3] is None and type(meta[4]) is int
                     and 0 <= meta[4] < 1 << 31)):
            raise ProtocolError("array header is not [index, dtype, shape, data|nil] or "
                                "[index, dtype, shape, nil, segment]")
        index, dtype_name, shape, inline = meta[:4]
        segment = meta[4] if len(meta) == 5 else None
        dtype = DTYPES.get(dtype_name)
        if dtype is None:
            raise ProtocolError(f"dtype {dtype_name[:32]!r} is not allowed on the wire")
        if len(shape) > self.limits.max_ndim or not all(
                type(d) is int and 0 <= d < 1 << 48 for d in shape):
            raise ProtocolError(f"bad array shape {shape[:8]!r}")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.limits.max_array_bytes:
            raise ProtocolError(f"array of {nbytes} bytes exceeds {self.limits.max_array_bytes}")
        if inline is not None and len(inline) != nbytes:
            raise ProtocolError(f"inline array has {len(inline)} bytes, shape says {nbytes}")
        ref = _ArrayRef(index, dtype, tuple(shape), nbytes, inline, segment)
        refs.append(ref)
        return ref

    def _chunk(self, frame: bytes | bytearray | memoryview) -> list[Any]:
        if len(frame) < CHUNK_HEAD:
            raise ProtocolError("chunk frame too short")
        _, _, msg_id, index, chunk = _CHUNK_HEAD.unpack_from(frame)
        landed, self._landing = self._landing == (msg_id, index, chunk), None
        data = memoryview(frame)[CHUNK_HEAD:]
        if landed and len(data) == 0:  # its data was written in place (chunk_target)
            pending, ref, _ = self._chunk_slot(msg_id, index, chunk, None)
        else:
            pending, ref, start = self._chunk_slot(msg_id, index, chunk, len(data))
            ref.buffer[start:start + len(data)] = data
        ref.seen.add(chunk)
        pending.missing -= 1
        if pending.missing:
            return []
        del self._pending[msg_id]
        self._pending_bytes -= pending.nbytes
        return [pending.msg]

    def _chunk_slot(self, msg_id: int, index: int, chunk: int, nbytes: int | None
                    ) -> tuple[_Pending, _ArrayRef, int]:
        """The message, array and offset a chunk of ``nbytes`` belongs at (None: already
        checked by :meth:`chunk_target`); ProtocolError if it belongs nowhere."""
        pending = self._pending.get(msg_id)
        if pending is None:
            raise ProtocolError(f"chunk for message {msg_id}, which is not being received")
        if index >= len(pending.arrays) or pending.arrays[index].chunks == 0:
            raise ProtocolError(f"chunk for array {index}, which message {msg_id} "
                                "does not send in chunks")
        ref = pending.arrays[index]
        if chunk >= ref.chunks:
            raise ProtocolError(f"chunk {chunk} out of range (array {index} has {ref.chunks})")
        if chunk in ref.seen:
            raise ProtocolError(f"chunk {chunk} of array {index} arrived twice")
        start = chunk * CHUNK_SIZE
        expect = min(CHUNK_SIZE, ref.nbytes - start)
        if nbytes is not None and nbytes != expect:
            raise ProtocolError(f"chunk {chunk} of array {index} has {nbytes} bytes, "
                                f"expected {expect}")
        return pending, ref, start


Decode = Callable[[Any, "list[_ArrayRef]"], Any]
"""A field's decoder: msgpack value -> typed value, or ProtocolError."""
_DECODERS: dict[type, Decode] = {}
"""Each registered message class's decoder, compiled once (see :data:`_ENCODERS`)."""


def _decoder(tp: Any, where: str) -> Decode:
    inner = _optional_of(tp)
    if inner is not None:
        dec = _decoder(inner, where)
        return lambda v, refs: None if v is None else dec(v, refs)
    if tp is int or tp is str or tp is bytes or tp is bool:
        def scalar(v: Any, refs: list[_ArrayRef]) -> Any:
            if type(v) is not tp:
                raise ProtocolError(f"{where}: expected {tp.__name__}, got {type(v).__name__}")
            return v
        return scalar
    if tp is float:
        def real(v: Any, refs: list[_ArrayRef]) -> float:
            if type(v) is not float and type(v) is not int:
                raise ProtocolError(f"{where}: expected float, got {type(v).__name__}")
            return float(v)
        return real
    if tp is PeerId:
        def peer(v: Any, refs: list[_ArrayRef]) -> PeerId:
            if type(v) is not bytes or len(v) != 32:
                raise ProtocolError(f"{where}: expected a 32-byte PeerId")
            return PeerId(v)
        return peer
    if tp is np.ndarray:
        def array(v: Any, refs: list[_ArrayRef]) -> np.ndarray:
            if not isinstance(v, _ArrayRef) or v.buffer is None:
                raise ProtocolError(f"{where}: expected an array, got {type(v).__name__}")
            # a view of the reassembly buffer: chunks arriving later fill it in place
            return v.buffer.view(v.dtype).reshape(v.shape)
        return array
    if dataclasses.is_dataclass(tp):
        fields = [(name, required, _decoder(ftp, f"{where}.{name}"))
                  for name, (ftp, required) in _schema(tp).items()]

        def record(v: Any, refs: list[_ArrayRef]) -> Any:
            if not isinstance(v, dict):
                raise ProtocolError(f"{where}: expected a map, got {type(v).__name__}")
            kwargs = {}
            for name, required, dec in fields:
                if name in v:
                    kwargs[name] = dec(v[name], refs)
                elif required:
                    raise ProtocolError(f"{where}: missing field {name!r}")
            try:
                return tp(**kwargs)
            except (TypeError, ValueError) as exc:
                raise ProtocolError(f"{where}: {exc}") from None
        return record
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        item = _decoder(args[0], f"{where}[]")

        def seq(v: Any, refs: list[_ArrayRef]) -> list[Any]:
            if not isinstance(v, list):
                raise ProtocolError(f"{where}: expected a list, got {type(v).__name__}")
            return [item(x, refs) for x in v]
        return seq
    if origin is dict:
        key, val = args[0], _decoder(args[1], f"{where}[]")

        def mapping(v: Any, refs: list[_ArrayRef]) -> dict[Any, Any]:
            if not isinstance(v, dict):
                raise ProtocolError(f"{where}: expected a map, got {type(v).__name__}")
            res = {}
            for k, x in v.items():
                if type(k) is not key:
                    raise ProtocolError(f"{where}: key {str(k)[:32]!r} is not {key.__name__}")
                res[k] = val(x, refs)
            return res
        return mapping
    raise TypeError(f"{where}: type {tp!r} cannot travel on the wire")  # the encoder said


# -- transfer precision ----------------------------------------------------------------


def cast_for_transfer(arr: np.ndarray, precision: str) -> np.ndarray:
    """``arr`` as float32 ("f32"), float16 ("f16") or bfloat16 ("bf16", dtype :data:`BF16`).

    bf16 keeps float32's range with 8 bits of mantissa (rounded to nearest even): the usual
    choice for activations; f16 keeps more mantissa but overflows above 65504.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    f32 = np.ascontiguousarray(arr, dtype=np.float32)
    if precision == "f32":
        return f32
    if precision == "f16":
        return f32.astype(np.float16)
    bits = f32.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(f32)] = 0x7FC0  # rounding could carry a NaN into infinity
    return rounded.view(BF16)


def precision_of(arr: np.ndarray) -> str | None:
    """The transfer precision an array is in ("f32", "f16", "bf16"), or None."""
    return {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16",
            BF16: "bf16"}.get(arr.dtype)


def restore_precision(arr: np.ndarray) -> np.ndarray:
    """A transfer-precision array back as float32 (bf16 and f16 widen exactly)."""
    if arr.dtype == BF16:
        return (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(arr, dtype=np.float32)
