"""Canonical CBOR (CTAP2 canonical form, via ``fido2.cbor``), decoded strictly.

Statements are hashed and signed as bytes, so there must be exactly one encoding of each
value: decoding re-encodes and refuses anything that does not come back byte for byte
(truncated input, non-minimal lengths, unsorted map keys, floats, tags, null).
"""

from __future__ import annotations

import struct
from typing import Any

from fido2 import cbor

from identity.errors import MalformedStatement

MAX_ENCODED = 4096
"""No statement, proof or signed envelope is larger than this (the DHT limit is 1000)."""


def encode(value: Any) -> bytes:
    """The canonical CBOR encoding of ``value`` (ints, bytes, str, bool, lists, maps)."""
    return cbor.encode(value)


def decode(data: bytes, *, what: str = "statement", limit: int = MAX_ENCODED) -> Any:
    """Decode canonical CBOR or raise :class:`MalformedStatement` saying why."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedStatement(f"{what}: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise MalformedStatement(f"{what}: empty")
    if len(data) > limit:
        raise MalformedStatement(f"{what}: {len(data)} bytes is over the {limit}-byte limit")
    try:
        value = cbor.decode(data)
    except (ValueError, KeyError, IndexError, TypeError, struct.error, RecursionError,
            UnicodeDecodeError) as exc:
        raise MalformedStatement(f"{what}: not valid CBOR (truncated or corrupt): {exc}") from exc
    try:
        again = cbor.encode(value)
    except (ValueError, TypeError) as exc:  # e.g. a map keyed by a list
        raise MalformedStatement(f"{what}: CBOR value of an unsupported shape") from exc
    if again != data:
        raise MalformedStatement(f"{what}: not canonical CBOR (truncated, or re-encoded)")
    return value
