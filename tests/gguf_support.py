"""Tiny GGUF models written at test time with ``gguf.GGUFWriter``: random weights (seeded), a
byte-level BPE vocabulary of the 256 bytes plus a few merges and ChatML's control tokens, of
the ``llama`` or ``qwen2`` architecture, matrices stored as F32, F16 or a block-quantized type
(the K-quants need rows of a multiple of 256 weights: ``d`` and ``ff``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "Ġt he", "i n", "Ġ a")


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


K_BLOCKS = {"Q4_K": (144, 4), "Q5_K": (176, 5), "Q6_K": (210, 6)}
"""K-quant types (bytes per 256-weight block, bits per weight), which ``gguf.quants`` reads
but cannot write: :func:`k_blocks` makes them."""


def k_blocks(qtype: str, rows: int, cols: int, scale: float, rng) -> np.ndarray:
    """Random ``qtype`` blocks [rows, cols / 256 * block bytes] whose weights are centred with
    standard deviation about ``scale``: random quants under one scale per block. Q4_K/Q5_K
    (``d * sc * q - dmin * m``): every 6-bit ``sc`` = 16 and ``m`` = 8 (scale bytes 80, 8 and
    0x80, packed as llama.cpp's get_scale_min_k4 reads them), ``dmin`` centres q's range;
    Q6_K (``d * sc * (q - 32)``): every int8 ``sc`` = 16."""
    nbytes, bits = K_BLOCKS[qtype]
    blocks = rng.integers(0, 256, (rows, cols // 256, nbytes), dtype=np.uint8)
    q_std = np.sqrt(((1 << bits) ** 2 - 1) / 12)  # a uniform quant's spread
    d = np.float16(scale / (16 * q_std))
    if qtype == "Q6_K":
        blocks[..., 192:208] = 16
        blocks[..., 208:210] = np.frombuffer(d.tobytes(), np.uint8)
    else:
        dmin = np.float16(float(d) * 16 * ((1 << bits) - 1) / 2 / 8)
        blocks[..., 0:2] = np.frombuffer(d.tobytes(), np.uint8)
        blocks[..., 2:4] = np.frombuffer(dmin.tobytes(), np.uint8)
        blocks[..., 4:8], blocks[..., 8:12], blocks[..., 12:16] = 80, 8, 0x80
    return blocks.reshape(rows, -1)


def write_tiny(path: Path, arch: str = "llama", qtype: str = "F32", *, seed: int = 0,
               layers: int = 2, d: int = 64, ff: int = 128, heads: int = 4, kv_heads: int = 2,
               context: int = 64, tied: bool | None = None, template: str = CHATML,
               pre: str | None = None, name: str = "Tiny Test Model") -> Path:
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    rng = np.random.default_rng(seed)
    tokens = byte_tokens() + ["".join(m.split(" ")) for m in MERGES] + list(SPECIALS)
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    vocab = len(tokens)
    tied = (arch == "llama") if tied is None else tied
    w = GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0 if arch == "llama" else 1e6)
    w.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre or ("smollm" if arch == "llama" else "qwen2"))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(MERGES))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    qt = GGMLQuantizationType[qtype]

    def matrix(name: str, rows: int, cols: int, scale: float) -> None:
        a = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qtype == "F32":
            w.add_tensor(name, a)
        elif qtype == "F16":
            w.add_tensor(name, a.astype(np.float16))
        elif qtype in K_BLOCKS:
            w.add_tensor(name, k_blocks(qtype, rows, cols, scale, rng), raw_dtype=qt)
        else:
            w.add_tensor(name, quants.quantize(a, qt), raw_dtype=qt)

    def vector(name: str, n: int, mean: float, scale: float) -> None:
        w.add_tensor(name, (mean + rng.standard_normal(n) * scale).astype(np.float32))

    hd = d // heads
    matrix("token_embd.weight", vocab, d, 1.0)
    vector("output_norm.weight", d, 1.0, 0.1)
    if not tied:
        matrix("output.weight", vocab, d, 0.1)
    for i in range(layers):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", d, 1.0, 0.1)
        vector(b + "ffn_norm.weight", d, 1.0, 0.1)
        matrix(b + "attn_q.weight", d, d, 0.2)
        matrix(b + "attn_k.weight", kv_heads * hd, d, 0.2)
        matrix(b + "attn_v.weight", kv_heads * hd, d, 0.2)
        matrix(b + "attn_output.weight", d, d, 0.1)
        matrix(b + "ffn_gate.weight", ff, d, 0.1)
        matrix(b + "ffn_up.weight", ff, d, 0.1)
        matrix(b + "ffn_down.weight", d, ff, 0.1)
        if arch == "qwen2":
            vector(b + "attn_q.bias", d, 0.0, 0.5)
            vector(b + "attn_k.bias", kv_heads * hd, 0.0, 0.5)
            vector(b + "attn_v.bias", kv_heads * hd, 0.0, 0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
