"""Many jobs submitted together keep the requester's window: at most ``window`` tasks at a peer.

Jobs planned in the same loop turn (``swarm.get([... .remote() for x in xs])``) used to see
none of each other's tasks, because a task only counted at its peer once its call coroutine
started: all 64 of the inference benchmark's calls went out at once, the worker's queue grew
far past the window, and queued tasks looked like stragglers and were copied to the other
worker (a quarter of the compute done twice).
"""

from __future__ import annotations

import asyncio

import numpy as np

from swarm.runtime import jobs
from swarm.runtime.protocol import RunTask
from tests.test_runtime_memory import matmul, swarm_of

JOBS = 16


async def test_jobs_submitted_together_keep_the_window_per_peer():
    rng = np.random.default_rng(0)
    verifier = jobs.FreivaldsCache()
    b = rng.standard_normal((64, 64), dtype=np.float32)
    xs = [rng.standard_normal((32, 64), dtype=np.float32) for _ in range(JOBS)]
    async with swarm_of(2) as (req, hosts):
        await matmul(req, verifier, xs[0], b)  # b cached on a worker, rates measured
        at_peer: list[int] = []
        sent: list[RunTask] = []

        def on_sent(peer, msg: RunTask) -> None:
            sent.append(msg)
            at_peer.append(req.inflight(peer))

        req.on_task_sent = on_sent
        outs = await asyncio.wait_for(
            asyncio.gather(*[matmul(req, verifier, x, b) for x in xs]), 60)
        for x, c in zip(xs, outs, strict=True):
            np.testing.assert_allclose(c, x @ b, rtol=1e-4, atol=1e-3)
        assert max(at_peer) <= req.window, at_peer
        assert len(sent) == JOBS  # one task per job: nothing queued long enough to be copied
        assert all(req.inflight(p) == 0 for p in req.links)
