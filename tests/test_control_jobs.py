"""`swarm status` shows running jobs: real `swarm publish`/`swarm join` processes whose tasks
are held in flight by SWARM_CHAOS (hold: unanswered until the test releases them), a real
client, and status polled with bounded deadlines until the workers' re-announcements show the
work, then show it gone."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from swarm.api import connect
from swarm.runtime.refs import get
from tests.conftest import run_swarm
from tests.control_support import Cluster

pytestmark = [pytest.mark.system]


def _status_cli(uri: str, *extra: str) -> str:
    res = run_swarm("status", uri, *extra, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout

def test_status_shows_running_jobs_then_none(tmp_path):
    hold = tmp_path / "hold"
    hold.mkdir()
    cluster = Cluster(tmp_path, env={"SWARM_CHAOS": f"hold={hold}"})
    client = None
    try:
        pub = cluster.publish()
        w1 = cluster.join("w1")
        workers = {pub.peer, w1.peer}
        obs = cluster.observer()
        idle = obs.wait(lambda s: {m["peer_id"] for m in s["members"]} == workers, 60,
                        "both workers")
        assert idle["running_tasks"] == 0 and idle["jobs"] == []
        client = connect(cluster.uri, data_dir=tmp_path, min_workers=2, timeout=60)
        me = str(client.node.peer_id)
        rng = np.random.default_rng(3)
        a, b = (rng.standard_normal((256, 256), dtype=np.float32) for _ in range(2))
        ref = client.matmul.remote(a, b)

        def busy(s: dict) -> bool:
            job = next((j for j in s["jobs"] if j["requester"] == me), None)
            running = {m["peer_id"] for m in s["members"] if m["tasks"] > 0}
            return (job is not None and running and set(job["workers"]) == running
                    and s["running_tasks"] >= job["tasks"] > 0)

        t0 = time.monotonic()
        obs.wait(busy, 60, "the running job")
        seen = time.monotonic() - t0
        # the CLI shows the same: JSON and the readable table
        st = json.loads(_status_cli(cluster.uri, "--json"))
        assert busy(st), st
        table = _status_cli(cluster.uri)
        assert f"job of {me[:12]}" in table and "running tasks: 0" not in table
        assert not ref.future().done()      # all of it seen while the tasks were held
        (hold / "release").touch()

        np.testing.assert_allclose(get(ref, timeout=60), a @ b, rtol=1e-3, atol=1e-2)
        t1 = time.monotonic()
        done = obs.wait(lambda s: s["running_tasks"] == 0 and s["jobs"] == [], 15,
                        "no running work after the job")
        assert all(m["tasks"] == 0 for m in done["members"])
        print(f"\nrunning job visible {seen:.2f} s after submit; idle again "
              f"{time.monotonic() - t1:.2f} s after it completed")
    finally:
        (hold / "release").touch()
        if client is not None:
            client.close()
        cluster.close()
