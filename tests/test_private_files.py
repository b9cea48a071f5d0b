"""Every file a peer keeps about itself goes through identity.files.write_private: 0600
whatever the umask, and a write that fails leaves the old file whole and no stray copy."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from dht import DHTNode
from identity.keys import PeerKey
from swarm.commands.consent import ConsentStore
from swarm.control.charter import load_floor, save_floor
from swarm.control.state import CoordinatorState, load_state, save_state
from swarm.members import load_seen_peers, save_seen_peers

pytestmark = pytest.mark.timeout(60)
KEY = PeerKey.generate()
SWARM = b"s" * 20


def _state(seq: int) -> CoordinatorState:
    return CoordinatorState(SWARM, 1, seq, KEY.peer_id)


WRITERS = {
    "control state": (lambda d, n: save_state(d, _state(n)),
                      lambda d: load_state(d, SWARM).seq),
    "charter floor": (lambda d, n: save_floor(d, b"k" * 32, n),
                      lambda d: load_floor(d, b"k" * 32)),
    "seen peers": (lambda d, n: save_seen_peers(d, SWARM, [("127.0.0.1", 1000 + n)]),
                   lambda d: load_seen_peers(d, SWARM)[0][1] - 1000),
    "consent": (lambda d, n: ConsentStore(d).remember(bytes([n]) * 20, f"swarm{n}"),
                lambda d: sorted(ConsentStore(d)._load())),
}


@pytest.mark.parametrize("name", WRITERS)
def test_a_failed_write_keeps_the_old_file_and_leaves_no_copy(name, tmp_path, monkeypatch):
    save, read = WRITERS[name]
    old = os.umask(0)
    try:
        save(tmp_path, 1)
    finally:
        os.umask(old)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert all(stat.S_IMODE((tmp_path / f).stat().st_mode) == 0o600 for f in files)
    before = read(tmp_path)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        save(tmp_path, 2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == files  # no .tmp left with the data
    assert read(tmp_path) == before


async def test_the_dht_state_is_0600(tmp_path):
    """node.json names the peers this one talks to: not a secret, but nobody else's."""
    old = os.umask(0)
    try:
        node = DHTNode(data_dir=tmp_path, rpc_timeout=2)
        await node.listen()
        await node.stop()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "node.json").stat().st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".new"))]
