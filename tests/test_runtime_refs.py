"""ObjectRef, get and wait: timeouts, ordering, misuse errors, awaiting in asyncio."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading

import numpy as np
import pytest

from swarm.errors import GetTimeoutError, SwarmError
from swarm.runtime.objects import object_id
from swarm.runtime.refs import ObjectRef, get, wait


def pending():
    return ObjectRef(object_id(np.zeros(1)), cf.Future())


def test_get_ready_and_list():
    a = np.arange(3.0)
    r = ObjectRef.ready(object_id(a), a)
    assert get(r) is a and get([r, r])[1] is a


def test_get_timeout_is_a_timeout_error():
    with pytest.raises(GetTimeoutError, match="1 of 1 refs not ready") as exc:
        get(pending(), timeout=0.05)
    assert isinstance(exc.value, TimeoutError) and isinstance(exc.value, SwarmError)


def test_get_raises_the_task_error():
    r = pending()
    r.future().set_exception(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        get(r)


def test_wait_splits_in_order_and_times_out():
    a, b, c = pending(), pending(), pending()
    c.future().set_result(1)
    ready, rest = wait([a, b, c], num_returns=1, timeout=0)
    assert ready == [c] and rest == [a, b]
    ready, rest = wait([a, b, c], num_returns=2, timeout=0.05)
    assert ready == [c] and rest == [a, b]


def test_wait_wakes_when_a_ref_completes():
    a, b = pending(), pending()
    done = threading.Event()
    threading.Timer(0.05, lambda: (b.future().set_result(2), done.set())).start()
    ready, rest = wait([a, b], timeout=10)
    assert done.is_set() and ready == [b] and rest == [a]


@pytest.mark.parametrize("call,err", [
    (lambda r: get(np.zeros(2)), TypeError),
    (lambda r: wait(r), TypeError),
    (lambda r: wait([r], num_returns=2), ValueError),
    (lambda r: wait([r, r]), ValueError),
    (lambda r: get(r, timeout=-1), ValueError),
])
def test_misuse_says_what_to_do(call, err):
    with pytest.raises(err):
        call(pending())


async def test_ref_is_awaitable():
    r = pending()
    asyncio.get_running_loop().call_later(0.01, r.future().set_result, 42)
    assert await asyncio.wait_for(r, 5) == 42


def test_a_content_address_hashed_on_every_core_is_the_same_address():
    from swarm.runtime.objects import object_id

    rng = np.random.default_rng(11)
    for shape in [(3,), (1024, 1024), (2049, 513)]:  # under and over the parallel floor
        x = rng.standard_normal(shape).astype(np.float32)
        assert object_id(x, parallel=True) == object_id(x)
    y = rng.standard_normal((1024, 1024)).astype(np.float32)
    assert object_id(y, parallel=True) != object_id(y.reshape(2048, 512), parallel=True)
