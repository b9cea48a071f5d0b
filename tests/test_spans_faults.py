"""A span's worker lost mid-generation (swarm.spans), on real local swarms whose workers die
abruptly (``crash_after``: ``os._exit`` on receiving a call): its span is re-placed by
swarm.placement's rule over the live workers' room and the text goes on unchanged; when no
live worker has room, the request fails naming the shortfall (SpanLost; exit 1 from
``swarm generate``, HTTP 503 from /v1/chat/completions); workers that keep taking the span and
dying cannot keep a sequence being rebuilt for ever."""

from __future__ import annotations

import numpy as np
import pytest

import swarm
from models import gguf_weights
from models.llama import Llama
from swarm.placement import Offer
from swarm.spans import SpanLlama, SpanLost, block_bytes, cache_bytes
from tests.conftest import run_swarm, subprocess_env
from tests.spans_support import chat, greedy

pytestmark = [pytest.mark.system]

MIB = 1 << 20
PROMPT = [1, 30, 23, 1004, 28, 5, 42, 2919]
TOKENS = 12


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread(one_blas_thread):
    """Every test here runs on one BLAS thread (tests.conftest.one_blas_thread)."""


@pytest.fixture(scope="module")
def weights():
    return gguf_weights.load()


@pytest.fixture(scope="module")
def per(weights) -> int:
    """Bytes one SmolLM2 block takes on a worker with its caches (~5.1 MiB): the offers below
    are counted in blocks."""
    return block_bytes(weights)[0] + cache_bytes(weights.config, 2048)


@pytest.fixture(scope="module")
def want(weights):
    return greedy(Llama(weights), PROMPT, TOKENS)


def test_a_lost_span_goes_to_the_fastest_live_worker_with_room(weights, want, per):
    """SmolLM2's 30 blocks, offers counted in blocks. Placed: the fast worker (room for 30)
    blocks 0-17, the big slow one (room for 54) 18-23, the small one (room for 9) 24-29. The
    small one dies mid-text: its 6 blocks fit both survivors; the placement rule (the least
    time) gives them to the fast one, which has room for 12 left. The old rule gave it to the
    one with the most room left, the slow one."""
    mem = [9 * per, 54 * per, 30 * per]
    with swarm.local(3, threads=1, max_memory=mem,
                     chaos=["crash_after=5", None, None]) as client:
        small, slow, fast = client.worker_ids
        offers = [Offer(small, mem[0], 1.0), Offer(slow, mem[1], 1.0),
                  Offer(fast, mem[2], 3.0)]
        model = SpanLlama(client, weights, offers)
        assert model.placement.workers() == [fast, slow, small]
        assert greedy(model, PROMPT, TOKENS) == want
        assert model.hosts() == [fast, slow, fast]
        assert model.take_stats().rebuilt >= 1


def test_a_lost_span_no_live_worker_has_room_for_fails_naming_the_shortfall(weights, per):
    """Two workers with room for 18 blocks hold 15 each; one dies mid-text and the other has
    room for 3 left. The old code ran the span on the requester, whose memory nobody offered;
    now the request fails, the shortfall named."""
    room = 18 * per
    need, left = 15 * per, 3 * per
    with swarm.local(2, threads=1, max_memory=[room, room],
                     chaos=[None, "crash_after=5"]) as client:
        model = SpanLlama(client, weights, [Offer(p, room, 1.0) for p in client.worker_ids])
        with pytest.raises(SpanLost, match=rf"blocks \d+\.\.\d+ lost their worker mid-generation "
                           rf"and no live worker has room for them: they need {need / MIB:.1f} "
                           rf"MiB .* the most any of the 1 live workers has left is "
                           rf"{left / MIB:.1f} MiB: {(need - left) / MIB:.1f} MiB short") as exc:
            greedy(model, PROMPT, TOKENS)
        assert exc.value.shortfall > 0
        assert model.take_stats().calls >= 5  # it failed mid-text, not up front


@pytest.mark.parametrize("where", ["cli", "chat"])
def test_a_lost_span_nobody_can_take_fails_the_request_clearly(weights, tmp_path, where, per):
    """As an up-front refusal is surfaced: `swarm generate` exits 1 with the shortfall and no
    traceback; /v1/chat/completions answers 503 (the old code: the text, run here)."""
    with swarm.local(2, threads=1, max_memory=[18 * per, 18 * per],
                     chaos=[None, "crash_after=3"]) as client:
        ask = "What is the capital of France?"
        if where == "cli":
            r = run_swarm("generate", client.uri, ask, "--max-tokens", "12",
                          env=subprocess_env(SWARM_HOME=str(tmp_path / "home")), timeout=300)
            assert r.returncode == 1, r.stderr
            assert "cannot hold" in r.stderr and "mid-generation" in r.stderr
            assert "short" in r.stderr and "Traceback" not in r.stderr
        else:
            status, body = chat(client, ask, max_tokens=12)
            assert status == 503, body
            assert "mid-generation" in body["error"]["message"]
            assert "short" in body["error"]["message"]


def test_workers_that_keep_taking_a_span_and_dying_cannot_keep_it_rebuilding(
        weights, want, monkeypatch):
    """The fastest worker takes all 30 blocks and dies mid-text; the next fastest takes them
    (a rebuild of the sequence's past) and dies on its next call. With one rebuild allowed a
    sequence (instead of swarm.spans.MAX_REBUILDS), the second loss fails the request rather
    than rebuilding again (the old code rebuilt for as long as workers came); the model still
    serves a new sequence on the worker left, with the local forward's tokens."""
    monkeypatch.setattr("swarm.spans.MAX_REBUILDS", 1)
    with swarm.local(3, threads=1, max_memory=600 * MIB,
                     chaos=["crash_after=4", "crash_after=1", None]) as client:
        first, second, third = client.worker_ids
        model = SpanLlama(client, weights, [Offer(first, 600 * MIB, 100.0),
                                            Offer(second, 600 * MIB, 1.0),
                                            Offer(third, 600 * MIB, 0.1)])
        assert model.placement.workers() == [first]
        with pytest.raises(SpanLost, match=r"rebuilt 1 times on replacement workers"):
            greedy(model, PROMPT, TOKENS)
        assert greedy(model, PROMPT, TOKENS) == want
        assert model.hosts() == [third]


def test_a_worker_sigkilled_mid_text_is_replaced_and_the_text_is_unchanged(weights, want):
    """The worker holding the second span is SIGKILLed between steps (a real process, a pulled
    plug): the survivor, with room for both spans, takes it, rebuilds its caches from the
    inputs the requester kept, and the greedy tokens are the local forward's."""
    with swarm.local(2, threads=1) as client:
        model = SpanLlama(client, weights)
        victim = model.placement.workers()[1]
        survivor = next(p for p in client.worker_ids if p != victim)
        cache = model.new_cache()
        logits = model.forward(PROMPT, cache)
        out: list[int] = []
        for step in range(TOKENS):
            out.append(int(np.argmax(logits)))
            if step == 4:
                proc = client.processes[client.worker_ids.index(victim)]
                proc.kill()
                proc.wait(30)
            logits = model.forward([out[-1]], cache)
        assert out == want
        assert model.hosts() == [survivor, survivor]
        assert model.take_stats().rebuilt >= 1
