"""Issue 33, findings 5-7, through real processes: a member that comes back (after an
unblock, or restarted from its data dir) and one that leaves."""

from __future__ import annotations

import time

import pytest

from swarm.control.machine import Timing
from tests.conftest import run_swarm
from tests.control_support import SIGTERM

pytestmark = [pytest.mark.system, pytest.mark.slow]


def _members(st: dict) -> set[str]:
    return {m["peer_id"] for m in st["members"]}


def _settled(st: dict) -> bool:
    """A coordinator that no member is fast enough to be handed the role by a rebalance (the
    first coordinator is whoever started first; a faster joiner takes over moments later)."""
    speed = {m["peer_id"]: m["tflops"] for m in st["members"]}
    coordinator = st["coordinator"]
    return coordinator in speed and \
        max(speed.values()) <= speed[coordinator] * Timing().rebalance


def _blocked(st: dict) -> set[str]:
    return {b["peer_id"] for b in st["blocked"]}


def test_unblocked_peer_joins_again_from_its_data_dir(cluster, tmp_path):
    """Finding 6: the block cached in the peer's own data dir is a hint checked against the
    swarm's current state, not a verdict: after ``unblock`` the same peer joins."""
    cluster.publish()
    cluster.join("w1")
    w2 = cluster.join("w2")
    target = w2.peer
    obs = cluster.observer()
    obs.wait(lambda s: len(s["members"]) == 3 and s["coordinator"], 60, "3 members")
    owner = ["--owner-key", f"soft:{tmp_path / 'owner.key'}", "--data-dir", str(tmp_path / "op")]
    res = run_swarm("block", cluster.uri, target, "--reason", "test", *owner, timeout=60)
    assert res.returncode == 0, res.stderr
    assert w2.wait_exit(30) == 3
    res = run_swarm("unblock", cluster.uri, target, *owner, timeout=60)
    assert res.returncode == 0, res.stderr
    obs.wait(lambda s: target not in _blocked(s), 30, "the unblock in the DHT")
    again = cluster.join("w2")
    assert again.peer == target
    again.wait_line(lambda s: s.startswith("joined swarm"), 60)
    obs.wait(lambda s: target in _members(s), 30, "the unblocked peer as a member")
    assert again.popen.poll() is None


def _wait_after(p, mark: int, pred, timeout: float) -> str:
    """The first stderr line of ``p`` from index ``mark`` on that matches; bounded."""
    deadline = time.monotonic() + timeout
    with p.cond:
        while True:
            for line in p.err[mark:]:
                if pred(line):
                    return line
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{p.name}: no matching line in {timeout} s; tail:\n"
                                     + "\n".join(p.err[-25:]))
            p.cond.wait(min(left, 0.2))


def test_a_member_that_leaves_is_dropped_at_once(cluster):
    """Finding 7: a worker that leaves (SIGTERM) says so, signed by its own key: the
    coordinator's view and a reader of the topic (what ``submit`` deals work from) drop it
    at once, not when its announcement expires two minutes later."""
    pub = cluster.publish()
    w1, w2 = cluster.join("w1"), cluster.join("w2")
    peers = {"pub": pub.peer, "w1": w1.peer, "w2": w2.peer}
    obs = cluster.observer()
    st = obs.wait(lambda s: _members(s) == set(peers.values()) and s["coordinator"]
                  in {pub.peer, w1.peer}, 60, "3 members, w2 not coordinating")
    coord = {pub.peer: pub, w1.peer: w1}[st["coordinator"]]
    _wait_after(coord, 0, lambda s: "3 members in view" in s, 30)
    mark = len(coord.err)
    w2.signal(SIGTERM)
    assert w2.wait_exit(30) == 0
    _wait_after(coord, mark, lambda s: "2 members in view" in s, 10)
    st = obs.wait(lambda s: w2.peer not in _members(s), 10, "the departed worker gone")
    assert _members(st) == {pub.peer, w1.peer}


def test_a_restarted_member_waits_to_hear_the_coordinator(cluster):
    """Finding 5: a member restarted from its data dir (its saved state names the live
    coordinator) suspected that coordinator at once ("no heartbeat ... for 6.4 s"), the
    wait having started before its node did (bootstrap, benchmark), and took over. The
    wait for a first heartbeat starts with the control plane: over the next few failover
    times it suspects nobody and the term stays. Whoever benchmarked fastest coordinates
    (a joiner may win the first election): the member restarted is one that does not."""
    pub = cluster.publish()
    joined = {w.peer: w for w in (cluster.join("w1"), cluster.join("w2"))}
    obs = cluster.observer()
    st = obs.wait(lambda s: _members(s) == {pub.peer, *joined} and _settled(s), 60,
                  "3 members and a coordinator no one would take the role from")
    coordinator, term = st["coordinator"], st["term"]
    target = next(p for p in joined if p != coordinator)
    w = joined[target]
    w.signal(SIGTERM)
    assert w.wait_exit(30) == 0
    again = cluster.join(w.name)
    assert again.peer == target
    again.wait_line(lambda s: s.startswith("joined swarm"), 60)
    obs.wait(lambda s: target in _members(s), 30, "the restarted member")
    # 2.5 failover times, from the moment it is listed: a start-up grace begun too early ran
    # out within one failover time, so it would have suspected the coordinator by then
    window_end = time.monotonic() + 2.5 * Timing().failover
    handed = f"taking over from {coordinator[:12]} at term {term + 1}"
    while time.monotonic() < window_end:
        st = obs.status()
        # the coordinator may hand the role to it when it benchmarked 1.5 times faster (a
        # rebalance, signed by the coordinator: CI's loaded cores made the restart fast);
        # taking it on its own, by suspecting the coordinator, is the bug
        if not (st["coordinator"] == coordinator and st["term"] == term):
            assert st["coordinator"] == target and st["term"] == term + 1, st
            assert [s for s in again.err if handed in s], "\n".join(again.err[-20:])
        assert not [s for s in again.err if "suspecting" in s], "\n".join(again.err[-20:])
        time.sleep(0.1)  # each pass is a whole DHT observation; no need to run them back to back
    assert again.popen.poll() is None
