"""A numpy forward pass of a Llama-family decoder (SmolLM2, Qwen2.5; models.archs) with a KV
cache.

Every product with a weight matrix goes through the executor (models.executor: local numpy,
or the swarm), a layer's independent products in one call (Q, K and V; gate and up); the
non-linear steps (RMSNorm, RoPE, softmax, SwiGLU) and the attention products with the cache
run here, on the requester. The arithmetic follows
llama.cpp's for the same file: RMSNorm ``x / sqrt(mean(x^2) + eps) * w``, rotary pairs that
sit side by side for Llama files (GGUF's permuted Q/K, see models.gguf_weights) or halves apart
for Qwen2 (``rope_style``), Q/K/V biases where the file has them, query head h reading KV head
``h // (n_heads / n_kv_heads)``, SiLU-gated FFN, the output head tied to the embeddings or not.
"""

from __future__ import annotations

import numpy as np

from models.executor import Executor, LocalExecutor, Product
from models.gguf_weights import LlamaConfig, LlamaWeights
from models.span import (
    PARTS,
    KVCache,
    Layer,
    Seq,
    apply_rope,
    biases,
    layer_products,
    model_layers,
    rms_norm,
    rope_tables,
    run_layers,
)

__all__ = ["KVCache", "Llama", "apply_rope", "rms_norm", "rope_tables"]


class Llama:
    """The forward pass; ``executor`` computes every weight product (default: numpy here)."""

    def __init__(self, weights: LlamaWeights, executor: Executor | None = None):
        self.weights = weights
        self.config = weights.config
        self.executor = executor or LocalExecutor()
        self._embd = weights.matrices["token_embd.weight"]  # [vocab, d]: rows by token
        self._head = weights.weight(weights.head)  # [d, vocab] as an operand
        self._layers = [{p: weights.weight(f"blk.{i}.{p}.weight") for p in PARTS}
                        for i in range(self.config.n_layers)]
        self._quantized = model_layers(weights, 0, self.config.n_layers)

    def matrices(self) -> list:
        """Every weight the executor will be handed (for ``Executor.prepare``)."""
        return [w for layer in self._layers for w in layer.values()] + [self._head]

    def _mm(self, *products: Product) -> list[np.ndarray]:
        return self.executor.matmuls(products)

    def layers(self, x: np.ndarray, seqs: list[Seq], first: int, count: int) -> np.ndarray:
        """Blocks ``[first, first + count)`` over the residual stream ``x`` (the executor
        computes their products); a subclass runs them elsewhere (swarm.spans)."""
        w = self.weights
        if type(self.executor) is LocalExecutor:  # the kernels here, as a span's worker
            # runs them (models.span.layer_products): no Product and Weight per product
            layers = self._quantized[first:first + count]

            def products(j: int, pairs: list) -> list[np.ndarray]:
                return layer_products(layers[j], pairs)

            return run_layers(self.config, layers, x, seqs, products, cache_first=first)
        layers = [Layer(w.layer(i, "attn_norm"), w.layer(i, "ffn_norm"), self._layers[i],
                        biases(w, i)) for i in range(first, first + count)]

        def products(j: int, pairs: list) -> list[np.ndarray]:
            return self._mm(*(Product(x, layers[j].matrices[p]) for p, x in pairs))

        return run_layers(self.config, layers, x, seqs, products, cache_first=first)

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
        starts = [_start(np.asarray(ids, dtype=np.int64), cache, c) for ids, cache in batch]
        seqs = [s for _, s in starts]
        ids = np.concatenate([i for i, _ in starts])
        x = self._embd.rows(ids)  # [rows, d] float32
        bounds = np.cumsum([0] + [len(i) for i, _ in starts])
        x = self.layers(x, seqs, 0, c.n_layers)
        for s in seqs:
            s.cache.length = s.end
        rows = np.arange(len(ids)) if all_logits else bounds[1:] - 1
        out = rms_norm(x[rows], w.vectors["output_norm.weight"], c.norm_eps)
        (logits,) = self._mm(Product(out, self._head))
        if all_logits:
            return [logits[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        return list(logits)


def _start(ids: np.ndarray, cache: KVCache, c: LlamaConfig) -> tuple[np.ndarray, Seq]:
    if len(ids) == 0:
        raise ValueError("forward needs at least one token")
    if ids.min() < 0 or ids.max() >= c.vocab_size:
        raise ValueError(f"token ids must lie in [0, {c.vocab_size})")
    return ids, Seq.start(len(ids), cache)
