"""Continuous batching (models.batching): sequences streamed from one forward run in one
batch, a new one joining at the next step; each gets the tokens it would get alone."""

from __future__ import annotations

import pytest

from models.batching import batcher
from models.generate import Usage, generator

PROMPTS = ["Say hello.", "What is the capital of France?",
           "Count from 1 to 100, one number a line."]


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread(one_blas_thread):
    """Every test here runs on one BLAS thread (tests.conftest.one_blas_thread)."""


@pytest.fixture(scope="module")
def gen():
    return generator()


def alone(gen, prompt: str, **kw) -> list:
    return list(gen.stream(gen.chat_prompt([{"role": "user", "content": prompt}]), **kw))


def test_a_sequence_joins_the_running_batch_and_each_gets_its_tokens_alone(gen):
    kw = [dict(max_tokens=40), dict(max_tokens=16, stop=["Paris"]),
          dict(max_tokens=12, temperature=0.9, seed=5)]
    want = [alone(gen, p, **k) for p, k in zip(PROMPTS, kw, strict=True)]
    stats = batcher(gen).stats
    before = (stats.steps, stats.joined_running)
    usages = [Usage() for _ in PROMPTS]
    first = gen.stream_batched(gen.chat_prompt([{"role": "user", "content": PROMPTS[0]}]),
                               usage=usages[0], **kw[0])
    got0 = [next(first), next(first)]  # the first is running ...
    rest = [gen.stream_batched(gen.chat_prompt([{"role": "user", "content": p}]),
                               usage=u, **k)
            for p, u, k in zip(PROMPTS[1:], usages[1:], kw[1:], strict=True)]
    got = [got0 + list(first)] + [list(r) for r in rest]  # ... when the others join it
    assert [[p.token for p in g] for g in got] == [[p.token for p in w] for w in want]
    assert ["".join(p.text for p in g) for g in got] == \
        ["".join(p.text for p in w) for w in want]
    assert [g[-1].finish_reason for g in got] == [w[-1].finish_reason for w in want]
    assert [u.completion_tokens for u in usages] == [len(w) for w in want]
    assert stats.joined_running - before[1] == 2 and stats.widest >= 3
    # one step per token of the longest, not one per token of each
    assert stats.steps - before[0] < sum(len(w) for w in want)


def test_a_reader_that_leaves_drops_out_and_the_others_go_on(gen):
    want = alone(gen, PROMPTS[0], max_tokens=20)
    ids = [gen.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS[:2]]
    keep = gen.stream_batched(ids[0], max_tokens=20)
    leave = gen.stream_batched(ids[1], max_tokens=200)
    got = [next(keep)]
    next(leave)
    leave.close()
    got += list(keep)
    assert [p.token for p in got] == [p.token for p in want]


def test_a_failing_forward_fails_each_sequence_of_that_step_with_its_error(gen):
    from models.batching import Batcher
    from models.generate import Generator

    class Broken:
        config = gen.model.config

        def new_cache(self, capacity):
            return gen.model.new_cache(capacity)

        def forward_batch(self, items):
            raise RuntimeError("the workers are gone")

    b = Batcher(Broken())
    g = Generator(gen.model, gen.tokenizer)
    streams = [b.stream(*g.prepare([1, 2, 3], max_tokens=4)) for _ in range(2)]
    for s in streams:
        with pytest.raises(RuntimeError, match="the workers are gone"):
            list(s)
