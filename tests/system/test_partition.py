"""Partition and heal across test hosts: the side cut off from the coordinator elects its
own at a higher term, both sides complete jobs and the owner blocks a peer during the split;
after healing, both sides see one coordinator, one term and the same members; no process
ever acted on two coordinators in the same term (from every node's log). The block must
survive the heal too: the deposed coordinator forwards the owner's signed block to the
coordinator whose higher-term state won."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import subprocess_env, swarm_cmd
from tests.control_support import uri_via
from tests.system.support import blocked, members

pytestmark = [pytest.mark.system, pytest.mark.slow]


def _summary(proc) -> dict:
    proc.wait_line(lambda s: s.startswith('{"summary"'), 180, "out")
    return json.loads(next(s for s in proc.out if s.startswith('{"summary"')))["summary"]


def test_partition_and_heal(cluster, net, tmp_path):
    ha = [net.host("a") for _ in range(4)]  # pub, w1, w2, requester
    hb = [net.host("b") for _ in range(3)]  # w3, w4, requester
    pub = cluster.publish(ha[0])
    procs = {"pub": pub} | {f"w{i}": cluster.join(f"w{i}", ha[i]) for i in (1, 2)} \
        | {f"w{i}": cluster.join(f"w{i}", hb[i - 3]) for i in (3, 4)}
    peers = {n: p.peer for n, p in procs.items()}
    side = {n: "a" if n in ("pub", "w1", "w2") else "b" for n in peers}
    st0 = cluster.wait_status(ha[3], lambda s: members(s) == set(peers.values())
                              and s["coordinator"], 90, "5 members and a coordinator")
    coord0 = next(n for n, p in peers.items() if p == st0["coordinator"])
    other = "b" if side[coord0] == "a" else "a"
    obs = {"a": ha[3], "b": hb[2]}
    # The owner will block a side-a worker during the split; nobody bootstraps through it.
    target = "w2" if coord0 != "w2" else "w1"
    via = {s: uri_via(cluster.uri, st0, peers[next(n for n in peers if side[n] == s
                                                    and n != target)]) for s in "ab"}

    net.partition()
    # The side without the coordinator elects one of its own, at a higher term.
    st_o = cluster.wait_status(obs[other], lambda s: s["coordinator"]
                               and side[_name(peers, s["coordinator"])] == other
                               and s["term"] > st0["term"], 60,
                               "a coordinator on the cut-off side", uri=via[other])
    # Both sides act: jobs on each, and the owner blocks a worker on side a.
    jobs = {s: cluster.driver(f"req{s}", obs[s], "--jobs", "2", "--size", "192",
                              uri=via[s]) for s in "ab"}
    res = subprocess.run(obs["a"].wrap(swarm_cmd(
        "block", via["a"], peers[target], "--reason", "split", "--owner-key",
        f"soft:{tmp_path / 'owner.key'}", "--data-dir", str(tmp_path / "op"))),
        capture_output=True, text=True, timeout=90, env=subprocess_env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert procs[target].wait_exit(30) == 3
    for s in "ab":
        done = _summary(jobs[s])
        assert done == {"jobs": 2, "ok": 2, "wrong": 0, "lost": 0, "rejected": 0}, (s, done)

    net.heal()
    alive = {p for n, p in peers.items() if n != target}

    def healed(s: dict) -> bool:
        return alive <= members(s) and s["coordinator"] in alive

    def both() -> tuple[dict, dict] | None:
        sa = cluster.wait_status(obs["a"], healed, 60, "the healed view", uri=via["a"])
        sb = cluster.wait_status(obs["b"], healed, 60, "the healed view", uri=via["b"])
        same = (sa["coordinator"], sa["term"]) == (sb["coordinator"], sb["term"])
        return (sa, sb) if same else None

    deadline = time.monotonic() + 90
    while not (views := both()):
        assert time.monotonic() < deadline, "the two sides never agreed on the coordinator"
    st_a, st_b = views
    # The blocked peer's last record may linger until its announcement expires.
    assert members(st_a) - {peers[target]} == members(st_b) - {peers[target]} == alive
    assert st_b["term"] >= st_o["term"] > st0["term"]

    # Fencing, from every node's own log: one coordinator per term for each process.
    seen = cluster.acted_on()
    assert any(t > st0["term"] for n in peers if side[n] == other for t in seen[n]), seen
    for name, terms in seen.items():
        for term, coords in terms.items():
            assert len(coords) == 1, f"{name} acted on {coords} in term {term}"


    # The owner's block, made on side a during the split, must survive the heal.
    # (The deposed coordinator forwards the owner's signed block to the winner.)
    st = cluster.wait_status(obs["b"], lambda s: peers[target] in blocked(s), 30,
                             "the block made during the split", uri=via["b"])
    assert blocked(st) == {peers[target]}
    assert blocked(cluster.status(obs["a"], via["a"])) == {peers[target]}

def _name(peers: dict[str, str], peer: str) -> str:
    return next(n for n, p in peers.items() if p == peer)
