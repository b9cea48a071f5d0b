"""MiniLM's non-matmul steps as single-threaded numba kernels (attention, LayerNorm, GELU).

Each kernel fuses what numpy does in several passes over freshly allocated temporaries (bias
and residual adds, padding to the longest sentence, masks, transposes, softmax reductions)
into one pass per row or per head that stays in L1/L2. No ``parallel=True``: these run in
worker processes capped at one thread, beside others on small machines.

Numba's LLVM pipeline only runs the *loop* vectorizer (SLP is off), and a loop with a constant
trip count (the 32 dimensions of a head) is unrolled before it gets there. So every hot loop
here runs over a long runtime dimension (tokens, or the 384/1536 features) with the short
constant one unrolled inside it; attention therefore works on transposed [dim, query] tiles.

``fastmath`` lets LLVM reorder LayerNorm's sums (in a fixed order of its own); no kernel whose
values a judge recomputes contracts multiply-adds (FMA or not, the same bits): results differ
from numpy's by float32 rounding only. Inputs are finite; no kernel relies on inf/NaN (the
softmax subtracts each column's max, and exp clamps its argument at -87). Outputs are allocated
by numpy, which asks for huge pages (numba's allocator does not: page faults on a fresh 50 MB
output made bias_gelu 3x slower).
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

HEADS = 12
HEAD = 32
DIM = HEADS * HEAD
EPS = 1e-12
F = np.float32
_SCALE = F(1.0 / math.sqrt(HEAD))
_BLOCK = 16  # keys per step of the probabilities x values product
_LANES = 16  # float32 lanes of an AVX-512 vector

# Attention's loops are all element-wise over queries, so they vectorise without reordering
# sums: its kernels skip fastmath's reassociation, which keeps each sum in its written order and
# exp's two-step range reduction exact (2.9e-7 relative error with it, 8e-8 without), and its
# contraction: a CPU with FMA would fuse the multiply-adds and one without would not, and a
# requester's crafted input (queries near 0, values that cancel) turned that last-bit
# difference into 1e-4 of attention's output, enough for the judge, which allows a product no
# slack on its input, to "prove" an honest worker on the other kind of CPU a liar (issue 45).
# So attention is the same bits on every machine, and GELU too (its 1 + erf cancels near
# x = -4). LayerNorm's row sums do need reordering to vectorise (it sums in a fixed order of
# its own).
_NO_REASSOC = {"nnan", "ninf", "nsz", "arcp", "afn"}
_EXACT_GELU = {"nnan", "ninf", "nsz"}
"""GELU's 1 + erf cancels near x = -4: no FMA and no reciprocal in place of its division."""
_kernel = functools.partial(numba.njit, cache=True, error_model="numpy")


def attention(qkv: np.ndarray, lengths: np.ndarray, bias: np.ndarray | None = None,
              tap: Tap | None = None) -> np.ndarray:
    """qkv: float32 [tokens, 1152] packed (every sentence's tokens one after another;
    columns: query 0:384, key 384:768, value 768:1152, 12 heads of 32 each), to which
    ``bias`` [1152] is added here; lengths: int64 [n] tokens per sentence. Returns float32
    C-contiguous [tokens, 384]: each sentence's tokens attend over that sentence's own tokens
    only (no padding), softmax(q k^T / sqrt(32)) v per head, heads side by side (head h in
    columns h*32:(h+1)*32). ``tap`` (:class:`Tap`) projects ``qkv`` itself, a sentence's rows
    at a time as they are read.

    Packed rather than padded: no work or memory for padding, no mask, and one head of one
    sentence at a time, whose scores ([n, n] floats) stay in cache. The bias goes into a
    sentence's rows as they are copied to a buffer that stays in cache (a pass of its own
    wrote a fresh [tokens, 1152] array)."""
    qkv = np.ascontiguousarray(qkv, np.float32)
    lengths = np.asarray(lengths, np.int64)
    if qkv.ndim != 2 or qkv.shape[1] != 3 * DIM:
        raise ValueError(f"qkv is [tokens, {3 * DIM}], got {qkv.shape}")
    if lengths.ndim != 1 or (lengths < 0).any() or int(lengths.sum()) != qkv.shape[0]:
        raise ValueError(f"lengths must be >= 0 and sum to {qkv.shape[0]} tokens")
    bias = np.zeros(3 * DIM, np.float32) if bias is None else _vector(bias, 3 * DIM)
    if qkv.shape[0] == 0:
        return np.zeros((0, DIM), np.float32)
    out = np.empty((qkv.shape[0], DIM), np.float32)
    _attention(qkv, lengths, bias, out, *_tap_args(tap, *qkv.shape))
    return out


class Tap:
    """One side of a Freivalds check (compute.verify.judge) taken by a step over rows it
    reads or writes anyway, while each block of rows is in cache: ``proj = rows @ right``
    (float32 sums, as compute.verify's pass takes them: the same up to float32 rounding) and
    ``sq = (rows * rows) @ weights`` (float32 sums: a row of MiniLM is bounded far below
    float32's range; a NaN, an infinity or an overflow reaches the sum and fails the check).
    """

    def __init__(self, right: np.ndarray, weights: np.ndarray | None, tokens: int) -> None:
        self.right_t = np.ascontiguousarray(np.asarray(right, np.float32).T)  # [rounds, width]
        width = self.right_t.shape[1]
        self.weights = (_ones(width) if weights is None
                        else np.ascontiguousarray(weights, np.float32))
        self.proj = np.empty((tokens, self.right_t.shape[0]), np.float32)
        self.sq = np.empty(tokens, np.float32)

    def args(self, rows: int, width: int) -> tuple[np.ndarray, ...]:
        if self.right_t.shape[1] != width or self.proj.shape[0] != rows:
            raise ValueError(f"a tap of [{self.proj.shape[0]}, {self.right_t.shape[1]}] on "
                             f"rows [{rows}, {width}]")
        return self.right_t, self.weights, self.proj, self.sq

    def take(self, rows: np.ndarray) -> Tap:
        """Both sums over all of ``rows`` at once (where no step reads or writes them)."""
        rows = np.ascontiguousarray(rows, np.float32)
        _project(rows, *self.args(*rows.shape), 0, rows.shape[0])
        return self


@functools.lru_cache(maxsize=8)
def _ones(width: int) -> np.ndarray:
    return np.ones(width, np.float32)


_NO_TAP = (np.zeros((0, 0), np.float32), np.zeros(0, np.float32),
           np.zeros((0, 0), np.float32), np.zeros(0, np.float32))


def _tap_args(tap: Tap | None, rows: int, width: int) -> tuple[np.ndarray, ...]:
    return _NO_TAP if tap is None else tap.args(rows, width)


def residual_layer_norm(y: np.ndarray, bias: np.ndarray, residual: np.ndarray,
                        gamma: np.ndarray, beta: np.ndarray, taps: tuple[Tap | None,
                        Tap | None] = (None, None)) -> np.ndarray:
    """LayerNorm(y + bias + residual) * gamma + beta over the last axis, eps 1e-12, float32
    [tokens, 384]. One pass per row (three over its 384 values, in L1) instead of numpy's
    eight passes over [tokens, 384] temporaries. ``taps``: (one of ``y``'s, one of the
    output's), each filled as the rows go by (:class:`Tap`)."""
    y, residual = np.ascontiguousarray(y, np.float32), np.ascontiguousarray(residual, np.float32)
    if y.ndim != 2 or residual.shape != y.shape:
        raise ValueError(f"y and residual are [tokens, dim], got {y.shape} and {residual.shape}")
    bias, gamma, beta = (_vector(v, y.shape[1]) for v in (bias, gamma, beta))
    out = np.empty(y.shape, np.float32)
    _tapped_layer_norm(y, bias, residual, gamma, beta, out,
                       *_tap_args(taps[0], *y.shape), *_tap_args(taps[1], *y.shape))
    return out


def bias_gelu(h: np.ndarray, bias: np.ndarray,
              taps: tuple[Tap | None, Tap | None] = (None, None)) -> np.ndarray:
    """exact-erf GELU of (h + bias), float32 [tokens, 1536]: the erf rational approximation of
    models/minilm.py's ``_gelu`` (Eigen's and XLA's, abs error ~1e-7, coefficients copied so
    the results agree), fused with the bias add in one pass (numpy: two, and a temporary).
    ``taps`` as in :func:`residual_layer_norm`."""
    h = np.ascontiguousarray(h, np.float32)
    if h.ndim != 2:
        raise ValueError(f"h is [tokens, dim], got {h.shape}")
    out = np.empty(h.shape, np.float32)
    bias = _vector(bias, h.shape[1])
    _tapped_gelu(h, bias, out, *_tap_args(taps[0], *h.shape), *_tap_args(taps[1], *h.shape))
    return out


def _vector(v: np.ndarray, dim: int) -> np.ndarray:
    v = np.ascontiguousarray(v, np.float32)
    if v.shape != (dim,):
        raise ValueError(f"expected a [{dim}] vector, got {v.shape}")
    return v


@intrinsic
def _bits_as_float32(typingctx, bits):
    """Reinterpret an int32's bits as a float32 (vectorisable, unlike a call to ldexp)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@_kernel(fastmath=_NO_REASSOC, inline="always")
def _exp(x):
    """float32 exp for x <= 0 (Cephes' expf: ~1 ulp): LLVM vectorises it, where it calls libm's
    expf once per element. Clamped at -87 (exp ~1.6e-38; numpy's would be smaller still)."""
    x = max(x, F(-87.0))
    k = np.floor(x * F(1.4426950408889634) + F(0.5))
    r = x - k * F(0.693359375) - k * F(-2.12194440e-4)
    p = F(1.9875691500e-4)
    p = p * r + F(1.3981999507e-3)
    p = p * r + F(8.3334519073e-3)
    p = p * r + F(4.1665795894e-2)
    p = p * r + F(1.6666665459e-1)
    p = p * r + F(5.0000001201e-1)
    p = p * r * r + r + F(1.0)
    return p * _bits_as_float32((np.int32(k) + np.int32(127)) << np.int32(23))


@_kernel(fastmath=_NO_REASSOC)
def _attention(qkv, lengths, bias, out, tr, tw, tp, ts):
    wide = _padded(lengths.max())
    rows = np.empty((wide, 3 * DIM), np.float32)      # one sentence's qkv + bias
    qt = np.zeros((HEAD, wide), np.float32)           # scaled queries, transposed
    ot = np.empty((HEAD, wide), np.float32)           # output, transposed
    st = np.empty((wide, wide), np.float32)           # scores, then probabilities: [key, query]
    top = np.empty(wide, np.float32)
    total = np.empty(wide, np.float32)
    start = 0
    for n in lengths:
        for r in range(n):
            for c in range(3 * DIM):
                rows[r, c] = qkv[start + r, c] + bias[c]
        if tp.shape[0]:
            _project(qkv, tr, tw, tp, ts, start, start + n)
        qt[:, n:_padded(n)] = 0.0                     # padding queries: finite, never written out
        for h in range(HEADS):
            _attend(rows, start, n, h, qt, st, ot, top, total, out)
        start += n


@_kernel(fastmath=_NO_REASSOC)
def _padded(n):
    """n rounded up to whole 16-float vectors: loops over queries then have no scalar tail."""
    return (n + _LANES - 1) // _LANES * _LANES


@_kernel(fastmath=_NO_REASSOC, inline="always")
def _dot8(s, a0, a1, a2, a3, a4, a5, a6, a7, x0, x1, x2, x3, x4, x5, x6, x7, i):
    """s + a0 x0[i] + ... + a7 x7[i], added in that order."""
    s += a0 * x0[i]
    s += a1 * x1[i]
    s += a2 * x2[i]
    s += a3 * x3[i]
    s += a4 * x4[i]
    s += a5 * x5[i]
    s += a6 * x6[i]
    s += a7 * x7[i]
    return s


@_kernel(fastmath=_NO_REASSOC)
def _attend(rows, start, n, h, qt, st, ot, top, total, out):
    """Head h of the sentence whose n rows (bias added) are ``rows[:n]``, written to rows
    start:start+n of ``out``. Every inner loop runs over queries i (m of them: n plus
    padding), 8 of the head's dimensions or of a block's keys unrolled in it: their values
    are taken into locals first. Read from ``rows`` inside the loop, LLVM reloaded them on
    every iteration (it cannot tell that the stores to ``st``/``ot`` leave ``rows`` alone);
    as locals they stay in registers, 8 at a time since AVX2 has 16. The sums keep their
    order (the same bits), and 128-token sentences run 1.5x faster."""
    m = _padded(n)
    q0, k0, v0 = h * HEAD, DIM + h * HEAD, 2 * DIM + h * HEAD
    for i in range(n):
        query = rows[i, q0:q0 + HEAD]
        for d in range(HEAD):
            qt[d, i] = query[d] * _SCALE
    top[:m] = F(-3.0e38)
    for j in range(n):                                 # st[j, i] = k_j . q_i, and its max
        key = rows[j, k0:k0 + HEAD]
        row = st[j]
        for c in range(0, HEAD, 8):                    # 8 dimensions at a time (_attend doc)
            a0, a1, a2, a3 = key[c], key[c + 1], key[c + 2], key[c + 3]
            a4, a5, a6, a7 = key[c + 4], key[c + 5], key[c + 6], key[c + 7]
            q_0, q_1, q_2, q_3 = qt[c], qt[c + 1], qt[c + 2], qt[c + 3]
            q_4, q_5, q_6, q_7 = qt[c + 4], qt[c + 5], qt[c + 6], qt[c + 7]
            if c == 0:
                for i in range(m):
                    row[i] = _dot8(F(0.0), a0, a1, a2, a3, a4, a5, a6, a7,
                                   q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7, i)
            elif c < HEAD - 8:
                for i in range(m):
                    row[i] = _dot8(row[i], a0, a1, a2, a3, a4, a5, a6, a7,
                                   q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7, i)
            else:
                for i in range(m):
                    t = _dot8(row[i], a0, a1, a2, a3, a4, a5, a6, a7,
                              q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7, i)
                    row[i] = t
                    top[i] = max(top[i], t)
    total[:m] = 0.0                                    # softmax over keys j, per query i
    for j in range(n):
        row = st[j]
        for i in range(m):
            e = _exp(row[i] - top[i])
            row[i] = e
            total[i] += e
    ot[:, :m] = 0.0                                    # ot[d, i] = sum_j v_j[d] p[j, i]
    j = 0
    while j < n:
        b = min(_BLOCK, n - j)
        values = rows[j:j + b, v0:v0 + HEAD]
        probs = st[j:j + b]
        for d in range(HEAD):
            row = ot[d]
            if b == _BLOCK:                            # a block of keys per store, 8 at a time
                for a in range(0, _BLOCK, 8):
                    b0, b1, b2, b3 = values[a, d], values[a + 1, d], values[a + 2, d], \
                        values[a + 3, d]
                    b4, b5, b6, b7 = values[a + 4, d], values[a + 5, d], values[a + 6, d], \
                        values[a + 7, d]
                    p0, p1, p2, p3 = probs[a], probs[a + 1], probs[a + 2], probs[a + 3]
                    p4, p5, p6, p7 = probs[a + 4], probs[a + 5], probs[a + 6], probs[a + 7]
                    for i in range(m):
                        row[i] = _dot8(row[i], b0, b1, b2, b3, b4, b5, b6, b7,
                                       p0, p1, p2, p3, p4, p5, p6, p7, i)
            else:
                for a in range(b):
                    v = values[a, d]
                    p = probs[a]
                    for i in range(m):
                        row[i] += v * p[i]
        j += b
    for i in range(n):
        inv = F(1.0) / total[i]
        dst = out[start + i, q0:q0 + HEAD]
        for d in range(HEAD):
            dst[d] = ot[d, i] * inv


@_kernel
def _residual_layer_norm(y, bias, residual, gamma, beta, out):
    """No fast-math, and each row's sums in one fixed order (:func:`_sum8`): the same bits on
    every machine, whatever its vector width. The judge of evidence recomputes this step;
    had its sums run in another order than the worker's (8 lanes on AVX2, 16 on AVX-512), a
    requester could have made rows that cancel (offset 1e3, spread 1e-3) turn the reordering
    into differences of order 1, and an honest product "proven" wrong (SECURITY.md)."""
    rows, dim = y.shape
    for r in range(rows):
        x = out[r]
        for c in range(dim):
            x[c] = y[r, c] + bias[c] + residual[r, c]
        mean = _sum8(x, False) / F(dim)
        for c in range(dim):
            x[c] = x[c] - mean
        inv = F(1.0) / np.sqrt(_sum8(x, True) / F(dim) + F(EPS))
        for c in range(dim):
            x[c] = x[c] * inv * gamma[c] + beta[c]


@_kernel
def _sum8(x, squares):
    """Sum of x (or of its squares) in float32, in a fixed order: 8 interleaved partial sums
    (element c into sum c % 8, in order), added pairwise ((0+1)+(2+3))+((4+5)+(6+7))."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = F(0.0)
    n = x.shape[0]
    c = 0
    while c + 8 <= n:
        v0, v1, v2, v3 = x[c], x[c + 1], x[c + 2], x[c + 3]
        v4, v5, v6, v7 = x[c + 4], x[c + 5], x[c + 6], x[c + 7]
        if squares:
            v0, v1, v2, v3 = v0 * v0, v1 * v1, v2 * v2, v3 * v3
            v4, v5, v6, v7 = v4 * v4, v5 * v5, v6 * v6, v7 * v7
        s0 += v0
        s1 += v1
        s2 += v2
        s3 += v3
        s4 += v4
        s5 += v5
        s6 += v6
        s7 += v7
        c += 8
    while c < n:
        v = x[c] * x[c] if squares else x[c]
        s0 += v
        c += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@_kernel(fastmath=_EXACT_GELU)
def _bias_gelu(h, bias, out):
    rows, dim = h.shape
    for r in range(rows):
        for c in range(dim):
            out[r, c] = _gelu(h[r, c] + bias[c])


@_kernel(fastmath=_EXACT_GELU, inline="always")
def _gelu(x):
    """0.5 x (1 + erf(x / sqrt 2)); erf as in models/minilm.py's _gelu (clamped at |z| = 4)."""
    z = x * F(0.7071067811865476)
    z = min(max(z, F(-4.0)), F(4.0))
    z2 = z * z
    p = z2 * F(-2.72614225801306e-10) + F(2.77068142495902e-08)
    p = z2 * p + F(-2.10102402082508e-06)
    p = z2 * p + F(-5.69250639462346e-05)
    p = z2 * p + F(-7.34990630326855e-04)
    p = z2 * p + F(-2.95459980854025e-03)
    p = z2 * p + F(-1.60960333262415e-02)
    q = z2 * F(-1.45660718464996e-05) + F(-2.13374055278905e-04)
    q = z2 * q + F(-1.68282697438203e-03)
    q = z2 * q + F(-7.37332916720468e-03)
    q = z2 * q + F(-1.42647390514189e-02)
    return F(0.5) * x * (F(1.0) + z * p / q)


# -- taps: a check's projections of rows a step reads or writes (Tap) ---------------------------

_TAP_ROWS = 8
"""Rows per block of a tapped step: the step reads a block (from memory, its own arithmetic
hiding the wait), then the block's input and output rows are projected from L1/L2 (8 x 1536
floats: 48 KiB each). A pass of its own would stream them from memory again. Untapped calls
take the same compiled path with empty taps: the step's own kernel compiled for whole arrays
and for blocks could vectorise its sums differently, and the requester's values would then
differ from the worker's in the last bit (seen: LayerNorm, in one process of two)."""


@_kernel(fastmath={"reassoc", "contract"})
def _project(x, right_t, weights, proj, sq, r0, r1):
    """A tap's sums over rows r0:r1 of x. Two rows at a time, all four check vectors and the
    squares in one loop: each load of the vectors serves both rows, and the row is loaded once
    (against compute.verify's pass, which reads it twice and squares in float64: 0.12 ms
    against 0.20 for 512 x 1536 floats in L2). No ``nnan``/``ninf``: a NaN or an infinity in
    the rows (a worker's unchecked output) reaches the sums."""
    rounds = right_t.shape[0]
    if rounds != 4:
        for i in range(r0, r1):
            for k in range(rounds):
                a = F(0.0)
                for c in range(x.shape[1]):
                    a += x[i, c] * right_t[k, c]
                proj[i, k] = a
            s = F(0.0)
            for c in range(x.shape[1]):
                s += x[i, c] * x[i, c] * weights[c]
            sq[i] = s
        return
    v0, v1, v2, v3 = right_t[0], right_t[1], right_t[2], right_t[3]
    for i in range(r0, r1, 2):
        i2 = min(i + 1, r1 - 1)  # an odd last row is done twice, harmlessly
        row, row2 = x[i], x[i2]
        a0 = a1 = a2 = a3 = s = F(0.0)
        e0 = e1 = e2 = e3 = t = F(0.0)
        for c in range(x.shape[1]):
            v, u, w = row[c], row2[c], weights[c]
            q0, q1, q2, q3 = v0[c], v1[c], v2[c], v3[c]
            a0 += v * q0
            a1 += v * q1
            a2 += v * q2
            a3 += v * q3
            s += v * v * w
            e0 += u * q0
            e1 += u * q1
            e2 += u * q2
            e3 += u * q3
            t += u * u * w
        proj[i, 0], proj[i, 1], proj[i, 2], proj[i, 3] = a0, a1, a2, a3
        proj[i2, 0], proj[i2, 1], proj[i2, 2], proj[i2, 3] = e0, e1, e2, e3
        sq[i], sq[i2] = s, t


@_kernel
def _tapped_layer_norm(y, bias, residual, gamma, beta, out, yr, yw, yp, ys, xr, xw, xp, xs):
    for b0 in range(0, y.shape[0], _TAP_ROWS):
        b1 = min(b0 + _TAP_ROWS, y.shape[0])
        _residual_layer_norm(y[b0:b1], bias, residual[b0:b1], gamma, beta, out[b0:b1])
        if yp.shape[0]:
            _project(y, yr, yw, yp, ys, b0, b1)
        if xp.shape[0]:
            _project(out, xr, xw, xp, xs, b0, b1)


@_kernel
def _tapped_gelu(h, bias, out, yr, yw, yp, ys, xr, xw, xp, xs):
    for b0 in range(0, h.shape[0], _TAP_ROWS):
        b1 = min(b0 + _TAP_ROWS, h.shape[0])
        _bias_gelu(h[b0:b1], bias, out[b0:b1])
        if yp.shape[0]:
            _project(h, yr, yw, yp, ys, b0, b1)
        if xp.shape[0]:
            _project(out, xr, xw, xp, xs, b0, b1)
