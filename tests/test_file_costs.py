"""tests/file_costs.py: the estimates that order the files cannot go stale unseen, and the
order is longest first with xdist's own reordering off."""

from __future__ import annotations

import re
from types import SimpleNamespace

from tests.file_costs import FILE_SECONDS, ROOT, longest_first, table

MARKED = re.compile(r"mark\.(system|slow)\b")


def test_every_listed_file_exists():
    gone = [f for f in FILE_SECONDS if not (ROOT / f).is_file()]
    assert not gone, f"tests/file_costs.py lists files that are gone: {gone}"


def test_every_file_with_a_system_or_slow_test_is_listed():
    tests = ROOT / "tests"
    marked = {p.relative_to(ROOT).as_posix() for p in tests.rglob("test_*.py")
              if p.parent == tests / "system" or MARKED.search(p.read_text())}
    missing = sorted(marked - set(FILE_SECONDS))
    assert not missing, (f"add these to tests/file_costs.py (seconds from a run's "
                         f"--durations=0, or a guess): {missing}")


def test_files_go_longest_first_and_the_rest_keep_their_order():
    big, mid = (ROOT / f for f in sorted(FILE_SECONDS, key=FILE_SECONDS.get)[-2:][::-1])
    a, b = ROOT / "tests" / "not_listed_a.py", ROOT / "tests" / "not_listed_b.py"
    items = [SimpleNamespace(path=p, name=f"{p.name}:{i}")
             for i, p in enumerate([b, mid, a, big, mid, b, big])]
    longest_first(items)
    assert [(i.path, i.name.split(":")[1]) for i in items] == [
        (big, "3"), (big, "6"), (mid, "1"), (mid, "4"), (b, "0"), (b, "5"), (a, "2")]


def test_xdist_does_not_reorder_the_files_by_their_test_counts(request):
    import xdist  # noqa: F401  (a test dependency: make test runs two workers)

    assert request.config.option.loadscopereorder is False


def test_a_table_from_durations_sums_each_files_phases():
    lines = ["12.50s call     tests/test_x.py::test_a",
             "3.00s setup    tests/test_x.py::test_b[1]",
             "0.40s teardown tests/system/test_y.py::test_c",
             "============ slowest durations ============"]
    assert table(lines) == {"tests/test_x.py": 16}
