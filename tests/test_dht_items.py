"""BEP 44 items: the spec's test vectors, limits, error codes and the store rules."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dht import (
    ItemError,
    MutableItem,
    immutable_target,
    mutable_target,
    signature_buffer,
    verify_mutable,
)
from dht.items import decide_mutable_store
from identity import PeerKey

# BEP 44 "Test vectors"
PUB = bytes.fromhex("77ff84905a91936367c01360803104f92432fcd904a43511876df5cdf3e7e548")
SIG_NO_SALT = bytes.fromhex(
    "305ac8aeb6c9c151fa120f120ea2cfb923564e11552d06a5d856091e5e853cff"
    "1260d3f39e4999684aa92eb73ffd136e6f4f3ecbfda0ce53a1608ecd7ae21f01")
SIG_SALT = bytes.fromhex(
    "6834284b6b24c3204eb2fea824d82f88883a3d95e8b4a21b8c0ded553d17d17d"
    "df9a8a7104b1258f30bed3787e6cb896fca78c58f8e03b5f18f14951a87d9a08")


def test_bep44_vector_mutable_without_salt():
    assert signature_buffer(b"Hello World!", 1) == b"3:seqi1e1:v12:Hello World!"
    assert mutable_target(PUB).hex() == "4a533d47ec9c7d95b1ad75f576cffc641853b750"
    assert verify_mutable(PUB, SIG_NO_SALT, b"Hello World!", 1)
    assert not verify_mutable(PUB, SIG_NO_SALT, b"Hello World!", 2)
    assert not verify_mutable(PUB, SIG_NO_SALT, b"Hello World?", 1)


def test_bep44_vector_mutable_with_salt():
    assert (signature_buffer(b"Hello World!", 1, b"foobar")
            == b"4:salt6:foobar3:seqi1e1:v12:Hello World!")
    assert mutable_target(PUB, b"foobar").hex() == "411eba73b6f087ca51a3795d9c8c938d365e32c1"
    assert verify_mutable(PUB, SIG_SALT, b"Hello World!", 1, b"foobar")
    assert not verify_mutable(PUB, SIG_SALT, b"Hello World!", 1, b"foobaz")
    assert not verify_mutable(PUB, SIG_SALT, b"Hello World!", 1)


def test_bep44_vector_immutable():
    assert immutable_target(b"Hello World!").hex() == "e5f96f6f38320f0f33959cb4d3d656452117aadb"


def test_spec_vectors_load_as_items():
    item = MutableItem.from_wire(PUB, b"foobar", 1, b"12:Hello World!", SIG_SALT)
    assert item.value == b"Hello World!"
    assert item.target == mutable_target(PUB, b"foobar")


@pytest.mark.parametrize("key", [PeerKey.generate(), Ed25519PrivateKey.generate()])
def test_create_signs_and_normalises_the_value(key):
    item = MutableItem.create(key, {"n": 1, "s": "text"}, seq=3, salt=b"s")
    assert item.value == {b"n": 1, b"s": b"text"}
    item.check()
    assert verify_mutable(item.pubkey, item.signature, item.value, 3, b"s")


def _code(fn) -> int:
    with pytest.raises(ItemError) as info:
        fn()
    return info.value.code


def test_limits_have_bep44_codes():
    key = PeerKey.generate()
    assert _code(lambda: MutableItem.create(key, b"x" * 997, 1)) == 205
    MutableItem.create(key, b"x" * 996, 1)  # "996:" + 996 bytes = exactly 1000
    assert _code(lambda: MutableItem.create(key, b"x", 1, salt=b"s" * 65)) == 207
    MutableItem.create(key, b"x", 1, salt=b"s" * 64)
    assert _code(lambda: MutableItem.create(key, b"x", -1)) == 203
    assert _code(lambda: MutableItem.create(key, b"x", 2**63)) == 203
    MutableItem.create(key, b"x", 2**63 - 1)
    good = MutableItem.create(key, b"x", 1)
    assert _code(lambda: MutableItem.from_wire(good.pubkey, b"", 2, b"1:x",
                                               good.signature)) == 206
    assert _code(lambda: MutableItem.from_wire(good.pubkey, b"", 1, b"01:x",
                                               good.signature)) == 203
    assert _code(lambda: MutableItem.from_wire(good.pubkey, b"", 1, b"1:x",
                                               good.signature[:10])) == 206


def test_store_rules():
    key = PeerKey.generate()
    v1 = MutableItem.create(key, b"one", 1)
    v2 = MutableItem.create(key, b"two", 2)
    other1 = MutableItem.create(key, b"other", 1)
    assert decide_mutable_store(None, v1, None) is True
    assert decide_mutable_store(v1, v2, None) is True
    assert decide_mutable_store(v1, v1, None) is False  # equal: refresh only
    assert _code(lambda: decide_mutable_store(v2, v1, None)) == 302
    assert _code(lambda: decide_mutable_store(v1, other1, None)) == 302
    assert _code(lambda: decide_mutable_store(v1, v2, cas=0)) == 301
    assert decide_mutable_store(v1, v2, cas=1) is True
    assert decide_mutable_store(None, v2, cas=7) is True  # nothing stored: CAS has nothing to fail


def test_an_announcement_signature_is_verified_once(monkeypatch):
    """Issue 19: a node serving a topic re-reads its entries for every get_peers; the
    signature check runs once per (peer, signature, signed bytes), and other bytes under a
    borrowed signature are still checked (and refused)."""
    import dataclasses

    from dht import announce

    key = PeerKey.from_seed(b"a" * 32)
    ann = announce.Announcement.create(key, key.peer_id, b"topic", b"rec", 2e9)
    calls = []
    real = announce.verify
    monkeypatch.setattr(announce, "verify", lambda *a: calls.append(1) or real(*a))
    for _ in range(5):
        ann.check(b"topic")
    assert len(calls) == 1
    forged = dataclasses.replace(ann, record=b"other")
    with pytest.raises(ItemError):
        forged.check(b"topic")
    with pytest.raises(ItemError):
        ann.check(b"other-topic")
