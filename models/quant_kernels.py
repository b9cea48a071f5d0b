"""Compiled kernels over GGUF weight blocks (numba; vectors from models.quant_simd).

A weight matrix is ``[out, in]``, one row per output, each row ``in / QK`` blocks as the file
stores them. Every kernel reads a row's blocks once and decodes them in registers, 16 weights
(one vector) at a time: :func:`_pair` gives two vectors at a time. A decoded weight is exactly
the float32 that ``gguf.quants.dequantize`` gives (the same operations in the same order:
``d * q``, ``d * q + m``, ``(d * sc) * q - dmin * m``, each a separate rounding).

**Summation order** (the same bits on every machine with IEEE float32; models.quant_simd).
``y[t, o] = total(A0) + total(A1)``: row ``o``'s weights, taken in 16-weight chunks ``c = 0, 1,
...`` in order, go to the 16-lane accumulator ``A0`` (even ``c``) or ``A1`` (odd ``c``), each
lane with one fused multiply-add per chunk (``A = fma(w, x, A)``); :func:`quant_simd.total`
adds the lanes in a fixed tree. The matrix-vector kernel (one row of ``x``) and the
batched one (a few rows) run the same operations, so a row's result does not depend on which
other rows share its call.

Each block layout gets its own compiled kernels (:func:`kernels`): a branch on the layout per
vector, left in one shared kernel, ran 2-15x slower (LLVM did not unswitch it). Compiled on
first use of a layout and kept in numba's on-disk cache.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numba
import numpy as np
from numba import types
from numba.extending import overload

from models.quant_simd import (
    LANES,
    bits_of,
    fma,
    iand,
    ior,
    ishl,
    ishr,
    isub,
    load_bf16,
    load_f16,
    load_f32,
    load_half,
    load_i8,
    load_u8,
    load_u32,
    scale,
    shift,
    store_f32,
    to_f32,
    total,
    zeros,
)

F = np.float32

# qt codes: the kernels' own small integers (GGMLQuantizationType values are not dense)
F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = range(11)
CODES = {"F32": F32, "F16": F16, "BF16": BF16, "Q4_0": Q4_0, "Q4_1": Q4_1, "Q5_0": Q5_0,
         "Q5_1": Q5_1, "Q8_0": Q8_0, "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K}
"""GGML type name -> kernel code."""
LAYOUT = {F32: (16, 64), F16: (16, 32), BF16: (16, 32), Q4_0: (32, 18), Q4_1: (32, 20),
          Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34), Q4_K: (256, 144), Q5_K: (256, 176),
          Q6_K: (256, 210)}
"""Kernel code -> (weights per block, bytes per block). The float types are read in blocks of
16 weights (one vector), so a row of them must hold a multiple of 16."""

_jit = numba.njit(cache=True, nogil=True)
_inline = numba.njit(cache=True, nogil=True, inline="always")


@_inline
def _scale_min_k4(row, at, s):
    """Sub-block ``s``'s 6-bit scale and min of a Q4_K/Q5_K block (12 bytes from ``at``)."""
    if s < 4:
        return np.int32(row[at + s] & 63), np.int32(row[at + 4 + s] & 63)
    sc = (row[at + 4 + s] & 15) | ((row[at + s - 4] >> 2) & 0x30)
    mn = (row[at + 4 + s] >> 4) | ((row[at + s] >> 2) & 0x30)
    return np.int32(sc), np.int32(mn)


@_inline
def _q4_0(row, base, v):
    q = load_u8(row, base + 2)
    q = iand(q, 15) if v == 0 else ishr(q, 4)
    return scale(to_f32(isub(q, 8)), load_half(row, base))


@_inline
def _q4_1(row, base, v):
    q = load_u8(row, base + 4)
    q = iand(q, 15) if v == 0 else ishr(q, 4)
    return shift(scale(to_f32(q), load_half(row, base)), load_half(row, base + 2))


@_inline
def _q5_0(row, base, v):
    q = load_u8(row, base + 6)
    q = iand(q, 15) if v == 0 else ishr(q, 4)
    q = ior(q, ishl(bits_of(load_u32(row, base + 2), 16 * v), 4))
    return scale(to_f32(isub(q, 16)), load_half(row, base))


@_inline
def _q5_1(row, base, v):
    q = load_u8(row, base + 8)
    q = iand(q, 15) if v == 0 else ishr(q, 4)
    q = ior(q, ishl(bits_of(load_u32(row, base + 4), 16 * v), 4))
    return shift(scale(to_f32(q), load_half(row, base)), load_half(row, base + 2))


@_inline
def _q8_0(row, base, v):
    return scale(to_f32(load_i8(row, base + 2 + 16 * v)), load_half(row, base))


@_inline
def _q4_k(row, p):
    """Sub-block ``s = p % 8`` of block ``p // 8``: its scale and min decoded once."""
    base, s = (p >> 3) * 144, p & 7
    at = base + 16 + 32 * (s >> 1)
    sh = 4 * (s & 1)
    sc, mn = _scale_min_k4(row, base + 4, s)
    d = load_half(row, base) * F(sc)
    dm = -(load_half(row, base + 2) * F(mn))
    return (shift(scale(to_f32(iand(ishr(load_u8(row, at), sh), 15)), d), dm),
            shift(scale(to_f32(iand(ishr(load_u8(row, at + 16), sh), 15)), d), dm))


@_inline
def _q5_k(row, p):
    base, s = (p >> 3) * 176, p & 7
    at = base + 48 + 32 * (s >> 1)
    sh = 4 * (s & 1)
    sc, mn = _scale_min_k4(row, base + 4, s)
    d = load_half(row, base) * F(sc)
    dm = -(load_half(row, base + 2) * F(mn))
    q0 = ior(iand(ishr(load_u8(row, at), sh), 15),
             ishl(iand(ishr(load_u8(row, base + 16), s), 1), 4))
    q1 = ior(iand(ishr(load_u8(row, at + 16), sh), 15),
             ishl(iand(ishr(load_u8(row, base + 32), s), 1), 4))
    return shift(scale(to_f32(q0), d), dm), shift(scale(to_f32(q1), d), dm)


@_inline
def _q6_k(row, p):
    """Group ``g = p % 8`` (32 weights, two 16-weight scales) of block ``p // 8``."""
    base, g = (p >> 3) * 210, p & 7
    lo = base + 64 * (g >> 2) + 32 * (g & 1)
    hi = base + 128 + 32 * (g >> 2)
    sl, sh = 4 * ((g >> 1) & 1), 2 * (g & 3)
    d = load_half(row, base + 208)
    q0 = ior(iand(ishr(load_u8(row, lo), sl), 15), ishl(iand(ishr(load_u8(row, hi), sh), 3), 4))
    q1 = ior(iand(ishr(load_u8(row, lo + 16), sl), 15),
             ishl(iand(ishr(load_u8(row, hi + 16), sh), 3), 4))
    d0 = d * F(np.int8(row[base + 192 + 2 * g]))
    d1 = d * F(np.int8(row[base + 193 + 2 * g]))
    return scale(to_f32(isub(q0, 32)), d0), scale(to_f32(isub(q1, 32)), d1)


@_inline
def _f16(row, base, v):
    return load_f16(row, base)


@_inline
def _bf16(row, base, v):
    return load_bf16(row, base)


@_inline
def _f32(row, base, v):
    return load_f32(row, base)


def _block_pair(vec, bb):
    def pair(qt, row, p):
        return vec(row, p * bb, 0), vec(row, p * bb, 1)
    return pair


def _k_pair(vec):
    def pair(qt, row, p):
        return vec(row, p)
    return pair


def _float_pair(vec, bb):
    def pair(qt, row, p):
        return vec(row, 2 * p * bb, 0), vec(row, (2 * p + 1) * bb, 0)
    return pair


def _float_single(vec, bb):
    def single(qt, row, c):
        return vec(row, c * bb, 0)
    return single


_PAIRS = {F32: _float_pair(_f32, 64), F16: _float_pair(_f16, 32), BF16: _float_pair(_bf16, 32),
          Q4_0: _block_pair(_q4_0, 18), Q4_1: _block_pair(_q4_1, 20),
          Q5_0: _block_pair(_q5_0, 22), Q5_1: _block_pair(_q5_1, 24),
          Q8_0: _block_pair(_q8_0, 34), Q4_K: _k_pair(_q4_k), Q5_K: _k_pair(_q5_k),
          Q6_K: _k_pair(_q6_k)}
_SINGLES = {F16: _float_single(_f16, 32), BF16: _float_single(_bf16, 32)}


def _pair(qt, row, p):
    """Weights ``32 p .. 32 p + 31`` of ``row`` (bytes) in layout ``qt``, as two float32
    vectors (the K-quants decode a sub-block's scales once for both). Typed by numba only
    (overloaded below): ``qt`` must be a compile-time constant, and only its layout's decoder
    is compiled into the caller."""
    raise NotImplementedError("compiled code only")


def _single(qt, row, c):
    """Weights ``16 c .. 16 c + 15`` of a row of a float layout (16-weight blocks)."""
    raise NotImplementedError("compiled code only")


def _literal(qt) -> int:
    if not isinstance(qt, types.IntegerLiteral):
        raise numba.errors.TypingError("the block layout must be a compile-time constant")
    return qt.literal_value


@overload(_pair, inline="always")
def _pair_typed(qt, row, p):
    return _PAIRS[_literal(qt)]


@overload(_single, inline="always")
def _single_typed(qt, row, c):
    return _SINGLES.get(_literal(qt), _float_single(_f32, 64))


@_inline
def _decode_row(qt, row, out):
    chunks = out.shape[0] // LANES
    for p in range(chunks // 2):
        w0, w1 = _pair(qt, row, p)
        store_f32(out, 2 * p * LANES, w0)
        store_f32(out, (2 * p + 1) * LANES, w1)
    if chunks % 2:  # a float row of an odd number of 16-weight blocks
        store_f32(out, (chunks - 1) * LANES, _single(qt, row, chunks - 1))


@functools.cache
def kernels(qt: int) -> SimpleNamespace:
    """The kernels for block layout ``qt``, compiled for it alone: ``qt`` is an integer
    constant of the closure, which picks the decoder at typing time (:func:`_pair`). Only
    integers may sit in the closure: numba keys its on-disk cache by the closure's pickled
    values, and a compiled function pickles differently in every process (a closure over
    the decoders compiled afresh in each)."""

    @_jit
    def dequantize_range(data, r0, r1, out):
        """``out[i] = row r0 + i of data`` for rows ``r0 .. r1 - 1``, decoded."""
        for r in range(r0, r1):
            _decode_row(qt, data[r], out[r - r0])

    @_jit
    def matvec(data, x, y, r0, r1):
        """``y[0, o] = data[o] . x[0]`` for rows ``o`` in ``[r0, r1)`` (module docstring's
        order), each weight decoded in registers as it is read."""
        xs = x[0]
        chunks = xs.shape[0] // LANES
        for o in range(r0, r1):
            row = data[o]
            a0 = zeros()
            a1 = zeros()
            for p in range(chunks // 2):
                w0, w1 = _pair(qt, row, p)
                a0 = fma(w0, load_f32(xs, 2 * p * LANES), a0)
                a1 = fma(w1, load_f32(xs, (2 * p + 1) * LANES), a1)
            if chunks % 2:
                c = chunks - 1
                a0 = fma(_single(qt, row, c), load_f32(xs, c * LANES), a0)
            y[0, o] = total(a0) + total(a1)

    @_jit
    def matmul_few(data, x, y, r0, r1, buf):
        """``y[t, o] = data[o] . x[t]`` for rows ``o`` in ``[r0, r1)`` and every row ``t`` of
        ``x`` (a few): each weight row decoded once into ``buf`` (float32 [in]), then
        :func:`dot_row`."""
        for o in range(r0, r1):
            _decode_row(qt, data[o], buf)
            dot_row(buf, x, y, o)

    @_jit
    def check_sums(data, r, brt, norms2, buf):
        """A Freivalds check's sums from every row ``o`` of ``data``, decoded once into
        ``buf`` (float32 [in]): ``brt[c] += r[o, c] * W[o]`` (float32 [rounds, in]) and
        ``norms2 += W[o]**2`` (float64 [in]). Element-wise over the row, so the compiler
        vectorizes it without reordering any sum (rows are added in order)."""
        n_in = buf.shape[0]
        for o in range(data.shape[0]):
            _decode_row(qt, data[o], buf)
            for c in range(r.shape[1]):
                s = r[o, c]
                acc = brt[c]
                for j in range(n_in):
                    acc[j] += buf[j] * s
            for j in range(n_in):
                v = np.float64(buf[j])
                norms2[j] += v * v

    return SimpleNamespace(dequantize_range=dequantize_range, matvec=matvec,
                           matmul_few=matmul_few, check_sums=check_sums)


@_jit
def dot_row(wr, x, y, o):
    """``y[t, o] = wr . x[t]`` for the decoded weight row ``wr`` (float32 [in], in L1) and
    every row ``t`` of ``x`` (a few), in :func:`kernels`' ``matvec`` order: a row's result has
    the same bits whichever path computed it. Rows of ``x`` go four at a time: eight
    independent accumulators hide the multiply-add latency and each load of ``wr`` serves
    four products."""
    chunks = x.shape[1] // LANES
    n = x.shape[0]
    t = 0
    while t + 4 <= n:
        x0, x1, x2, x3 = x[t], x[t + 1], x[t + 2], x[t + 3]
        a0 = b0 = c0 = d0 = zeros()
        a1 = b1 = c1 = d1 = zeros()
        for c in range(0, chunks - 1, 2):
            w0 = load_f32(wr, c * LANES)
            w1 = load_f32(wr, (c + 1) * LANES)
            a0 = fma(w0, load_f32(x0, c * LANES), a0)
            b0 = fma(w0, load_f32(x1, c * LANES), b0)
            c0 = fma(w0, load_f32(x2, c * LANES), c0)
            d0 = fma(w0, load_f32(x3, c * LANES), d0)
            a1 = fma(w1, load_f32(x0, (c + 1) * LANES), a1)
            b1 = fma(w1, load_f32(x1, (c + 1) * LANES), b1)
            c1 = fma(w1, load_f32(x2, (c + 1) * LANES), c1)
            d1 = fma(w1, load_f32(x3, (c + 1) * LANES), d1)
        if chunks % 2 == 1:
            c = chunks - 1
            w0 = load_f32(wr, c * LANES)
            a0 = fma(w0, load_f32(x0, c * LANES), a0)
            b0 = fma(w0, load_f32(x1, c * LANES), b0)
            c0 = fma(w0, load_f32(x2, c * LANES), c0)
            d0 = fma(w0, load_f32(x3, c * LANES), d0)
        y[t, o] = total(a0) + total(a1)
        y[t + 1, o] = total(b0) + total(b1)
        y[t + 2, o] = total(c0) + total(c1)
        y[t + 3, o] = total(d0) + total(d1)
        t += 4
    while t < n:
        xs = x[t]
        a0 = zeros()
        a1 = zeros()
        for c in range(0, chunks - 1, 2):
            a0 = fma(load_f32(wr, c * LANES), load_f32(xs, c * LANES), a0)
            a1 = fma(load_f32(wr, (c + 1) * LANES), load_f32(xs, (c + 1) * LANES), a1)
        if chunks % 2 == 1:
            c = chunks - 1
            a0 = fma(load_f32(wr, c * LANES), load_f32(xs, c * LANES), a0)
        y[t, o] = total(a0) + total(a1)
        t += 1
