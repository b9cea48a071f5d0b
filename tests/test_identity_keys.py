"""Peer keys: PeerId order and forms, key files created 0600, loose files refused."""

from __future__ import annotations

import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from identity import KeyFileError, PeerId, PeerKey, verify


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_peer_id_order_is_bytes_order(a, b):
    assert (PeerId(a) < PeerId(b)) == (a < b)
    assert (PeerId(a) == PeerId(b)) == (a == b)


@given(st.binary(min_size=32, max_size=32))
def test_peer_id_printable_forms_round_trip(raw):
    pid = PeerId(raw)
    assert PeerId.parse(str(pid)) == pid
    assert PeerId.parse(pid.hex()) == pid
    assert str(pid).startswith(pid.short())


@pytest.mark.parametrize("bad", ["", "p123", "zz" * 32, "p" + "1" * 52, "x" * 53])
def test_peer_id_parse_rejects_garbage(bad):
    with pytest.raises(ValueError, match="not a PeerId"):
        PeerId.parse(bad)


def test_peer_id_must_be_32_bytes():
    with pytest.raises(ValueError):
        PeerId(b"short")


def test_sign_and_verify():
    key = PeerKey.generate()
    sig = key.sign(b"hello")
    assert verify(key.peer_id, sig, b"hello")
    assert not verify(key.peer_id, sig, b"hellO")
    assert not verify(PeerKey.generate().peer_id, sig, b"hello")
    assert not verify(key.peer_id, b"\x00" * 64, b"hello")


def test_key_file_created_0600_and_reloaded(tmp_path):
    path = tmp_path / "keys" / "peer.pem"
    key = PeerKey.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = PeerKey.load_or_create(path)
    assert again.peer_id == key.peer_id
    assert key.seed().hex() not in repr(key)


def test_world_readable_key_is_refused(tmp_path):
    path = tmp_path / "peer.pem"
    PeerKey.generate().save(path)
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        PeerKey.load(path)


def test_garbage_key_file_is_refused(tmp_path):
    path = tmp_path / "peer.pem"
    path.write_bytes(b"not a key")
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="not a PEM"):
        PeerKey.load(path)
