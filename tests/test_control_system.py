"""The control plane with real processes on loopback: publish, join, status, failover after
SIGKILL, block surviving coordinator change and full restart, kick, forged and stale commands,
consent without a terminal. Times are printed (run with -s) and asserted only loosely."""

from __future__ import annotations

import time

import pytest

from identity import BlockCommand, PeerKey, Role, Signed, sign_as_peer
from swarm.control.machine import Timing
from swarm.errors import RemoteError
from swarm.uri import parse
from tests.conftest import DEAD, run_swarm
from tests.control_support import SIGKILL, SIGTERM

pytestmark = [pytest.mark.system, pytest.mark.slow]


def _members(st: dict) -> set[str]:
    return {m["peer_id"] for m in st["members"]}


def test_failover_block_and_full_restart(cluster, tmp_path):
    pub = cluster.publish()
    workers = {n: cluster.join(n) for n in ("w1", "w2", "w3")}
    peers = {n: p.peer for n, p in workers.items()} | {"pub": pub.peer}
    join_times = [float(p.wait_line(lambda s: s.startswith("joined swarm"), 60).split(" in ")[1]
                        .split(" s")[0]) for p in workers.values()]
    obs = cluster.observer()
    st = obs.wait(lambda s: _members(s) == set(peers.values())
                  and s["coordinator"] in _members(s), 60, "4 members and a coordinator")
    assert st["owner"]["hardware_backed"] is False and st["term"] >= 1
    term1 = st["term"]

    # Block w3 as the owner: it leaves, and it is listed as blocked.
    res = run_swarm("block", cluster.uri, peers["w3"], "--reason", "test",
                    "--owner-key", f"soft:{tmp_path / 'owner.key'}",
                    "--data-dir", str(tmp_path / "op"), timeout=60)
    assert res.returncode == 0, res.stderr
    assert workers["w3"].wait_exit(30) == 3
    assert "blocked" in workers["w3"].err[-1]

    # A forged block command (an unknown peer claiming to be an admin) is not applied.
    st = obs.status()
    rogue = PeerKey.generate()
    forged = BlockCommand(swarm=parse(cluster.uri).pubkey, counter=int(time.time() * 1000),
                          target=PeerKey.from_seed(b"x" * 32).peer_id, reason="forged",
                          role=Role.ADMIN, term=st["term"])
    with pytest.raises(RemoteError, match="did not apply"):
        obs.send(Signed(forged, (sign_as_peer(forged, rogue),)), rogue)

    # SIGKILL the coordinator: a new one takes over with the blocklist intact.
    st = obs.status()
    coord = next(n for n, p in peers.items() if p == st["coordinator"])
    procs = {"pub": pub} | workers
    killed_at = time.monotonic()
    procs[coord].signal(SIGKILL)
    st2 = obs.wait(lambda s: s["term"] > st["term"] and s["coordinator"] != peers[coord],
                   30, "a new coordinator")
    failover = time.monotonic() - killed_at
    print(f"\njoin times {join_times}; failover after SIGKILL {failover:.2f} s")
    assert peers["w3"] in {b["peer_id"] for b in st2["blocked"]}
    # The design's bound, not a guess: silence for `failover`, a claim of the next term that
    # may take `claim`, a first successor that fails to take over within `handoff`, and one
    # observation to see it (its time measured here). The typical figure (about 2 s) is a
    # speed goal and lives in bench/, not here.
    started = time.monotonic()
    obs.status()
    observe = time.monotonic() - started
    t = Timing()
    assert failover < t.failover + t.claim + t.handoff + 2 * observe, (failover, observe)

    # The deposed coordinator's key signing a command at its old term: refused (fencing).
    old_key = PeerKey.load(tmp_path / coord / "peer.key")
    stale = BlockCommand(swarm=parse(cluster.uri).pubkey, counter=int(time.time() * 1000),
                         target=PeerKey.from_seed(b"y" * 32).peer_id, reason="stale",
                         role=Role.COORDINATOR, term=term1)
    with pytest.raises(RemoteError, match="did not apply"):
        obs.send(Signed(stale, (sign_as_peer(stale, old_key),)), old_key)

    # Full restart of every node (the killed one too): w3 stays out, the block holds.
    for p in procs.values():
        p.signal(SIGTERM)
    for p in procs.values():
        p.wait_exit(30)
    port = int(parse(cluster.uri).peers[0][1])
    pub2 = cluster.publish("pub", port=port)
    again = {n: cluster.join(n) for n in ("w1", "w2")}
    w3 = cluster.join("w3")
    assert w3.wait_exit(60) == 3
    assert "blocked" in "\n".join(w3.err)
    obs = cluster.observer()
    st3 = obs.wait(lambda s: s["coordinator"] and s["term"] > st2["term"]
                   and len(s["members"]) == 3, 60, "a coordinator after the restart")
    assert peers["w3"] in {b["peer_id"] for b in st3["blocked"]}
    assert peers["w3"] not in _members(st3)
    del pub2, again


def test_kick_disconnects_the_peer(cluster, tmp_path):
    cluster.publish()
    w1, w2 = cluster.join("w1"), cluster.join("w2")
    target = w2.peer
    cluster.observer().wait(lambda s: len(s["members"]) == 3 and s["coordinator"], 60,
                            "3 members")
    res = run_swarm("kick", cluster.uri, target, "--reason", "maintenance",
                    "--owner-key", f"soft:{tmp_path / 'owner.key'}",
                    "--data-dir", str(tmp_path / "op"), timeout=60)
    assert res.returncode == 0, res.stderr
    assert w2.wait_exit(30) == 3
    assert any("kicked: maintenance" in line for line in w2.err)
    assert w1.popen.poll() is None  # the others stay


def test_idle_members_do_not_poll_the_dht_while_heartbeats_flow(cluster, tmp_path):
    """Issue 19: a follower reads the membership topic, the charter and the state items only
    when a heartbeat's digest says its copy differs (or the coordinator falls silent), so an
    idle member's DHT lookups over a window stay bounded whatever the window's length (the
    polling code ran two or three lookups a second on every member)."""
    import json

    def stats(name: str) -> dict:
        return json.loads((tmp_path / f"{name}.stats").read_text())

    pub = cluster.start("pub", "publish", "--name", "lab", "--owner-key",
                        f"soft:{tmp_path / 'owner.key'}", "--backend", "numpy",
                        env={"SWARM_STATS": str(tmp_path / "pub.stats")})
    cluster.uri = pub.wait_line(lambda s: s.startswith("magnet:?"), 90, "out")
    workers = {n: cluster.join(n, env={"SWARM_STATS": str(tmp_path / f"{n}.stats")})
               for n in ("w1", "w2")}
    peers = {n: p.peer for n, p in workers.items()} | {"pub": pub.peer}
    st = cluster.observer().wait(lambda s: _members(s) == set(peers.values())
                                 and s["coordinator"] in _members(s), 60, "3 members")
    follower = next(n for n, p in peers.items() if p != st["coordinator"])
    proc = workers.get(follower, pub)
    deadline = time.monotonic() + 30
    while True:  # the joins settle: the follower's reads stop (bounded wait)
        first = stats(follower)
        time.sleep(4.0)
        second = stats(follower)
        if second["lookups"] - first["lookups"] <= 1 or time.monotonic() > deadline:
            break
    before = second
    coordinator = next(n for n, p in peers.items() if p == st["coordinator"])
    coord_before = stats(coordinator)
    window_end = time.monotonic() + 12.0
    while time.monotonic() < window_end:
        assert proc.popen.poll() is None
        time.sleep(0.5)
    after = stats(follower)
    lookups = after["lookups"] - before["lookups"]
    assert lookups <= 4, f"{lookups} DHT lookups by an idle follower in 12 s"
    # The coordinator's topic listings back off while nobody joins (each is answered with
    # the whole list by every replica): at most every 8 s, where it listed every second.
    listings = stats(coordinator)["listings"] - coord_before["listings"]
    assert listings <= 4, f"{listings} topic listings by an idle coordinator in 12 s"
    assert after["bytes_in"] > before["bytes_in"]  # the coordinator's heartbeats came
    assert cluster.observer().status()["coordinator"] == st["coordinator"]


def test_consent_refused_without_a_terminal_names_yes(tmp_path):
    uri = "magnet:?xs=urn:btpk:" + "11" * 32 + f"&dn=lab&x.pe={DEAD}&x.op=" + "ab" * 16
    res = run_swarm("join", uri, "--data-dir", str(tmp_path / "d"), timeout=60)
    assert res.returncode == 3
    assert "--yes" in res.stderr


def test_graceful_handoff_while_a_job_runs(cluster):
    import numpy as np

    from swarm.api import connect
    from swarm.runtime.refs import get

    pub = cluster.publish()
    workers = {n: cluster.join(n) for n in ("w1", "w2")}
    peers = {n: p.peer for n, p in workers.items()} | {"pub": pub.peer}
    obs = cluster.observer()
    st = obs.wait(lambda s: len(s["members"]) == 3 and s["coordinator"], 60, "3 members")
    procs = {"pub": pub} | workers
    coord = next(n for n, p in peers.items() if p == st["coordinator"])
    rng = np.random.default_rng(1)
    a = rng.standard_normal((768, 768), dtype=np.float32)
    bs = [rng.standard_normal((768, 768), dtype=np.float32) for _ in range(8)]
    client = connect(cluster.uri, data_dir=cluster.root, min_workers=3, timeout=60)
    try:
        refs = [client.matmul.remote(a, b) for b in bs]
        t0 = time.monotonic()
        procs[coord].signal(SIGTERM)  # leaves gracefully while the job runs
        st2 = obs.wait(lambda s: s["term"] > st["term"] and s["coordinator"] != peers[coord],
                       30, "the successor")
        handoff = time.monotonic() - t0
        outs = get(refs, timeout=120)
        for b, out in zip(bs, outs, strict=True):
            np.testing.assert_allclose(out, a @ b, rtol=1e-3, atol=1e-2)
        assert procs[coord].wait_exit(30) == 0
        assert any("handed off" in line for line in procs[coord].err)
        print(f"\nhandoff (SIGTERM to successor's term in the DHT) {handoff:.2f} s")
        assert st2["coordinator"] in peers.values()
    finally:
        client.close()


def test_owner_commands_and_an_admin_block(cluster, tmp_path):
    cluster.publish()
    w1 = cluster.join("w1")
    w2 = cluster.join("w2")
    admin, target = w1.peer, w2.peer
    obs = cluster.observer()
    obs.wait(lambda s: len(s["members"]) == 3 and s["coordinator"], 60, "3 members")
    owner = ["--owner-key", f"soft:{tmp_path / 'owner.key'}", "--data-dir", str(tmp_path / "pub")]
    res = run_swarm("owner", "add-admin", cluster.uri, admin, *owner, timeout=60)
    assert res.returncode == 0, res.stderr
    res = run_swarm("owner", "show", cluster.uri, "--json", "--data-dir", str(tmp_path / "op"),
                    timeout=60)
    assert res.returncode == 0, res.stderr
    import json

    shown = json.loads(res.stdout)
    assert shown["admins"] == [admin] and shown["hardware_backed"] is False
    assert shown["chain_length"] == 2
    # The admin blocks w2 with its peer key once the coordinator has the new charter.
    obs.wait(lambda s: s["coordinator_admins"] == [admin], 30, "the admin at the coordinator")
    res = run_swarm("block", cluster.uri, target, "--as", "admin", "--key",
                    str(tmp_path / "w1" / "peer.key"), "--data-dir", str(tmp_path / "op"),
                    timeout=60)
    assert res.returncode == 0, res.stderr
    st = obs.wait(lambda s: target in {b["peer_id"] for b in s["blocked"]}, 20, "the block")
    assert next(b for b in st["blocked"] if b["peer_id"] == target)["by"] == "admin"
    # A peer that is not an admin cannot.
    res = run_swarm("unblock", cluster.uri, target, "--as", "admin", "--key",
                    str(tmp_path / "pub" / "peer.key"), "--data-dir", str(tmp_path / "op"),
                    timeout=60)
    assert res.returncode == 1 and "did not apply" in res.stderr
    # Ownership transfer: the new key owns the swarm, the chain still verifies.
    res = run_swarm("owner", "transfer", cluster.uri, "--new-owner-key",
                    f"soft:{tmp_path / 'new-owner.key'}", *owner, timeout=60)
    assert res.returncode == 0, res.stderr
    res = run_swarm("owner", "show", cluster.uri, "--json", "--data-dir", str(tmp_path / "op"),
                    timeout=60)
    assert json.loads(res.stdout)["owner"] != shown["owner"]
    assert json.loads(res.stdout)["chain_length"] == 4


def test_publish_without_a_security_key_says_how_to_proceed(tmp_path):
    res = run_swarm("publish", "--name", "lab", "--data-dir", str(tmp_path / "d"), timeout=60)
    assert res.returncode == 4
    assert "soft:PATH" in res.stderr and res.stdout == ""
