"""Bencode (BEP 3) with a strict decoder.

BEP 44 signs and hashes bencoded bytes, so there must be exactly one encoding of each value:
the decoder refuses anything the encoder would not have produced (trailing data, leading
zeros, ``-0``, unsorted or duplicate dict keys) and bounds depth and size, because its input
comes from the network.
"""

from __future__ import annotations

from dht.errors import BencodeError

MAX_DEPTH = 32
MAX_SIZE = 1 << 20

Value = bytes | int | list["Value"] | dict[bytes, "Value"]


def bencode(value: object) -> bytes:
    """Encode bytes, str (as UTF-8), int, list/tuple and dict (bytes or str keys)."""
    out: list[bytes] = []
    _encode(value, out, 0)
    return b"".join(out)


def _encode(value: object, out: list[bytes], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise BencodeError(f"value nested deeper than {MAX_DEPTH}")
    if isinstance(value, bool):  # before int: bencode has no booleans
        raise BencodeError("bencode has no booleans; use 0 or 1")
    if isinstance(value, int):
        out.append(b"i%de" % value)
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        out.append(b"%d:" % len(raw))
        out.append(raw)
    elif isinstance(value, str):
        _encode(value.encode(), out, depth)
    elif isinstance(value, list | tuple):
        out.append(b"l")
        for item in value:
            _encode(item, out, depth + 1)
        out.append(b"e")
    elif isinstance(value, dict):
        keys: dict[bytes, object] = {}
        for k, v in value.items():
            raw = k.encode() if isinstance(k, str) else k
            if not isinstance(raw, bytes):
                raise BencodeError(f"dict keys must be bytes or str, not {type(k).__name__}")
            if raw in keys:
                raise BencodeError(f"duplicate dict key {raw!r}")
            keys[raw] = v
        out.append(b"d")
        for raw in sorted(keys):
            _encode(raw, out, depth + 1)
            _encode(keys[raw], out, depth + 1)
        out.append(b"e")
    else:
        raise BencodeError(f"cannot bencode {type(value).__name__}")


def bdecode(data: bytes, *, max_size: int = MAX_SIZE, max_depth: int = MAX_DEPTH) -> Value:
    """Decode exactly one canonical bencoded value filling all of ``data``."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BencodeError(f"bdecode takes bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_size:
        raise BencodeError(f"{len(data)} bytes is more than the {max_size} allowed")
    value, end = _Decoder(data, max_depth).decode(0, 0)
    if end != len(data):
        raise BencodeError(f"trailing data after offset {end}")
    return value


class _Decoder:
    def __init__(self, data: bytes, max_depth: int) -> None:
        self.data = data
        self.max_depth = max_depth

    def _fail(self, pos: int, why: str) -> BencodeError:
        return BencodeError(f"{why} at offset {pos}")

    def decode(self, pos: int, depth: int) -> tuple[Value, int]:
        if depth > self.max_depth:
            raise self._fail(pos, f"nested deeper than {self.max_depth}")
        if pos >= len(self.data):
            raise self._fail(pos, "unexpected end")
        lead = self.data[pos : pos + 1]
        if lead == b"i":
            end = self.data.find(b"e", pos + 1)
            if end < 0:
                raise self._fail(pos, "unterminated integer")
            return self._int(self.data[pos + 1 : end], pos), end + 1
        if lead.isdigit():
            return self._bytes(pos)
        if lead == b"l":
            items: list[Value] = []
            pos += 1
            while self.data[pos : pos + 1] != b"e":
                item, pos = self.decode(pos, depth + 1)
                items.append(item)
            return items, pos + 1
        if lead == b"d":
            result: dict[bytes, Value] = {}
            last: bytes | None = None
            pos += 1
            while self.data[pos : pos + 1] != b"e":
                if not self.data[pos : pos + 1].isdigit():
                    raise self._fail(pos, "dict key is not a byte string")
                key, pos = self._bytes(pos)
                if last is not None and key <= last:
                    raise self._fail(pos, "dict keys unsorted or duplicated")
                last = key
                result[key], pos = self.decode(pos, depth + 1)
            return result, pos + 1
        raise self._fail(pos, f"unexpected byte {lead!r}")

    def _int(self, digits: bytes, pos: int) -> int:
        body = digits[1:] if digits.startswith(b"-") else digits
        if not body or not body.isdigit():
            raise self._fail(pos, "malformed integer")
        if (body.startswith(b"0") and len(body) > 1) or digits == b"-0":
            raise self._fail(pos, "non-canonical integer")
        if len(body) > 20:
            raise self._fail(pos, "integer too long")
        return int(digits)

    def _bytes(self, pos: int) -> tuple[bytes, int]:
        colon = self.data.find(b":", pos)
        if colon < 0 or colon - pos > 8:
            raise self._fail(pos, "malformed string length")
        digits = self.data[pos:colon]
        if not digits.isdigit() or (digits.startswith(b"0") and len(digits) > 1):
            raise self._fail(pos, "non-canonical string length")
        start = colon + 1
        end = start + int(digits)
        if end > len(self.data):
            raise self._fail(pos, "string runs past the end")
        return self.data[start:end], end
