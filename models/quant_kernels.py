"""Compiled kernels over GGUF weight blocks (numba; vectors from models.quant_simd).

A weight matrix is ``[out, in]``, one row per output, each row ``in / QK`` blocks as the file
stores them. Every kernel reads a row's blocks once and decodes them in registers, 16 weights
(one vector) at a time: :data:`_DECODERS` give vector ``v`` of a block. A decoded weight is exactly
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

from models.quant_simd import (
    LANES,
    bits_of,
    fma,
    half,
    iand,
    ior,
    ishl,
    ishr,
    isub,
    load_bf16,
    load_f16,
    load_f32,
    load_i8,
    load_u8,
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
def _u16(row, at):
    return np.uint32(row[at]) | (np.uint32(row[at + 1]) << np.uint32(8))


@_inline
def _u32(row, at):
    return _u16(row, at) | (_u16(row, at + 2) << np.uint32(16))


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
    return scale(to_f32(isub(q, 8)), half(_u16(row, base)))


@_inline
def _q4_1(row, base, v):
    q = load_u8(row, base + 4)
    q = iand(q, 15) if v == 0 else ishr(q, 4)
    return shift(scale(to_f32(q), half(_u16(row, base))), half(_u16(row, base + 2)))


@_inline
def _q5_0(row, base, v):
    q = load_u8(row, base + 6)
    q = iand(q, 15) if v == 0 else ishr(q, 4)
    q = ior(q, ishl(bits_of(_u32(row, base + 2), 16 * v), 4))
    return scale(to_f32(isub(q, 16)), half(_u16(row, base)))


@_inline
def _q5_1(row, base, v):
    q = load_u8(row, base + 8)
    q = iand(q, 15) if v == 0 else ishr(q, 4)
    q = ior(q, ishl(bits_of(_u32(row, base + 4), 16 * v), 4))
    return shift(scale(to_f32(q), half(_u16(row, base))), half(_u16(row, base + 2)))


@_inline
def _q8_0(row, base, v):
    return scale(to_f32(load_i8(row, base + 2 + 16 * v)), half(_u16(row, base)))


@_inline
def _q4_k(row, base, v):
    s = v // 2
    q = load_u8(row, base + 16 + 32 * (s // 2) + 16 * (v % 2))
    q = iand(q, 15) if s % 2 == 0 else ishr(q, 4)
    sc, mn = _scale_min_k4(row, base + 4, s)
    d = half(_u16(row, base)) * F(sc)
    dm = half(_u16(row, base + 2)) * F(mn)
    return shift(scale(to_f32(q), d), -dm)


@_inline
def _q5_k(row, base, v):
    s = v // 2
    q = load_u8(row, base + 48 + 32 * (s // 2) + 16 * (v % 2))
    q = iand(q, 15) if s % 2 == 0 else ishr(q, 4)
    hb = load_u8(row, base + 16 + 16 * (v % 2))
    q = ior(q, ishl(iand(ishr(hb, s), 1), 4))
    sc, mn = _scale_min_k4(row, base + 4, s)
    d = half(_u16(row, base)) * F(sc)
    dm = half(_u16(row, base + 2)) * F(mn)
    return shift(scale(to_f32(q), d), -dm)


@_inline
def _q6_k(row, base, v):
    g, h = v // 2, v % 2
    ql = load_u8(row, base + 64 * (g // 4) + 32 * (g % 2) + 16 * h)
    ql = iand(ishr(ql, 4 * ((g // 2) % 2)), 15)
    qh = load_u8(row, base + 128 + 32 * (g // 4) + 16 * h)
    qh = iand(ishr(qh, 2 * (g % 4)), 3)
    q = isub(ior(ql, ishl(qh, 4)), 32)
    sc = np.int8(row[base + 192 + v])
    return scale(to_f32(q), half(_u16(row, base + 208)) * F(sc))


@_inline
def _f16(row, base, v):
    return load_f16(row, base)


@_inline
def _bf16(row, base, v):
    return load_bf16(row, base)


@_inline
def _f32(row, base, v):
    return load_f32(row, base)


_DECODERS = {F32: _f32, F16: _f16, BF16: _bf16, Q4_0: _q4_0, Q4_1: _q4_1, Q5_0: _q5_0,
             Q5_1: _q5_1, Q8_0: _q8_0, Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k}
"""Kernel code -> vector ``v`` of a block: weights ``16 v .. 16 v + 15`` of the block at byte
``base`` of ``row``, as float32."""


@functools.cache
def kernels(qt: int) -> SimpleNamespace:
    """The kernels for block layout ``qt``, compiled for it alone: its decoder and block sizes
    are constants of the closure (numba keys its on-disk cache by the closure's values too)."""
    vec = _DECODERS[qt]
    per_block, bb = LAYOUT[qt]
    nv = per_block // LANES
    lg = nv.bit_length() - 1  # log2(nv): 1, 2 or 16 vectors per block

    @_inline
    def decode_row(row, out):
        for b in range(out.shape[0] // per_block):
            for v in range(nv):
                store_f32(out, (b * nv + v) * LANES, vec(row, b * bb, v))

    @_jit
    def dequantize_range(data, r0, r1, out):
        """``out[i] = row r0 + i of data`` for rows ``r0 .. r1 - 1``, decoded."""
        for r in range(r0, r1):
            decode_row(data[r], out[r - r0])

    @_jit
    def matvec(data, x, y, r0, r1):
        """``y[0, o] = data[o] . x[0]`` for rows ``o`` in ``[r0, r1)`` (module docstring's order),
        each weight decoded in registers as it is read."""
        xs = x[0]
        chunks = xs.shape[0] // LANES
        for o in range(r0, r1):
            row = data[o]
            a0 = zeros()
            a1 = zeros()
            for c in range(0, chunks - 1, 2):
                w0 = vec(row, (c >> lg) * bb, c & (nv - 1))
                w1 = vec(row, ((c + 1) >> lg) * bb, (c + 1) & (nv - 1))
                a0 = fma(w0, load_f32(xs, c * LANES), a0)
                a1 = fma(w1, load_f32(xs, (c + 1) * LANES), a1)
            if chunks % 2 == 1:
                c = chunks - 1
                a0 = fma(vec(row, (c >> lg) * bb, c & (nv - 1)), load_f32(xs, c * LANES), a0)
            y[0, o] = total(a0) + total(a1)

    return SimpleNamespace(dequantize_range=dequantize_range, matvec=matvec)


@_jit
def dot_rows(w, x, y, o0):
    """``y[t, o0 + i] = w[i] . x[t]`` for every row ``i`` of the decoded weights ``w`` (float32
    [rows, in], a tile in cache) and every row ``t`` of ``x`` (a few), in :func:`kernels`'
    ``matvec`` order: a row's result has the same bits whichever path computed it."""
    chunks = x.shape[1] // LANES
    for i in range(w.shape[0]):
        wr = w[i]
        for t in range(x.shape[0]):
            xs = x[t]
            a0 = zeros()
            a1 = zeros()
            for c in range(0, chunks - 1, 2):
                a0 = fma(load_f32(wr, c * LANES), load_f32(xs, c * LANES), a0)
                a1 = fma(load_f32(wr, (c + 1) * LANES), load_f32(xs, (c + 1) * LANES), a1)
            if chunks % 2 == 1:
                c = chunks - 1
                a0 = fma(load_f32(wr, c * LANES), load_f32(xs, c * LANES), a0)
            y[t, o0 + i] = total(a0) + total(a1)
