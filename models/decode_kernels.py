"""Compiled (numba) non-linear steps of a decode step: RMSNorm, SwiGLU, and RoPE plus attention
against the KV cache for a few new rows of one sequence.

Why: at batch 1 a block's non-linear steps in numpy are ~40 calls of a few microseconds each
on vectors of a few hundred floats (RoPE's strided views, the attention's transposes, mask,
softmax): ~0.3 ms a block, 10 ms of a SmolLM2 token on this project's 2-core machines, paid
by the worker that runs a span and again by the requester that checks it. Here each step is
one call.

The sums run in a fixed order on every machine with IEEE float32 (vectors of
models.quant_simd, no fast-math): a worker and the requester re-running its span get the same
bits, whatever SIMD width their CPUs have. Prefill (more rows than :data:`ROWS`) stays in numpy,
where BLAS makes the long products fast.
"""

from __future__ import annotations

import numba
import numpy as np

from models.quant_simd import LANES, fma, load_f32, scale, splat, store_f32, total, zeros

ROWS = 8
"""A sequence with at most this many new rows takes :func:`attend` (decode, a few drafted
tokens); more rows take numpy's batched products (models.span.run_layers)."""

_jit = numba.njit(cache=True, nogil=True)


def supported(head_dim: int) -> bool:
    """Whether the kernels take heads of this size (whole vectors)."""
    return head_dim % LANES == 0


@_jit
def rms_norm(x, w, eps, out):
    """``out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w``; the mean summed in float64."""
    n, d = x.shape
    if w.shape[0] != d or out.shape != x.shape:
        raise ValueError("rms_norm: operands of mismatched sizes")
    for i in range(n):
        s = 0.0
        for j in range(d):
            v = np.float64(x[i, j])
            s += v * v
        inv = np.float32(1.0 / np.sqrt(s / d + eps))
        for j in range(d):
            out[i, j] = (x[i, j] * inv) * w[j]


@_jit
def swiglu(gate, up, out):
    """``out = silu(gate) * up``, silu(g) = g / (1 + exp(-g)) (-0 for very negative g)."""
    n, f = gate.shape
    if up.shape != gate.shape or out.shape != gate.shape:
        raise ValueError("swiglu: operands of mismatched sizes")
    one = np.float32(1.0)
    for i in range(n):
        for j in range(f):
            g = gate[i, j]
            out[i, j] = (g / (one + np.exp(-g))) * up[i, j]


@_jit
def _rope_row(src, at, cos, sin, t, half, neox, dst):
    """Head ``src[at:at + 2 half]`` rotated by row ``t``'s angles into ``dst`` (as
    models.span.apply_rope: adjacent pairs, or halves apart for ``neox``)."""
    for i in range(half):
        c, s = cos[t, i], sin[t, i]
        if neox:
            a, b = src[at + i], src[at + half + i]
            dst[i] = a * c - b * s
            dst[half + i] = a * s + b * c
        else:
            a, b = src[at + 2 * i], src[at + 2 * i + 1]
            dst[2 * i] = a * c - b * s
            dst[2 * i + 1] = a * s + b * c


@_jit
def attend(q, k, v, ck, cv, begin, cos, sin, neox, scl, out):
    """One sequence's new rows ``t`` (positions ``begin + t``): RoPE on ``q`` [n, heads *
    hd] and ``k`` [n, kv_heads * hd], the rotated keys and ``v`` written into this layer's
    cache ``ck``, ``cv`` [kv_heads, capacity, hd], then each query head attends (scores
    scaled by ``scl``, softmax) to the cached positions ``[0, begin + t]`` of its KV head
    (heads grouped as models.span.run_layers groups them); ``out`` [n, heads * hd]."""
    n = q.shape[0]
    nkv, capacity, hd = ck.shape
    nh = q.shape[1] // hd
    # numba does not check bounds: every size is checked here, before anything is written
    if hd % LANES or nh == 0 or nkv == 0 or nh % nkv \
            or q.shape[1] != nh * hd or k.shape != (n, nkv * hd) or v.shape != k.shape \
            or cv.shape != ck.shape or out.shape != q.shape or begin < 0 \
            or begin + n > capacity or cos.shape[0] < n or sin.shape != cos.shape \
            or cos.shape[1] != hd // 2:
        raise ValueError("attend: operands of mismatched sizes")
    group = nh // nkv
    half = hd // 2
    chunks = hd // LANES
    qr = np.empty(hd, np.float32)
    p = np.empty(begin + n, np.float32)
    for t in range(n):
        for g in range(nkv):
            _rope_row(k[t], g * hd, cos, sin, t, half, neox, ck[g, begin + t])
            cv[g, begin + t, :] = v[t, g * hd:(g + 1) * hd]
    for t in range(n):
        end = begin + t + 1
        row = out[t]
        for h in range(nh):
            g = h // group
            _rope_row(q[t], h * hd, cos, sin, t, half, neox, qr)
            top = np.float32(-np.inf)
            for s in range(end):
                key = ck[g, s]
                a = zeros()
                for c in range(chunks):
                    a = fma(load_f32(qr, c * LANES), load_f32(key, c * LANES), a)
                x = total(a) * scl
                p[s] = x
                if x > top:
                    top = x
            tot = np.float32(0.0)
            for s in range(end):
                e = np.exp(p[s] - top)
                p[s] = e
                tot += e
            inv = np.float32(1.0) / tot
            for c in range(chunks):
                a = zeros()
                for s in range(end):
                    a = fma(splat(p[s]), load_f32(cv[g, s], c * LANES), a)
                store_f32(row, h * hd + c * LANES, scale(a, inv))
