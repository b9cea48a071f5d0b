"""Freivalds' check: is ``c`` really ``a @ b``? Costs a few skinny products, not a matmul.

**Vectors.** Every check draws ``rounds`` fresh secret vectors ``r`` (N x 1, independent
standard normal, from the OS's entropy pool) and compares ``a @ (b @ r)`` with ``c @ r``.
Nothing of ``r`` outlives the check, so a worker learns nothing from one verdict that helps
it pass the next. Signs (+1/-1) would not do: two equal errors in one row cancel whenever
their signs agree (1 time in 2 per round), whatever the worker does.

**Miss probability.** Let ``e = c - a @ b`` (the error a worker added) and ``e_i`` one row
of it. For Gaussian ``r``, ``e_i . r`` is ``N(0, ||e_i||^2)`` *whatever the arrangement of
the errors in the row*, so with a row threshold ``T_i`` (below) one round misses with
probability at most ``2 T_i / (sqrt(2 pi) ||e_i||) <= 0.8 T_i / ||e_i||`` (the densest
interval of a normal of that spread, wherever the honest rounding puts its centre), and
``rounds`` independent rounds miss with probability at most
:func:`miss_probability` ``= (0.8 T_i / ||e_i||) ** rounds``. With the default 4 rounds
and ``T_i`` below ~4e-3 of rms(C) (normal, uniform-positive and lognormal data at
n = 2048; see bench/compute.py), an element wrong by 10% of rms(C) passes with probability
<= 1e-6 and one wrong by 1% is caught >= 99% of the time.

**Threshold: a rounding model.** ``T_i = KAPPA * sigma_i`` where ``sigma_i`` models the
spread of an honest row's residual ``(a @ (b @ r) - c @ r)_i``. The worst honest producer
is one that accumulates each element in order over K in f32 (the tiled and naive WGSL
kernels, on a GPU or on Mesa llvmpipe); BLAS (numpy) blocks its sums and rounds less.
Sequential f32 summation adds ``u * s_t`` (``u = 2**-24``) at every partial sum ``s_t``;
over a row the partial sums are bounded by a drift term (``t/K * c_i``, data with a mean)
plus a random-walk term (``Q_i = sum_t a_it**2 ||b_t||**2``, zero-mean data); the check
itself sums over N (``c @ r``, ``b @ r``) and over K (``a @ (b r)``) in f32 too. Together::

    sigma_i**2 = u**2 (K + N) (||c_i||**2 + Q_i)        [+ u16**2 Q_i for f16 inputs]

where ``u16 = 2**-11`` covers products computed from inputs rounded to half precision
(``precision="f16"``, checked against the unrounded inputs). Using ``||c_i||`` of the
*claimed* result is safe: an error ``e_i`` raises ``sigma_i`` by at most
``u sqrt(K + N) ||e_i||``, far below ``||e_i||`` itself.

Why four rounds: at n = 2048 the median row threshold is ``T ~ 1.95e-3`` rms(C) for normal
data (1.4e-3 uniform-positive, 1.25e-3 lognormal), so one round misses an error of 10% of
rms(C) with probability <= 0.016 and one of 1% with <= 0.16. Three rounds would miss the 10%
error with ~4e-6 (over the 1e-6 goal); four miss it with ~6e-8 and the 1% one with ~6e-4
(``test_four_rounds_are_the_fewest_that_meet_the_goal_at_2048``). Three rounds would need
KAPPA <= 5.1, about 2x over the worst honest ratio measured: not taken.

Cost: ``b @ R``, ``a (b R)`` and ``c @ R`` and the squared row norms of ``b``, ``c`` and
``a`` (weighted, for ``Q``), against ``2 M N K`` flops for the product. The check is
memory-bound, so each matrix is read from memory once, by one compiled loop (numba,
:func:`_pass`): a row block is streamed in by its squares and every product is taken from
L2 (products summed in float32 vector lanes, like BLAS, and never worse than the in-order
float32 sums the rounding model charges the check with; squares in float64), in 2 MiB
shares taken by one pinned thread per core; no BLAS. Measured on the 2-core EPYC test
machine at n = 2048 (bench/check_pass.py: medians of 21, interleaved with the numpy
product, old and new in one run; five runs while other tests held the cores, load 1.2-2.4):
1.9-5.6 ms, median run 3.6 ms, 2.8-7.9% of the ~69 ms two-thread product, against 7.4-7.8
ms for the previous pass (BLAS matrix-vector products on one thread) in the same runs;
bench/compute.py 2.44 ms (3.5%; 1.8% of a one-thread product); 1.5-1.8 ms back to back with
no product in between. At n = 4096: 11.8-13.4 ms (2.0-2.3%) against 20.7-21.1
(bench/compute.py: 1.6%); at n = 1024, where all three fit in L3 and arithmetic bounds the
pass: 0.7-0.8 ms (8-9%) against 3.5-3.9. Where it goes: a pass over 16 MiB from memory
takes ~0.5 ms on two cores (~0.8 on one: streaming alone is 0.5 ms at the ~34 GB/s one core
reads, the products from L2 the rest), so ~1.5 ms for the three, plus ~0.2 ms for the
vectors and the comparison. Right after a numpy product OpenBLAS's idle threads spin for
~0.1 s on the cores, and a check then takes up to ~3.5 ms; other processes on the cores
slow it the same way. The first check in a process imports numba and loads the compiled
loop from numba's on-disk cache (~0.25 s), or compiles it (~0.6 s); :func:`warm_up` does
that in the background (a requester's ``FreivaldsCache`` starts it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from compute.backend import check_operands, check_precision
from compute.errors import InvalidInput

ROUNDS = 4
"""Default number of independent Gaussian vectors per check."""
KAPPA = 8.0
"""Threshold over the rounding model ``sigma_i``. The largest honest ``|residual| / sigma_i``
measured over >= 1,000 products (numpy, tiled and naive WGSL on llvmpipe, sequential f32;
normal, uniform-positive and lognormal data; n = 64..8192) is in bench/compute.py's table
(about 2.5); KAPPA leaves >= 3x on top of it."""
_U32 = 2.0**-24
_U16 = 2.0**-11


_rngs = threading.local()


def _secret_rng() -> np.random.Generator:
    """This thread's generator, seeded once from the OS's entropy pool: a worker cannot
    predict the check vectors (seeding one per draw cost ~30 us, more than a 1x1 check)."""
    rng = getattr(_rngs, "rng", None)
    if rng is None:
        rng = _rngs.rng = np.random.default_rng()
    return rng


def draw_vectors(n: int, rounds: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """``rounds`` fresh standard-normal check vectors of length ``n``, as columns (f32)."""
    return (rng or _secret_rng()).standard_normal((n, rounds), dtype=np.float32)


_BLOCK = 1 << 16
"""Elements per row block of a pass (256 KiB of float32): stays in a core's L2 between
streaming it in and taking the products from it."""


def _rows_kernel(x: np.ndarray, rt: np.ndarray, w: np.ndarray, proj: np.ndarray,
                 sq: np.ndarray, r0: int, r1: int) -> None:  # pragma: no cover - compiled
    """Rows ``r0:r1`` of ``proj = x @ rt.T`` (float32 sums) and ``sq = (x * x) @ w`` (float64
    sums: squares of any finite float32 stay finite) (compiled by :func:`_kernel`; ``rt`` is
    ``cols x k``, float32).

    Row blocks of :data:`_BLOCK` elements: the squares stream the block in from memory at
    full speed (~34 GB/s on one core here), then every product is taken from L2, four
    columns per loop over a row. One loop doing both ran at half that speed from
    memory (the products' arithmetic stalled the stream): 2.1 ms per 16 MiB against 1.1;
    pairs of rows cut the loads of ``rt`` by half (1.1 -> 1.0 ms), and float32 sums (eight
    to a vector, against four float64) another 15% (0.92 -> 0.77 ms). The sums' order is
    the compiler's (vector lanes): each lane sums a part of the row in order, so the error
    stays within that of one in-order float32 sum (largest honest residual over sigma
    measured 0.65 against 0.55 with float64 sums; KAPPA is 8)."""
    k = x.shape[1]
    cols = rt.shape[0]
    rows = max(1, _BLOCK // k)
    for b0 in range(r0, r1, rows):
        b1 = min(r1, b0 + rows)
        for i in range(b0, b1):
            s = 0.0
            for j in range(k):
                v = np.float64(x[i, j])
                s += v * v * w[j]
            sq[i] = s
        for i in range(b0, b1, 2):  # two rows at a time: each load of rt serves both
            i2 = min(i + 1, b1 - 1)     # (an odd last row is done twice, harmlessly)
            c = 0
            while c + 4 <= cols:
                a0 = a1 = a2 = a3 = np.float32(0.0)
                e0 = e1 = e2 = e3 = np.float32(0.0)
                for j in range(k):
                    v = x[i, j]
                    u = x[i2, j]
                    t0 = rt[c, j]
                    t1 = rt[c + 1, j]
                    t2 = rt[c + 2, j]
                    t3 = rt[c + 3, j]
                    a0 += v * t0
                    a1 += v * t1
                    a2 += v * t2
                    a3 += v * t3
                    e0 += u * t0
                    e1 += u * t1
                    e2 += u * t2
                    e3 += u * t3
                proj[i, c], proj[i, c + 1], proj[i, c + 2], proj[i, c + 3] = a0, a1, a2, a3
                proj[i2, c], proj[i2, c + 1], proj[i2, c + 2], proj[i2, c + 3] = e0, e1, e2, e3
                c += 4
            while c < cols:
                a0 = e0 = np.float32(0.0)
                for j in range(k):
                    a0 += x[i, j] * rt[c, j]
                    e0 += x[i2, j] * rt[c, j]
                proj[i, c] = a0
                proj[i2, c] = e0
                c += 1


def _verdict_kernel(z: np.ndarray, q: np.ndarray, cr: np.ndarray, c_norms2: np.ndarray,
                    scale: float, f16: float) -> int:  # pragma: no cover - compiled
    """:func:`judge`'s verdict in one loop over its four small arrays (numpy: a dozen calls,
    60 us, where a tapped check's projections of 512 rows take 100): 2 when the input side
    is not finite, 1 when the output side is not or a residual passes its row's threshold
    ``KAPPA * sqrt(scale * (c_norms2 + q) + f16 * q)``, else 0. Float64 throughout."""
    m, rounds = z.shape
    for i in range(m):
        if not np.isfinite(q[i]):
            return 2
        for t in range(rounds):
            if not np.isfinite(z[i, t]):
                return 2
    for i in range(m):
        c2 = np.float64(c_norms2[i])
        if not np.isfinite(c2):
            return 1
        qi = np.float64(q[i])
        limit = KAPPA * np.sqrt(scale * (c2 + qi) + f16 * qi)
        for t in range(rounds):
            d = np.float64(z[i, t]) - np.float64(cr[i, t])
            if not abs(d) <= limit:  # a NaN or an infinity in the output fails here too
                return 1
    return 0


_compiled: dict[str, Any] = {}
_compile_lock = threading.Lock()


def _kernel(name: str = "rows") -> Any:
    """:func:`_rows_kernel` (or ``"verdict"``: :func:`_verdict_kernel`) compiled by numba on
    first use (importing numba costs ~0.2 s, so not at import). ``reassoc``/``contract``
    only: the sums may be vectorised and use FMA, while NaN and infinity keep their IEEE
    meaning (no ``nnan``/``ninf``; the verdict gets no fast-math at all). ``nogil``:
    :func:`_pass` runs row ranges on several threads. Cached on disk where numba finds a
    writable cache directory; otherwise compiled once per process (~0.4 s)."""
    with _compile_lock:
        if name not in _compiled:
            import numba

            fn, options = ((_rows_kernel, {"nogil": True, "fastmath": {"reassoc", "contract"}})
                           if name == "rows" else (_verdict_kernel, {"nogil": True}))
            try:
                _compiled[name] = numba.njit(cache=True, **options)(fn)
            except RuntimeError:  # no writable cache directory: compile in memory
                _compiled[name] = numba.njit(**options)(fn)
        return _compiled[name]


_warming: threading.Thread | None = None


def _warm() -> None:
    """Each kernel once on tiny arrays (a pass this small would be plain numpy)."""
    x, z = np.zeros((2, 2), np.float32), np.zeros((2, 1), np.float32)
    _kernel()(x, z.T.copy(), np.ones(2), z.copy(), np.zeros(2), 0, 2)
    judge(z, np.zeros(2), z, np.zeros(2), (2, 2))


def warm_up() -> threading.Thread:
    """Import numba and load (or compile) the pass in a background thread, once per process,
    so that the first check does not wait ~0.25 s (~0.6 s to compile). Callers that will
    check (a requester) start it early; a check that comes first just waits for the same
    lock."""
    global _warming
    with _compile_lock:
        if _warming is None:
            _warming = threading.Thread(target=_warm, name="swarm-check-warm-up",
                                        daemon=True)
            _warming.start()
        return _warming


_SMALL = 1 << 12
"""Elements of ``x`` up to which a pass is plain numpy (small shards, round trips)."""
_SHARE = 1 << 19
"""Elements per share of a pass that a helper takes at a time (2 MiB, ~0.07 ms; each take
costs a few us). Helpers take shares as they come free, not fixed halves: when another
process holds one core (or OpenBLAS's threads still spin after a product, ~0.1 s), the other
helper takes most of the shares instead of the check waiting for the slow half."""
_MAX_HELPERS = 4
"""At most this many cores share a pass: it is memory-bound (two were measured, 2x)."""
_pool: list[ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _helpers() -> list[ThreadPoolExecutor]:
    """One thread per usable core (up to :data:`_MAX_HELPERS`), each pinned to its core.

    Pinned, because Linux wakes a thread on its waker's core when it deems that cheaper:
    after the machine had been idle for a moment (0.05 s), a helper woken by the checking
    thread ran on that same core, after it, and a two-way split took as long as one thread
    (0.6 + 0.6 ms). The checking thread itself only waits, for the same reason."""
    global _pool
    with _pool_lock:
        if _pool is None:
            cpus = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else list(range(os.cpu_count() or 1)))
            pools = []
            for cpu in cpus[:_MAX_HELPERS]:
                pool = ThreadPoolExecutor(1, thread_name_prefix="swarm-check")
                if hasattr(os, "sched_setaffinity"):
                    with contextlib.suppress(OSError):  # unpinned is slower, not wrong
                        pool.submit(os.sched_setaffinity, 0, {cpu}).result()
                pools.append(pool)
            _pool = pools
        return _pool


def _forget_pool() -> None:
    """In a forked child: none of the parent's threads (helpers, warm-up) exist there, and a
    lock one of them held would stay held."""
    global _pool, _pool_lock, _compile_lock, _warming, _rngs
    _pool, _warming = None, None
    _rngs = threading.local()  # a child drawing the parent's next vectors would repeat them
    _pool_lock, _compile_lock = threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _pass(x: np.ndarray, right: np.ndarray | None, weights: np.ndarray | None,
          serial: bool = False) -> tuple[np.ndarray | None, np.ndarray]:
    """``x @ right`` (float32; skipped when ``right`` is None) and ``(x * x) @ weights``
    (row norms squared when ``weights`` is None, float64), reading ``x`` from memory once.

    The check is memory-bound, and matrix-vector products in BLAS re-read each block of
    ``x`` once per check vector: here one compiled loop (:func:`_rows_kernel`) takes every
    product and the squares while a block is in L2 (products in float32 like BLAS, squares in
    float64, so that those of any finite float32 stay finite).
    Shares of :data:`_SHARE` elements go to the pinned helper threads (:func:`_helpers`)
    when there are two or more; they wait on a lock, never spin, so on a busy machine they
    take nothing from the computing workers between checks. ``serial``: all on the calling
    thread (a caller that runs several checks at once on its own threads, and counts their
    thread time: models.mlp's)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    if m * k <= _SMALL:  # a few numpy calls beat the compiled loop's setup
        w = None if weights is None else np.asarray(weights, dtype=np.float64)
        x64 = x.astype(np.float64)
        sq = (x64 * x64).sum(axis=1) if w is None else (x64 * x64) @ w
        if right is None:
            return None, sq
        return x @ np.asarray(right, dtype=np.float32), sq
    cols = 0 if right is None else right.shape[1]
    proj = np.zeros((m, cols), np.float32)
    sq = np.zeros(m)
    if m == 0 or k == 0:
        return (None if right is None else proj), sq
    rt = (np.zeros((0, k), np.float32) if right is None
          else np.ascontiguousarray(np.asarray(right).T, dtype=np.float32))
    w = np.ones(k) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    kernel = _kernel()
    shares = min(m, (m * k) // _SHARE)
    helpers = _helpers() if shares >= 2 and not serial else []
    if len(helpers) < 2:
        kernel(x, rt, w, proj, sq, 0, m)
    else:
        edges = [m * p // shares for p in range(shares + 1)]
        taken = itertools.count()  # next() is atomic under the GIL

        def take() -> None:
            while (p := next(taken)) < shares:
                kernel(x, rt, w, proj, sq, edges[p], edges[p + 1])

        for f in [h.submit(take) for h in helpers[:shares]]:
            f.result()
    return (None if right is None else proj), sq


def row_norms2(x: np.ndarray) -> np.ndarray:
    """Squared row norms (float64) of a 2-D float32 array."""
    return _pass(x, None, None)[1]


def project(x: np.ndarray, right: np.ndarray, serial: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:
    """``x @ right`` (float32) and ``x``'s squared row norms (float64), reading ``x`` once:
    a weight's check vectors for several checks and its norms cost one pass over it."""
    return _pass(x, right, None, serial)


_BLAS_COLUMNS = 32
"""From this many columns :func:`products` hands ``x @ right`` to BLAS: the pass takes four
columns per loop and is compute-bound past ~16 (n=4096, 128 columns: pass 89 ms, one BLAS
thread 44 ms)."""
_blas: Any = None
_blas_lock = threading.Lock()


def products(x: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``x @ right`` (float32 sums) for many check vectors at once (a weight's batch).

    BLAS on one thread, the caller's: a requester shares the cores with the workers it
    checks, and OpenBLAS's pool spins on for a while after each product. The limit is
    process-wide (threadpoolctl) for the product's duration, so refills take turns."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    right = np.ascontiguousarray(right, dtype=np.float32)
    if right.shape[1] < _BLAS_COLUMNS:
        return _pass(x, right, None)[0]
    global _blas
    with _blas_lock:
        if _blas is None:
            from threadpoolctl import ThreadpoolController

            _blas = ThreadpoolController()
        with _blas.limit(limits=1, user_api="blas"):
            return x @ right


def miss_probability(error_norm: float, threshold: float, rounds: int = ROUNDS) -> float:
    """Upper bound on the chance that a row with error of norm ``error_norm`` passes."""
    if error_norm <= 0:
        return 1.0
    return min(1.0, 0.8 * threshold / error_norm) ** rounds


def _variance(k: int, n: int, q: np.ndarray, c_norms2: np.ndarray, precision: str
              ) -> np.ndarray:
    """``sigma_i**2`` of the rounding model (module docstring), per row, from
    ``q_i = sum_t a_it**2 ||b_t||**2`` and ``||c_i||**2``."""
    var = _U32**2 * (k + n) * (c_norms2 + q)
    if precision == "f16":
        var += _U16**2 * q
    return var


def thresholds(a: np.ndarray, c: np.ndarray, b_norms2: np.ndarray, precision: str = "f32"
               ) -> np.ndarray:
    """Per-row thresholds ``KAPPA * sigma_i`` (what a residual may reach on an honest row)."""
    q = _pass(a, None, b_norms2)[1]
    return KAPPA * np.sqrt(_variance(a.shape[1], c.shape[1], q, row_norms2(c), precision))


def check_product(a: np.ndarray, b: np.ndarray, c: Any, r: np.ndarray, b_norms2: np.ndarray,
                  precision: str = "f32", br: np.ndarray | None = None,
                  output_unit: float = 0.0, serial: bool = False) -> bool:
    """The check itself with check vectors ``r`` (N x rounds) and ``b``'s squared row norms
    (:func:`row_norms2`; a caller checking many results against one weight keeps them).
    ``br`` is ``b @ r`` when the caller already has it; ``output_unit``: see :func:`judge`;
    ``serial``: see :func:`_pass`."""
    c = np.asarray(c)
    if br is None and c.shape == (a.shape[0], b.shape[1]) and c.size:
        with np.errstate(over="ignore", invalid="ignore"):
            br = _pass(b, r, None, serial)[0]
    return check_projected(a, c, r, br, b_norms2, b.shape, precision, output_unit, serial)


def check_projected(a: np.ndarray, c: Any, r: np.ndarray, br: np.ndarray | None,
                    b_norms2: np.ndarray, shape: tuple[int, int], precision: str = "f32",
                    output_unit: float = 0.0, serial: bool = False) -> bool:
    """:func:`check_product` from what it takes of ``b`` alone: ``br = b @ r``, its squared
    row norms and its ``shape`` (a weight kept in a file's block format gives these from its
    dequantized rows, models.quant.QTensor.check_vectors, without a float32 copy)."""
    m, n = a.shape[0], shape[1]
    c = np.asarray(c)
    if c.shape != (m, n) or c.dtype.kind not in "fiu":
        return False
    c = np.ascontiguousarray(c, dtype=np.float32)
    if m == 0 or n == 0:
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        z, q = _pass(a, br, b_norms2, serial)
        cr, c_norms2 = _pass(c, r, None, serial)
    if not np.isfinite(b_norms2).all():
        raise InvalidInput("a and b must be finite (and small enough to multiply in f32)")
    return judge(z, q, cr, c_norms2, tuple(shape), precision, output_unit)


def judge(z: np.ndarray, q: np.ndarray, cr: np.ndarray, c_norms2: np.ndarray,
          shape: tuple[int, int], precision: str = "f32", output_unit: float = 0.0) -> bool:
    """The check's verdict from its two sides, each one pass (:func:`_pass`): the input's
    ``z = a (b r)`` and ``q = (a * a) @ ||b_t||**2``, and the output's ``c r`` and ``||c_i||**2``
    (a caller may take each side where the rows already pass through a core, as
    models.minilm_span does inside the steps that read or write them). ``shape`` is ``b``'s.
    Raises InvalidInput when the input side is not finite (the caller's own values, not the
    result's). ``output_unit``: the unit roundoff of a format the result was rounded to after
    it was computed (2**-11 for f16, 2**-8 for bf16): each element may then be off by that
    fraction of itself, so a row's residual has up to ``output_unit * ||c_i||`` more spread,
    added to the rounding model's variance (through ``c_norms2``; the kernel is unchanged)."""
    k, n = shape
    if output_unit:
        c_norms2 = np.asarray(c_norms2) * (1.0 + output_unit**2 / (_U32**2 * (k + n)))
    verdict = _kernel("verdict")(np.asarray(z), np.asarray(q), np.asarray(cr),
                                 np.asarray(c_norms2), _U32**2 * (k + n),
                                 _U16**2 if precision == "f16" else 0.0)
    if verdict == 2:
        raise InvalidInput("a and b must be finite (and small enough to multiply in f32)")
    return verdict == 0


def residuals(a: np.ndarray, b: np.ndarray, c: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``a (b r) - c r`` per row and vector (float64), for callers that rank rows."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (_pass(a, _pass(b, r, None)[0], None)[0].astype(np.float64)
                - _pass(c, r, None)[0])


def residual_ratios(a: np.ndarray, b: np.ndarray, c: np.ndarray, rounds: int = ROUNDS,
                    rng: np.random.Generator | None = None, precision: str = "f32"
                    ) -> np.ndarray:
    """``|residual| / sigma_i`` per row and round (calibration of KAPPA; bench/compute.py)."""
    a, b = check_operands(a, b)
    c = np.ascontiguousarray(c, dtype=np.float32)
    r = draw_vectors(b.shape[1], rounds, rng)
    z, q = _pass(a, _pass(b, r, None)[0], row_norms2(b))
    cr, c_norms2 = _pass(c, r, None)
    var = _variance(a.shape[1], b.shape[1], q, c_norms2, precision)
    diff = np.abs(z.astype(np.float64) - cr)
    return diff / np.sqrt(np.maximum(var, 1e-300))[:, None]


def verify_matmul(
    a: Any,
    b: Any,
    c: Any,
    rounds: int = ROUNDS,
    *,
    rng: np.random.Generator | None = None,
    precision: str = "f32",
) -> bool:
    """Return True when ``c`` equals ``a @ b`` within float tolerance (Freivalds' check).

    ``rounds`` fresh Gaussian vectors are drawn for this call alone. ``rng`` defaults to a
    fresh OS-seeded generator; pass one only for reproducible tests. ``precision`` is what
    the product was computed in ("f16": inputs were rounded to half precision). A ``c`` of
    the wrong shape, or with NaN or infinity, is wrong. Operands that cannot be multiplied,
    or that are not finite, raise :class:`compute.InvalidInput`.
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise InvalidInput(f"rounds must be a positive integer, got {rounds!r}")
    check_precision(precision)
    a, b = check_operands(a, b)
    r = draw_vectors(b.shape[1], rounds, rng)
    br, b_norms2 = _pass(b, r, None)   # one pass over b: b @ r and its row norms
    return check_product(a, b, c, r, b_norms2, precision, br=br)
