"""Spans placed by the memory each worker offers (swarm.placement through swarm.spans), on
real local swarms: a model bigger than any worker runs on spans that fit each offer, with the
same greedy tokens as the local forward; a model that fits no placement is refused before
anything is sent, the shortfall named; workers announce what they offer and hold."""

from __future__ import annotations

import time

import numpy as np
import pytest

import swarm
from models import gguf_weights
from models.llama import Llama
from swarm.placement import PlacementError
from swarm.spans import SpanLlama, block_bytes, cache_bytes
from tests.conftest import run_swarm, subprocess_env
from tests.spans_support import chat, greedy

pytestmark = [pytest.mark.system]

MIB = 1 << 20
PROMPT = [1, 504, 3458, 282, 4649, 314]
TOKENS = 8


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread(one_blas_thread):
    """Every test here runs on one BLAS thread (tests.conftest.one_blas_thread)."""


@pytest.fixture(scope="module")
def weights():
    return gguf_weights.load()


def test_a_model_bigger_than_any_worker_runs_on_spans_that_fit_each_offer(weights):
    per = block_bytes(weights)[0] + cache_bytes(weights.config, 2048)
    total = per * weights.config.n_layers  # ~153 MiB: SmolLM2's Q4_1 blocks and caches
    # room for 9, 11 and 11 of the 30 blocks: whatever speeds the workers measure (noisy
    # under load), every placement that fits gives the small one 8 or 9 and the others 10+
    offers = [int(9.5 * per) // MIB * MIB, int(11.5 * per) // MIB * MIB,
              int(11.5 * per) // MIB * MIB]
    assert all(m < total for m in offers) and sum(offers) > total
    with swarm.local(3, threads=1, max_memory=offers) as client:
        small, *big = client.worker_ids
        model = SpanLlama(client, weights)
        spans = {s.worker: s for s in model.placement.spans}
        assert set(spans) == set(client.worker_ids)  # it takes all three
        for peer, m in zip(client.worker_ids, offers, strict=True):
            assert spans[peer].bytes <= m
        assert all(spans[small].count < spans[b].count for b in big)
        assert greedy(model, PROMPT, TOKENS) == greedy(Llama(weights), PROMPT, TOKENS)
        assert model.hosts() == model.placement.workers()
        # each worker announces its offer, what it holds (within it) and the span it hosts
        model_id = bytes.fromhex(weights.address)[:12]
        want = {p: (model_id, s.first, s.count) for p, s in spans.items()}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            records = {r.peer_id: r for r in client.members()}
            if all(records.get(p) and records[p].hosted == (want[p],) for p in want):
                break
            time.sleep(0.2)
        for peer, m in zip(client.worker_ids, offers, strict=True):
            assert records[peer].hosted == (want[peer],)
            offered, used = records[peer].memory
            assert offered == m and spans[peer].count * block_bytes(weights)[0] <= used <= m


def test_a_worker_that_over_claims_memory_fails_its_span_and_is_replaced(weights):
    """It announces 4 GiB but holds 20 MiB: placed half the blocks (~77 MiB), it refuses
    them; the honest worker, with room for both halves, takes its span, and the text is the
    local forward's."""
    with swarm.local(2, threads=1, max_memory=[20 * MIB, 600 * MIB],
                     chaos=[f"claim={4 << 30}", None]) as client:
        liar, honest = client.worker_ids
        model = SpanLlama(client, weights)
        assert liar in model.placement.workers()  # its claim was believed at placement
        assert greedy(model, PROMPT, TOKENS) == greedy(Llama(weights), PROMPT, TOKENS)
        stats = model.take_stats()
        assert stats.rejected >= 1
        assert model.hosts() == [honest, honest]
        assert liar not in client.node.proven_liars  # a refusal proves nothing


def test_a_model_that_fits_no_placement_is_refused_up_front(weights, tmp_path):
    with swarm.local(2, threads=1, max_memory=[50 * MIB, 50 * MIB]) as client:
        with pytest.raises(PlacementError, match=r"the 2 workers offer 100\.0 MiB: .* short"):
            SpanLlama(client, weights)
        r = run_swarm("generate", client.uri, "What is the capital of France?",
                      env=subprocess_env(SWARM_HOME=str(tmp_path / "home")), timeout=180)
        assert r.returncode == 1, r.stderr
        assert "offer 100.0 MiB" in r.stderr and "short" in r.stderr
        assert "Traceback" not in r.stderr
        status, body = chat(client, "What is the capital of France?")
        assert status == 503 and "offer 100.0 MiB" in body["error"]["message"]


@pytest.mark.parametrize("model", [b"short", "a" * 12, 12])
def test_a_span_call_naming_its_model_badly_is_refused(weights, model):
    from models import span as llama_span
    from swarm.runtime.actors import SpanConfig, check_span_forward

    c = SpanConfig.of(weights.config)
    x = np.zeros((1, c.d_model), np.float32)
    flat = llama_span.bundle(weights, 0, 1)
    params = {"first": 0, "count": 1, "config": c.params(), "seqs": [[1, 0, 1]], "drop": []}
    check_span_forward([x, flat], params | {"model": b"m" * 12})
    with pytest.raises(ValueError, match="model= is the first 12 bytes"):
        check_span_forward([x, flat], params | {"model": model})


def test_offers_are_read_from_the_records_speeds_within_noise_count_as_equal():
    from identity.keys import PeerKey
    from swarm.members import MemberRecord
    from swarm.placement import Offer
    from swarm.spans import MIN_SPEED, announced_offers

    a, b, c, d = (PeerKey.generate().peer_id for _ in range(4))
    records = {a: MemberRecord(a, 0.011, memory=(450 * MIB, 0)),
               b: MemberRecord(b, 0.0135, memory=(200 * MIB, 5)),  # the same machine, noisier
               c: MemberRecord(c, 0.03, memory=(300 * MIB, 0)),  # more than twice as fast
               d: MemberRecord(d, 0.0)}  # announces no memory and no speed
    assert announced_offers(records) == [Offer(a, 450 * MIB, 0.0135),
                                         Offer(b, 200 * MIB, 0.0135),
                                         Offer(c, 300 * MIB, 0.03),
                                         Offer(d, 0, MIN_SPEED)]


def test_a_worker_holding_the_model_file_makes_its_span_from_it(weights):
    """Issue 46, weights where they are: a worker started with the model's file (`--model`)
    announces it and makes its span's bundle from its own copy; only the worker without the
    file is sent one. The tokens are the local forward's (the bundle is the one the requester
    named by content address, whoever made it)."""
    want = greedy(Llama(weights), PROMPT, TOKENS)
    with swarm.local(2, threads=1, models=[[gguf_weights.default_path()], []]) as client:
        holder, other = client.worker_ids
        assert client.offers()[holder].models and not client.offers()[other].models
        model = SpanLlama(client, weights)
        assert set(model.placement.workers()) == {holder, other}
        assert greedy(model, PROMPT, TOKENS) == want
        assert client.node.requester.objects_sent == 1  # the other worker's bundle only
        assert model.take_stats().rejected == 0


def test_a_span_the_workers_file_does_not_match_is_sent_and_never_made_again(tmp_path):
    """The bundle a call names is used only if the worker's own copy gives the same content
    address: another file under the model id the call names (a different copy, or a requester
    naming a model it does not run) is not used, nothing is lost (the worker asks for the
    bundle), and that span is not made again."""
    import msgpack

    from models import span as llama_span
    from swarm.runtime.local_bundles import LocalBundles
    from swarm.runtime.objects import ObjectStore, object_id
    from swarm.runtime.protocol import RunTask, TaskArg
    from tests.gguf_support import write_tiny

    mine = write_tiny(tmp_path / "mine.gguf", "llama", "Q8_0", seed=1, layers=3)
    theirs = write_tiny(tmp_path / "theirs.gguf", "llama", "Q8_0", seed=2, layers=3)
    model = b"m" * 12
    want = llama_span.bundle(gguf_weights.read(gguf_weights.open_file(mine)), 1, 2)

    def call(actor="llama_span", first=1, count=2, name=model) -> RunTask:
        params = msgpack.packb({"model": name, "first": first, "count": count})
        return RunTask(1, actor, 1, 0, "forward", [TaskArg(array=np.zeros((1, 4), np.float32)),
                                                  TaskArg(oid=object_id(want).raw)], params)

    store = ObjectStore(1 << 30)
    right = LocalBundles({model: mine})
    build = right.wanted(call(), store)
    assert build is not None and np.array_equal(right.make(build), want) and right.made == 1
    for refused in (call(actor="matmul"), call(name=b"x" * 12), call(count=0)):
        assert right.wanted(refused, store) is None
    store.put(want)
    assert right.wanted(call(), store) is None  # held already: nothing to make
    wrong = LocalBundles({model: theirs})
    build = wrong.wanted(call(), ObjectStore(1 << 30))
    assert build is not None and wrong.make(build) is None and wrong.made == 0
    assert wrong.wanted(call(), ObjectStore(1 << 30)) is None  # not made again
    past_end = wrong.wanted(call(first=2, count=2), ObjectStore(1 << 30))
    assert past_end is not None and wrong.make(past_end) is None
