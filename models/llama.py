"""A numpy forward pass of a Llama decoder (SmolLM2-135M) with a KV cache.

Every product with a weight matrix goes through the executor (models.executor: local numpy,
or the swarm), a layer's independent products in one call (Q, K and V; gate and up); the
non-linear steps (RMSNorm, RoPE, softmax, SwiGLU) and the attention products with the cache
run here, on the requester. The arithmetic follows
llama.cpp's for the same file: RMSNorm ``x / sqrt(mean(x^2) + eps) * w``, rotary pairs that
sit side by side (GGUF's permuted Q/K, see models.gguf_weights), query head h reading KV head
``h // (n_heads / n_kv_heads)``, SiLU-gated FFN, tied output head.
"""

from __future__ import annotations

import numpy as np

from models.executor import Executor, LocalExecutor, Product
from models.gguf_weights import LlamaConfig, LlamaWeights


class KVCache:
    """Keys and values of one sequence, every layer: [layers, kv_heads, positions, head_dim].
    Grows by doubling up to the model's context, so a short chat holds a short cache."""

    def __init__(self, config: LlamaConfig, capacity: int = 256):
        self.config = config
        self.length = 0
        self._alloc(min(capacity, config.context_length))

    def _alloc(self, capacity: int) -> None:
        c = self.config
        shape = (c.n_layers, c.n_kv_heads, capacity, c.head_dim)
        k, v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        if self.length:
            k[:, :, :self.length] = self.k[:, :, :self.length]
            v[:, :, :self.length] = self.v[:, :, :self.length]
        self.k, self.v = k, v

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

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


def rope_tables(config: LlamaConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, [len(positions), head_dim / 2], for llama.cpp's adjacent-pair rotation."""
    half = config.head_dim // 2
    inv_freq = config.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / config.head_dim)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate each adjacent pair (2i, 2i+1) of x [tokens, heads, head_dim] by its angle."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    scale = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
    return (x * scale) * w


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x: silu -> -0
        return x / (1.0 + np.exp(-x))


_PARTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


class Llama:
    """The forward pass; ``executor`` computes every weight product (default: numpy here)."""

    def __init__(self, weights: LlamaWeights, executor: Executor | None = None):
        self.weights = weights
        self.config = weights.config
        self.executor = executor or LocalExecutor()
        self._head = weights.weight("token_embd.weight")  # [d, vocab]: tied embeddings
        self._layers = [{p: weights.weight(f"blk.{i}.{p}.weight") for p in _PARTS}
                        for i in range(self.config.n_layers)]

    def matrices(self) -> list:
        """Every weight the executor will be handed (for ``Executor.prepare``)."""
        return [w for layer in self._layers for w in layer.values()] + [self._head]

    def _mm(self, *products: Product) -> list[np.ndarray]:
        return self.executor.matmuls(products)

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.config, capacity)

    def forward(self, ids: np.ndarray | list[int], cache: KVCache, *,
                all_logits: bool = False) -> np.ndarray:
        """Feed ``ids`` after what ``cache`` holds; return the logits of the last position
        ([vocab]) or, with ``all_logits``, of every new position ([len(ids), vocab])."""
        ids = np.asarray(ids, dtype=np.int64)
        c, w = self.config, self.weights
        n = len(ids)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"token ids must lie in [0, {c.vocab_size})")
        cache.reserve(n)
        start = cache.length
        end = start + n
        cos, sin = rope_tables(c, np.arange(start, end))
        hd, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
        group = nh // nkv
        scale = np.float32(1.0 / np.sqrt(hd))
        # causal mask over the cached positions plus the new ones: new token t sees [0, start+t]
        mask = np.where(np.arange(end)[None, :] <= np.arange(start, end)[:, None],
                        np.float32(0), np.float32(-np.inf))
        x = np.ascontiguousarray(self._head.array[:, ids].T)  # [n, d]
        for i in range(c.n_layers):
            lw = self._layers[i]
            h = rms_norm(x, w.layer(i, "attn_norm"), c.norm_eps)
            q, k, v = self._mm(Product(h, lw["attn_q"]), Product(h, lw["attn_k"]),
                               Product(h, lw["attn_v"]))
            q = apply_rope(q.reshape(n, nh, hd), cos, sin)
            k = apply_rope(k.reshape(n, nkv, hd), cos, sin)
            v = v.reshape(n, nkv, hd)
            cache.k[i, :, start:end] = k.transpose(1, 0, 2)
            cache.v[i, :, start:end] = v.transpose(1, 0, 2)
            keys, values = cache.k[i, :, :end], cache.v[i, :, :end]  # [nkv, end, hd]
            qg = q.transpose(1, 0, 2).reshape(nkv, group * n, hd)  # heads grouped by KV head
            scores = (qg @ keys.transpose(0, 2, 1)).reshape(nkv, group, n, end) * scale
            scores += mask
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            attn = (p.reshape(nkv, group * n, end) @ values).reshape(nh, n, hd)
            attn = attn.transpose(1, 0, 2).reshape(n, nh * hd)
            (o,) = self._mm(Product(np.ascontiguousarray(attn), lw["attn_output"]))
            x = x + o
            h = rms_norm(x, w.layer(i, "ffn_norm"), c.norm_eps)
            gate, up = self._mm(Product(h, lw["ffn_gate"]), Product(h, lw["ffn_up"]))
            (down,) = self._mm(Product(silu(gate) * up, lw["ffn_down"]))
            x = x + down
        cache.length = end
        out = x if all_logits else x[-1:]
        out = rms_norm(out, w.tensors["output_norm.weight"], c.norm_eps)
        (logits,) = self._mm(Product(out, self._head))
        return logits if all_logits else logits[0]
