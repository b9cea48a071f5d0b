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

from dataclasses import dataclass

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
        return self.forward_batch([(ids, cache)], all_logits=all_logits)[0]

    def forward_batch(self, batch: list[tuple[np.ndarray | list[int], KVCache]], *,
                      all_logits: bool = False) -> list[np.ndarray]:
        """Several sequences in one pass: their rows go through each weight product
        together (one product per weight for the whole batch), attention runs per sequence
        against its own cache. Returns each sequence's logits as ``forward`` does."""
        c, w = self.config, self.weights
        if not batch:
            raise ValueError("forward_batch needs at least one sequence")
        if len({id(cache) for _, cache in batch}) != len(batch):
            raise ValueError("each sequence in a batch needs its own cache")
        seqs = [_Seq.start(np.asarray(ids, dtype=np.int64), cache, c) for ids, cache in batch]
        hd, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
        group = nh // nkv
        scale = np.float32(1.0 / np.sqrt(hd))
        ids = np.concatenate([s.ids for s in seqs])
        x = np.ascontiguousarray(self._head.array[:, ids].T)  # [rows, d]
        bounds = np.cumsum([0] + [len(s.ids) for s in seqs])
        for i in range(c.n_layers):
            lw = self._layers[i]
            h = rms_norm(x, w.layer(i, "attn_norm"), c.norm_eps)
            q_all, k_all, v_all = self._mm(Product(h, lw["attn_q"]), Product(h, lw["attn_k"]),
                                           Product(h, lw["attn_v"]))
            attn = np.empty_like(q_all)
            for s, lo, hi in zip(seqs, bounds[:-1], bounds[1:], strict=True):
                n, cache = hi - lo, s.cache
                q = apply_rope(q_all[lo:hi].reshape(n, nh, hd), s.cos, s.sin)
                k = apply_rope(k_all[lo:hi].reshape(n, nkv, hd), s.cos, s.sin)
                cache.k[i, :, s.begin:s.end] = k.transpose(1, 0, 2)
                cache.v[i, :, s.begin:s.end] = v_all[lo:hi].reshape(n, nkv, hd).transpose(1, 0, 2)
                keys, values = cache.k[i, :, :s.end], cache.v[i, :, :s.end]  # [nkv, end, hd]
                qg = q.transpose(1, 0, 2).reshape(nkv, group * n, hd)  # heads by KV head
                scores = (qg @ keys.transpose(0, 2, 1)).reshape(nkv, group, n, s.end) * scale
                scores += s.mask
                scores -= scores.max(axis=-1, keepdims=True)
                p = np.exp(scores)
                p /= p.sum(axis=-1, keepdims=True)
                out = (p.reshape(nkv, group * n, s.end) @ values).reshape(nh, n, hd)
                attn[lo:hi] = out.transpose(1, 0, 2).reshape(n, nh * hd)
            (o,) = self._mm(Product(attn, lw["attn_output"]))
            x = x + o
            h = rms_norm(x, w.layer(i, "ffn_norm"), c.norm_eps)
            gate, up = self._mm(Product(h, lw["ffn_gate"]), Product(h, lw["ffn_up"]))
            (down,) = self._mm(Product(silu(gate) * up, lw["ffn_down"]))
            x = x + down
        for s in seqs:
            s.cache.length = s.end
        rows = np.arange(len(ids)) if all_logits else bounds[1:] - 1
        out = rms_norm(x[rows], w.tensors["output_norm.weight"], c.norm_eps)
        (logits,) = self._mm(Product(out, self._head))
        if all_logits:
            return [logits[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        return list(logits)


@dataclass
class _Seq:
    """One sequence's part of a pass: its new ids, where they go in its cache, its RoPE
    angles and causal mask (new token t sees cached positions [0, begin + t])."""

    ids: np.ndarray
    cache: KVCache
    begin: int
    end: int
    cos: np.ndarray
    sin: np.ndarray
    mask: np.ndarray

    @classmethod
    def start(cls, ids: np.ndarray, cache: KVCache, c: LlamaConfig) -> _Seq:
        if len(ids) == 0:
            raise ValueError("forward needs at least one token")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"token ids must lie in [0, {c.vocab_size})")
        cache.reserve(len(ids))
        begin, end = cache.length, cache.length + len(ids)
        cos, sin = rope_tables(c, np.arange(begin, end))
        mask = np.where(np.arange(end)[None, :] <= np.arange(begin, end)[:, None],
                        np.float32(0), np.float32(-np.inf))
        return cls(ids, cache, begin, end, cos, sin, mask)
