"""MiniLM's layers run whole on a worker (models.minilm_span, the ``minilm`` actor): the
trace it answers with, the requester's check of every product in it, and the judge of
evidence against it."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from models import minilm_span
from models.minilm import MiniLM, pool, run_layers
from models.span import Fingerprints
from swarm.runtime.actors import MiniLMActor, check_minilm_forward

TEXTS = ["hello world", "Verified model outputs from untrusted machines.", "Москва",
         "word " * 40]


@pytest.fixture(scope="module")
def model():
    return MiniLM.load()


@pytest.fixture(scope="module")
def call(model):
    enc = model.tokenizer.encode(TEXTS)
    return (model.embed_tokens(enc), minilm_span.bundle(model.layers),
            {"lengths": enc.lengths.tolist(), "trace": True}, enc)


def _check(model, x, lengths, trace):
    check = minilm_span.TraceCheck(trace, x.shape[0], model.layers, Fingerprints())
    return pool(run_layers(model.layers, x, lengths, check, check), lengths)


def test_the_checked_trace_gives_the_local_forwards_embeddings(model, call):
    x, flat, params, enc = call
    (trace,) = MiniLMActor(None).forward([x, flat], params)
    assert trace.dtype == np.float32 and trace.shape == (enc.tokens * minilm_span.TRACE_WIDTH,)
    got = _check(model, x, enc.lengths, trace)
    assert np.array_equal(got, model.embed(TEXTS))  # the same code on the same values
    (hidden,) = MiniLMActor(None).forward([x, flat], {**params, "trace": False})
    assert np.array_equal(pool(hidden, enc.lengths), got)


@pytest.mark.parametrize("layer,part", [(0, "qkv"), (2, "up"), (5, "down")])
def test_any_wrong_product_is_caught_before_it_is_used(model, call, layer, part):
    x, flat, params, enc = call
    (trace,) = MiniLMActor(None).forward([x, flat], params)
    blocks = minilm_span.trace_blocks(trace, enc.tokens)
    blocks[layer][part][enc.tokens - 1, 7] += 0.5  # one value of the last sentence
    with pytest.raises(minilm_span.TraceMismatch, match=f"layer {layer} {part}"):
        _check(model, x, enc.lengths, trace)


def test_a_wrong_layer_is_caught_at_the_first_product(model, call):
    x, flat, params, enc = call
    (trace,) = MiniLMActor(None).forward_wrong_layer([x, flat], params)
    with pytest.raises(minilm_span.TraceMismatch, match="layer 0 qkv"):
        _check(model, x, enc.lengths, trace)


def test_bad_calls_are_refused_with_what_to_send(call):
    x, flat, params, _ = call
    bad = [([x, flat], {**params, "lengths": [2] * 3}, "lengths= sum to 6"),
           ([x, flat], {**params, "lengths": [1, x.shape[0] - 1]}, "2..256"),
           ([x, flat], {**params, "extra": 1}, "forward takes"),
           ([x, flat[:-1]], params, "bundle must be"),
           ([x[:, :100], flat], params, r"x must be float32 \[tokens, 384\]"),
           ([x, flat], {**params, "trace": 1}, "trace= must be"),
           ([x], params, "2 arrays")]
    for arrays, p, msg in bad:
        with pytest.raises((ValueError, TypeError), match=msg):
            check_minilm_forward(arrays, p)


def test_the_actor_keeps_to_the_workers_blas_threads(call, monkeypatch):
    """A worker started with --threads 1 runs the layers on one BLAS thread."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from compute.numpy_backend import NumpyBackend

    seen = []
    real = minilm_span.traced

    def spy(*a, **kw):
        seen.append([i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"])
        return real(*a, **kw)

    monkeypatch.setattr(minilm_span, "traced", spy)
    x, flat, params, _ = call
    with threadpool_limits(2, user_api="blas"):
        MiniLMActor(NumpyBackend(threads=1)).forward([x, flat], params)
    assert seen == [[1]]


def test_the_judge_proves_a_wrong_product_and_never_an_honest_trace(model, call):
    from identity.keys import PeerKey
    from swarm.runtime.evidence import Evidence, Receipt, check_evidence, output_ids
    from swarm.runtime.objects import object_id

    x, flat, params, enc = call
    (trace,) = MiniLMActor(None).forward([x, flat], params)
    packed = msgpack.packb(params, use_bin_type=True)
    worker, requester = PeerKey.generate(), PeerKey.generate()

    def judge(out, p=packed):
        arrays = {object_id(a).raw: a for a in (x, flat, out)}
        r = Receipt.sign(worker, requester.peer_id, 1, "minilm", "forward", p,
                         [object_id(x).raw, object_id(flat).raw], output_ids([out]))
        return check_evidence(Evidence(r, p), arrays.get)

    assert not judge(trace).proven
    # an honest worker on another machine: its non-linear steps round differently
    # (here: every activation into a product nudged by one ulp), its products are exact
    layers = minilm_span.unbundle(flat)
    rounded = np.empty_like(trace)
    out = minilm_span.trace_blocks(rounded, enc.tokens)

    def nudged(j, part, a):
        a = np.nextafter(a, np.float32(np.inf))
        return np.matmul(a, getattr(layers[j], part).array, out=out[j][part])

    run_layers(layers, x, enc.lengths, nudged)
    assert not judge(rounded).proven
    assert np.abs(_check(model, x, enc.lengths, rounded) - model.embed(TEXTS)).max() < 1e-5
    bad = trace.copy()
    minilm_span.trace_blocks(bad, enc.tokens)[3]["up"][2, 11] += 1.0
    finding = judge(bad)
    assert finding.proven and "layer 3 up" in finding.why
    assert judge(bad[:-1]).proven  # the wrong shape, signed
    assert not judge(bad, msgpack.packb({**params, "trace": False})).proven  # not its params


@pytest.mark.parametrize("part", ["qkv", "out", "up", "down"])
@pytest.mark.parametrize("value", [np.nan, np.inf, 1e30])
def test_a_non_finite_or_huge_value_is_caught_and_proven(model, call, value, part):
    """Whichever step reads it first (attention, LayerNorm, GELU), with its check's sums."""
    from identity.keys import PeerKey
    from swarm.runtime.evidence import Evidence, Receipt, check_evidence, output_ids
    from swarm.runtime.objects import object_id

    x, flat, params, enc = call
    (trace,) = MiniLMActor(None).forward([x, flat], params)
    minilm_span.trace_blocks(trace, enc.tokens)[2][part][1, 3] = value
    with pytest.raises(minilm_span.TraceMismatch, match=f"layer 2 {part}"):
        _check(model, x, enc.lengths, trace)
    packed = msgpack.packb(params, use_bin_type=True)
    worker = PeerKey.generate()
    r = Receipt.sign(worker, PeerKey.generate().peer_id, 1, "minilm", "forward", packed,
                     [object_id(x).raw, object_id(flat).raw], output_ids([trace]))
    arrays = {object_id(a).raw: a for a in (x, flat, trace)}
    finding = check_evidence(Evidence(r, packed), arrays.get)
    assert finding.proven and f"layer 2 {part}" in finding.why
