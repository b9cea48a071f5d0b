"""Issue 12 through the CLI, with real processes on loopback.

Finding 1: a peer that holds only the join URI announces itself (as a requester) and puts a
coordinator-state item at term 2^62 - 1; ``swarm status`` must still name an honest
coordinator within 10 s, and the owner's ``swarm block`` / ``swarm unblock`` take effect.

Finding 6: the publisher (the coordinator, unless a faster worker took the role) is SIGKILLed; a newcomer given the original URI
plus ``SWARM_BOOTSTRAP`` (a ``swarm dht serve`` node) joins and computes, and so does one
given only the ``join_uri`` that ``swarm status --json`` prints.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest

from identity import PeerKey
from swarm.control import charter
from swarm.control.state import CoordinatorState
from swarm.members import MemberRecord, announce, swarm_id
from swarm.uri import parse
from tests.conftest import run_swarm, subprocess_env
from tests.control_support import SIGKILL

pytestmark = [pytest.mark.system, pytest.mark.slow]


def _status(uri: str, env: dict[str, str] | None = None) -> dict:
    res = run_swarm("status", uri, "--json", timeout=60, env=subprocess_env(**(env or {})))
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def _wait_status(uri: str, pred, timeout: float, what: str,
                 env: dict[str, str] | None = None) -> tuple[dict, float]:
    start = time.monotonic()
    last: object = None
    while time.monotonic() - start < timeout:
        try:
            last = _status(uri, env)
            if pred(last):
                return last, time.monotonic() - start
        except (AssertionError, json.JSONDecodeError) as exc:
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"status never showed {what} in {timeout} s; last: {last}")


def test_term_inflation_through_the_cli(cluster, tmp_path):  # noqa: F811 - the fixture
    pub = cluster.publish()
    w1, w2 = cluster.join("w1"), cluster.join("w2")
    honest = {pub.peer, w1.peer, w2.peer}
    obs = cluster.observer()
    obs.wait(lambda s: {m["peer_id"] for m in s["members"]} == honest
             and s["coordinator"] in honest, 90, "3 members and a coordinator")

    # The attacker: only the URI; a member record as a requester, a state item at 2^62 - 1.
    mallory = PeerKey.generate()
    sid = swarm_id(parse(cluster.uri).pubkey)
    lie = CoordinatorState(sid, 2**62 - 1, 1, mallory.peer_id)

    async def attack():
        from dht import DHTNode

        node = DHTNode(mallory, rpc_timeout=1.0)
        charter.register_validators(node)
        await node.listen(0, "127.0.0.1")
        await node.bootstrap(list(parse(cluster.uri).peers))
        await announce(node, sid, MemberRecord(mallory.peer_id, 1e6, dht=node.address,
                                               roles=("requester",)))
        await node.put_mutable(mallory, lie.encode_item(), salt=charter.state_salt(sid),
                               seq=lie.seq)
        return node

    node = obs._run(attack(), 60)
    try:
        # the coordinator reads the members' state items every 5 s (rivals): it saw the lie
        # and did not count it
        named = obs.status()["coordinator"]
        coordinator = next(p for p in (pub, w1, w2) if p.peer == named)
        coordinator.wait_line(lambda s: "ignoring the DHT's state" in s
                              and mallory.peer_id.short() in s, 30)
        started = time.monotonic()
        st = obs.wait(lambda s: s["coordinator"] in honest and s["term"] < 100, 10,
                      "an honest coordinator")
        took = time.monotonic() - started
        print(f"honest coordinator named {took:.1f} s after the attack, term {st['term']}")
        owner = ("--owner-key", f"soft:{tmp_path / 'owner.key'}",
                 "--data-dir", str(tmp_path / "op"))
        res = run_swarm("block", cluster.uri, w2.peer, "--reason", "test", *owner, timeout=60)
        assert res.returncode == 0, res.stderr[-2000:]
        assert w2.wait_exit(30) == 3
        res = run_swarm("unblock", cluster.uri, w2.peer, *owner, timeout=60)
        assert res.returncode == 0, res.stderr[-2000:]
        st = _status(cluster.uri)
        assert st["coordinator"] in honest and not st["blocked"]
        assert not any("error 203" in line for p in (pub, w1) for line in p.err)
    finally:
        obs._run(node.stop(), 10)


def test_newcomers_find_the_swarm_after_the_publisher_is_gone(cluster, tmp_path):  # noqa: F811
    dht = cluster.start("dht", "dht", "serve", "--port", "0")
    addr = dht.wait_line(lambda s: s.startswith("listening on"), 60, "out").split()[-1]
    boot = {"SWARM_BOOTSTRAP": addr}
    pub = cluster.start("pub", "publish", "--name", "lab", "--owner-key",
                        f"soft:{tmp_path / 'owner.key'}", "--backend", "numpy", "-v", env=boot)
    cluster.uri = uri = pub.wait_line(lambda s: s.startswith("magnet:?"), 90, "out")
    assert addr.split(":")[-1] in uri  # the publisher's URI names the bootstrap node too
    j = parse(uri)  # the URI as shared: it names the publisher only
    original = str(replace(j, peers=tuple(p for p in j.peers if f"{p[0]}:{p[1]}" != addr)))
    workers = [cluster.join(n) for n in ("w1", "w2", "w3")]
    peers = {pub.peer, *(w.peer for w in workers)}
    obs = cluster.observer()
    obs.wait(lambda s: {m["peer_id"] for m in s["members"]} == peers
             and s["coordinator"] in peers, 90, "4 members and a coordinator")

    pub.signal(SIGKILL)
    pub.wait_exit(10)
    survivors = peers - {pub.peer}
    # waited for in-process (a `swarm status` process per poll cost a second of CPU each),
    # then shown by the CLI given the original URI and SWARM_BOOTSTRAP, as a newcomer runs it
    obs.wait(lambda s: s["coordinator"] in survivors, 60, "a new coordinator")
    st, _ = _wait_status(original, lambda s: s["coordinator"] in survivors, 60,
                         "a new coordinator", env=boot)
    assert pub.peer not in parse(st["join_uri"]).peers  # names live peers only
    assert 1 <= len(parse(st["join_uri"]).peers) <= 4

    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 100
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", a.T)
    for name, target, env in (("n1", original, boot), ("n2", st["join_uri"], {})):
        newcomer = cluster.join(name, uri=target, env=env)
        newcomer.wait_line(lambda s: s.startswith("joined swarm"), 90)
        res = run_swarm("submit", target, "matmul", str(tmp_path / "a.npy"),
                        str(tmp_path / "b.npy"), "-o", str(tmp_path / f"c-{name}.npy"),
                        "--data-dir", str(tmp_path / f"client-{name}"), "--timeout", "120",
                        timeout=150, env=subprocess_env(**env))
        assert res.returncode == 0, res.stderr[-2000:]
        assert np.allclose(np.load(tmp_path / f"c-{name}.npy"), a @ a.T, rtol=1e-4)
