"""The numpy forward of SmolLM2-135M against llama.cpp (bench/llama_reference.json, written by
bench/llama_reference.py): top-1 tokens and logits at every position of four documents."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models import gguf_weights
from models.executor import LocalExecutor, Weight
from models.llama import Llama, apply_rope, rope_tables
from tests.conftest import ROOT

REFERENCE = json.loads((ROOT / "bench" / "llama_reference.json").read_text())



@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread(one_blas_thread):
    """Every test here runs on one BLAS thread (tests.conftest.one_blas_thread)."""

@pytest.fixture(scope="module")
def model() -> Llama:
    return Llama(gguf_weights.load())


@pytest.fixture(scope="module")
def logits(model) -> list[np.ndarray]:
    return [model.forward(d["ids"], model.new_cache(), all_logits=True)
            for d in REFERENCE["documents"]]


def _compare(logits, key):
    agree = total = 0
    worst = 0.0
    for lg, doc in zip(logits, REFERENCE["documents"], strict=True):
        ref_ids, ref = np.array(doc[key]["top_ids"]), np.array(doc[key]["top_logits"])
        agree += int((lg.argmax(1) == ref_ids[:, 0]).sum())
        total += len(ref_ids)
        worst = max(worst, float(np.abs(np.take_along_axis(lg, ref_ids, 1) - ref).max()))
    return agree, total, worst


def test_agrees_with_llama_cpp_on_the_same_float32_weights(logits):
    """llama.cpp on the dequantized weights (F32 GGUF, F32 KV cache) computes the same model:
    measured 547/547 top-1, largest logit difference 1.1e-4."""
    agree, total, worst = _compare(logits, "float32")
    assert total >= 500
    assert agree / total >= 0.99, f"top-1 agreement {agree}/{total}"
    assert worst < 1e-3, f"largest logit difference {worst}"


def test_agrees_with_llama_cpp_on_the_shipped_file_within_its_rounding(logits):
    """llama.cpp on the Q4_1 file as shipped rounds every product's activations to 8 bits;
    measured 527/547 top-1 (96.3%), largest logit difference 1.12, and every disagreement at
    a position where llama.cpp's own two best tokens are within 0.17 of each other."""
    agree, total, worst = _compare(logits, "shipped")
    assert agree / total >= 0.95, f"top-1 agreement {agree}/{total}"
    assert worst < 2.0
    for lg, doc in zip(logits, REFERENCE["documents"], strict=True):
        ref_ids, ref = np.array(doc["shipped"]["top_ids"]), np.array(doc["shipped"]["top_logits"])
        ours = lg.argmax(1)
        for pos in np.flatnonzero(ours != ref_ids[:, 0]):
            assert ref[pos, 0] - ref[pos, 1] < 0.5, f"a clear llama.cpp choice differs at {pos}"
            assert ours[pos] in ref_ids[pos, :3]


def test_cache_gives_the_same_logits_as_one_pass(model):
    ids = REFERENCE["documents"][0]["ids"][:40]
    whole = model.forward(ids, model.new_cache(), all_logits=True)
    cache = model.new_cache(capacity=4)  # grows while decoding
    step = [model.forward(ids[:25], cache)]
    step += [model.forward([t], cache) for t in ids[25:]]
    assert cache.length == 40 and cache.capacity >= 40
    np.testing.assert_allclose(np.stack(step), whole[24:], atol=2e-4)


def test_rope_on_permuted_weights_equals_rotate_half_on_hugging_faces(model):
    """The converter's Q/K permutation (the trap): adjacent-pair rotation on the GGUF's rows
    gives the same attention scores as rotate-half on the rows put back in HF's order."""
    w, c = model.weights, model.config
    rng = np.random.default_rng(1)
    h = rng.standard_normal((6, c.d_model)).astype(np.float32)
    cos, sin = rope_tables(c, np.arange(6))
    q = apply_rope((h @ w.layer(3, "attn_q")).reshape(6, c.n_heads, -1), cos, sin)
    k = apply_rope((h @ w.layer(3, "attn_k")).reshape(6, c.n_kv_heads, -1), cos, sin)

    def rotate_half(x):
        half = x.shape[-1] // 2
        cc, ss = np.concatenate([cos, cos], -1)[:, None], np.concatenate([sin, sin], -1)[:, None]
        return x * cc + np.concatenate([-x[..., half:], x[..., :half]], -1) * ss

    q_hf = rotate_half((h @ gguf_weights.hf_order(w.layer(3, "attn_q"), c.n_heads))
                       .reshape(6, c.n_heads, -1))
    k_hf = rotate_half((h @ gguf_weights.hf_order(w.layer(3, "attn_k"), c.n_kv_heads))
                       .reshape(6, c.n_kv_heads, -1))
    scores = np.einsum("thd,shd->hts", q[:, ::3], k)
    np.testing.assert_allclose(np.einsum("thd,shd->hts", q_hf[:, ::3], k_hf), scores,
                               rtol=1e-4, atol=1e-3)
    # and the rotation is not a no-op: without it (or with the wrong pairing) scores move
    assert not np.allclose(np.einsum("thd,shd->hts", rotate_half(
        (h @ w.layer(3, "attn_q")).reshape(6, c.n_heads, -1))[:, ::3], rotate_half(
        (h @ w.layer(3, "attn_k")).reshape(6, c.n_kv_heads, -1))), scores, atol=1e-2)


class Recording(LocalExecutor):
    def __init__(self, corrupt: str = ""):
        self.calls: list[list[str]] = []
        self.corrupt = corrupt

    def matmuls(self, products):
        self.calls.append([p.w.name for p in products])
        out = super().matmuls(products)
        return [y + 1 if p.w.name == self.corrupt else y
                for p, y in zip(products, out, strict=True)]


def test_every_weight_product_goes_through_the_executor(model):
    ex = Recording()
    m = Llama(model.weights, ex)
    ids = [504, 1463, 282]
    np.testing.assert_array_equal(m.forward(ids, m.new_cache()),
                                  model.forward(ids, model.new_cache()))
    assert len(ex.calls) == 4 * 30 + 1
    assert ex.calls[0] == ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]
    assert ex.calls[-1] == ["token_embd.weight"]
    used = {n for call in ex.calls for n in call}
    assert used == {w.name for w in m.matrices()} and len(used) == 7 * 30 + 1
    assert all(isinstance(w, Weight) and len(w.digest) == 64 for w in m.matrices())
    bad = Llama(model.weights, Recording(corrupt="blk.7.ffn_down.weight"))
    assert not np.allclose(bad.forward(ids, bad.new_cache()), m.forward(ids, m.new_cache()))


@pytest.mark.parametrize("ids, needle", [([], "at least one token"), ([49152], r"\[0, 49152\)"),
                                         ([-1], r"\[0, 49152\)")])
def test_bad_ids_are_refused(model, ids, needle):
    with pytest.raises(ValueError, match=needle):
        model.forward(ids, model.new_cache())


def test_the_context_is_a_hard_limit(model):
    cache = model.new_cache()
    cache.length = model.config.context_length - 1
    with pytest.raises(ValueError, match="context of 8192 tokens"):
        cache.reserve(2)


def test_a_batch_of_sequences_equals_each_alone(model):
    """Three sequences at different points (a prompt, a decode step, a second chunk) in one
    pass: one product per weight for all their rows, each its own cache and positions."""
    docs = [d["ids"] for d in REFERENCE["documents"]]
    alone, caches = [], []
    for ids, fed in ((docs[0][:12], 0), (docs[1][:9], 8), (docs[2][:20], 15)):
        ref_cache, cache = model.new_cache(), model.new_cache(capacity=4)
        if fed:
            model.forward(ids[:fed], ref_cache)
            model.forward(ids[:fed], cache)
        alone.append(model.forward(ids[fed:], ref_cache, all_logits=True))
        caches.append((ids[fed:], cache))
    ex = Recording()
    together = Llama(model.weights, ex).forward_batch(caches, all_logits=True)
    assert len(ex.calls) == 4 * 30 + 1  # one pass for all three
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-4)
    assert [c.length for _, c in caches] == [12, 9, 20]
    last = Llama(model.weights).forward_batch(
        [([5], model.new_cache()), ([7, 8], model.new_cache())])
    assert [x.shape for x in last] == [(49152,), (49152,)]
    cache = model.new_cache()
    with pytest.raises(ValueError, match="its own cache"):
        model.forward_batch([([1], cache), ([2], cache)])
