"""Freivalds' check: accepts correct f32 products from any backend, rejects wrong ones."""

from __future__ import annotations

import numpy as np
import pytest

from compute import InvalidInput, get_backend, verify_matmul


def operands(m, k, n, seed=0, kind="normal"):
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return (rng.standard_normal((m, k), dtype=np.float32),
                rng.standard_normal((k, n), dtype=np.float32))
    if kind == "positive":
        return (rng.uniform(0, 1, (m, k)).astype(np.float32),
                rng.uniform(0, 1, (k, n)).astype(np.float32))
    return (rng.lognormal(0, 2, (m, k)).astype(np.float32),
            rng.lognormal(0, 2, (k, n)).astype(np.float32))


@pytest.fixture(scope="module")
def big():
    a, b = operands(2048, 2048, 2048, seed=7)
    return a, b, a @ b


def test_accepts_correct_2048(big):
    a, b, c = big
    assert all(verify_matmul(a, b, c) for _ in range(5))


@pytest.mark.parametrize("where", [(0, 0), (1234, 567), (2047, 2047)])
def test_rejects_one_wrong_element_2048(big, where):
    a, b, c = big
    i, j = where
    for wrong in (c[i, j] + 3.0, 0.0 if abs(c[i, j]) > 3 else 10.0, -c[i, j] + 8.0):
        bad = c.copy()
        bad[i, j] = wrong
        # Sign vectors never hide a single wrong element: every round sees it.
        assert not any(verify_matmul(a, b, bad) for _ in range(5)), (where, wrong)


def test_rejects_bit_flip_and_swapped_rows(big):
    a, b, c = big
    bad = c.copy()
    bad.view(np.uint32)[100, 200] ^= 1 << 28  # an exponent bit: a corrupted transfer
    assert not verify_matmul(a, b, bad)
    swapped = c.copy()
    swapped[[5, 6]] = swapped[[6, 5]]
    assert not verify_matmul(a, b, swapped)


@pytest.mark.parametrize("kind", ["normal", "positive", "lognormal"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (300, 7, 2), (2, 513, 300), (129, 257, 65)])
def test_accepts_sequential_f32_accumulation(kind, shape):
    """A naive kernel sums in order over k in f32: the worst rounding an honest peer has."""
    m, k, n = shape
    a, b = operands(m, k, n, seed=k, kind=kind)
    c = np.zeros((m, n), np.float32)
    for kk in range(k):
        c += np.outer(a[:, kk], b[kk, :])
    assert verify_matmul(a, b, c, rounds=4)
    # Sensitivity: an error of 1e-3 * ||a_i|| * ||b||_F is ~40x the tolerance.
    wrong = c.copy()
    wrong[m // 2, n // 2] += 1e-3 * np.linalg.norm(a[m // 2]) * np.linalg.norm(b)
    assert not verify_matmul(a, b, wrong)


def test_accepts_every_backend_result():
    from compute import available_backends

    a, b = operands(67, 130, 45, seed=3)
    names = [s.name for s in available_backends() if s.validated]
    assert "numpy" in names
    for name in names:
        assert verify_matmul(a, b, get_backend(name).matmul(a, b)), name


def test_wrong_shape_or_non_finite_result_is_wrong():
    a, b = operands(8, 8, 8)
    c = a @ b
    assert not verify_matmul(a, b, c[:, :7])
    assert not verify_matmul(a, b, c.astype(np.complex64))
    nan = c.copy()
    nan[3, 3] = np.nan
    assert not verify_matmul(a, b, nan)
    assert verify_matmul(a, b, c.astype(np.float64))  # any real dtype is fine


def test_zero_rows_and_empty_products():
    a, b = operands(6, 5, 4)
    a[2] = 0
    c = a @ b
    assert verify_matmul(a, b, c)
    c[2, 1] = 1e-30
    assert not verify_matmul(a, b, c)
    assert verify_matmul(np.zeros((0, 3)), np.zeros((3, 4)), np.zeros((0, 4)))


def test_bad_operands_are_refused():
    a, b = operands(4, 4, 4)
    with pytest.raises(InvalidInput):
        verify_matmul(a, b[:3], a @ b)
    inf = a.copy()
    inf[0, 0] = np.inf
    with pytest.raises(InvalidInput):
        verify_matmul(inf, b, a @ b)
    with pytest.raises(InvalidInput):
        verify_matmul(a, b, a @ b, rounds=0)


def test_vectors_are_secret_by_default():
    """Without an rng each call draws fresh vectors; a seeded rng makes them repeatable."""
    a, b = operands(64, 64, 64)
    c = a @ b
    # Two errors in one row that cancel for exactly half of all sign vectors.
    bad = c.copy()
    bad[0, 0] += 50.0
    bad[0, 1] += 50.0
    outcomes = {verify_matmul(a, b, bad, rounds=1) for _ in range(64)}
    assert outcomes == {True, False}
    assert not any(verify_matmul(a, b, bad, rounds=40) for _ in range(3))
    seeded = [verify_matmul(a, b, bad, rounds=1, rng=np.random.default_rng(9)) for _ in range(4)]
    assert len(set(seeded)) == 1
