"""The worker's sans-IO core without links or loops: admission, call order, chaos decisions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import compute
from identity.keys import PeerKey
from swarm.runtime.actors import REGISTRY
from swarm.runtime.chaos import Chaos, ChaosSpec
from swarm.runtime.hostcore import MAX_INSTANCES, Call, Crash, HostCore, Plan
from swarm.runtime.objects import ObjectStore, object_id
from swarm.runtime.protocol import RunTask, TaskArg, TaskFailed


@dataclass(eq=False)
class Link:
    remote: object


def core(capacity: int = 1 << 20, chaos: ChaosSpec | None = None) -> HostCore:
    backend = compute.get_backend("numpy")
    return HostCore(ObjectStore(capacity), Chaos(chaos or ChaosSpec()), REGISTRY,
                    lambda cls: cls(backend), inline_numpy=True)


def call(link, task, *, instance=0, seq=-1, args=None, method="matmul") -> Call:
    args = args if args is not None else [TaskArg(array=np.ones((2, 2), np.float32))] * 2
    nbytes = sum(a.array.nbytes for a in args if a.array is not None)
    return Call(link, RunTask(task, "matmul", instance, seq, method, args), nbytes)


def test_admits_unordered_calls_and_refuses_unknown_methods_and_draining():
    c, link = core(), Link(PeerKey.generate().peer_id)
    assert c.admit(call(link, 1)) is None and len(c.queue) == 1
    refused = c.admit(call(link, 2, method="nope"))
    assert isinstance(refused, TaskFailed) and refused.kind == "invalid"
    c.draining = True
    refused = c.admit(call(link, 3))
    assert refused.kind == "busy" and len(c.queue) == 1


def test_memory_full_refuses_and_queued_bytes_are_freed_when_done_or_dropped():
    c, link = core(capacity=40), Link(PeerKey.generate().peer_id)
    assert c.admit(call(link, 1)) is None                 # 32 bytes reserved
    assert c.store.reserved == 32
    refused = c.admit(call(link, 2))
    assert refused.kind == "busy" and "memory is full" in refused.message
    running = c.next()
    assert c.activity() == (1, [(link.remote, 1)])
    c.done(running)
    assert c.store.reserved == 0 and c.activity() == (0, [])
    c.admit(call(link, 3))
    assert [x.msg.task for x in c.drop(lambda x: True)] == [3] and c.store.reserved == 0


def test_calls_of_one_actor_run_in_order_and_a_duplicate_holds_nothing():
    c, link = core(), Link(PeerKey.generate().peer_id)
    assert c.admit(call(link, 11, instance=1, seq=1)) is None
    assert not c.queue and c.store.reserved == 32         # held for seq 0
    c.admit(call(link, 10, instance=1, seq=0))
    assert [x.msg.task for x in c.queue] == [10, 11]
    c.admit(call(link, 12, instance=1, seq=0))            # a retry of a call that ran
    assert len(c.queue) == 2 and c.store.reserved == 64


def test_instances_per_requester_are_capped_and_forgotten_with_the_link():
    c, link = core(), Link(PeerKey.generate().peer_id)
    for i in range(1, MAX_INSTANCES + 1):
        assert c.admit(call(link, i, instance=i, seq=1)) is None   # each held for its seq 0
    refused = c.admit(call(link, 0, instance=MAX_INSTANCES + 1, seq=0))
    assert refused.kind == "invalid" and str(MAX_INSTANCES) in refused.message
    other = Link(PeerKey.generate().peer_id)
    assert c.admit(call(other, 1, instance=1, seq=0)) is None      # others are not affected
    c.forget(link)
    assert c.store.reserved == 32 and all(k[0] == other.remote for k in c.instances)


def test_out_of_order_calls_hold_at_most_a_share_of_memory():
    c, link = core(capacity=4 * 64), Link(PeerKey.generate().peer_id)
    big = [TaskArg(array=np.ones((4, 4), np.float32))] * 2     # 128 bytes: over 1/4 of 256
    refused = c.admit(call(link, 1, instance=1, seq=1, args=big))
    assert refused.kind == "busy" and "held out of order" in refused.message
    assert c.admit(call(link, 2, instance=1, seq=0, args=big)) is None  # in order: fits


def test_plan_resolves_inputs_and_a_missing_object_rewinds_the_actors_order():
    c, link = core(), Link(PeerKey.generate().peer_id)
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    oid = object_id(a)
    first = call(link, 1, instance=1, seq=0, args=[TaskArg(oid=oid.raw), TaskArg(array=a)])
    c.admit(first)
    c.admit(call(link, 2, instance=1, seq=1))
    failed = c.plan(c.next())
    assert failed.kind == "missing" and failed.missing == [oid.raw]
    assert not c.queue                                     # seq 1 waits for seq 0 again
    c.store.put(a, oid)
    c.admit(first)
    assert [x.msg.task for x in c.queue] == [1, 2]
    plan = c.plan(c.next())
    assert isinstance(plan, Plan) and plan.inline and plan.method is not None
    np.testing.assert_array_equal(plan.method(plan.arrays, plan.params)[0], a @ a)


def test_chaos_decisions_crash_refuse_hang_corrupt_drop():
    link = Link(PeerKey.generate().peer_id)
    c = core(chaos=ChaosSpec(crash_after=0))
    c.admit(call(link, 1))
    assert isinstance(c.plan(c.next()), Crash)
    c = core(chaos=ChaosSpec(invalid=1.0))
    c.admit(call(link, 1))
    assert c.plan(c.next()).message == "SWARM_CHAOS: refused"
    c = core(chaos=ChaosSpec(hang=1.0))
    c.admit(call(link, 1))
    plan = c.plan(c.next())
    assert plan.method is None and not plan.inline
    c = core(chaos=ChaosSpec(corrupt=1.0, drop=1.0, delay_ms=5, seed=1))
    c.admit(call(link, 1))
    plan = c.plan(c.next())
    right = plan.method(plan.arrays, plan.params)
    answer = c.answer(plan, right)
    assert answer.drop and answer.delay_s == 0.005
    assert not np.array_equal(answer.outputs[0], right[0])


def test_a_methods_error_and_a_kernel_timeout_are_told_apart():
    from swarm.runtime.kernels import KernelTimeout

    c, link = core(), Link(PeerKey.generate().peer_id)
    c.admit(call(link, 1))
    plan = c.plan(c.next())
    assert c.failed(plan, KernelTimeout("too slow")).kind == "timeout"
    failed = c.failed(plan, ValueError("bad"))
    assert failed.kind == "error" and failed.message == "ValueError: bad"
    from swarm.runtime.actors import StaleCache

    assert c.failed(plan, StaleCache("holds 0 positions")).kind == "stale"  # typed, not words


def test_span_caches_are_reserved_against_max_memory():
    """Issue 45, finding 5: span actors' K/V caches were actor state, never reserved: the cap
    was 1 GiB per instance and a requester may make 256 instances, with a config of its own
    choosing, so one key made a worker with 16 MiB of --max-memory hold 256 MiB. Now every
    cache byte of every instance is reserved in the worker's store before it is allocated."""
    import pytest

    from models import span as llama_span
    from swarm.runtime.actors import SpanConfig

    c, link = core(capacity=16 << 20), Link(PeerKey.generate().peer_id)
    from models.quant import QTensor

    cfg = SpanConfig(d_model=32, d_ff=16, n_heads=1, n_kv_heads=1, context_length=4096,
                     rope_base=10000.0, norm_eps=1e-5)  # 64 KiB of cache per position
    count, rows, seqs = 256, 16, 8  # 8 MiB of caches a call
    rng = np.random.default_rng(0)

    def matrix(out: int, n_in: int) -> QTensor:
        a = (rng.standard_normal((out, n_in)) * 0.1).astype(np.float32)
        return QTensor("F32", (out, n_in), a.view(np.uint8))

    ones = np.ones(32, np.float32)
    layer = llama_span.Layer(ones, ones, {p: matrix(*shape) for p, shape in
                                          llama_span.matrix_shapes(cfg).items()})
    flat = llama_span.bundle_of(cfg, [layer] * count)
    x = rng.standard_normal((rows * seqs, 32)).astype(np.float32)
    params = {"first": 0, "count": count, "config": cfg.params(), "drop": [],
              "seqs": [[s, 0, rows] for s in range(seqs)]}
    refused = 0
    for i in range(1, 33):  # 32 instances x 8 sequences x 16 positions: 256 MiB asked for
        actor = c.instance(link.remote, "llama_span", i).actor
        try:
            actor.forward([x, flat], params)
        except ValueError as e:
            assert "--max-memory" in str(e)
            refused += 1
        kept = sum(v.nbytes for inst in c.instances.values() for v in inst.actor.caches.values())
        assert kept <= c.store.reserved <= 16 << 20, (i, kept)
    assert refused == 30  # two calls' caches fill the 16 MiB
    with pytest.raises(ValueError, match="max-memory"):
        c.instance(link.remote, "llama_span", 9).actor.forward([x, flat], params)
    c.forget(link)
    assert c.store.reserved == 0


def test_one_requesters_long_calls_delay_another_by_one_call_not_all():
    """Issue 45, finding 8: the worker's queue was one FIFO, and a kernel costs no bytes, so
    N endless kernels from one requester (each stopped at the time limit) held every other
    requester's work for N limits. Calls now go by each requester's share of the worker's
    time, kernels stopped at their limit counted in full."""
    c = core()
    a, b = Link(PeerKey.generate().peer_id), Link(PeerKey.generate().peer_id)
    for t in range(1, 6):
        assert c.admit(call(a, t)) is None  # five kernels that run to the 60 s limit
    first = c.next()
    assert first.link is a
    assert c.admit(call(b, 9)) is None  # another requester's task, queued behind them
    c.done(first, 60.0)
    second = c.next()
    assert second.link is b and second.msg.task == 9  # one limit, not five
    c.done(second, 0.01)
    order = []
    while (nxt := c.next()) is not None:
        order.append(nxt.msg.task)
        c.done(nxt, 60.0)
    assert order == [2, 3, 4, 5]  # a's own calls keep their order
    # a requester that comes back later starts level, with no credit for its absence
    assert c.admit(call(b, 10)) is None and c.admit(call(a, 11)) is None
    assert c.next().msg.task == 10
