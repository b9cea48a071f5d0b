"""write_private: the one atomic 0600 file writer (keys, software authenticators)."""

from __future__ import annotations

import os
import stat

import pytest

from identity.keys import PeerKey


def test_a_failed_key_save_leaves_no_copy_of_the_key_behind(tmp_path):
    """The key is written under a temporary name, then put in place; when that fails (here
    a directory stands at the path) the temporary copy of the private key must go too."""
    target = tmp_path / "peer.pem"
    target.mkdir()
    with pytest.raises(OSError):
        PeerKey.generate().save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peer.pem"]


def test_write_private_is_0600_whole_and_replaces(tmp_path):
    from identity.files import write_private

    old = os.umask(0)
    try:
        path = tmp_path / "sub" / "secret"
        assert write_private(path, b"one")
        assert write_private(path, b"two")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["secret"]


def test_write_private_exclusive_keeps_what_stands(tmp_path):
    from identity.files import write_private

    path = tmp_path / "secret"
    assert write_private(path, b"first", exclusive=True)
    assert not write_private(path, b"second", exclusive=True)
    assert path.read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]
