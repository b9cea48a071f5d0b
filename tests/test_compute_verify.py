"""Freivalds' check: accepts correct f32 products from any backend, rejects wrong ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compute import InvalidInput, get_backend, verify_matmul
from compute.verify import draw_vectors, miss_probability
from tests.conftest import no_install_fixes

ROOT = Path(__file__).resolve().parent.parent


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
    c = sequential(a, b)
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


def test_vectors_are_fresh_per_check_unless_seeded():
    """Without an rng each call draws fresh vectors; a seeded rng makes them repeatable."""
    a, b = operands(64, 64, 64)
    c = a @ b
    bad = c.copy()
    bad[0, 0] += 1.0
    seeded = [verify_matmul(a, b, bad, rounds=1, rng=np.random.default_rng(9)) for _ in range(4)]
    assert len(set(seeded)) == 1
    first = draw_vectors(64, 2)
    assert not np.array_equal(first, draw_vectors(64, 2))


@pytest.mark.parametrize("pattern", ["equal", "opposite", "many"])
def test_errors_arranged_to_cancel_are_caught(pattern):
    """Sign vectors let two equal errors cancel half the time per round (12 of 53 crafted
    shards passed a two-round check); Gaussian vectors give no arrangement an edge."""
    a, b = operands(64, 128, 96, seed=5)
    c = a @ b
    bad = c.copy()
    d = 0.1 * np.sqrt(np.mean(c.astype(np.float64) ** 2))          # 10% of rms(C)
    if pattern == "equal":
        bad[3, 10] += d
        bad[3, 11] += d
    elif pattern == "opposite":
        bad[3, 10] += d
        bad[3, 11] -= d
    else:
        bad[3, :64] += d * np.where(np.arange(64) % 2, 1, -1)
    rng = np.random.default_rng(2)
    assert not any(verify_matmul(a, b, bad, rng=rng) for _ in range(500))
    # The stated bound holds for this row's threshold: the one-round pass rate is tiny.
    passed = sum(verify_matmul(a, b, bad, rounds=1, rng=rng) for _ in range(500))
    assert passed <= 5


def rows_thresholds(a, b, c):
    from compute.verify import row_norms2, thresholds

    return thresholds(a, c, row_norms2(b))


@pytest.mark.parametrize("kind", ["normal", "positive", "lognormal"])
def test_one_percent_of_rms_is_caught_at_2048(kind):
    """At n = 2048 an element off by 1% of rms(C) is caught (>= 99% by the stated bound) and
    one off by 10% passes with probability <= 1e-6 (in a row of typical norm)."""
    a, b = operands(64, 2048, 2048, seed=11, kind=kind)
    c = a @ b
    rms = float(np.sqrt(np.mean(c.astype(np.float64) ** 2)))
    limits = rows_thresholds(a, b, c)
    i = int(np.argsort(limits)[len(limits) // 2])   # a row of median threshold
    assert miss_probability(0.01 * rms, limits[i]) <= 0.01
    assert miss_probability(0.1 * rms, limits[i]) <= 1e-6
    rng = np.random.default_rng(3)
    for j in (0, 1000, 2047):
        bad = c.copy()
        bad[i, j] += 0.01 * rms
        assert not any(verify_matmul(a, b, bad, rng=rng) for _ in range(10))
    assert all(verify_matmul(a, b, c, rng=rng) for _ in range(10))


def sequential(a, b):
    """A naive kernel's order: sum over k in f32, one term at a time."""
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for kk in range(a.shape[1]):
        c += np.outer(a[:, kk], b[kk, :])
    return c


def test_honest_results_are_never_rejected():
    """>= 1,000 honest checks: every f32 backend here (numpy, wgpu tiled and naive),
    sequential f32 sums, and what the f16 kernel computes (inputs rounded to half, f32 sums;
    numpy's order and the sequential one), three distributions, assorted shapes. The GPU's
    own f16 kernel: test_honest_f16_results_are_never_rejected."""
    from compute import available_backends

    def half(x):
        return x.astype(np.float16).astype(np.float32)

    producers = {"numpy": (lambda a, b: a @ b, "f32"), "sequential": (sequential, "f32"),
                 "numpy-f16": (lambda a, b: half(a) @ half(b), "f16"),
                 "sequential-f16": (lambda a, b: sequential(half(a), half(b)), "f16")}
    status = {s.name: s for s in available_backends()}
    wgpu = "wgpu" in status and status["wgpu"].validated
    if wgpu:
        gpu = get_backend("wgpu")
        producers["wgpu-tiled"] = (lambda a, b: gpu.matmul(a, b, kernel="tiled"), "f32")
        producers["wgpu-naive"] = (lambda a, b: gpu.matmul(a, b, kernel="naive"), "f32")
    rng = np.random.default_rng(4)
    checks = dict.fromkeys(producers, 0)
    for kind in ("normal", "positive", "lognormal"):
        for m, k, n in [(1, 1, 1), (7, 300, 2), (64, 64, 64), (33, 257, 129), (128, 512, 96),
                        (16, 1500, 16)]:
            a, b = operands(m, k, n, seed=m + k + n, kind=kind)
            for name, (produce, precision) in producers.items():
                c = produce(a, b)
                for _ in range(15):
                    assert verify_matmul(a, b, c, rng=rng, precision=precision), (
                        kind, (m, k, n), name)
                    checks[name] += 1
    print(f"honest checks per producer: {checks}")
    assert sum(checks.values()) >= 1000
    assert checks["numpy-f16"] and checks["sequential-f16"]


def test_four_rounds_are_the_fewest_that_meet_the_goal_at_2048():
    """The stated bound, numerically (normal data, n = 2048, a row of median threshold,
    T ~ 1.95e-3 rms(C)): per round an error of 10% of rms(C) is missed with probability
    <= 0.8 T / |e| ~ 0.016 and one of 1% with ~0.16. Three rounds miss 10% with ~4e-6
    (> 1e-6), so fewer vectors would not keep the guarantee; four miss it with ~6e-8 and
    miss 1% with ~6e-4 (caught >= 99.9%)."""
    from compute.verify import row_norms2, thresholds

    a, b = operands(256, 2048, 2048, seed=11)
    c = a @ b
    rms = float(np.sqrt(np.mean(c.astype(np.float64) ** 2)))
    t = float(np.median(thresholds(a, c, row_norms2(b))))
    assert 1.5e-3 < t / rms < 2.5e-3
    assert miss_probability(0.1 * rms, t, rounds=3) > 1e-6
    assert miss_probability(0.1 * rms, t, rounds=4) <= 1e-7
    assert miss_probability(0.01 * rms, t, rounds=4) <= 1e-3


@pytest.mark.parametrize("shape", [(0, 5), (1, 7), (1, 2048), (5, 1), (300, 7), (129, 257),
                                   (1100, 1003)])  # the last is shared by threads
@pytest.mark.parametrize("cols", [0, 1, 4, 6])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("compiled_only", [False, True])
def test_fused_pass_equals_the_float64_reference(shape, cols, weighted, compiled_only,
                                                 monkeypatch):
    """One compiled pass gives ``x @ r`` (float32 sums, within the rounding model's bound) and
    the squares (float64), whatever the shape, number of vectors and thread split; small
    inputs take plain numpy, which must agree (``compiled_only`` runs them compiled too)."""
    from compute import verify
    from compute.verify import _pass

    if compiled_only:
        monkeypatch.setattr(verify, "_SMALL", 0)

    m, k = shape
    rng = np.random.default_rng(m * 31 + k + cols)
    x = rng.standard_normal((m, k), dtype=np.float32)
    r = rng.standard_normal((k, cols), dtype=np.float32)
    w = rng.random(k) if weighted else None
    proj, sq = _pass(x, r if cols else None, w)
    x64 = x.astype(np.float64)
    ref_sq = (x64 * x64) @ (np.ones(k) if w is None else w)
    np.testing.assert_allclose(sq, ref_sq, rtol=1e-12)
    assert sq.dtype == np.float64 and sq.shape == (m,)
    if not cols:
        assert proj is None
        return
    assert proj.dtype == np.float32 and proj.shape == (m, cols)
    ref = x64 @ r.astype(np.float64)
    scale = np.abs(x64) @ np.abs(r.astype(np.float64))
    # no worse than summing in order in float32 (what the rounding model charges the check)
    assert np.all(np.abs(proj - ref) <= 2.0**-24 * (k + 1) * scale)
    assert np.all(np.abs(proj - ref) <= 2.0**-24 * 64 * scale.max(initial=0))  # far better here


def test_fused_pass_squares_past_float32_stay_finite():
    """A row whose float32 squares overflow (1e20**2 > 3.4e38) is summed in float64."""
    from compute.verify import _pass, row_norms2

    x = np.ones((3, 600), np.float32)
    x[1] = 1e20
    r = np.ones((600, 4), np.float32)
    proj, sq = _pass(x, r, None)
    np.testing.assert_allclose(sq, [600.0, 600 * 1e40, 600.0], rtol=1e-6)
    np.testing.assert_allclose(row_norms2(x), sq)
    # float32 sums of 600 terms: within 600 * 2**-24 = 3.6e-5 in any order (AVX2's lanes
    # give 1.4e-6 here, AVX-512's under 1e-6)
    np.testing.assert_allclose(proj[1], 600 * np.float32(1e20), rtol=3.6e-5)
    x[2, 5] = np.inf  # non-finite stays non-finite (callers refuse it)
    assert not np.isfinite(_pass(x, r, None)[1][2])
    small = x[:, :4].copy()  # the plain-numpy path for small inputs does the same
    small[1] = 1e20
    np.testing.assert_allclose(_pass(small, None, None)[1][:2], [4.0, 4e40], rtol=1e-6)
    assert not np.isfinite(_pass(x[:, :8], None, None)[1][2])


def test_default_check_reads_each_matrix_once_in_the_fused_pass(monkeypatch):
    """The check makes no BLAS call: each of b, a and c goes through the compiled pass once,
    row by row (the BLAS pass re-read every block once per check vector)."""
    from compute import verify

    def no_blas(*args, **kwargs):
        raise AssertionError("BLAS called by the check")

    a, b = operands(1200, 1000, 1100, seed=1)  # two shares of a pass each or more
    c = a @ b
    kernel, verdict = verify._kernel(), verify._kernel("verdict")
    seen: dict[int, list[tuple[int, int]]] = {}

    def counting(x, rt, w, proj, sq, r0, r1):
        seen.setdefault(id(x), []).append((r0, r1))
        return kernel(x, rt, w, proj, sq, r0, r1)

    monkeypatch.setattr(verify, "_kernel",
                        lambda name="rows": counting if name == "rows" else verdict)
    monkeypatch.setattr(np, "matmul", no_blas)
    monkeypatch.setattr(np, "dot", no_blas)
    assert verify_matmul(a, b, c)
    assert set(seen) == {id(a), id(b), id(c)}
    for x in (a, b, c):
        ranges = sorted(seen[id(x)])
        assert len(ranges) >= 2
        assert ranges[0][0] == 0 and ranges[-1][1] == len(x)
        assert all(p[1] == q[0] for p, q in zip(ranges, ranges[1:], strict=False))


def test_checks_from_many_threads_and_a_forked_child():
    """Concurrent checks share the helper threads; a forked child (which has none of them)
    still checks instead of waiting forever on the parent's pool."""
    import concurrent.futures as cf
    import multiprocessing

    a, b = operands(1200, 900, 1000, seed=2)
    c = a @ b
    bad = c.copy()
    bad[5, 5] += 10.0  # ~1/3 of rms(C): missed with probability ~1e-9
    with cf.ThreadPoolExecutor(4) as ex:
        verdicts = list(ex.map(lambda cc: verify_matmul(a, b, cc), [c, bad] * 4))
    assert verdicts == [True, False] * 4
    child = multiprocessing.get_context("fork").Process(
        target=lambda: None if verify_matmul(a, b, c) else 1 / 0)
    child.start()
    child.join(60)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0


def test_a_forked_child_never_draws_its_parents_next_check_vectors():
    """Each thread keeps one secret generator; a fork must not hand the child its state."""
    import os

    from compute.verify import draw_vectors

    draw_vectors(64, 4)  # this thread's generator now exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, draw_vectors(64, 4).tobytes())
        os._exit(0)
    os.close(write)
    got = b""
    while chunk := os.read(read, 1 << 16):
        got += chunk
    os.close(read)
    os.waitpid(pid, 0)
    assert len(got) == 64 * 4 * 4
    assert got != draw_vectors(64, 4).tobytes()


def test_warm_up_compiles_the_pass_in_the_background_once():
    """A requester starts loading the pass when it starts (~0.25 s from numba's cache),
    not at its first check; a second call starts nothing new. In a fresh process: the
    warm-up used to run a pass so small that it never reached the compiled kernel."""
    code = ("from compute import verify\n"
            "thread = verify.warm_up()\n"
            "assert verify.warm_up() is thread\n"
            "thread.join(120)\n"
            "assert not thread.is_alive()\n"
            "print(sorted(k for k, f in verify._compiled.items() if f.signatures))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['rows', 'verdict']"


def test_products_for_many_check_vectors_match_and_leave_blas_threads_as_they_were():
    from threadpoolctl import threadpool_info

    from compute.verify import products

    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 200)).astype(np.float32)
    before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    for cols in (4, 64):  # the compiled pass, then BLAS on one thread
        r = rng.standard_normal((200, cols)).astype(np.float32)
        got = products(x, r)
        assert got.dtype == np.float32 and got.shape == (300, cols)
        np.testing.assert_allclose(got, x.astype(np.float64) @ r, rtol=1e-4, atol=1e-3)
    assert [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"] == before


def test_honest_f16_results_are_never_rejected():
    """The honest checks of test_honest_results_are_never_rejected on the GPU's own f16
    kernel, where the adapter has shader-f16 (a GPU; Mesa's llvmpipe has none: a skip that
    says no install fixes it; no wgpu adapter at all is a failure under CI)."""
    from compute import available_backends

    status = {s.name: s for s in available_backends()}
    if "wgpu" not in status or not status["wgpu"].validated:
        pytest.skip(f"no wgpu adapter here: {status.get('wgpu') and status['wgpu'].reason}")
    gpu = get_backend("wgpu")
    if not gpu.f16_available:
        pytest.skip(no_install_fixes(f"f16 honest checks need shader-f16: {gpu.f16_reason}"))
    rng = np.random.default_rng(4)
    checks = 0
    for kind in ("normal", "positive", "lognormal"):
        for m, k, n in [(1, 1, 1), (7, 300, 2), (64, 64, 64), (33, 257, 129), (128, 512, 96),
                        (16, 1500, 16)]:
            a, b = operands(m, k, n, seed=m + k + n, kind=kind)
            c = gpu.matmul(a, b, "f16")
            for _ in range(15):
                assert verify_matmul(a, b, c, rng=rng, precision="f16"), (kind, (m, k, n))
                checks += 1
    assert checks == 270
