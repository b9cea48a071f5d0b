"""Generation with SmolLM2-135M: greedy and seeded sampling, the three ways to stop, streamed
text, and requests refused before any work with the limit named."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models import gguf_weights
from models.generate import GenerationError, Generator, _safe_end
from models.llama import Llama
from models.sampling import Sampler, Sampling
from models.tokenizer_bpe import BPETokenizer

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
HAIKU = [{"role": "user", "content": "Write a haiku about the sea."}]



@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread(one_blas_thread):
    """Every test here runs on one BLAS thread (tests.conftest.one_blas_thread)."""

@pytest.fixture(scope="module")
def gen() -> Generator:
    w = gguf_weights.load()
    return Generator(Llama(w), BPETokenizer(w.vocab))


def test_the_capital_of_france_is_paris(gen):
    text, reason = gen.complete(gen.chat_prompt(FRANCE), max_tokens=24)
    assert "Paris" in text
    assert reason == "stop"  # it ended its turn (<|im_end|>, the EOS) on its own


def test_greedy_is_the_argmax_of_the_forward(gen):
    ids = gen.chat_prompt(HAIKU)
    pieces = list(gen.stream(ids, max_tokens=6))
    cache = gen.model.new_cache()
    logits = gen.model.forward(ids, cache)
    want = []
    for _ in range(6):
        want.append(int(np.argmax(logits)))
        logits = gen.model.forward([want[-1]], cache)
    assert [p.token for p in pieces] == want
    assert pieces[-1].finish_reason == "length"
    assert "".join(p.text for p in pieces) == gen.tokenizer.decode(want)


def test_same_seed_same_text_other_seeds_other_text(gen):
    ids = gen.chat_prompt(HAIKU)
    kw = dict(max_tokens=8, temperature=0.9, top_p=0.95)
    a = gen.complete(ids, seed=7, **kw)
    assert gen.complete(ids, seed=7, **kw) == a
    others = {gen.complete(ids, seed=s, **kw)[0] for s in (8, 9)}
    assert others - {a[0]}, "sampling ignored the seed"


def test_max_tokens_counts_tokens_and_usage_is_reported(gen):
    from models.generate import Usage
    usage = Usage()
    pieces = list(gen.stream("Once upon a time", max_tokens=5, usage=usage))
    assert len(pieces) == 5 and pieces[-1].finish_reason == "length"
    assert usage.prompt_tokens == len(gen.tokenizer.encode("Once upon a time"))
    assert usage.completion_tokens == 5


def test_a_stop_string_ends_the_text_before_it(gen):
    ids = gen.chat_prompt(FRANCE)
    full, _ = gen.complete(ids, max_tokens=24)
    assert " is " in full
    pieces = list(gen.stream(ids, max_tokens=24, stop=[" is "]))
    text = "".join(p.text for p in pieces)
    assert text == full[:full.index(" is ")]
    assert pieces[-1].finish_reason == "stop"
    assert all(" is" not in p.text for p in pieces)  # held back, never sent


def test_streamed_text_never_splits_a_character():
    assert _safe_end("ab\ufffd", []) == 2
    assert _safe_end("hello wor", ["world"]) == 6
    assert _safe_end("hello", ["xyz"]) == 5


@pytest.mark.parametrize("kw, needle", [
    (dict(max_tokens=0), "max_tokens must be an integer from 1 to"),
    (dict(max_tokens=10**9), "from 1 to 8191 .*context of 8192"),
    (dict(max_tokens=True), "max_tokens"),
    (dict(max_tokens=2.5), "max_tokens"),
    (dict(temperature=-0.1), "temperature must be a number from 0 to 2"),
    (dict(temperature=2.5), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p=1.5), "top_p"),
    (dict(seed=-1), "seed"),
    (dict(stop=[""]), "stop must be a list of non-empty strings"),
    (dict(stop="x"), "stop must be a list"),
])
def test_bad_requests_are_refused(gen, kw, needle):
    with pytest.raises(GenerationError, match=needle):
        next(gen.stream("Hello", **kw))


def test_empty_prompt_is_refused(gen):
    with pytest.raises(GenerationError, match="prompt is empty"):
        next(gen.stream(""))


def test_a_prompt_over_the_context_is_refused_naming_it(gen):
    with pytest.raises(GenerationError, match="8192 tokens; the model's context is 8192"):
        next(gen.stream([100] * 8192))


def test_top_p_keeps_only_the_nucleus():
    logits = np.log(np.array([0.6, 0.3, 0.05, 0.05]))
    picks = {Sampler(Sampling(1.0, 0.5, seed))(logits) for seed in range(50)}
    assert picks == {0}
    picks = {Sampler(Sampling(1.0, 0.85, seed))(logits) for seed in range(200)}
    assert picks == {0, 1}
    counts = np.bincount([Sampler(Sampling(1.0, 1.0, s))(logits) for s in range(2000)],
                         minlength=4) / 2000
    np.testing.assert_allclose(counts, [0.6, 0.3, 0.05, 0.05], atol=0.04)
