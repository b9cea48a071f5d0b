"""What every decoder architecture module declares, and the one reading of its
hyper-parameters from a GGUF's metadata that they share (the Llama family: pre-norm blocks of
grouped-query attention with RoPE and a SwiGLU FFN; models.llama runs them)."""

from __future__ import annotations

from dataclasses import dataclass

from models.gguf_file import ModelFile, WeightsError

ROPE_STYLES = ("norm", "neox")
"""How RoPE pairs a head's dimensions: ``norm`` rotates adjacent pairs (2i, 2i+1), as llama.cpp
does for Llama files (whose converter permuted Q and K rows); ``neox`` rotates (i, i + d/2)."""


@dataclass(frozen=True)
class LlamaConfig:
    """The shape facts a forward needs, every one read from the file's metadata."""

    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    rope_base: float
    norm_eps: float
    vocab_size: int
    context_length: int
    rope_style: str = "norm"
    rope_scale: float = 1.0
    """Positions are multiplied by this before the angles (linear RoPE scaling: 1 / factor)."""
    rope_freqs: tuple[float, ...] | None = None
    """Per-frequency divisors (a ``rope_freqs.weight`` tensor: Llama 3's long-context scaling)."""
    qkv_bias: bool = False
    tied_output: bool = True
    """The output head is the token embedding matrix (no ``output.weight``)."""

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class Architecture:
    """One ``general.architecture`` this code runs: how its file differs from plain Llama."""

    name: str
    rope_style: str
    qkv_bias: bool = False
    """Q, K and V carry biases in every block (required; a Llama file may have them too)."""

    def config(self, f: ModelFile) -> LlamaConfig:
        k = f.arch_key
        d, n_heads = int(k("embedding_length")), int(k("attention.head_count"))
        n_kv = int(k("attention.head_count_kv", n_heads))
        if d % n_heads or n_heads % n_kv or (d // n_heads) % 2:
            raise WeightsError(f"{f.path.name}: {n_heads} heads and {n_kv} KV heads do not "
                               f"divide a width of {d} into even head sizes")
        hd = d // n_heads
        for key in ("attention.key_length", "attention.value_length", "rope.dimension_count"):
            if int(k(key, hd)) != hd:
                raise WeightsError(f"{f.path.name}: {self.name}.{key} = {k(key)} differs from "
                                   f"the head size {hd}: not supported")
        scaling = str(k("rope.scaling.type", "none"))
        if scaling == "linear":
            scale = 1.0 / float(k("rope.scaling.factor"))
        elif scaling in ("none", ""):
            scale = 1.0
        else:
            raise WeightsError(f"{f.path.name}: RoPE scaling {scaling!r} is not supported "
                               "(none, linear)")
        return LlamaConfig(
            n_layers=int(k("block_count")), d_model=d, d_ff=int(k("feed_forward_length")),
            n_heads=n_heads, n_kv_heads=n_kv, rope_base=float(k("rope.freq_base", 10000.0)),
            norm_eps=float(k("attention.layer_norm_rms_epsilon")),
            vocab_size=int(k("vocab_size", len(f.vocab.tokens))),
            context_length=int(k("context_length")), rope_style=self.rope_style,
            rope_scale=scale, qkv_bias=self.qkv_bias or "blk.0.attn_q.bias" in f.tensors,
            tied_output="output.weight" not in f.tensors)

    def shapes(self, c: LlamaConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward reads, by GGUF name, in numpy order ([out, in])."""
        kv = c.n_kv_heads * c.head_dim
        want: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.vocab_size, c.d_model),
                                            "output_norm.weight": (c.d_model,)}
        if not c.tied_output:
            want["output.weight"] = (c.vocab_size, c.d_model)
        for i in range(c.n_layers):
            b = f"blk.{i}."
            want |= {b + "attn_norm.weight": (c.d_model,), b + "ffn_norm.weight": (c.d_model,),
                     b + "attn_q.weight": (c.d_model, c.d_model),
                     b + "attn_k.weight": (kv, c.d_model), b + "attn_v.weight": (kv, c.d_model),
                     b + "attn_output.weight": (c.d_model, c.d_model),
                     b + "ffn_gate.weight": (c.d_ff, c.d_model),
                     b + "ffn_up.weight": (c.d_ff, c.d_model),
                     b + "ffn_down.weight": (c.d_model, c.d_ff)}
            if c.qkv_bias:
                want |= {b + "attn_q.bias": (c.d_model,), b + "attn_k.bias": (kv,),
                         b + "attn_v.bias": (kv,)}
        return want
