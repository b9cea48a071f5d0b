"""Compiled loops of the MLP trainer (numba): a step's weight fingerprints, each product's
check sides, and its SGD update, each one pass over what it reads.

They ran as several numpy passes, each reading the parameters from memory again (and the
fingerprints' ``rᵀ W`` went to BLAS, whose pool of threads then spun on a core for a while
after every call: CPU that showed up nowhere near the check that caused it). Here each is one
loop on the calling thread, so its thread time is all it costs.

**Squared norms in float32, as lower bounds.** A check's threshold grows with squared row
norms (the weight's, and the claimed output's: compute.verify's rounding model). Summing
those squares in float64 took half of each pass's time: a float32 square and sum fit twice
as many lanes, and the pass then runs at the speed it streams its input (measured on a
1024 x 1024 weight: the fingerprints 1.16 -> 0.50 ms, an output's side 0.54 -> 0.26 ms).
The float32 sum ``s`` of ``n`` squares (any order, fused or not) is within
``γ_n = n u / (1 - n u)`` (``u = 2**-24``) of the exact sum, plus ``2**-150`` per square
that underflows, so :func:`_floor` hands on ``s / (1 + 2 n u) - n 2**-149`` (in float64,
at least 0): never above the exact squared norm. A threshold made of it is never above the
one exact norms give, so every product the float64 sums refused is refused (at most ``2 n u``
stricter: ``1.2e-4`` relative at n = 1024, against KAPPA's >= 3x margin over honest
residuals). A sum that overflows (an element over ``2**64``) or is NaN is redone in float64,
as before.

Compiled on first use and kept in numba's on-disk cache (where it finds a writable one).
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)
_reassoc = numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
_U = 2.0**-24
_TINY = 2.0**-149
_F32_MAX = 3.4028234663852886e38


@_jit
def _floor(s: np.float32, n: int) -> float:  # pragma: no cover - compiled
    """A float32 sum ``s`` of ``n`` squares as a float64 lower bound of the exact sum."""
    return max(0.0, np.float64(s) / (1.0 + 2.0 * n * _U) - n * _TINY)


@_reassoc
def _fingerprints64(w: np.ndarray, rft: np.ndarray, rb: np.ndarray, wr: np.ndarray,
                    rows2: np.ndarray, wtrt: np.ndarray, cols2: np.ndarray
                    ) -> None:  # pragma: no cover - compiled
    """:func:`fingerprints` for any number of rounds, squares in float64 (what a weight
    whose float32 squares overflow falls back to)."""
    n_in, n_out = w.shape
    rounds = rft.shape[0]
    for i in range(n_in):
        s = 0.0
        for j in range(n_out):
            v = np.float64(w[i, j])
            s += v * v
            cols2[j] += v * v
        rows2[i] = s
        for t in range(rounds):
            a = np.float32(0.0)
            for j in range(n_out):
                a += w[i, j] * rft[t, j]
            wr[i, t] = a
            c = rb[i, t]
            for j in range(n_out):
                wtrt[t, j] += w[i, j] * c


@_reassoc
def _fingerprints4(w: np.ndarray, rft: np.ndarray, rb: np.ndarray, back: bool,
                   wr: np.ndarray, rows2: np.ndarray, wtrt: np.ndarray, cols2: np.ndarray
                   ) -> bool:  # pragma: no cover - compiled
    """:func:`fingerprints` for 4 rounds in one pass over ``w``, two rows at a time (each
    load of ``rft`` and of ``wtrt`` serves both), squares in float32 (module docstring):
    ``rows2`` as lower bounds, ``cols2`` as float32 sums (:func:`fingerprints` bounds them).
    False when a row's squares overflow (the caller redoes it all in float64)."""
    n_in, n_out = w.shape
    pairs = n_in - n_in % 2
    for i in range(0, n_in, 2):
        i2 = i + 1 if i < pairs else i     # an odd last row: alone, counted once
        one = i2 == i
        s = np.float32(0.0)
        s2 = np.float32(0.0)
        a0 = a1 = a2 = a3 = np.float32(0.0)
        e0 = e1 = e2 = e3 = np.float32(0.0)
        c0, c1, c2, c3 = rb[i, 0], rb[i, 1], rb[i, 2], rb[i, 3]
        d0, d1, d2, d3 = rb[i2, 0], rb[i2, 1], rb[i2, 2], rb[i2, 3]
        g = np.float32(0.0) if one else np.float32(1.0)
        if back:
            for j in range(n_out):
                v = w[i, j]
                u = w[i2, j] * g
                q = v * v
                p = u * u
                s += q
                s2 += p
                cols2[j] += q + p
                t0, t1, t2, t3 = rft[0, j], rft[1, j], rft[2, j], rft[3, j]
                a0 += v * t0
                a1 += v * t1
                a2 += v * t2
                a3 += v * t3
                e0 += u * t0
                e1 += u * t1
                e2 += u * t2
                e3 += u * t3
                wtrt[0, j] += v * c0 + u * d0
                wtrt[1, j] += v * c1 + u * d1
                wtrt[2, j] += v * c2 + u * d2
                wtrt[3, j] += v * c3 + u * d3
        else:
            for j in range(n_out):
                v = w[i, j]
                u = w[i2, j] * g
                s += v * v
                s2 += u * u
                t0, t1, t2, t3 = rft[0, j], rft[1, j], rft[2, j], rft[3, j]
                a0 += v * t0
                a1 += v * t1
                a2 += v * t2
                a3 += v * t3
                e0 += u * t0
                e1 += u * t1
                e2 += u * t2
                e3 += u * t3
        if not (s <= _F32_MAX and s2 <= _F32_MAX):
            return False
        rows2[i] = _floor(s, n_out)
        wr[i, 0], wr[i, 1], wr[i, 2], wr[i, 3] = a0, a1, a2, a3
        if not one:
            rows2[i2] = _floor(s2, n_out)
            wr[i2, 0], wr[i2, 1], wr[i2, 2], wr[i2, 3] = e0, e1, e2, e3
    return True


def fingerprints(w: np.ndarray, rf: np.ndarray, rb: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(w @ rf, w's row norms², wᵀ @ rb, w's column norms²)`` from one read of ``w``
    (``rb`` None: the last two are None). Products in float32 (row sums in the compiler's
    lane order, as compute.verify's pass; column sums in row order); norms in float64,
    never above the exact ones (module docstring; squares of any finite float32 stay
    finite)."""
    w = np.ascontiguousarray(w, np.float32)
    n_in, n_out = w.shape
    rounds = rf.shape[1]
    back = rb is not None
    rb_ = np.ascontiguousarray(rb if back else np.zeros((n_in, rounds), np.float32),
                               np.float32)
    rft = np.ascontiguousarray(rf.T, np.float32)
    wr = np.empty((n_in, rounds), np.float32)
    rows2 = np.empty(n_in)
    wtrt = np.zeros((rounds, n_out), np.float32)
    cols2: np.ndarray = np.zeros(n_out, np.float32)
    fast = rounds == 4 and _fingerprints4(w, rft, rb_, back, wr, rows2, wtrt, cols2)
    if fast and back and not np.all(cols2 <= _F32_MAX):
        fast = False
    if not fast:
        wtrt[...] = 0
        cols2 = np.zeros(n_out)
        _fingerprints64(w, rft, rb_, wr, rows2, wtrt, cols2)
    elif back:
        cols2 = np.maximum(0.0, cols2.astype(np.float64) / (1.0 + 2.0 * n_in * _U)
                           - n_in * _TINY)
    if not back:
        return wr, rows2, None, None
    return wr, rows2, np.ascontiguousarray(wtrt.T), cols2


@_reassoc
def _out_side(c: np.ndarray, rt: np.ndarray, cr: np.ndarray, c2: np.ndarray
              ) -> None:  # pragma: no cover - compiled
    """The output's side of a check: ``cr = c @ rtᵀ`` (float32 lane sums, as
    compute.verify's pass) and the squared row norms ``c2`` (float32 squares as float64
    lower bounds, a row whose squares overflow or are NaN summed in float64), one pass over
    ``c``, two rows at a time for 4 rounds."""
    m, n = c.shape
    rounds = rt.shape[0]
    pairs = m - m % 2 if rounds == 4 else 0
    for i in range(0, pairs, 2):
        s = np.float32(0.0)
        s2 = np.float32(0.0)
        a0 = a1 = a2 = a3 = np.float32(0.0)
        e0 = e1 = e2 = e3 = np.float32(0.0)
        for j in range(n):
            v = c[i, j]
            u = c[i + 1, j]
            s += v * v
            s2 += u * u
            t0, t1, t2, t3 = rt[0, j], rt[1, j], rt[2, j], rt[3, j]
            a0 += v * t0
            a1 += v * t1
            a2 += v * t2
            a3 += v * t3
            e0 += u * t0
            e1 += u * t1
            e2 += u * t2
            e3 += u * t3
        cr[i, 0], cr[i, 1], cr[i, 2], cr[i, 3] = a0, a1, a2, a3
        cr[i + 1, 0], cr[i + 1, 1], cr[i + 1, 2], cr[i + 1, 3] = e0, e1, e2, e3
        c2[i] = _floor(s, n) if s <= _F32_MAX else _squares64(c, i)
        c2[i + 1] = _floor(s2, n) if s2 <= _F32_MAX else _squares64(c, i + 1)
    for i in range(pairs, m):
        s = np.float32(0.0)
        for j in range(n):
            s += c[i, j] * c[i, j]
        c2[i] = _floor(s, n) if s <= _F32_MAX else _squares64(c, i)
        for t in range(rounds):
            a = np.float32(0.0)
            for j in range(n):
                a += c[i, j] * rt[t, j]
            cr[i, t] = a


@_reassoc
def _squares64(c: np.ndarray, i: int) -> float:  # pragma: no cover - compiled
    s = 0.0
    for j in range(c.shape[1]):
        v = np.float64(c[i, j])
        s += v * v
    return s


@_reassoc
def _in_side(a: np.ndarray, brt: np.ndarray, bn2: np.ndarray, z: np.ndarray, q: np.ndarray
             ) -> None:  # pragma: no cover - compiled
    """The input's side of a check of ``c = a @ b``: ``z = a @ brtᵀ`` (``brt = (b @ r)ᵀ``;
    float32 lane sums) and ``q = (a * a) @ bn2`` (float64; ``bn2``: ``b``'s squared row
    norms)."""
    m, k = a.shape
    for i in range(m):
        s = 0.0
        for j in range(k):
            v = np.float64(a[i, j])
            s += v * v * bn2[j]
        q[i] = s
        for t in range(brt.shape[0]):
            acc = np.float32(0.0)
            for j in range(k):
                acc += a[i, j] * brt[t, j]
            z[i, t] = acc


@_reassoc
def _in_side_t(a: np.ndarray, br: np.ndarray, bn2: np.ndarray, zt: np.ndarray, q: np.ndarray
               ) -> None:  # pragma: no cover - compiled
    """:func:`_in_side` of ``c = aᵀ @ b`` from ``a`` as it is (no transposed copy):
    ``zt = (aᵀ @ br)ᵀ`` (float32, summed in row order) and ``q = (aᵀ * aᵀ) @ bn2``."""
    rows, k = a.shape
    for s in range(rows):
        w = bn2[s]
        for i in range(k):
            v = np.float64(a[s, i])
            q[i] += v * v * w
        for t in range(br.shape[1]):
            c = br[s, t]
            for i in range(k):
                zt[t, i] += a[s, i] * c


def product_sides(a: np.ndarray, brt: np.ndarray, bn2: np.ndarray, c: np.ndarray,
                  rt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Both sides of Freivalds' check of ``c = a @ b`` (``compute.verify.judge``'s ``z, q,
    cr, c_norms2``) from ``b``'s fingerprints: ``brt = (b @ r)ᵀ`` and ``bn2``, its squared
    row norms; ``rt = rᵀ``. All float32 C-contiguous but ``bn2`` (float64)."""
    rounds = rt.shape[0]
    z = np.empty((a.shape[0], rounds), np.float32)
    q = np.empty(a.shape[0])
    cr = np.empty((c.shape[0], rounds), np.float32)
    c2 = np.empty(c.shape[0])
    _in_side(a, brt, bn2, z, q)
    _out_side(c, rt, cr, c2)
    return z, q, cr, c2


def gradient_sides(a: np.ndarray, dz: np.ndarray, rt: np.ndarray, c: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`product_sides` of a weight's gradient ``c = aᵀ @ dz`` (``b`` is ``dz``, the
    block's own: its side is made here)."""
    rounds, k = rt.shape[0], a.shape[1]
    br = np.empty((dz.shape[0], rounds), np.float32)
    bn2 = np.empty(dz.shape[0])
    _in_side(dz, rt, np.ones(dz.shape[1]), br, bn2)
    zt = np.zeros((rounds, k), np.float32)
    q = np.zeros(k)
    _in_side_t(a, br, bn2, zt, q)
    cr = np.empty((c.shape[0], rounds), np.float32)
    c2 = np.empty(c.shape[0])
    _out_side(c, rt, cr, c2)
    return np.ascontiguousarray(zt.T), q, cr, c2


@_jit
def _sgd(grads: tuple, samples: float, momentum: np.float32, lr: np.float32,
         velocity: np.ndarray, params: np.ndarray) -> None:  # pragma: no cover - compiled
    """Per element: the blocks' gradients added in order in float64, over ``samples``,
    rounded to float32, then ``v = v * momentum + g`` and ``p -= lr * v``, each
    operation rounded to float32 as numpy's in-place steps round them (no fused
    multiply-add: the same bits as the numpy passes this replaced)."""
    for e in range(params.shape[0]):
        s = 0.0
        for g in grads:
            s += np.float64(g[e])
        v = velocity[e] * momentum
        v = v + np.float32(s / samples)
        velocity[e] = v
        params[e] = params[e] - lr * v


def sgd_step(grads: list[np.ndarray], samples: int, momentum: float, lr: float,
             velocity: np.ndarray, params: np.ndarray) -> None:
    """One SGD-with-momentum step on ``params`` (in place, float32, 1-D) from the blocks'
    summed gradients ``grads`` (each laid out as ``params``), in one pass."""
    flat = tuple(np.ascontiguousarray(g, np.float32).reshape(-1) for g in grads)
    if not flat or any(g.shape != params.shape for g in flat) \
            or velocity.shape != params.shape or params.dtype != np.float32 \
            or velocity.dtype != np.float32 or params.ndim != 1:
        raise ValueError("sgd_step: each gradient, the velocity and the parameters must be "
                         f"float32 [{params.size}]")
    _sgd(flat, float(samples), np.float32(momentum), np.float32(lr), velocity, params)
