"""Shard plans: every output element covered exactly once, sizes follow the weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute import InvalidInput, Shard, merge_shards, plan_shards

weights_st = st.lists(
    st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1e4)), min_size=1, max_size=12
).filter(lambda ws: sum(ws) > 0)


def coverage(m: int, n: int, shards: list[Shard]) -> np.ndarray:
    count = np.zeros((m, n), dtype=np.int32)
    for s in shards:
        count[s.rows[0] : s.rows[1], s.cols[0] : s.cols[1]] += 1
    return count


@settings(max_examples=300, deadline=None)
@given(
    m=st.integers(0, 300),
    n=st.integers(0, 300),
    weights=weights_st,
    mode=st.sampled_from(["rows", "tiles"]),
    min_rows=st.integers(1, 40),
)
def test_every_element_covered_exactly_once(m, n, weights, mode, min_rows):
    shards = plan_shards(m, n, weights, mode=mode, min_rows=min_rows)
    assert np.all(coverage(m, n, shards) == 1)
    assert [s.index for s in shards] == list(range(len(shards)))
    for s in shards:
        assert weights[s.worker] > 0, "a zero-weight worker got work"
        assert s.size > 0
    if mode == "rows":
        assert all(s.cols == (0, n) for s in shards)
        assert len({s.worker for s in shards}) == len(shards)
    if len(shards) > 1:  # no slivers: a side is short only where the whole output is
        assert all(s.shape[0] >= min(min_rows, m) for s in shards)
        assert all(s.shape[1] >= min(min_rows, n) for s in shards)


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 200), n=st.integers(1, 200), weights=weights_st,
       mode=st.sampled_from(["rows", "tiles"]))
def test_merge_reassembles_the_product(m, n, weights, mode):
    full = np.arange(m * n, dtype=np.float32).reshape(m, n)
    shards = plan_shards(m, n, weights, mode=mode)
    parts = [full[s.rows[0] : s.rows[1], s.cols[0] : s.cols[1]].copy() for s in shards]
    assert np.array_equal(merge_shards(m, n, shards, parts), full)


def test_rows_follow_weights():
    shards = plan_shards(1000, 8, [3.0, 1.0, 0.0, 6.0])
    assert [(s.worker, s.shape[0]) for s in shards] == [(0, 300), (1, 100), (3, 600)]


def test_tiles_are_proportional_and_near_square():
    shards = plan_shards(1024, 1024, [1.0] * 4, mode="tiles")
    assert sorted(s.shape for s in shards) == [(512, 512)] * 4
    shards = plan_shards(900, 900, [2.0, 1.0, 1.0], mode="tiles")
    areas = {s.worker: s.size for s in shards}
    assert areas[0] == pytest.approx(2 * areas[1], rel=0.01)
    assert areas[1] == pytest.approx(areas[2], rel=0.01)


def test_min_rows_drops_slivers():
    shards = plan_shards(100, 10, [100.0, 1.0], min_rows=8)
    assert [(s.worker, s.rows) for s in shards] == [(0, (0, 100))]
    # Too few rows for anyone's minimum: the heaviest worker takes them all.
    assert [s.worker for s in plan_shards(3, 3, [1.0, 2.0], min_rows=8)] == [1]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"weights": []},
        {"weights": [0.0, 0.0]},
        {"weights": [1.0, -1.0]},
        {"weights": [float("nan")]},
        {"weights": [1.0], "mode": "cubes"},
        {"weights": [1.0], "min_rows": 0},
    ],
)
def test_bad_plans_are_refused(kwargs):
    with pytest.raises(InvalidInput):
        plan_shards(10, 10, **kwargs)
    with pytest.raises(ValueError):  # InvalidInput is a ValueError too
        plan_shards(-1, 10, [1.0])


def test_merge_refuses_bad_results():
    shards = plan_shards(4, 4, [1.0, 1.0])
    ok = [np.zeros(s.shape, np.float32) for s in shards]
    with pytest.raises(InvalidInput, match="shape"):
        merge_shards(4, 4, shards, [ok[0], np.zeros((1, 4), np.float32)])
    with pytest.raises(InvalidInput, match="results"):
        merge_shards(4, 4, shards, ok[:1])
    with pytest.raises(InvalidInput, match="cover"):
        merge_shards(4, 4, shards[:1], ok[:1])
    overlap = [Shard(0, (0, 3), (0, 4)), Shard(1, (2, 4), (0, 4))]
    with pytest.raises(InvalidInput, match="overlap"):
        merge_shards(4, 4, overlap, [np.zeros((3, 4)), np.zeros((2, 4))])
    with pytest.raises(InvalidInput, match="outside"):
        merge_shards(4, 4, [Shard(0, (0, 5), (0, 4))], [np.zeros((5, 4))])
