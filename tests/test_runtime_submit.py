"""`swarm submit` end to end against a local swarm, and its input errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import swarm
from tests.conftest import DEAD, run_swarm, subprocess_env

pytestmark = [pytest.mark.system]


@pytest.fixture(scope="module")
def cluster():
    with swarm.local(workers=2, threads=1) as c:
        yield c


def test_submit_matmul_end_to_end(cluster, tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((120, 80)).astype(np.float32)
    b = rng.standard_normal((80, 60)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "c.npy"
    r = run_swarm("submit", cluster.uri, "matmul", str(tmp_path / "a.npy"),
                  str(tmp_path / "b.npy"), "-o", str(out), "--json", "--timeout", "60",
                  env=subprocess_env(SWARM_HOME=str(tmp_path / "home")))
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(out), a @ b, rtol=1e-4, atol=1e-3)
    report = json.loads(r.stdout)
    workers = {str(p) for p in cluster.worker_ids}
    assert {p["peer"] for p in report["peers"]} <= workers | {"local"}
    assert sum(p["shards"] for p in report["peers"] if p["peer"] in workers) >= 1
    assert all(p["rejected"] == 0 and p["verified"] == p["shards"] for p in report["peers"])


def test_submit_table_output(cluster, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((4, 4), np.float32))
    r = run_swarm("submit", cluster.uri, "matmul", str(tmp_path / "a.npy"),
                  str(tmp_path / "a.npy"), "-o", str(tmp_path / "c.npy"),
                  env=subprocess_env(SWARM_HOME=str(tmp_path / "home")))
    assert r.returncode == 0, r.stderr
    assert "verified" in r.stdout and "shards" in r.stdout


@pytest.mark.parametrize("case,match", [
    ("missing", "no such file"),
    ("pickled", "not a plain .npy"),
    ("shapes", "cannot multiply"),
])
def test_submit_bad_inputs_exit_2(tmp_path, case, match):
    a = tmp_path / "a.npy"
    b = tmp_path / "b.npy"
    np.save(a, np.ones((2, 3), np.float32))
    if case == "pickled":
        np.save(b, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    elif case == "shapes":
        np.save(b, np.ones((2, 3), np.float32))
    r = run_swarm("submit", DEAD, "--swarm", "00" * 20, "matmul", str(a), str(b),
                  "-o", str(tmp_path / "c.npy"),
                  env=subprocess_env(SWARM_HOME=str(tmp_path / "home")))
    assert r.returncode == 2, r.stderr
    assert match in r.stderr


def test_submit_bad_uri_exit_2(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((2, 2), np.float32))
    r = run_swarm("submit", "magnet:?xs=nonsense", "matmul", str(tmp_path / "a.npy"),
                  str(tmp_path / "a.npy"), "-o", str(tmp_path / "c.npy"),
                  env=subprocess_env(SWARM_HOME=str(tmp_path / "home")))
    assert r.returncode == 2, r.stderr


def test_submit_unreachable_swarm_fails_clearly(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((2, 2), np.float32))
    r = run_swarm("submit", DEAD, "--swarm", "00" * 20, "matmul",
                  str(tmp_path / "a.npy"), str(tmp_path / "a.npy"), "-o", str(tmp_path / "c.npy"),
                  "--timeout", "5", env=subprocess_env(SWARM_HOME=str(tmp_path / "home")))
    assert r.returncode == 1, r.stderr
    assert "cannot reach the swarm" in r.stderr and "Traceback" not in r.stderr
    assert "--bootstrap" in r.stderr and "join_uri" in r.stderr  # what to do (issue 35)
