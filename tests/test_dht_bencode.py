"""Bencode: exact encodings, strict decoding, and round trips under hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dht import BencodeError, bdecode, bencode

values = st.recursive(
    st.binary(max_size=40) | st.integers(min_value=-(2**64), max_value=2**64),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.binary(max_size=8), children, max_size=5),
    max_leaves=20,
)


def test_known_encodings():
    assert bencode(b"Hello World!") == b"12:Hello World!"
    assert bencode("spam") == b"4:spam"
    assert bencode(0) == b"i0e"
    assert bencode(-42) == b"i-42e"
    assert bencode([b"a", 1]) == b"l1:ai1ee"
    assert bencode({b"b": 1, "a": [b""]}) == b"d1:al0:e1:bi1ee"


@pytest.mark.parametrize("bad", [True, 1.5, None, object(), {1: b"x"}, {b"a": 1, "a": 2}])
def test_unencodable_values_are_refused(bad):
    with pytest.raises(BencodeError):
        bencode(bad)


@pytest.mark.parametrize("data", [
    b"", b"i1", b"i01e", b"i-0e", b"ie", b"i-e", b"i1x2e", b"03:abc", b"3:ab", b"4:spamx",
    b"l", b"li1e", b"d1:ai1e", b"d1:bi1e1:ai2ee", b"d1:ai1e1:ai2ee", b"di1ei2ee", b"x",
    b"-1:a", b"i" + b"9" * 30 + b"e", b"1:a1:b",
])
def test_strict_decoder_refuses(data):
    with pytest.raises(BencodeError):
        bdecode(data)


def test_depth_and_size_bounds():
    with pytest.raises(BencodeError):
        bdecode(b"l" * 40 + b"e" * 40)
    assert bdecode(b"l" * 10 + b"e" * 10, max_depth=32) == [[[[[[[[[[]]]]]]]]]]
    with pytest.raises(BencodeError):
        bdecode(b"5:hello", max_size=4)


@given(values)
def test_round_trip(value):
    assert bdecode(bencode(value)) == value


@given(st.binary(max_size=200))
def test_decoder_never_raises_anything_but_bencode_error(data):
    try:
        value = bdecode(data)
    except BencodeError:
        return
    assert bencode(value) == data  # whatever decodes is canonical
