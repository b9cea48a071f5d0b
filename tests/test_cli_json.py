"""`--json` on every command that reports something: each output parsed, its keys asserted.

One small swarm of real processes on loopback (publish, two joins) serves the commands that
need one; the exit events of `join --json` come from a block and a kick. `bench --json` and
`demo --json` are parsed in tests/test_compute_bench.py and tests/test_control_demo.py."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

from tests.conftest import run_swarm, subprocess_env, swarm_cmd
from tests.control_support import SIGTERM, Cluster

pytestmark = [pytest.mark.system, pytest.mark.slow]

MEMBER_KEYS = {"event", "peer", "uri", "name", "swarm", "role", "joined_in_s", "gflops", "dht"}


def _event(proc, event: str, timeout: float = 90) -> dict:
    line = proc.wait_line(lambda s: s.startswith("{") and json.loads(s)["event"] == event,
                          timeout, "out")
    return json.loads(line)


def _json(*args: str, timeout: float = 60) -> dict:
    res = run_swarm(*args, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_json_of_every_swarm_command(tmp_path):
    cluster = Cluster(tmp_path)
    owner = ["--owner-key", f"soft:{tmp_path / 'owner.key'}"]
    op = ["--data-dir", str(tmp_path / "op")]
    try:
        pub = cluster.start("pub", "publish", "--name", "lab", *owner, "--backend", "numpy",
                            "--json")
        up = _event(pub, "published")
        assert set(up) == MEMBER_KEYS | {"owner", "hardware_backed"}
        assert up["uri"].startswith("magnet:?") and up["hardware_backed"] is False
        cluster.uri = uri = up["uri"]
        w1 = cluster.start("w1", "join", uri, "--yes", "--backend", "numpy", "--threads", "1",
                           "--max-memory", "300M", "--json")
        w2 = cluster.start("w2", "join", uri, "--yes", "--backend", "numpy", "--threads", "1",
                           "--json")
        joined = {p.name: _event(p, "joined") for p in (w1, w2)}
        assert all(set(e) == MEMBER_KEYS for e in joined.values())
        assert joined["w1"]["swarm"] == up["swarm"] and joined["w1"]["gflops"] > 0
        peers = {up["peer"], joined["w1"]["peer"], joined["w2"]["peer"]}
        cluster.observer().wait(lambda s: {m["peer_id"] for m in s["members"]} == peers
                                and s["coordinator"], 60, "3 members and a coordinator")

        status = _json("status", uri, "--json", *op)
        assert {"coordinator", "term", "members", "running_tasks", "jobs", "placements",
                "blocked", "owner"} <= set(status)
        assert {"peer_id", "tflops", "tasks", "role", "health", "memory", "models",
                "spans"} <= set(status["members"][0])
        shown_w1 = next(m for m in status["members"] if m["peer_id"] == joined["w1"]["peer"])
        assert shown_w1["memory"]["offered"] == 300 << 20  # its --max-memory, announced
        assert 0 <= shown_w1["memory"]["used"] <= 300 << 20 and shown_w1["spans"] == []
        assert status["placements"] == []

        shown = _json("owner", "show", uri, "--json", *op)
        assert {"name", "owner", "hardware_backed", "admins", "policy", "chain_length"} <= set(
            shown)
        added = _json("owner", "add-admin", uri, joined["w1"]["peer"], *owner, "--json",
                      "--data-dir", str(tmp_path / "pub"))
        assert added["admins"] == [joined["w1"]["peer"]] and added["counter"] > shown["counter"]

        target = joined["w2"]["peer"]
        blocked = _json("block", uri, target, "--reason", "test", *owner, "--json", *op)
        assert blocked == {"action": "block", "peer": target, "role": "owner", "reason": "test",
                           "confirmed": True, "term": blocked["term"],
                           "coordinator": blocked["coordinator"]}
        assert blocked["coordinator"] in peers and blocked["term"] >= 1
        assert w2.wait_exit(30) == 3
        left = _event(w2, "left", 10)
        assert left["exit_code"] == 3 and "blocked" in left["reason"]
        unblocked = _json("unblock", uri, target, *owner, "--json", *op)
        assert unblocked["action"] == "unblock" and unblocked["confirmed"] is True

        kicked = _json("kick", uri, joined["w1"]["peer"], *owner, "--json", *op)
        assert kicked["action"] == "kick" and kicked["confirmed"] is False
        assert w1.wait_exit(30) == 3
        assert _event(w1, "left", 10)["exit_code"] == 3

        report = _json("doctor", uri, "--no-bench", "--json", *op)
        clock = next(f for f in report["findings"] if f["check"] == "clock")
        assert clock["status"] == "ok", clock

        pub.signal(SIGTERM)
        assert pub.wait_exit(60) == 0
        left = _event(pub, "left", 10)
        assert set(left) == {"event", "reason", "exit_code"} and left["exit_code"] == 0
    finally:
        cluster.close()


async def test_dht_serve_json_lines(tmp_path):
    proc = await asyncio.create_subprocess_exec(
        *swarm_cmd("dht", "serve", "--json", "--data-dir", str(tmp_path)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=subprocess_env())
    try:
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        assert first["event"] == "listening" and first["host"] == "127.0.0.1"
        assert 0 < first["port"] < 65536
        proc.send_signal(signal.SIGTERM)
        rest = [json.loads(line) for line in
                (await asyncio.wait_for(proc.stdout.read(), 30)).splitlines()]
        assert rest[-1] == {"event": "stopped"}
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

