"""bench/runtime.py's floor: the same work on bare single-threaded processes, timed in the
runtime benchmark's rounds (what the done-when ratios can be judged against)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import runtime  # noqa: E402


def test_floor_processes_time_both_shares_and_exit_when_closed():
    floor = runtime.Floor(n=64, batch=4, rows=8, workers=2)
    try:
        assert [p.poll() for p in floor.procs] == [None, None]
        assert 0 < floor.call("big") < 30
        assert 0 < floor.call("inference") < 30
    finally:
        floor.close()
    assert [p.returncode for p in floor.procs] == [0, 0]


def test_rows_relate_each_runner_to_numpy_and_to_the_floor():
    times = {"numpy a@b": [2.0, 2.0], "swarm": [4.0, 4.0], "floor": [1.0, 3.0]}
    rows = {r["runner"]: r for r in runtime._rows("c", times, "numpy a@b", 8e9, "floor")}
    assert rows["swarm"]["vs_numpy"] == 0.5 and rows["swarm"]["vs_floor"] == 0.5
    assert rows["floor"]["vs_floor"] == 1.0 and rows["swarm"]["gflops"] == 2.0
    assert runtime._rows("c", times, "numpy a@b", 8e9, "absent")[0]["vs_floor"] is None


def test_combining_an_already_combined_run_says_so():
    run = {"meta": {"load_1m": 1.0}, "results": [{"case": "c", "runner": "r", "median_s": 1.0,
                                                    "gflops": None, "vs_numpy": None}]}
    combined = runtime.combine([run, run])
    assert combined["meta"]["load_1m"] == [1.0, 1.0]
    with pytest.raises(ValueError, match="single runs"):
        runtime.combine([combined])
