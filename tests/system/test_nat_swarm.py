"""`swarm publish`, `join` and `submit` across NATs (the testbed of tests/system/nat.py): the
swarm is published on the public segment; a worker behind one NAT computes the shards of a
requester behind the other, over WebRTC signaled through the publisher, through TURN where
a symmetric NAT leaves nothing else; a worker with no path is reported unreachable once and
not dialed again and again."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import subprocess_env, swarm_cmd
from tests.system.support import POLL, NetCluster, submit_matmul

pytestmark = [pytest.mark.system, pytest.mark.slow]


def _reach(host, uri, tmp_path, env, count: int, timeout: float = 120) -> dict[str, str]:
    """`swarm status --json --reach` from ``host`` once ``count`` members are listed; within
    ``timeout`` s in all (it was 60 runs of up to 90 s each, back to back)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        res = subprocess.run(host.wrap(swarm_cmd(
            "status", uri, "--json", "--reach", "--data-dir", str(tmp_path / "obs"))),
            capture_output=True, text=True, timeout=max(left, 5), env=subprocess_env(**env))
        assert res.returncode == 0, res.stderr[-2000:]
        members = json.loads(res.stdout)["members"]
        if len(members) >= count:
            return {m["peer_id"]: m["reach"] for m in members}
        time.sleep(POLL)
    raise AssertionError(f"never {count} members in {timeout} s: {res.stdout[-2000:]}")


def _swarm(natnet, tmp_path, worker_nat: str, env: dict[str, str], *pub_args: str,
           slow_publisher: bool = True):
    """Publisher on the public segment, one worker behind ``worker_nat``, and the host behind
    the other NAT that the requester runs on. A slow publisher takes 2 s per task, so that
    the job cannot finish on it before the worker behind the NAT has done its share (a
    publisher holding its tasks would leave them to the straggler timeouts instead)."""
    cluster = NetCluster(tmp_path, natnet)
    pub = natnet.public_host()
    cone = natnet.behind(natnet.router("cone"))
    sym = natnet.behind(natnet.router("symmetric", symmetric=True))
    worker_host, requester_host = (cone, sym) if worker_nat == "cone" else (sym, cone)
    cluster.start("pub", pub, swarm_cmd(
        "publish", "--name", "natlab", "--owner-key", f"soft:{tmp_path / 'owner.key'}",
        "--backend", "numpy", "--host", pub.addr, "-v", "--data-dir", str(tmp_path / "pub"),
        *pub_args),
        {**env, "SWARM_CHAOS": "delay=2000"} if slow_publisher else env)
    cluster.uri = cluster.procs[0].wait_line(lambda s: s.startswith("magnet:?"), 90, "out")
    worker = cluster.start("w", worker_host, swarm_cmd(
        "join", cluster.uri, "--yes", "--backend", "numpy", "--threads", "1", "--host",
        worker_host.addr, "-v", "--data-dir", str(tmp_path / "w")), env)
    return cluster, worker, requester_host


@pytest.mark.parametrize("worker_nat", ["cone", "symmetric"])
def test_worker_behind_nat_computes_for_requester_behind_the_other(natnet, tmp_path,
                                                                   worker_nat):
    turn = natnet.start_turn()
    env = {"SWARM_ICE_SERVERS": json.dumps(turn.ice_servers())}
    cluster, worker, requester = _swarm(natnet, tmp_path, worker_nat, env)
    try:
        wid = worker.peer
        reach = _reach(requester, cluster.uri, tmp_path, env, 2)
        assert reach[wid] == "webrtc relay-relay", reach  # only TURN joins these two NATs
        assert reach[cluster.procs[0].peer] == "direct", reach
        res = submit_matmul(requester, cluster.uri, tmp_path, "--min-workers", "2", env=env)
        assert res.returncode == 0, res.stderr[-3000:] + "\n".join(worker.err[-40:])
        report = json.loads(res.stdout)
        done = {r["peer"]: r for r in report["peers"]}
        assert wid in done and done[wid]["verified"], report
        assert turn.credential not in res.stderr + "\n".join(worker.err)
    finally:
        cluster.close()


def test_worker_with_no_path_is_reported_unreachable_once(natnet, tmp_path):
    """No TURN: the requester behind the cone NAT cannot reach a worker behind the
    symmetric one; the job runs on the publisher and the worker is reported, not retried."""
    cluster, worker, requester = _swarm(natnet, tmp_path, "symmetric", {},
                                        slow_publisher=False)  # the job is all its own
    try:
        wid = worker.peer
        reach = _reach(requester, cluster.uri, tmp_path, {}, 2)
        assert reach[wid].startswith("unreachable"), reach
        res = submit_matmul(requester, cluster.uri, tmp_path, "--min-workers", "1")
        assert res.returncode == 0, res.stderr[-3000:]
        report = json.loads(res.stdout)
        assert wid not in {r["peer"] for r in report["peers"]}
        said = [s for s in res.stderr.splitlines() if "unreachable" in s and wid[:12] in s]
        assert len(said) == 1, res.stderr[-3000:]
    finally:
        cluster.close()


def test_member_relay_carries_the_link_where_no_turn_exists(natnet, tmp_path):
    """No TURN, symmetric NAT: the publisher opted in to relay data, so the worker behind it
    still computes for the requester behind the cone NAT, through a sealed circuit."""
    cluster, worker, requester = _swarm(natnet, tmp_path, "symmetric", {},
                                        "--relay-data", "50M")
    try:
        wid, pid = worker.peer, cluster.procs[0].peer
        reach = _reach(requester, cluster.uri, tmp_path, {}, 2)
        assert reach[wid] == f"member relay {pid[:12]}", reach
        res = submit_matmul(requester, cluster.uri, tmp_path, "--min-workers", "2")
        assert res.returncode == 0, res.stderr[-3000:]
        done = {r["peer"]: r for r in json.loads(res.stdout)["peers"]}
        assert wid in done and done[wid]["verified"], done
    finally:
        cluster.close()


def test_jobs_survive_nat_mappings_disappearing(natnet, tmp_path):
    """Both routers forget every mapping (conntrack flushed) while jobs run: no job is lost or
    wrong, and the worker behind the NAT is found silent, dialed again (a new ICE session
    through TURN) and computes again."""
    import sys

    turn = natnet.start_turn()
    env = {"SWARM_ICE_SERVERS": json.dumps(turn.ice_servers())}
    cluster, worker, requester = _swarm(natnet, tmp_path, "cone", env)
    stop = tmp_path / "stop"
    try:
        wid = worker.peer
        drv = cluster.start("drv", requester, [
            sys.executable, "-m", "tests.system.driver", cluster.uri, "--data-dir",
            str(tmp_path / "drv"), "--until-file", str(stop), "--min-workers", "2",
            "--size", "192", "--batch", "4", "--timeout", "120"],
            {**env, "SWARM_DRIVER_LOG": "INFO"})

        def jobs() -> list[dict]:
            return [json.loads(s) for s in list(drv.out) if s.startswith('{"job"')]

        def worked(rows) -> bool:
            return any(r["peers"].get(wid, {}).get("verified") for r in rows)

        drv.wait_line(lambda s: s.startswith('{"job"') and wid in s, 120, "out")
        again = f"worker {wid[:12]} reached again over webrtc"

        def redials() -> int:
            return sum(again in line for line in list(drv.err))

        before = redials()
        for router in natnet.routers:
            router.flush()
        # The worker is dialed again, then computes in a job that began after that: a job
        # in flight at the flush may finish later with the worker's shards verified before
        # it, which said nothing about the new link (and once stopped the run too early).
        drv.wait_line(lambda s: again in s and redials() > before, 150)
        after = len(jobs()) + 1  # the job running now may have begun before the redial
        drv.wait_line(lambda s: len(jobs()) > after and worked(jobs()[after:]), 150, "out")
        stop.touch()
        assert drv.wait_exit(180) == 0, "\n".join(drv.err[-40:])
        log = "\n".join(drv.err)
        # Its relayed path went quiet, not broken: an overdue shard's probe called the link
        # lost, seconds after the flush, not the keepalive after 20 s of silence.
        assert f"link to worker {wid[:12]} lost (silent: nothing heard" in log, log[-4000:]
        summary = json.loads(drv.out[-1])["summary"]
        assert summary["lost"] == 0 and summary["wrong"] == 0, summary
    finally:
        stop.touch()
        cluster.close()
