"""models.ops' numba kernels against models.minilm's numpy steps, on random data and on real
MiniLM activations (sentences of 2 to 256 tokens), and swapped into a whole forward pass."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from models import minilm, ops
from models.executor import LocalExecutor, Product
from models.minilm import MiniLM

TEXTS = [
    "",                                         # [CLS] [SEP]: 2 tokens
    "hello world",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "attention " * 60,                          # 62 tokens
    "a long line of words, " * 80,              # truncated at 256 tokens
    "Numba compiles Python loops to machine code.",
]


@numba.vectorize(["float32(float32)"], fastmath={"nnan", "ninf", "nsz"}, cache=True)
def _gelu(x):  # no FMA, as models.ops (issue 45: 1 + erf cancels near x = -4)
    """The numpy forward's GELU before models.ops (erf: the float32 rational that Eigen and
    XLA use), kept as the reference."""
    z = x * np.float32(0.7071067811865476)
    z = min(max(z, np.float32(-4.0)), np.float32(4.0))
    z2 = z * z
    p = z2 * np.float32(-2.72614225801306e-10) + np.float32(2.77068142495902e-08)
    p = z2 * p + np.float32(-2.10102402082508e-06)
    p = z2 * p + np.float32(-5.69250639462346e-05)
    p = z2 * p + np.float32(-7.34990630326855e-04)
    p = z2 * p + np.float32(-2.95459980854025e-03)
    p = z2 * p + np.float32(-1.60960333262415e-02)
    q = z2 * np.float32(-1.45660718464996e-05) + np.float32(-2.13374055278905e-04)
    q = z2 * q + np.float32(-1.68282697438203e-03)
    q = z2 * q + np.float32(-7.37332916720468e-03)
    q = z2 * q + np.float32(-1.42647390514189e-02)
    return np.float32(0.5) * x * (np.float32(1.0) + z * p / q)




def _attention(qkv: np.ndarray, real: np.ndarray, mask: np.ndarray,
               n: int, longest: int) -> np.ndarray:
    """The numpy forward's attention before models.ops (padded to the longest sentence, with
    a mask), kept as the reference: packed [tokens, 1152] -> packed [tokens, 384]."""
    head = minilm.DIM // minilm.HEADS
    padded = np.zeros((n * longest, 3 * minilm.DIM), np.float32)
    padded[real.reshape(-1)] = qkv
    # contiguous [n, heads, longest, 32] operands: numpy's stacked matmul on strided views
    # skips BLAS (1.6 s a layer at 32 x 128 tokens here, against ~40 ms contiguous)
    q, k, v = (np.ascontiguousarray(padded[:, i * minilm.DIM:(i + 1) * minilm.DIM]
                                    .reshape(n, longest, minilm.HEADS, head).transpose(0, 2, 1, 3))
               for i in range(3))
    q *= np.float32(1.0 / math.sqrt(head))
    scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    scores += mask[:, None, None, :]
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(n * longest, minilm.DIM)
    return np.ascontiguousarray(ctx[real.reshape(-1)])


@pytest.fixture(scope="module")
def model() -> MiniLM:
    return MiniLM.load()


def _reference_attention(qkv: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """models.minilm's padded numpy attention, given packed rows and lengths."""
    longest = int(lengths.max())
    real = np.arange(longest)[None, :] < lengths[:, None]
    mask = np.where(real, 0.0, np.finfo(np.float32).min).astype(np.float32)
    return _attention(qkv, real, mask, lengths.size, longest)


def _forward(model: MiniLM, texts: list[str], fused: bool,
             trace: list[dict[str, np.ndarray]] | None = None) -> np.ndarray:
    """MiniLM.forward with either its numpy steps or models.ops' kernels (``fused``); ``trace``
    collects every layer's inputs and outputs of those steps."""
    batch = model.tokenizer.encode(texts)
    ex = LocalExecutor()
    starts = np.concatenate([[0], np.cumsum(batch.lengths)[:-1]])
    pos = np.arange(batch.tokens) - np.repeat(starts, batch.lengths)
    x = minilm._layer_norm(model.word[batch.ids] + model.position[pos] + model.token_type,
                           *model.ln0)
    for layer in model.layers:
        (qkv,) = ex.matmuls([Product(x, layer.qkv)])
        qkv = qkv + layer.qkv_bias
        if fused:
            ctx = ops.attention(qkv, batch.lengths)
        else:
            ctx = _reference_attention(qkv, batch.lengths)
        (o,) = ex.matmuls([Product(ctx, layer.out)])
        if fused:
            x1 = ops.residual_layer_norm(o, layer.out_bias, x, *layer.ln1)
        else:
            x1 = minilm._layer_norm(o + layer.out_bias + x, *layer.ln1)
        (h,) = ex.matmuls([Product(x1, layer.up)])
        g = ops.bias_gelu(h, layer.up_bias) if fused else _gelu(h + layer.up_bias)
        (d,) = ex.matmuls([Product(g, layer.down)])
        if fused:
            x2 = ops.residual_layer_norm(d, layer.down_bias, x1, *layer.ln2)
        else:
            x2 = minilm._layer_norm(d + layer.down_bias + x1, *layer.ln2)
        if trace is not None:
            trace.append(dict(qkv=qkv, ctx=ctx, o=o, x=x, x1=x1, h=h, g=g, d=d, x2=x2,
                              lengths=batch.lengths, layer=layer))
        x = x2
    pooled = np.add.reduceat(x, starts, axis=0) / batch.lengths[:, None].astype(np.float32)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def trace(model) -> list[dict[str, np.ndarray]]:
    """Every layer's activations of the numpy forward over TEXTS."""
    out: list[dict[str, np.ndarray]] = []
    _forward(model, TEXTS, fused=False, trace=out)
    return out


def test_real_batch_has_the_edge_lengths(trace):
    lengths = trace[0]["lengths"]
    assert lengths.min() == 2 and lengths.max() == minilm.MAX_TOKENS


def _float64_attention(qkv: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    x = qkv.astype(np.float64)
    out = np.zeros((x.shape[0], 384))
    for s, e in zip(np.cumsum(lengths) - lengths, np.cumsum(lengths), strict=True):
        for h in range(12):
            q, k, v = (x[s:e, c + h * 32:c + (h + 1) * 32] for c in (0, 384, 768))
            scores = q @ k.T / np.sqrt(32)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[s:e, h * 32:(h + 1) * 32] = p / p.sum(axis=1, keepdims=True) @ v
    return out


def test_attention_matches_numpy_on_random_data():
    rng = np.random.default_rng(0)
    lengths = np.array([1, 2, 17, 33, 64, 5, 16, 129], np.int64)
    qkv = (rng.standard_normal((int(lengths.sum()), 1152)) * 1.5).astype(np.float32)
    got = ops.attention(qkv, lengths)
    want = _reference_attention(qkv, lengths)
    assert got.dtype == np.float32 and got.shape == (qkv.shape[0], 384)
    assert got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got, _float64_attention(qkv, lengths), rtol=1e-5, atol=2e-6)


def test_attention_is_stable_for_peaked_softmaxes():
    """Scores in the thousands: nothing overflows or turns NaN, and the error against float64
    is numpy's (float32 scores that large are only known to ~1e-3, and near-ties amplify it)."""
    rng = np.random.default_rng(3)
    lengths = np.array([3, 40, 100], np.int64)
    qkv = (rng.standard_normal((int(lengths.sum()), 1152)) * 25).astype(np.float32)
    got = ops.attention(qkv, lengths)
    assert np.isfinite(got).all()
    exact = _float64_attention(qkv, lengths)
    numpy_error = np.abs(_reference_attention(qkv, lengths) - exact).max()
    assert np.abs(got - exact).max() <= 1.1 * numpy_error + 1e-6


def test_attention_matches_numpy_on_real_activations(trace):
    for t in trace:
        got = ops.attention(t["qkv"], t["lengths"])
        np.testing.assert_allclose(got, t["ctx"], rtol=1e-5, atol=5e-6)


def test_attention_of_a_batch_is_each_sentence_alone(trace):
    qkv, lengths = trace[2]["qkv"], trace[2]["lengths"]
    together = ops.attention(qkv, lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for s, e in zip(starts[:-1], starts[1:], strict=True):
        alone = ops.attention(qkv[s:e], np.array([e - s]))
        assert np.array_equal(together[s:e], alone)
    # changing one sentence's rows leaves every other sentence's output as it was
    changed = qkv.copy()
    changed[starts[1]:starts[2]] *= 3
    again = ops.attention(changed, lengths)
    assert not np.allclose(again[starts[1]:starts[2]], together[starts[1]:starts[2]])
    keep = np.ones(qkv.shape[0], bool)
    keep[starts[1]:starts[2]] = False
    assert np.array_equal(again[keep], together[keep])


def test_attention_checks_its_input():
    qkv = np.zeros((5, 1152), np.float32)
    with pytest.raises(ValueError, match="sum to 5"):
        ops.attention(qkv, np.array([2, 2]))
    with pytest.raises(ValueError, match="1152"):
        ops.attention(np.zeros((5, 384), np.float32), np.array([5]))
    assert ops.attention(np.zeros((0, 1152), np.float32), np.zeros(0, np.int64)).shape == (0, 384)


def test_residual_layer_norm_matches_numpy_on_random_data():
    rng = np.random.default_rng(1)
    y, residual = (rng.standard_normal((300, 384)).astype(np.float32) * 4 for _ in range(2))
    bias, beta = (rng.standard_normal(384).astype(np.float32) for _ in range(2))
    gamma = rng.uniform(0.1, 3, 384).astype(np.float32)
    got = ops.residual_layer_norm(y, bias, residual, gamma, beta)
    want = minilm._layer_norm(y + bias + residual, gamma, beta)
    assert got.dtype == np.float32 and got.shape == y.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-6)


def _fixed_order_layer_norm(v, gamma, beta):
    """models.ops' LayerNorm of one row, one float32 operation at a time in Python: no vector
    unit decides any order here."""
    f = np.float32

    def sum8(xs):
        parts = [f(0.0)] * 8
        for c, x in enumerate(xs):
            parts[c % 8] = f(parts[c % 8] + x)
        return f(f(f(parts[0] + parts[1]) + f(parts[2] + parts[3]))
                 + f(f(parts[4] + parts[5]) + f(parts[6] + parts[7])))

    mean = f(sum8(v) / f(len(v)))
    centred = [f(x - mean) for x in v]
    inv = f(f(1.0) / np.sqrt(f(sum8([f(x * x) for x in centred]) / f(len(v)) + f(1e-12))))
    return np.array([f(f(x * inv) * g + b) for x, g, b in zip(centred, gamma, beta,
                                                                strict=True)], np.float32)


def test_layer_norm_is_the_same_bits_on_every_machine():
    """The judge of evidence recomputes LayerNorm; a worker on another CPU must get the very
    same bits, or a requester could frame it: with rows that cancel (offset 1e3, spread
    1e-3, the attack's), a judge summing in another order took an honest "up" output of
    -1.07 for a lie (its own input gave -0.29). So the step sums in one fixed order, which a
    scalar reference matches bit for bit (before: the order of the compiler's vector code,
    which differs by CPU)."""
    rng = np.random.default_rng(8)
    rows = np.concatenate([rng.standard_normal((2, 384)) * 3,
                           1000 + rng.standard_normal((2, 384)) * 1e-3]).astype(np.float32)
    zeros = np.zeros_like(rows)
    gamma = rng.uniform(0.1, 3, 384).astype(np.float32)
    beta = rng.standard_normal(384).astype(np.float32)
    bias = np.zeros(384, np.float32)
    got = ops.residual_layer_norm(rows, bias, zeros, gamma, beta)
    for row, out in zip(rows, got, strict=True):
        assert np.array_equal(out, _fixed_order_layer_norm(row, gamma, beta))


def test_residual_layer_norm_matches_numpy_on_real_activations(trace):
    for t in trace:
        layer = t["layer"]
        got = ops.residual_layer_norm(t["o"], layer.out_bias, t["x"], *layer.ln1)
        np.testing.assert_allclose(got, t["x1"], rtol=1e-5, atol=2e-5)
        got = ops.residual_layer_norm(t["d"], layer.down_bias, t["x1"], *layer.ln2)
        np.testing.assert_allclose(got, t["x2"], rtol=1e-5, atol=2e-5)


def test_bias_gelu_matches_numpy_on_random_data():
    rng = np.random.default_rng(2)
    h = (rng.standard_normal((50, 1536)) * 4).astype(np.float32)
    bias = rng.standard_normal(1536).astype(np.float32)
    got = ops.bias_gelu(h, bias)
    want = _gelu(h + bias)
    assert got.dtype == np.float32 and got.shape == h.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_bias_gelu_matches_numpy_on_real_activations(trace):
    for t in trace:
        got = ops.bias_gelu(t["h"], t["layer"].up_bias)
        np.testing.assert_allclose(got, t["g"], rtol=1e-6, atol=1e-7)


def test_exp_is_accurate_over_the_softmax_range():
    x = -np.linspace(0, 87, 20001).astype(np.float32)
    got = np.array([ops._exp(v) for v in x], np.float64)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 1.5e-7


def test_forward_with_the_kernels_equals_the_models_embeddings(model):
    got = _forward(model, TEXTS, fused=True)
    want = model.embed(TEXTS)
    assert np.abs(got - want).max() <= 1e-6


def _taps(rng, rows, y_width, x_width, rounds=4):
    """A tap of a step's input (check vectors only) and one of its output (weighted)."""
    from compute.verify import draw_vectors

    weights = rng.uniform(0.5, 2.0, x_width)
    return (ops.Tap(draw_vectors(y_width, rounds, rng), None, rows),
            ops.Tap(draw_vectors(x_width, rounds, rng), weights, rows))


def _steps(rng, rows):
    """Each tapped step: (name, call(taps), the rows it reads; attention takes only a tap of
    its input: the pass projects its output itself)."""
    y384, res = (rng.standard_normal((rows, 384), dtype=np.float32) for _ in range(2))
    y1536 = rng.standard_normal((rows, 1536), dtype=np.float32)
    y1152 = rng.standard_normal((rows, 1152), dtype=np.float32)
    lengths = np.array([rows // 2, rows - rows // 2] if rows > 1 else [1], np.int64)
    g, b = rng.standard_normal(384, dtype=np.float32), rng.standard_normal(384, dtype=np.float32)
    b1536, b1152 = (np.linspace(-1, 1, n, dtype=np.float32) for n in (1536, 1152))
    return [
        ("layer norm", lambda t: ops.residual_layer_norm(y384, b, res, g, b, taps=t), y384),
        ("gelu", lambda t: ops.bias_gelu(y1536, b1536, taps=t), y1536),
        ("attention", lambda t: ops.attention(y1152, lengths, b1152, t[0]), y1152),
    ]


@pytest.mark.parametrize("rounds", [4, 3])
@pytest.mark.parametrize("rows", [1, 37, 512])
def test_a_tapped_step_writes_the_same_rows_and_takes_a_passs_sums(rows, rounds):
    """A step that also takes a check's sums (models.ops.Tap) writes what it writes untapped,
    bit for bit, and its sums are compute.verify's pass's within float32 rounding (odd row
    counts: the kernel takes rows two at a time; 3 rounds: its general path)."""
    from compute.verify import _pass

    rng = np.random.default_rng(rows + rounds)
    for name, step, y in _steps(rng, rows):
        plain = step((None, None))
        y_tap, x_tap = _taps(rng, rows, y.shape[1], plain.shape[1], rounds)
        out = step((y_tap, x_tap))
        assert np.array_equal(out, plain), name
        sides = [(y_tap, y)] + ([(x_tap, out)] if name != "attention" else [])
        for tap, seen in sides:
            proj, sq = _pass(seen, tap.right_t.T.copy(), tap.weights.astype(np.float64))
            scale = np.sqrt(sq)[:, None] * np.linalg.norm(tap.right_t, axis=1)[None, :]
            assert (np.abs(tap.proj - proj) <= 1e-5 * scale).all(), name
            np.testing.assert_allclose(tap.sq, sq, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 3e20])
def test_a_non_finite_or_huge_value_reaches_a_taps_sums(value):
    """A tap sums a worker's unchecked output: a NaN, an infinity, or a value whose square
    overflows float32 makes that row's sums non-finite (the check then fails it), however
    the step itself treats it (no fast-math assumption that values are finite)."""
    rng = np.random.default_rng(5)
    for name, step, y in _steps(rng, 9):
        y[4, 17] = value
        y_tap, x_tap = _taps(rng, 9, y.shape[1], 384 if name == "layer norm" else y.shape[1])
        step((y_tap, x_tap))
        assert not np.isfinite(y_tap.sq[4]) or not np.isfinite(y_tap.proj[4]).all(), name
        others = np.delete(np.arange(9), 4)
        assert np.isfinite(y_tap.sq[others]).all() and np.isfinite(y_tap.proj[others]).all()


def test_a_tap_of_the_wrong_shape_is_refused():
    rng = np.random.default_rng(6)
    y = rng.standard_normal((8, 1536), dtype=np.float32)
    with pytest.raises(ValueError, match="a tap of"):
        ops.bias_gelu(y, np.zeros(1536, np.float32),
                      taps=(ops.Tap(np.ones((1536, 4), np.float32), None, 7), None))


def _attention_without_fma(qkv: np.ndarray, lengths, bias: np.ndarray) -> np.ndarray:
    """ops.attention as a CPU without FMA computes it: the kernel's operations in its order,
    each multiply and each add rounded to float32 on its own (numpy, element-wise over the
    queries as the kernel's vector loops run)."""
    from models import ops

    f = np.float32
    out = np.empty((qkv.shape[0], ops.DIM), f)
    start = 0

    def exp(x):
        x = np.maximum(x, f(-87.0))
        k = np.floor(x * f(1.4426950408889634) + f(0.5))
        r = x - k * f(0.693359375) - k * f(-2.12194440e-4)
        p = np.full_like(r, f(1.9875691500e-4))
        for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                  5.0000001201e-1):
            p = p * r + f(c)
        p = p * r * r + r + f(1.0)
        return p * ((k.astype(np.int32) + np.int32(127)) << np.int32(23)).view(f)

    for n in lengths:
        rows = qkv[start:start + n] + bias
        for h in range(ops.HEADS):
            q0, k0, v0 = h * ops.HEAD, ops.DIM + h * ops.HEAD, 2 * ops.DIM + h * ops.HEAD
            qt = rows[:, q0:q0 + ops.HEAD].T * ops._SCALE             # [d, i]
            st = np.empty((n, n), f)
            for j in range(n):
                s = np.zeros(n, f)
                for d in range(ops.HEAD):
                    s = s + rows[j, k0 + d] * qt[d]
                st[j] = s
            top = st.max(axis=0)
            total = np.zeros(n, f)
            for j in range(n):
                st[j] = exp(st[j] - top)
                total = total + st[j]
            ot = np.zeros((ops.HEAD, n), f)
            for j in range(n):
                for d in range(ops.HEAD):
                    ot[d] = ot[d] + rows[j, v0 + d] * st[j]
            out[start:start + n, q0:q0 + ops.HEAD] = (ot * (f(1.0) / total)).T
        start += n
    return out


def test_attention_is_the_same_bits_with_and_without_fma():
    """Issue 45, finding 3: attention was compiled with fastmath's ``contract``, so a CPU with
    FMA fused its multiply-adds and one without did not. A requester's crafted first-layer
    input (queries near 0, values that cancel) made attention's output ~1e-4 of its terms,
    and the judge, recomputing with FMA, proved an honest worker without FMA a liar (it
    allows the products no slack on their inputs). Attention now never contracts: the
    kernel gives the no-FMA bits, on the crafted input and on ordinary ones."""
    from models import ops

    rng = np.random.default_rng(45)
    n = 24
    qkv = rng.standard_normal((n, 3 * ops.DIM)).astype(np.float32)
    qkv[:, :ops.DIM] *= np.float32(1e-3)                   # queries near 0: even weights
    v = qkv[:, 2 * ops.DIM:]
    v[1::2] = -v[0::2] + np.float32(1e-4) * rng.standard_normal(v[1::2].shape).astype(
        np.float32)                                        # values that cancel pairwise
    bias = np.zeros(3 * ops.DIM, np.float32)
    for x in (qkv, rng.standard_normal((n, 3 * ops.DIM)).astype(np.float32)):
        got = ops.attention(x, np.array([n]), bias)
        want = _attention_without_fma(x, [n], bias)
        assert np.array_equal(got, want), np.abs(got - want).max()


def test_gelu_is_the_same_bits_with_and_without_fma():
    """Issue 45, finding 3 (the same for GELU): its 1 + erf cancels near x = -4, so a fused
    multiply-add there changed more than the last bit of a tiny output. The kernel gives the
    bits of its formula with every multiply and add rounded on its own."""
    from models import ops

    f = np.float32
    rng = np.random.default_rng(45)
    h = np.concatenate([rng.uniform(-6, -3, (8, 1536)), rng.standard_normal((8, 1536))]
                       ).astype(f)
    bias = np.zeros(1536, f)
    x = h + bias
    z = np.clip(x * f(0.7071067811865476), f(-4.0), f(4.0))
    z2 = z * z
    p = z2 * f(-2.72614225801306e-10) + f(2.77068142495902e-08)
    for c in (-2.10102402082508e-06, -5.69250639462346e-05, -7.34990630326855e-04,
              -2.95459980854025e-03, -1.60960333262415e-02):
        p = z2 * p + f(c)
    q = z2 * f(-1.45660718464996e-05) + f(-2.13374055278905e-04)
    for c in (-1.68282697438203e-03, -7.37332916720468e-03, -1.42647390514189e-02):
        q = z2 * q + f(c)
    want = f(0.5) * x * (f(1.0) + z * p / q)
    got = ops.bias_gelu(h, bias)
    assert np.array_equal(got, want), np.abs(got - want).max()
