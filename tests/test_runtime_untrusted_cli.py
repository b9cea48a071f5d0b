"""Trust no worker, through the CLI with real processes (issue 13).

* ``SWARM_CHAOS=invalid=1`` beside honest workers: every ``swarm submit`` succeeds.
* One honest worker, one ``SWARM_CHAOS=corrupt=1`` liar, a publisher that coordinates:
  repeated one-shot ``swarm submit`` runs each deliver signed evidence before they exit, and
  the coordinator blocks the liar on that proof; liar claims about the honest worker from
  fresh keys change nothing.
"""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

import swarm
from identity import PeerId, PeerKey
from swarm.control.machine import Timing
from swarm.control.state import seal
from swarm.members import live_members, swarm_id
from swarm.uri import parse
from tests.conftest import run_swarm, subprocess_env

pytestmark = [pytest.mark.system, pytest.mark.slow]

MAX_SUBMITS = 8
"""One-shot submits the liar test may run to get two pieces of evidence delivered."""


def _operands(tmp_path, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1200, 256)).astype(np.float32)   # several shards per worker
    b = rng.standard_normal((256, 256)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return a, b


def _submit(tmp_path, uri: str, seed: int, *extra: str, may_fail: bool = False):
    """One `swarm submit`; its result checked. ``may_fail``: a submit that found too few
    workers (the one failure a caller expects) returns None; any other failure fails."""
    a, b = _operands(tmp_path, seed)
    out = tmp_path / f"c{seed}.npy"
    r = run_swarm("submit", uri, "matmul", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                  "-o", str(out), "--json", "--timeout", "60", *extra, timeout=120,
                  env=subprocess_env(SWARM_HOME=str(tmp_path / "home")))
    if may_fail and r.returncode != 0 and "workers asked for (--min-workers)" in r.stderr:
        return None
    assert r.returncode == 0, r.stderr[-3000:]
    (tmp_path / f"submit{seed}.log").write_text(r.stderr)
    np.testing.assert_allclose(np.load(out), a @ b, rtol=1e-4, atol=1e-3)
    return r


def test_a_worker_refusing_every_task_as_invalid_fails_no_submit(tmp_path):
    with swarm.local(workers=3, threads=1, chaos=[None, "invalid=1", None]) as c:
        refuser = str(c.worker_ids[1])
        for seed in range(3):
            report = json.loads(_submit(tmp_path, c.uri, seed, "--min-workers", "3").stdout)
            rows = {r["peer"]: r for r in report["peers"]}
            # it was dealt work (the path under test ran), refused all of it, and the
            # others did every shard
            assert rows[refuser]["failed"] >= 1 and rows[refuser]["shards"] == 0, rows
            assert sum(r["verified"] for r in rows.values()) == report["shards"], rows


def test_a_slow_liar_beaten_by_a_straggler_copy_is_still_caught(tmp_path):
    """Issue 48, finding 3: a liar that a straggler copy beat to its band (slow, as any worker
    is on a loaded machine) was never checked: the copy's pass ended the job, the liar's
    attempt was cancelled with it and its wrong answer dropped unread, so the one-shot
    submit gave no evidence (under load three submits of four, and the liar stayed unblocked).
    Its answer is judged when it comes, and the submit waits for it as for its reports."""
    with swarm.local(workers=3, threads=1, chaos=["corrupt=1,delay=400", None, None]) as c:
        liar = c.worker_ids[0]
        r = _submit(tmp_path, c.uri, 0, "--min-workers", "3", "-v")
        rows = {x["peer"]: x for x in json.loads(r.stdout)["peers"]}
        assert rows[str(liar)]["verified"] == 0, rows  # dealt a band, never used
        said = [s for s in r.stderr.splitlines() if f"rejected a result from {liar.short()}" in s]
        assert said and "nothing to prove" not in said[0], r.stderr[-3000:]  # with evidence


def test_the_liar_is_blocked_on_evidence_from_one_shot_submits(cluster, tmp_path):
    pub = cluster.publish()
    honest = cluster.start("honest", "join", cluster.uri, "--yes", "--backend", "numpy",
                           "--threads", "1", "--no-coordinate", "-v")
    liar = cluster.start("liar", "join", cluster.uri, "--yes", "--backend", "numpy",
                         "--threads", "1", "--no-coordinate", "-v",
                         env={"SWARM_CHAOS": "corrupt=1"})
    peers = {"pub": pub.peer, "honest": honest.peer, "liar": liar.peer}
    obs = cluster.observer()
    obs.wait(lambda s: {m["peer_id"] for m in s["members"]} == set(peers.values())
             and s["coordinator"] == peers["pub"], 90, "3 members, the publisher coordinating")

    # Claims about the honest worker from fresh keys: not evidence, never acted on.
    join = parse(cluster.uri)
    sid = swarm_id(join.pubkey)

    st = obs.status()
    addr = next(tuple(m["dht"]) for m in st["members"] if m["peer_id"] == peers["pub"])

    async def claims():
        for _ in range(6):
            fresh = PeerKey.generate()
            body = msgpack.packb({"p": PeerId.parse(peers["honest"]).raw, "r": "wrong shard"},
                                 use_bin_type=True)
            await obs.node.send_message(addr, seal(fresh, sid, "liar", body))

    obs._run(claims(), 30)
    assert peers["honest"] not in {b["peer_id"] for b in obs.status()["blocked"]}

    def liar_blocked(s: dict) -> bool:
        return peers["liar"] in {b["peer_id"] for b in s["blocked"]}

    # The cause first: two pieces of evidence against the liar in the coordinator's hands (its
    # threshold), each from a fresh requester process. Not every submit is sure to yield one:
    # on a loaded machine a straggler copy can beat the liar to its band, and its answer is
    # judged only if it comes within BEATEN_WAIT (before that fix, under load, three submits
    # of four gave none and the test waited 60 s for a block that one piece cannot make).
    # So submit until two were delivered.
    need, delivered, said = Timing().liar_threshold, 0, []
    liar_short = PeerId.parse(peers["liar"]).short()
    for seed in range(MAX_SUBMITS):
        r = _submit(tmp_path, cluster.uri, seed, "--min-workers", "3", "-v", may_fail=True)
        if r is None:  # the liar left (its block): a submit that waits for three cannot start
            break
        lines = r.stderr.splitlines()
        delivered += sum(f"evidence against {liar_short} delivered" in s for s in lines)
        row = next((x for x in json.loads(r.stdout)["peers"] if x["peer"] == peers["liar"]),
                   None)  # its shards, verified, rejected (None: dealt nothing)
        said += [f"submit {seed}: the liar's report row {row}"]
        said += [f"submit {seed}: {s}" for s in lines if liar_short in s]
        if delivered >= need:
            break
    assert delivered >= need or r is None, (
        f"{MAX_SUBMITS} submits delivered {delivered} pieces of evidence against the liar:\n"
        + "\n".join(said))
    # then its consequence: the coordinator blocks, its state item says so
    st = obs.wait(liar_blocked, 30, "the liar blocked")
    assert peers["honest"] not in {b["peer_id"] for b in st["blocked"]}
    assert peers["pub"] not in {b["peer_id"] for b in st["blocked"]}
    assert liar.wait_exit(30) == 3                # it learns it is blocked and leaves
    # and says so: a client that has not read the block yet deals it no more work (and
    # does not dial it, warning that it is unreachable) until its record expires in 120 s
    listed = obs._run(live_members(obs.node, sid), 30)
    assert peers["liar"] not in {str(r.peer_id) for r in listed}
    assert honest.popen.poll() is None
    _submit(tmp_path, cluster.uri, 9)             # and the swarm still works
