"""Issue 14, done-when: a swarm published, joined and used with only libtorrent nodes as
bootstrap.

Six libtorrent sessions (mainline DHT nodes that know nothing of swarm) form the DHT on
127.0.0.1. ``swarm publish`` bootstraps from one of them, two ``swarm join`` processes from
others, holding a URI that names no peer at all: members find each other through BEP 5
peers under the membership topic's info-hash and each member's own entries (signed), the
charter and coordinator state are BEP 44 items on the libtorrent nodes, a coordinator is
elected, and ``swarm submit`` (bootstrapped from yet another libtorrent node) computes a
matmul correctly. Under CI a missing libtorrent fails the test.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest

from dht import topic_target
from swarm.members import membership_topic
from swarm.uri import parse
from tests.conftest import run_swarm
from tests.control_support import Cluster
from tests.libtorrent_support import lt, network, wait_alert

pytestmark = pytest.mark.timeout(420)


def _status(uri: str, boot: str) -> dict:
    res = run_swarm("status", uri, "--json", "--bootstrap", boot, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def test_a_swarm_lives_on_libtorrent_nodes_only(tmp_path):
    sessions = network(6)
    boot = [f"127.0.0.1:{s.listen_port()}" for s in sessions]
    cluster = Cluster(tmp_path)
    try:
        pub = cluster.start("pub", "publish", "--name", "lab", "--owner-key",
                            f"soft:{tmp_path / 'owner.key'}", "--backend", "numpy",
                            "--bootstrap", boot[0], "-v")
        uri = pub.wait_line(lambda s: s.startswith("magnet:?"), 120, "out")
        bare = str(replace(parse(uri), peers=()))  # names neither the publisher nor a node
        workers = [cluster.start(name, "join", bare, "--yes", "--backend", "numpy",
                                 "--threads", "1", "--bootstrap", boot[i], "-v")
                   for name, i in (("w1", 2), ("w2", 4))]
        peers = {pub.peer, *(w.peer for w in workers)}

        deadline, last = time.monotonic() + 150, None
        while time.monotonic() < deadline:
            try:
                last = _status(bare, boot[5])
                if ({m["peer_id"] for m in last["members"]} == peers
                        and last["coordinator"] in peers):
                    break
            except (AssertionError, json.JSONDecodeError) as exc:
                last = exc
            time.sleep(0.5)
        else:
            raise AssertionError(f"no 3 members and a coordinator in 150 s; last: {last}")

        # what a mainline node sees: the charter as a BEP 44 item, members as BEP 5 peers
        join = parse(uri)
        sessions[3].pop_alerts()
        sessions[3].dht_get_mutable_item(join.pubkey, join.salt)
        wait_alert(sessions[3], lt.dht_mutable_item_alert,
                   lambda a: a.authoritative and bool(a.item) and a.seq >= 1)
        topic = topic_target(membership_topic(join.swarm_id))
        sessions[5].pop_alerts()
        sessions[5].dht_get_peers(lt.sha1_hash(topic))
        wait_alert(sessions[5], lt.dht_get_peers_reply_alert,
                   lambda a: bytes.fromhex(str(a.info_hash)) == topic and len(a.peers()) >= 3)

        a = np.arange(64 * 48, dtype=np.float32).reshape(64, 48) / 100
        b = np.arange(48 * 32, dtype=np.float32).reshape(48, 32) / 50
        np.save(tmp_path / "a.npy", a)
        np.save(tmp_path / "b.npy", b)
        res = run_swarm("submit", bare, "matmul", str(tmp_path / "a.npy"),
                        str(tmp_path / "b.npy"), "-o", str(tmp_path / "c.npy"),
                        "--data-dir", str(tmp_path / "client"), "--timeout", "120",
                        "--bootstrap", boot[1], timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        assert np.allclose(np.load(tmp_path / "c.npy"), a @ b, rtol=1e-4)
    finally:
        cluster.close()
        del sessions
