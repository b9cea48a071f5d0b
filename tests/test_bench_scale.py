"""bench/scale.py re-renders a saved run, and says clearly when the file is not one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = {"members": 13, "join_s": 11.3, "cpu_worker": 0.005, "cpu_worker_max": 0.007,
       "cpu_coordinator": 0.019, "bytes_per_node_s": 6897.0, "bytes_coordinator_s": 82614.0,
       "lookups_worker_s": 0.0, "failover_s": 2.98}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_a_saved_run_is_rendered_as_the_table(tmp_path):
    saved = tmp_path / "rows.json"
    saved.write_text(json.dumps([ROW]))
    out = run("--from-json", str(saved))
    assert out.returncode == 0, out.stderr
    assert "     13   11.30     0.5%     0.7%     1.9%      6897     82614   0.00     2.98s" \
        in out.stdout


def test_a_file_that_is_not_a_run_is_a_clear_error(tmp_path):
    bad = tmp_path / "rows.json"
    bad.write_text("{not json")
    out = run("--from-json", str(bad))
    assert out.returncode == 2 and "cannot read" in out.stderr and "Traceback" not in out.stderr
    bad.write_text(json.dumps([{"members": 2}]))
    out = run("--from-json", str(bad))
    assert out.returncode == 2 and "not a list of rows" in out.stderr
    out = run("--from-json", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "cannot read" in out.stderr
