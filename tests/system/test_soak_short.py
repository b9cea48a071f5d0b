"""A one-minute soak (bench/soak.py): continuous verified jobs with seeded churn; nothing
wrong, nothing lost. `make soak` runs it, CI does not: CI's shorter churn runs are
tests/system/test_faults.py (churn across hosts) and test_runtime_local.py (killed mid-job)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, subprocess_env

pytestmark = [pytest.mark.system, pytest.mark.slow, pytest.mark.soak]


def test_soak_one_minute():
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "1",
                          "--workers", "3", "--churn-every", "12", "--json"],
                         capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert res.stdout, res.stderr[-2000:]
    r = json.loads(res.stdout.splitlines()[-1])
    print(f"\nsoak: {r}")
    assert res.returncode == 0, r
    assert r["wrong"] == 0 and r["lost"] == 0
    assert r["completed"] == r["submitted"] >= 5
    assert len(r["churn"]) >= 3
