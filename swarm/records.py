"""Compact signed records, declared: member records and the coordinator's state.

These live in 1,000-byte DHT values and are signed, so they keep short map keys and leave
out fields at their defaults; they are read from strangers, so every field is checked as it
is decoded. A record type declares its fields once (:class:`Schema` of :class:`Field` s,
each with a value codec below), and both directions come from that declaration: what a
field may hold is written in one place, not once in an encoder and again in a hand-written
decoder. Checks across fields (a serving list that adds up, a browser naming its relay) stay
with the record type. Data-plane messages use :mod:`swarm.wire`'s schemas instead (long
keys, arrays as chunks, no size bound of 1,000 bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from identity.keys import PeerId
from swarm.errors import ProtocolError

_REQUIRED: Any = object()


class Codec:
    """One value's shape: :meth:`pack` gives the msgpack-ready value, :meth:`unpack` checks
    an untrusted one and raises ``ValueError`` with what is wrong."""

    def pack(self, value: Any) -> Any:
        return value

    def unpack(self, raw: Any) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Codec):
    """An int in ``[lo, hi)`` (bools refused)."""

    lo: int = 0
    hi: int = 1 << 63

    def unpack(self, raw: Any) -> int:
        if type(raw) is not int or not self.lo <= raw < self.hi:
            raise ValueError(f"an int in [{self.lo}, {self.hi})")
        return raw


@dataclass(frozen=True)
class Num(Codec):
    """A finite number (int or float) at least ``lo``, as a float."""

    lo: float = -math.inf

    def pack(self, value: Any) -> float:
        return float(value)

    def unpack(self, raw: Any) -> float:
        if type(raw) not in (int, float) or not math.isfinite(raw) or raw < self.lo:
            raise ValueError("a finite number" + (f" >= {self.lo:g}" if self.lo > -math.inf
                                                  else ""))
        return float(raw)


@dataclass(frozen=True)
class Bool(Codec):
    def unpack(self, raw: Any) -> bool:
        if type(raw) is not bool:
            raise ValueError("a bool")
        return raw


@dataclass(frozen=True)
class Str(Codec):
    """A str of at most ``most`` characters (``utf8``: bytes of UTF-8) and at least
    ``least``."""

    most: int
    least: int = 0
    utf8: bool = False

    def unpack(self, raw: Any) -> str:
        n = len(raw.encode()) if isinstance(raw, str) and self.utf8 else \
            len(raw) if isinstance(raw, str) else -1
        if not self.least <= n <= self.most:
            raise ValueError(f"a string of {self.least} to {self.most} "
                             + ("bytes" if self.utf8 else "characters"))
        return raw


@dataclass(frozen=True)
class Bytes(Codec):
    """Bytes of one of the lengths in ``sizes``."""

    sizes: tuple[int, ...]

    def unpack(self, raw: Any) -> bytes:
        if not isinstance(raw, bytes) or len(raw) not in self.sizes:
            raise ValueError(f"{' or '.join(map(str, self.sizes))} bytes")
        return raw


@dataclass(frozen=True)
class Blob(Codec):
    """Bytes of at most ``most``."""

    most: int

    def unpack(self, raw: Any) -> bytes:
        if not isinstance(raw, bytes) or len(raw) > self.most:
            raise ValueError(f"at most {self.most} bytes")
        return raw


@dataclass(frozen=True)
class Peer(Codec):
    """A peer id (32 bytes on the wire)."""

    def pack(self, value: PeerId) -> bytes:
        return value.raw

    def unpack(self, raw: Any) -> PeerId:
        if type(raw) is not bytes or len(raw) != 32:
            raise ValueError("a 32-byte peer id")
        return PeerId(raw)


@dataclass(frozen=True)
class OneOf(Codec):
    """One of ``values``, as itself (``index``: as its position in ``values``)."""

    values: tuple[Any, ...]
    index: bool = False

    def pack(self, value: Any) -> Any:
        return self.values.index(value) if self.index else value

    def unpack(self, raw: Any) -> Any:
        if self.index:
            if type(raw) is not int or not 0 <= raw < len(self.values):
                raise ValueError(f"an index below {len(self.values)}")
            return self.values[raw]
        if type(raw) is not type(self.values[0]) or raw not in self.values:
            raise ValueError(f"one of {', '.join(map(str, self.values))}")
        return raw


@dataclass(frozen=True)
class Maybe(Codec):
    """``inner`` or None."""

    inner: Codec

    def pack(self, value: Any) -> Any:
        return None if value is None else self.inner.pack(value)

    def unpack(self, raw: Any) -> Any:
        return None if raw is None else self.inner.unpack(raw)


@dataclass(frozen=True)
class Seq(Codec):
    """A list of at most ``most`` items of ``item``, as a tuple."""

    item: Codec
    most: int

    def pack(self, value: Any) -> list:
        return [self.item.pack(v) for v in value]

    def unpack(self, raw: Any) -> tuple:
        if not isinstance(raw, list) or len(raw) > self.most:
            raise ValueError(f"a list of at most {self.most}")
        return tuple(self.item.unpack(v) for v in raw)


@dataclass(frozen=True)
class Row(Codec):
    """A fixed-length list, one codec per position, as a tuple (``make`` builds the value
    from the tuple and ``parts`` takes it apart, for a dataclass kept as a row)."""

    items: tuple[Codec, ...]
    make: Callable[..., Any] | None = None
    parts: Callable[[Any], tuple] | None = None

    def pack(self, value: Any) -> list:
        parts = self.parts(value) if self.parts is not None else value
        return [c.pack(v) for c, v in zip(self.items, parts, strict=True)]

    def unpack(self, raw: Any) -> Any:
        if not isinstance(raw, list) or len(raw) != len(self.items):
            raise ValueError(f"a list of {len(self.items)}")
        got = tuple(c.unpack(v) for c, v in zip(self.items, raw, strict=True))
        return self.make(*got) if self.make is not None else got


@dataclass(frozen=True)
class Scalars(Codec):
    """A map of at most ``most`` short str keys to small scalars (a policy)."""

    most: int
    key_len: int = 24
    str_len: int = 24

    def pack(self, value: Any) -> dict:
        return dict(sorted(value.items()))

    def unpack(self, raw: Any) -> dict:
        if not isinstance(raw, dict) or len(raw) > self.most or not all(
                isinstance(k, str) and len(k) <= self.key_len
                and isinstance(v, str | int | float | bool)
                and (not isinstance(v, str) or len(v) <= self.str_len)
                for k, v in raw.items()):
            raise ValueError(f"at most {self.most} short keys to small scalars")
        return dict(raw)


@dataclass(frozen=True)
class Field:
    """One field of a record: its map ``key``, the attribute it fills, its codec."""

    key: str
    attr: str
    codec: Codec
    default: Any = _REQUIRED
    """The value when the key is absent (a required field has none)."""
    omit: Callable[[Any], bool] | None = None
    """Leave the key out when this holds for the value (a default that costs no bytes)."""
    null_is_default: bool = False
    """A nil value reads as the default (as an absent key does)."""


@dataclass(frozen=True)
class Schema:
    """A record type's fields, in the order their keys are written."""

    name: str
    """What the record is called in errors ("member record")."""
    fields: tuple[Field, ...] = field(default_factory=tuple)

    def pack(self, obj: Any, **values: Any) -> dict[str, Any]:
        """The msgpack-ready map of ``obj``'s fields (``values`` stand in for attributes)."""
        out: dict[str, Any] = {}
        for f in self.fields:
            v = values[f.attr] if f.attr in values else getattr(obj, f.attr)
            if f.omit is None or not f.omit(v):
                out[f.key] = f.codec.pack(v)
        return out

    def unpack(self, m: dict) -> dict[str, Any]:
        """Attribute -> checked value for each field; :class:`ProtocolError` naming the
        field for a value that is missing or wrong."""
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.key not in m or (f.null_is_default and m[f.key] is None):
                if f.default is _REQUIRED:
                    raise ProtocolError(f"{self.name}: {f.attr} is missing")
                out[f.attr] = f.default
                continue
            try:
                out[f.attr] = f.codec.unpack(m[f.key])
            except (ValueError, TypeError) as exc:
                raise ProtocolError(f"{self.name}: {f.attr} must be {exc}") from None
        return out
