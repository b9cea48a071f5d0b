"""models.decode_kernels against the numpy steps they replace at decode (models.span's prefill
path): RMSNorm, SwiGLU, and RoPE plus grouped-query attention over a KV cache."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from models import decode_kernels as dk
from models.span import apply_rope, rope_tables


def _numpy_attend(c, q, k, v, ck, cv, begin, cos, sin):
    """models.span.run_layers' numpy path for one sequence of ``n`` new rows."""
    n, hd, nh, nkv = q.shape[0], c.head_dim, c.n_heads, c.n_kv_heads
    group, end = nh // nkv, begin + q.shape[0]
    qr = apply_rope(q.reshape(n, nh, hd), cos, sin, c.rope_style)
    kr = apply_rope(k.reshape(n, nkv, hd), cos, sin, c.rope_style)
    ck[:, begin:end] = kr.transpose(1, 0, 2)
    cv[:, begin:end] = v.reshape(n, nkv, hd).transpose(1, 0, 2)
    mask = np.where(np.arange(end)[None, :] <= np.arange(begin, end)[:, None], 0.0, -np.inf)
    qg = qr.transpose(1, 0, 2).reshape(nkv, group * n, hd)
    scores = (qg @ ck[:, :end].transpose(0, 2, 1)).reshape(nkv, group, n, end) / np.sqrt(hd)
    scores = scores + mask
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = (p.reshape(nkv, group * n, end) @ cv[:, :end]).reshape(nh, n, hd)
    return out.transpose(1, 0, 2).reshape(n, nh * hd)


@pytest.mark.parametrize("style", ["norm", "neox"])
@pytest.mark.parametrize("n, begin", [(1, 0), (1, 37), (3, 20), (8, 5)])
def test_attend_equals_the_numpy_steps(style, n, begin):
    c = SimpleNamespace(head_dim=32, n_heads=6, n_kv_heads=2, rope_base=10000.0, rope_scale=1.0,
                        rope_freqs=None, rope_style=style)
    rng = np.random.default_rng(n * 100 + begin)
    hd, nh, nkv = 32, 6, 2
    q = rng.standard_normal((n, nh * hd)).astype(np.float32)
    k = rng.standard_normal((n, nkv * hd)).astype(np.float32)
    v = rng.standard_normal((n, nkv * hd)).astype(np.float32)
    past = rng.standard_normal((nkv, 64, hd)).astype(np.float32)
    cos, sin = rope_tables(c, np.arange(begin, begin + n))
    ck, cv = past.copy(), past[::-1].copy()
    want_k, want_v = ck.copy(), cv.copy()
    want = _numpy_attend(c, q, k, v, want_k, want_v, begin, cos, sin)
    out = np.full((n, nh * hd), np.nan, np.float32)
    dk.attend(q, k, v, ck, cv, begin, cos, sin, style == "neox", np.float32(hd ** -0.5), out)
    np.testing.assert_allclose(ck, want_k, rtol=1e-6, atol=1e-6)  # keys rotated and stored
    np.testing.assert_array_equal(cv, want_v)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    if not begin:  # position 0 turns nothing: any pairing gives the same
        return
    # the other RoPE pairing gives other values: the style is not ignored
    other = np.empty_like(out)
    dk.attend(q, k, v, past.copy(), past[::-1].copy(), begin, cos, sin, style != "neox",
              np.float32(hd ** -0.5), other)
    assert not np.allclose(other, want, atol=1e-3)


def test_rms_norm_and_swiglu_equal_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 96)).astype(np.float32) * 3
    w = rng.standard_normal(96).astype(np.float32)
    out = np.empty_like(x)
    dk.rms_norm(x, w, 1e-5, out)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)
    gate = rng.standard_normal((2, 160)).astype(np.float32) * 4
    gate[0, :3] = [-200.0, -1e30, 90.0]  # exp overflows: silu -> -0, no warning, no NaN
    up = rng.standard_normal((2, 160)).astype(np.float32)
    got = np.empty_like(gate)
    dk.swiglu(gate, up, got)
    g64 = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        want = g64 / (1 + np.exp(-g64)) * up
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)


def test_mismatched_sizes_are_refused_before_anything_is_written():
    """numba checks no bounds: a position past the cache or a short operand is refused."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4 * 16)).astype(np.float32)
    k = rng.standard_normal((2, 2 * 16)).astype(np.float32)
    ck = np.zeros((2, 8, 16), np.float32)
    cos, sin = np.ones((2, 8), np.float32), np.zeros((2, 8), np.float32)
    out = np.empty_like(q)
    for begin, kk, cc in ((7, k, ck), (0, k[:1], ck), (0, k, ck[:, :, :8].copy())):
        with pytest.raises(ValueError, match="mismatched"):
            dk.attend(q, kk, kk, cc, cc.copy(), begin, cos, sin, False, np.float32(0.25), out)
    assert not ck.any()
    with pytest.raises(ValueError, match="mismatched"):
        dk.rms_norm(q, np.ones(8, np.float32), 1e-5, out)
    with pytest.raises(ValueError, match="mismatched"):
        dk.swiglu(q, q[:1], out)
