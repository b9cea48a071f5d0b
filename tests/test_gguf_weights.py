"""SmolLM2-135M's GGUF read into float32: the shape facts, loaded once per content address."""

from __future__ import annotations

import numpy as np

from models import gguf_weights


def test_config_is_smollm2_135m():
    c = gguf_weights.load().config
    assert (c.n_layers, c.d_model, c.d_ff, c.n_heads, c.n_kv_heads) == (30, 576, 1536, 9, 3)
    assert (c.vocab_size, c.head_dim, c.rope_base) == (49152, 64, 1e5)
    assert abs(c.norm_eps - 1e-5) < 1e-9


def test_loaded_once_by_content_address():
    a, b = gguf_weights.load(), gguf_weights.load()
    assert a is b
    assert a.address == gguf_weights.file_address(gguf_weights.default_path())
    assert len(a.address) == 64


def test_matrices_are_in_out_and_finite():
    w = gguf_weights.load()
    assert w.layer(0, "attn_k").shape == (576, 192)
    assert w.layer(29, "ffn_down").shape == (1536, 576)
    assert w.tensors["token_embd.weight"].shape == (576, 49152)  # the tied head, [in, out]
    for name in ("blk.0.attn_q.weight", "token_embd.weight", "output_norm.weight"):
        assert w.tensors[name].dtype == np.float32
        assert np.isfinite(w.tensors[name]).all()


def test_hf_order_inverts_the_converters_permute():
    """convert_hf_to_gguf.py's permute, applied to rows [out, in]; hf_order takes [in, out]."""
    rng = np.random.default_rng(0)
    n_heads, d = 3, 8 * 3
    hf = rng.standard_normal((d, 5)).astype(np.float32)  # [out, in], Hugging Face's order
    permuted = hf.reshape(n_heads, 2, d // n_heads // 2, 5).swapaxes(1, 2).reshape(d, 5)
    assert np.array_equal(gguf_weights.hf_order(permuted.T, n_heads).T, hf)


def _tiny(address: str) -> gguf_weights.LlamaWeights:
    from models.executor import digest_of

    c = gguf_weights.LlamaConfig(1, 4, 8, 2, 1, 1e4, 1e-5, 6, 16)
    rng = np.random.default_rng(2)
    tensors = {"token_embd.weight": rng.standard_normal((4, 6)).astype(np.float32),
               "output_norm.weight": np.ones(4, np.float32)}
    vocab = gguf_weights.Vocabulary(["a", "b"], [1, 3], ["a b"], 1, 1, "{{ x }}", "smollm")
    return gguf_weights.LlamaWeights(address, c, tensors,
                                     {"token_embd.weight": digest_of(tensors["token_embd.weight"])},
                                     vocab)


def test_the_cache_round_trips_and_a_partial_one_is_never_read(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_weights.CACHE_ENV, str(tmp_path))
    weights = _tiny("ab" * 32)
    target = tmp_path / f"{weights.address}.v{gguf_weights._CACHE_FORMAT}"
    (tmp_path / ".partial-x").mkdir()  # a writer that died: ignored, never renamed into place
    gguf_weights._write_cache(target, weights)
    back = gguf_weights._load_cached(tmp_path / "unused.gguf", weights.address)
    assert back.config == weights.config and back.vocab == weights.vocab
    assert back.digests == weights.digests
    for name, arr in weights.tensors.items():
        assert np.array_equal(back.tensors[name], arr)
        assert not back.tensors[name].flags.writeable
    assert sorted(p.name for p in tmp_path.iterdir()) == [".partial-x", target.name]
    gguf_weights._write_cache(target, weights)  # a second writer loses the race quietly
    assert sorted(p.name for p in tmp_path.iterdir()) == [".partial-x", target.name]
