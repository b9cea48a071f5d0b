"""A float64 reference forward of a Llama-family GGUF, written apart from the product's forward
(models.llama, models.span, models.archs) so that tests and benchmarks compare two readings of
the file: its own metadata reading, tensors dequantized by ``gguf.quants`` straight from
``GGUFReader``, the whole sequence at once (no KV cache), every step in float64.

It states llama.cpp's conventions once more on purpose: RMSNorm, RoPE over adjacent pairs for
``llama`` files and over halves for ``qwen2`` (:data:`ROPE`), Q/K/V biases where present,
grouped-query attention, SwiGLU, the output head tied unless ``output.weight`` exists. Slow
(minutes for a 0.5B model): for checks, never for serving.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROPE = {"llama": "norm", "qwen2": "neox"}


def _tensors(reader) -> dict[str, np.ndarray]:
    from gguf import quants

    out = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        out[t.name] = np.asarray(quants.dequantize(t.data, t.tensor_type),
                                 np.float64).reshape(shape)
    return out


def reference_logits(path: Path | str, ids: list[int]) -> np.ndarray:
    """Logits ``[len(ids), vocab]`` (float64) of every position of ``ids`` from position 0."""
    from gguf import GGUFReader

    reader = GGUFReader(Path(path))

    def key(k: str, default=None):
        f = reader.fields.get(k)
        return default if f is None else f.contents()

    arch = key("general.architecture")
    p = arch + "."
    n_layers, d = key(p + "block_count"), key(p + "embedding_length")
    nh = key(p + "attention.head_count")
    nkv = key(p + "attention.head_count_kv", nh)
    base, eps = key(p + "rope.freq_base", 10000.0), key(p + "attention.layer_norm_rms_epsilon")
    hd = d // nh
    t = _tensors(reader)
    style = ROPE[arch]

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x):  # [n, heads, hd]
        pos = np.arange(x.shape[0], dtype=np.float64)
        ang = pos[:, None] * base ** (-np.arange(hd // 2) * 2.0 / hd)[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if style == "norm":
            a, b = x[..., 0::2], x[..., 1::2]
        else:
            a, b = x[..., :hd // 2], x[..., hd // 2:]
        ra, rb = a * c - b * s, a * s + b * c
        out = np.empty_like(x)
        if style == "norm":
            out[..., 0::2], out[..., 1::2] = ra, rb
        else:
            out[..., :hd // 2], out[..., hd // 2:] = ra, rb
        return out

    n = len(ids)
    x = t["token_embd.weight"][np.asarray(ids)]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(n_layers):
        b = f"blk.{i}."
        h = norm(x, t[b + "attn_norm.weight"])
        q, k, v = (h @ t[b + f"attn_{m}.weight"].T + t.get(b + f"attn_{m}.bias", 0.0)
                   for m in "qkv")
        q, k = rope(q.reshape(n, nh, hd)), rope(k.reshape(n, nkv, hd))
        v = v.reshape(n, nkv, hd)
        att = np.empty((n, nh, hd))
        for head in range(nh):
            kv = head // (nh // nkv)
            scores = q[:, head] @ k[:, kv].T / np.sqrt(hd) + causal
            w = np.exp(scores - scores.max(axis=1, keepdims=True))
            att[:, head] = (w / w.sum(axis=1, keepdims=True)) @ v[:, kv]
        x = x + att.reshape(n, d) @ t[b + "attn_output.weight"].T
        h = norm(x, t[b + "ffn_norm.weight"])
        g, u = h @ t[b + "ffn_gate.weight"].T, h @ t[b + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ t[b + "ffn_down.weight"].T
    head = t.get("output.weight", t["token_embd.weight"])
    return norm(x, t["output_norm.weight"]) @ head.T
