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
