"""`swarm demo` end to end: the README's main job must really work."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_swarm

pytestmark = [pytest.mark.system, pytest.mark.slow]


def test_demo_survives_the_coordinator_and_catches_the_liar(tmp_path):
    res = run_swarm("demo", "--workers", "2", "--size", "512", "--json",
                    "--data-dir", str(tmp_path), timeout=170)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout)
    assert r["ok"] and r["correct"]
    assert r["coordinator_after"] != r["coordinator_before"]
    assert r["term_after"] > r["term_before"]
    assert r["wrong_results_caught"] > 0
    assert r["peers"][r["chaos_worker"]]["verified"] == 0
    assert r["chaos_blocked"]  # reported to the (new) coordinator, which blocked it
    assert len(r["members"]) == 4
