"""A span's weight bundle (models.span.bundle): the blocks as the file stores them, kept
quantized by the worker (views of the bytes it was sent, multiplied by the same kernels as the
requester's), and refused with a clear error when its bytes do not fit its header, its
types or the call's shapes."""

from __future__ import annotations

import numpy as np
import pytest

from models import gguf_weights
from models import span as llama_span
from models.quant import QTensor
from swarm.runtime.actors import LlamaSpanActor, SpanConfig, check_span_forward
from tests.gguf_support import write_tiny

SIZE = {"d": 256, "ff": 512, "heads": 4, "kv_heads": 2, "context": 64}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bundles")
    return {q: gguf_weights.load(write_tiny(d / f"{q}.gguf", "qwen2", q, seed=i, layers=2,
                                            **SIZE))
            for i, q in enumerate(("Q4_K", "Q6_K", "Q8_0"))}


def _mixed(files) -> tuple[list[llama_span.Layer], np.ndarray, SpanConfig]:
    """Two layers of other block formats (as a Q4_K_M file mixes Q4_K, Q6_K, Q8_0 ...)."""
    layers = llama_span.model_layers(files["Q4_K"], 0, 1) + \
        llama_span.model_layers(files["Q6_K"], 1, 1)
    layers[1].matrices["attn_v"] = files["Q8_0"].matrices["blk.1.attn_v.weight"]
    c = files["Q4_K"].config
    return layers, llama_span.bundle_of(c, layers), SpanConfig.of(c)


def _params(c: SpanConfig, rows: int, count: int = 2) -> dict:
    return {"first": 0, "count": count, "config": c.params(), "seqs": [[1, 0, rows]],
            "drop": []}


def test_a_bundle_carries_the_files_blocks_and_the_worker_keeps_them_quantized(files):
    layers, flat, c = _mixed(files)
    stored = sum(a.nbytes for lw in layers for a in (*lw.matrices.values(), lw.attn_norm,
                                                       lw.ffn_norm, *lw.biases.values()))
    assert flat.dtype == np.uint8 and stored <= flat.nbytes <= stored + 64 * 2 * 12 + 128
    got = llama_span.unbundle(flat, c, 2)
    for want, lw in zip(layers, got, strict=True):
        for p in llama_span.PARTS:
            m = lw.matrices[p]
            assert isinstance(m, QTensor) and m.qtype == want.matrices[p].qtype
            assert np.array_equal(m.data, want.matrices[p].data)
            assert np.shares_memory(m.data, flat)  # a view of what was sent: no copy
        assert np.array_equal(lw.biases["attn_k"], want.biases["attn_k"])
        assert np.shares_memory(lw.attn_norm, flat)
    assert {lw.matrices["attn_v"].qtype.name for lw in got} == {"Q4_K", "Q8_0"}


def test_the_worker_computes_the_requesters_products_to_the_bit(files):
    """The worker's trace is what the requester's own kernels give on the same rows (decode
    and prefill paths), so a greedy text through spans is the local forward's."""
    layers, flat, c = _mixed(files)
    rng = np.random.default_rng(1)
    for rows in (1, 12):
        x = rng.standard_normal((rows, c.d_model)).astype(np.float32)
        check_span_forward([x, flat], _params(c, rows))
        (trace,) = LlamaSpanActor(None).forward([x, flat], _params(c, rows))
        products, want = llama_span.traced_products(c, layers, rows)
        seq = llama_span.Seq.start(rows, llama_span.KVCache(c, rows, layers=2))
        llama_span.run_layers(c, layers, x, [seq], products)
        assert np.array_equal(trace, want)


def _header(flat: np.ndarray) -> np.ndarray:
    return flat[:4 * (2 + 7 * 2)].view("<u4")


def test_bad_bundles_are_refused_naming_what_is_wrong(files):
    from gguf import GGMLQuantizationType as Q

    layers, flat, c = _mixed(files)
    x = np.zeros((1, c.d_model), np.float32)

    def retyped(part: int, to: int) -> np.ndarray:
        bad = flat.copy()
        _header(bad)[2 + part] = to
        return bad

    float32 = np.zeros(flat.nbytes // 4, np.float32)  # the old format
    magic = flat.copy()
    magic[0] ^= 1
    cases = [
        (float32, "a bundle is a uint8 vector"),
        (flat[:40], "starts with a 64-byte header"),
        (flat[:-1], f"is {flat.nbytes} bytes, got {flat.nbytes - 1}"),
        (np.concatenate([flat, np.zeros(64, np.uint8)]), "bytes, got"),
        (magic, "not a bundle of 2 layers"),
        (retyped(0, 999), "GGML type 999, which is unknown; supported: F32"),
        (retyped(0, int(Q.Q2_K)), "Q2_K is not supported; supported: F32"),
        (retyped(0, int(Q.Q6_K)), "bytes, got"),  # another size than the bytes sent
    ]
    for bad, needle in cases:
        with pytest.raises(ValueError, match=needle):
            check_span_forward([x, bad], _params(c, 1))
    with pytest.raises(ValueError, match="not a bundle of 1 layers"):
        check_span_forward([x, flat], _params(c, 1, count=1))
    # a format whose blocks do not tile the row (d_ff = 64 is no multiple of 256)
    small = SpanConfig.of(gguf_weights.LlamaConfig(**{**files["Q4_K"].config.__dict__,
                                                      "d_model": 64, "d_ff": 64}))
    with pytest.raises(ValueError, match="a Q4_K row holds a multiple of 256 weights"):
        check_span_forward([x[:, :64], flat], _params(small, 1))
