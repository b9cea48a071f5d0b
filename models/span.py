"""Spans of Llama blocks: one layer pass shared by the local forward, a worker hosting a span,
and the requester that checks what the worker sent (sans-IO; products by models.quant's kernels).

A worker hosting layers ``[first, first + count)`` keeps their weights as one content-addressed
*bundle* (:func:`bundle`: the blocks as the file stores them, kept quantized) and each
sequence's keys and values, and answers a call with the
span's **trace**: for every layer and new row, each weight product's input and output
(:data:`TRACE`). The requester never takes the worker's word for anything: it re-runs the same
layer pass (:func:`run_layers`) itself, with its own cache, where each product comes from the
trace only after two checks (:class:`TraceCheck`):

* the output is the worker's recorded input times ``W`` (a wrong matmul the worker signed:
  provable), and
* the output is the requester's **own** input times ``W``, within the f32 rounding bound of
  that product: the requester computed every input itself (the non-linear steps, RMSNorm,
  RoPE, attention, SwiGLU and residuals, are its own values), so a worker can change what is
  used by no more than honest rounding of each product (SECURITY.md states the bound);

both by Freivalds' check with secret Gaussian vectors ``R`` and the fingerprint ``W @ R``,
precomputed per weight from its dequantized rows (:class:`Fingerprints`), so a check costs
``O(rows * (k + n))``
instead of the product's ``O(rows * k * n)``.

A product that fails the first check is a wrong matmul the worker signed: exact evidence that
anyone can re-check (swarm.runtime.evidence judges it per product with its worst-case rounding
bound). See SECURITY.md, "Spans of layers".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from compute.errors import InvalidInput
from compute.verify import check_projected, draw_vectors, project

if TYPE_CHECKING:  # models.quant loads numba and gguf (about a second): on first use
    from models.quant import QTensor

PARTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
"""A block's weight products, in the order the pass needs them."""
INPUT_OF = {"attn_q": "h_attn", "attn_k": "h_attn", "attn_v": "h_attn", "attn_output": "attn",
            "ffn_gate": "h_ffn", "ffn_up": "h_ffn", "ffn_down": "act"}
"""Which recorded input each product multiplies."""
BIASED = ("attn_q", "attn_k", "attn_v")
"""The products that may carry a bias (Qwen2's Q, K and V)."""
TRACE = ("h_attn", "attn_q", "attn_k", "attn_v", "attn", "attn_output", "h_ffn", "ffn_gate",
         "ffn_up", "act", "ffn_down")
"""One layer's columns of a trace, left to right."""


class SpanMismatch(ValueError):
    """A trace the requester cannot use. ``signed_lie``: a product that is not its own
    recorded input times the weight (a wrong matmul, provable); else the recorded input is
    not the requester's (a non-linear step done wrong, or a cache that differs)."""

    def __init__(self, layer: int, part: str, signed_lie: bool, why: str) -> None:
        super().__init__(f"layer {layer} {part}: {why}")
        self.layer, self.part, self.signed_lie = layer, part, signed_lie


def widths(c) -> dict[str, int]:
    kvd = c.n_kv_heads * c.head_dim
    d, f = c.d_model, c.d_ff
    return {"h_attn": d, "attn_q": d, "attn_k": kvd, "attn_v": kvd, "attn": d,
            "attn_output": d, "h_ffn": d, "ffn_gate": f, "ffn_up": f, "act": f, "ffn_down": d}


def trace_columns(c) -> dict[str, tuple[int, int]]:
    """Column range of each name within one layer's part of a trace."""
    out, at = {}, 0
    for name, w in widths(c).items():
        out[name] = (at, at + w)
        at += w
    return out


def layer_width(c) -> int:
    return sum(widths(c).values())


def matrix_shapes(c) -> dict[str, tuple[int, int]]:
    """Each product's weight shape, ``[out, in]`` (as the file stores it)."""
    w = widths(c)
    return {p: (w[p], w[INPUT_OF[p]]) for p in PARTS}


@dataclass(frozen=True)
class Layer:
    """One block's weights: ``matrices`` by part, each kept as the file stores it
    (models.quant.QTensor ``[out, in]``, or anything with its ``matmul``: an executor's
    Weight); the norm vectors and ``biases`` by part (Q, K and V of a Qwen2 block, added
    after the product) as float32."""

    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    matrices: dict[str, Any]
    biases: dict[str, np.ndarray] = field(default_factory=dict)


def model_layers(weights, first: int, count: int) -> list[Layer]:
    """Layers ``[first, first + count)`` of ``weights`` (models.gguf_weights.LlamaWeights),
    their matrices the file's own (no copy)."""
    return [Layer(weights.vectors[f"blk.{i}.attn_norm.weight"],
                  weights.vectors[f"blk.{i}.ffn_norm.weight"],
                  {p: weights.matrices[f"blk.{i}.{p}.weight"] for p in PARTS}, biases(weights, i))
            for i in range(first, first + count)]


def biases(weights, i: int) -> dict[str, np.ndarray]:
    return {p: b for p in BIASED if (b := weights.bias(i, p)) is not None}


# -- bundles: what a worker hosting a span is sent ----------------------------------------------

BUNDLE_MAGIC = 0x31425153
"""A bundle's first little-endian uint32 (``b"SQB1"``: span, quantized, version 1)."""
ALIGN = 64
"""Every section of a bundle starts at a multiple of this many bytes."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@functools.lru_cache(maxsize=64)
def _sections(c, qtypes: tuple[tuple[Any, ...], ...]) -> tuple[int, list[dict[str, tuple]]]:
    """Where each layer's parts lie in a bundle of ``len(qtypes)`` layers whose matrices
    have block formats ``qtypes`` (PARTS order per layer): ``(total bytes, [{name: (start,
    stop, qtype or None, shape)}])``, vectors under their own names (``bias.attn_q`` ...).
    ValueError for a format or shape models.quant does not multiply."""
    from models.quant import row_bytes

    d, w, shapes = c.d_model, widths(c), matrix_shapes(c)
    at = _aligned(4 * (2 + len(PARTS) * len(qtypes)))
    layers = []
    for row in qtypes:
        where: dict[str, tuple] = {}
        parts = [("attn_norm", None, (d,)), ("ffn_norm", None, (d,))]
        parts += [(p, t, shapes[p]) for p, t in zip(PARTS, row, strict=True)]
        parts += [(f"bias.{p}", None, (w[p],)) for p in BIASED if c.qkv_bias]
        for name, t, shape in parts:
            size = 4 * shape[0] if t is None else shape[0] * row_bytes(t, shape[1])
            where[name] = (at, at + size, t, shape)
            at = _aligned(at + size)
        layers.append(where)
    return at, layers


def layer_bytes(c, layers: Sequence[Layer]) -> list[int]:
    """Bytes each of ``layers`` takes in a bundle (its blocks as the file stores them, its
    vectors, alignment): what a worker holds for it (swarm.placement's block sizes)."""
    return [_sections(c, (tuple(lw.matrices[p].qtype for p in PARTS),))[0]
            - _aligned(4 * (2 + len(PARTS))) for lw in layers]


def bundle_of(c, layers: Sequence[Layer],
              copied: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
    """``layers`` (matrices as models.quant.QTensor) as one uint8 vector: a header (magic,
    layer count, each matrix's GGML type), then per layer its norms, its matrices' blocks
    as the file stores them (PARTS order) and its biases, each section aligned. What a
    worker is sent, once, and names by content address after (:func:`unbundle` reads it).
    ``copied(src)`` is told of each matrix once its bytes are in (a worker making the bundle
    from its own file lets the mapped pages go: swarm.runtime.local_bundles)."""
    qtypes = [[lw.matrices[p].qtype for p in PARTS] for lw in layers]
    total, where = _sections(c, tuple(map(tuple, qtypes)))
    out = np.zeros(total, np.uint8)
    head = [BUNDLE_MAGIC, len(layers)] + [int(t) for row in qtypes for t in row]
    out[:4 * len(head)] = np.asarray(head, "<u4").view(np.uint8)
    for lw, sections in zip(layers, where, strict=True):
        for name, (a, b, t, _) in sections.items():
            if t is not None:
                src = lw.matrices[name].data
            else:
                src = lw.attn_norm if name == "attn_norm" else lw.ffn_norm \
                    if name == "ffn_norm" else lw.biases[name.removeprefix("bias.")]
                src = np.ascontiguousarray(src, "<f4")
            out[a:b] = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
            if t is not None and copied is not None:
                copied(src)
    return out


def bundle(weights, first: int, count: int) -> np.ndarray:
    """Layers ``[first, first + count)`` of ``weights`` as one bundle (:func:`bundle_of`)."""
    return bundle_of(weights.config, model_layers(weights, first, count))


def bundle_sections(flat: Any, c, count: int) -> list[dict[str, tuple]]:
    """The sections of a bundle of ``count`` layers (:func:`_sections`), its header and size
    checked: ValueError, saying what is wrong, for anything else (bytes from the network)."""
    if not isinstance(flat, np.ndarray) or flat.dtype != np.uint8 or flat.ndim != 1:
        got = f"{flat.dtype} {list(flat.shape)}" if isinstance(flat, np.ndarray) \
            else type(flat).__name__
        raise ValueError(f"a bundle is a uint8 vector (models.span.bundle), got {got}")
    n_head = 2 + len(PARTS) * count
    if flat.size < 4 * n_head:
        raise ValueError(f"a bundle of {count} layers starts with a {4 * n_head}-byte "
                         f"header, got {flat.size} bytes")
    head = flat[:4 * n_head].view("<u4")
    if int(head[0]) != BUNDLE_MAGIC or int(head[1]) != count:
        raise ValueError(f"not a bundle of {count} layers (its header says "
                         f"{int(head[1]) if int(head[0]) == BUNDLE_MAGIC else 'nothing'})")
    from gguf import GGMLQuantizationType

    from models.quant import SUPPORTED

    qtypes = []
    for j in range(count):
        row = []
        for v in head[2 + len(PARTS) * j:2 + len(PARTS) * (j + 1)].tolist():
            try:
                row.append(GGMLQuantizationType(v))
            except ValueError:
                raise ValueError(f"a bundle's matrix has GGML type {v}, which is unknown; "
                                 f"supported: {', '.join(t.name for t in SUPPORTED)}") from None
        qtypes.append(row)
    total, where = _sections(c, tuple(map(tuple, qtypes)))
    if flat.size != total:
        raise ValueError(f"a bundle of {count} layers of these types is {total} bytes, got "
                         f"{flat.size}")
    return where


def unbundle(flat: np.ndarray, c, count: int) -> list[Layer]:
    """The layers of a bundle, every part a view of its bytes (matrices stay quantized);
    ValueError when the bundle does not fit (:func:`bundle_sections`)."""
    from models.quant import QTensor

    layers = []
    for sections in bundle_sections(flat, c, count):
        vec = {name: flat[a:b].view("<f4") for name, (a, b, t, _) in sections.items()
               if t is None}
        mats = {name: QTensor.from_bytes(t, shape, flat[a:b])
                for name, (a, b, t, shape) in sections.items() if t is not None}
        layers.append(Layer(vec["attn_norm"], vec["ffn_norm"], mats,
                            {p: vec[f"bias.{p}"] for p in BIASED if c.qkv_bias}))
    return layers


def layer_products(layer: Layer, pairs: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
    """``[x @ W_part.T, ...]`` by the layer's own matrices, together (models.quant.matmuls:
    the same bits as one at a time)."""
    from models.quant import matmuls

    return matmuls([(layer.matrices[p], x) for p, x in pairs])


# -- the layer pass -----------------------------------------------------------------------------

Products = Callable[[int, list[tuple[str, np.ndarray]]], list[np.ndarray]]
"""``products(j, [(part, x), ...])`` -> ``[x @ W_part of the run's layer j, ...]``."""


def rope_tables(c, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, [len(positions), head_dim / 2]: pair i turns by ``position * scale *
    base^(-2i/head_dim) / freqs[i]`` (llama.cpp's angles, linear scaling and freq factors)."""
    half = c.head_dim // 2
    inv_freq = c.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / c.head_dim)
    if c.rope_freqs is not None:
        inv_freq = inv_freq / np.asarray(c.rope_freqs, np.float64)
    angles = (positions.astype(np.float64) * c.rope_scale)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
               style: str = "norm") -> np.ndarray:
    """Rotate pairs of x [tokens, heads, head_dim] by their angles: adjacent pairs (2i, 2i+1)
    for ``norm``, (i, i + head_dim/2) for ``neox`` (models.decoder.ROPE_STYLES)."""
    half = x.shape[-1] // 2
    lo, hi = (np.s_[..., 0::2], np.s_[..., 1::2]) if style == "norm" else \
        (np.s_[..., :half], np.s_[..., half:])
    x0, x1 = x[lo], x[hi]
    cc, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[lo] = x0 * cc - x1 * s
    out[hi] = x0 * s + x1 * cc
    return out


def _kernels():
    """models.decode_kernels (numba: imported on first use, as models.quant is)."""
    from models import decode_kernels

    return decode_kernels


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * w`` per row of float32 ``x`` (1-D or 2-D)."""
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim not in (1, 2):
        scale = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
        return (x * scale) * w
    x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]))
    out = np.empty(x2.shape, np.float32)
    _kernels().rms_norm(x2, np.ascontiguousarray(w, np.float32), float(eps), out)
    return out.reshape(x.shape)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``silu(gate) * up`` (float32 [rows, d_ff]) in one compiled pass."""
    gate, up = np.ascontiguousarray(gate, np.float32), np.ascontiguousarray(up, np.float32)
    out = np.empty(gate.shape, np.float32)
    _kernels().swiglu(gate, up, out)
    return out


class KVCache:
    """Keys and values of one sequence for ``layers`` layers: [layers, kv_heads, positions,
    head_dim]. Grows by doubling up to the model's context, so a short chat holds a short
    cache."""

    def __init__(self, config, capacity: int = 256, layers: int | None = None):
        self.config = config
        self.layers = config.n_layers if layers is None else layers
        self.length = 0
        self._alloc(min(max(capacity, 1), config.context_length))

    def _alloc(self, capacity: int) -> None:
        c = self.config
        shape = (self.layers, c.n_kv_heads, capacity, c.head_dim)
        k, v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        if self.length:
            k[:, :, :self.length] = self.k[:, :, :self.length]
            v[:, :, :self.length] = self.v[:, :, :self.length]
        self.k, self.v = k, v

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def reserve(self, n_new: int) -> None:
        need = self.length + n_new
        if need > self.config.context_length:
            raise ValueError(f"{need} positions exceed the model's context of "
                             f"{self.config.context_length} tokens")
        if need > self.capacity:
            cap = self.capacity
            while cap < need:
                cap *= 2
            self._alloc(min(cap, self.config.context_length))


@dataclass
class Seq:
    """One sequence's part of a pass: its new rows, where they go in its cache, its RoPE
    angles and causal mask (new row t sees cached positions [0, begin + t])."""

    cache: KVCache
    begin: int
    end: int
    cos: np.ndarray
    sin: np.ndarray
    mask: np.ndarray

    @classmethod
    def start(cls, n: int, cache: KVCache) -> Seq:
        if n <= 0:
            raise ValueError("forward needs at least one token")
        cache.reserve(n)
        return cls.span(cache, cache.length, cache.length + n)

    @classmethod
    def span(cls, cache: KVCache, begin: int, end: int) -> Seq:
        """Positions ``[begin, end)`` of ``cache`` (room for them already reserved)."""
        cos, sin = rope_tables(cache.config, np.arange(begin, end))
        mask = np.where(np.arange(end)[None, :] <= np.arange(begin, end)[:, None],
                        np.float32(0), np.float32(-np.inf))
        return cls(cache, begin, end, cos, sin, mask)


def run_layers(c, layers: Sequence[Layer], x: np.ndarray, seqs: Sequence[Seq],
               products: Products, cache_first: int = 0) -> np.ndarray:
    """Run ``layers`` over ``x`` ([rows, d]: each sequence's new rows, in order) and return
    the residual stream after them. Run layer ``j`` keeps its keys and values in layer
    ``cache_first + j`` of each sequence's cache. Does not advance the caches' lengths."""
    hd, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
    group = nh // nkv
    scale = np.float32(1.0 / np.sqrt(hd))
    bounds = np.cumsum([0] + [s.end - s.begin for s in seqs])
    kernels = _kernels()
    fused = kernels.supported(hd) and max(s.end - s.begin for s in seqs) <= kernels.ROWS
    neox = c.rope_style == "neox"
    for j, lw in enumerate(layers):
        ci = cache_first + j
        h = rms_norm(x, lw.attn_norm, c.norm_eps)
        q_all, k_all, v_all = products(j, [("attn_q", h), ("attn_k", h), ("attn_v", h)])
        if lw.biases:
            q_all, k_all, v_all = (y + lw.biases[p] for y, p in
                                   zip((q_all, k_all, v_all), ("attn_q", "attn_k", "attn_v"),
                                       strict=True))
        attn = np.empty_like(q_all)
        for s, lo, hi in zip(seqs, bounds[:-1], bounds[1:], strict=True):
            n, cache = hi - lo, s.cache
            if fused:  # decode: one compiled call (models.decode_kernels)
                kernels.attend(np.ascontiguousarray(q_all[lo:hi]),
                               np.ascontiguousarray(k_all[lo:hi]),
                               np.ascontiguousarray(v_all[lo:hi]), cache.k[ci], cache.v[ci],
                               s.begin, s.cos, s.sin, neox, scale, attn[lo:hi])
                continue
            q = apply_rope(q_all[lo:hi].reshape(n, nh, hd), s.cos, s.sin, c.rope_style)
            k = apply_rope(k_all[lo:hi].reshape(n, nkv, hd), s.cos, s.sin, c.rope_style)
            cache.k[ci, :, s.begin:s.end] = k.transpose(1, 0, 2)
            cache.v[ci, :, s.begin:s.end] = v_all[lo:hi].reshape(n, nkv, hd).transpose(1, 0, 2)
            keys, values = cache.k[ci, :, :s.end], cache.v[ci, :, :s.end]  # [nkv, end, hd]
            qg = q.transpose(1, 0, 2).reshape(nkv, group * n, hd)  # heads by KV head
            scores = (qg @ keys.transpose(0, 2, 1)).reshape(nkv, group, n, s.end) * scale
            scores += s.mask
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            out = (p.reshape(nkv, group * n, s.end) @ values).reshape(nh, n, hd)
            attn[lo:hi] = out.transpose(1, 0, 2).reshape(n, nh * hd)
        (o,) = products(j, [("attn_output", attn)])
        x = x + o
        h = rms_norm(x, lw.ffn_norm, c.norm_eps)
        gate, up = products(j, [("ffn_gate", h), ("ffn_up", h)])
        (down,) = products(j, [("ffn_down", swiglu(gate, up))])
        x = x + down
    return x


# -- the worker's side ----------------------------------------------------------------------------

def traced_products(c, layers: Sequence[Layer], rows: int) -> tuple[Products, np.ndarray]:
    """Products computed here (numpy) and written, with their inputs, into a fresh trace
    ([rows, count * layer_width]); returns (products, trace)."""
    cols, width = trace_columns(c), layer_width(c)
    trace = np.empty((rows, len(layers) * width), np.float32)

    def products(j: int, pairs: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        base = j * width
        out = layer_products(layers[j], pairs)
        for (part, x), y in zip(pairs, out, strict=True):
            lo, hi = cols[INPUT_OF[part]]
            trace[:, base + lo:base + hi] = x
            lo, hi = cols[part]
            trace[:, base + lo:base + hi] = y
        return out

    return products, trace


# -- the requester's side -------------------------------------------------------------------------

def product_shape(w: QTensor | np.ndarray) -> tuple[int, int]:
    """``[in, out]`` of a product by ``w``: a QTensor is stored ``[out, in]`` (as the file
    keeps it), a plain float32 weight ``[in, out]`` (MiniLM's, multiplied as ``x @ w``)."""
    return tuple(w.shape) if isinstance(w, np.ndarray) else tuple(w.shape[::-1])


class Fingerprints:
    """Per weight (a models.quant.QTensor ``W``, ``[out, in]``): secret Gaussian vectors ``R``
    ([out, rounds], never sent), the fingerprint ``W.T @ R`` and ``W``'s squared column norms,
    from its dequantized rows in one streamed pass (QTensor.check_vectors: no float32 copy);
    a plain float32 ``[in, out]`` weight (MiniLM's) gets ``W @ R`` and its row norms;
    each set serves ``reuse`` checks, then is drawn afresh (why reuse is safe enough, and its
    cost: SECURITY.md)."""

    ROUNDS = 4
    REUSE = 64

    def __init__(self, rounds: int = ROUNDS, reuse: int = REUSE) -> None:
        self.rounds, self.reuse = rounds, reuse
        self._sets: dict[int, list] = {}
        self.checks = 0
        self.refreshes = 0

    def vectors(self, w: QTensor | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(R, W.T @ R, W's squared column norms)`` for one check of a product by ``w``."""
        entry = self._sets.get(id(w))
        if entry is None or entry[0] is not w or entry[4] >= self.reuse:
            if isinstance(w, np.ndarray):  # a float32 ``[in, out]`` weight (MiniLM's)
                r = draw_vectors(w.shape[1], self.rounds)
                br, norms2 = project(w, r)
            else:
                r = draw_vectors(w.shape[0], self.rounds)
                br, norms2 = w.check_vectors(r)
            entry = self._sets[id(w)] = [w, r, br, norms2, 0]
            self.refreshes += 1
        entry[4] += 1
        self.checks += 1
        return entry[1], entry[2], entry[3]

    def check(self, w: QTensor | np.ndarray, x: np.ndarray, y: np.ndarray) -> bool:
        """Whether ``y`` is ``x @ W.T`` within f32 rounding (compute.verify's threshold)."""
        r, br, norms2 = self.vectors(w)
        return check_projected(x, y, r, br, norms2, product_shape(w))

    def check_both(self, w: QTensor | np.ndarray, xw: np.ndarray, x: np.ndarray, y: np.ndarray
                   ) -> tuple[bool, bool]:
        """Whether ``y`` is ``xw @ W.T``, and whether it is ``x @ W.T``, each within f32
        rounding of that product (one set of vectors, one use of it). When ``xw`` and ``x``
        are the same bits (an honest worker's recorded input is the requester's own: the
        same steps on the same values) the two checks are one predicate on the same
        operands, so it runs once: half the cost of checking an honest span."""
        r, br, norms2 = self.vectors(w)
        shape = product_shape(w)
        signed = check_projected(xw, y, r, br, norms2, shape)
        if xw.shape == x.shape and xw.dtype == x.dtype and xw.tobytes() == x.tobytes():
            return signed, signed
        return signed, check_projected(x, y, r, br, norms2, shape)


class TraceCheck:
    """Products taken from a worker's trace, each checked (module docstring) before use."""

    def __init__(self, c, layers: Sequence[Layer], trace: np.ndarray, first: int,
                 fingerprints: Fingerprints, rows: slice | None = None) -> None:
        count, width = len(layers), layer_width(c)
        if trace.shape[1:] != (count * width,) or trace.dtype != np.float32:
            raise SpanMismatch(first, "trace", False, f"a trace of {count} layers is "
                               f"[rows, {count * width}] float32, got {trace.shape} "
                               f"{trace.dtype}")
        self.c, self.layers, self.trace, self.first = c, layers, trace, first
        self.fp, self.cols, self.width = fingerprints, trace_columns(c), width
        self.rows = rows or slice(0, trace.shape[0])

    def _cols(self, j: int, name: str) -> np.ndarray:
        lo, hi = self.cols[name]
        return self.trace[self.rows, j * self.width + lo:j * self.width + hi]

    def __call__(self, j: int, pairs: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        out = []
        for part, x in pairs:
            xw = self._cols(j, INPUT_OF[part])
            if xw.shape != x.shape:
                raise SpanMismatch(self.first + j, part, False,
                                   f"the trace has {xw.shape[0]} rows, the pass {x.shape[0]}")
            y = np.ascontiguousarray(self._cols(j, part))
            xw = np.ascontiguousarray(xw)
            try:
                signed, own = self.fp.check_both(self.layers[j].matrices[part], xw, x, y)
            except InvalidInput:  # a recorded input not finite, or too large to square in f32
                raise SpanMismatch(self.first + j, part, False, f"the recorded "
                                   f"{INPUT_OF[part]} is not finite (or overflows)") from None
            if not signed:
                raise SpanMismatch(self.first + j, part, True,
                                   "the output is not its recorded input times the weight")
            if not own:  # the worker's input is not the requester's: only f32 rounding of
                # the requester's own product may differ (issue 45: a recorded input moved
                # within a tolerance, in an aimed direction, steered tokens)
                raise SpanMismatch(self.first + j, part, False,
                                   f"the output is not the requester's own {INPUT_OF[part]} "
                                   "times the weight")
            out.append(y)
        return out
