"""bench/run_all.py re-renders docs/benchmarks.md from saved results and keeps what no script
generates: ``###`` subsections at the end of a generated section and sections of other names."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import run_all  # noqa: E402

OLD = """# Benchmarks

## Headline ratios

- stale

## runtime

an old generated table

### the run before

kept words

## scale simulation

a hand-written section
"""


def test_a_re_render_keeps_hand_written_subsections_and_sections(tmp_path):
    (tmp_path / "benchmarks.md").write_text(OLD)
    results = [{"name": "runtime", "date": "today", "command": "python bench/runtime.py",
                "seconds": 1.0, "load_1m": 0.5, "data": None, "error": "not run here"}]
    text = run_all.write(results, tmp_path, quick=True).read_text()
    assert "an old generated table" not in text and "- stale" not in text
    runtime = text.index("## runtime")
    assert runtime < text.index("Not measured: not run here") < text.index("### the run before") \
        < text.index("kept words") < text.index("## scale simulation") \
        < text.index("a hand-written section")
    again = run_all.write(results, tmp_path, quick=True).read_text()
    assert again == text  # re-rendering twice changes nothing


def test_one_script_re_measured_replaces_its_own_results_only(tmp_path):
    """``--only runtime`` wrote a benchmarks.json of the runtime alone, and the next re-render
    dropped every other section; each result also names the machine it ran on."""
    import json

    def result(name, when, where):
        return {"name": name, "date": when, "command": f"python bench/{name}.py",
                "seconds": 1.0, "load_1m": 0.5, "data": None, "error": "not run here",
                "machine": where}

    saved = tmp_path / "benchmarks.json"
    saved.write_text(json.dumps({"quick": False, "results": [
        result("compute", "old", "box A"), result("runtime", "old", "box A")]}))
    out = run_all.merged(saved, [result("runtime", "new", "box B")], quick=False)
    assert [(r["name"], r["date"]) for r in out] == [("compute", "old"), ("runtime", "new")]
    assert run_all.merged(saved, [result("runtime", "new", "box B")], quick=True) == [
        result("runtime", "new", "box B")]  # a --quick run never mixes with a full one
    text = run_all.write(out, tmp_path, quick=False).read_text()
    assert "different machines" in text and "box A" in text and "box B" in text
