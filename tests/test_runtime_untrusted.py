"""Workers are strangers: their refusals, results and kernels must not hurt anyone else's job.

Real actor hosts behind in-memory links, one of them misbehaving through ``SWARM_CHAOS``.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

import compute
from identity.keys import PeerKey
from swarm.links import memory_pair
from swarm.runtime import jobs
from swarm.runtime.chaos import parse
from swarm.runtime.host import ActorHost
from swarm.runtime.requester import Requester


@contextlib.asynccontextmanager
async def swarm_of(*chaos: str | None, **host_options):
    """A requester linked to one real actor host per ``chaos`` spec (None = honest)."""
    me = PeerKey.generate()
    req = Requester(me.peer_id)
    hosts, serving = [], []
    for spec in chaos:
        key = PeerKey.generate()  # the host signs receipts as the peer at the link's end
        host = ActorHost(compute.get_backend("numpy"), chaos=parse(spec), key=key,
                         **host_options)
        mine, theirs = memory_pair(me, key)
        serving.append(asyncio.create_task(host.serve(theirs)))
        req.attach(mine)
        hosts.append((mine.remote, host))
    try:
        yield req, hosts
    finally:
        await req.close()
        await asyncio.wait_for(asyncio.gather(*serving, return_exceptions=True), 10)
        for _, host in hosts:
            await host.close()


async def matmul(req: Requester, a, b):
    job = jobs.matmul_job(a, b, workers=req.workers(), rates=req.rates, precision="f32",
                          backend=compute.get_backend("numpy"), verifier=jobs.FreivaldsCache())
    results, report = await req.run(job.calls, local=job.local, verify=job.verify,
                                    owners=job.owners, timeout=60)
    return job.merge(results), report


async def test_a_worker_refusing_tasks_as_invalid_never_fails_the_job():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((600, 300)).astype(np.float32)
    b = rng.standard_normal((300, 300)).astype(np.float32)
    async with swarm_of(None, "invalid=1", None) as (req, hosts):
        liar = hosts[1][0]
        for _ in range(3):
            c, report = await matmul(req, a, b)
            np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
            mine = report.peers.get(str(liar))
            assert mine is None or mine.verified == 0
        assert req.rates.rejected.get(liar, 0) >= 1      # counted as misbehaviour


async def test_a_liars_large_results_are_proven_by_receipts_it_signs_only_when_asked():
    """Large results come without receipts (hashing each for one cost 6% of the inference
    row); the requester asks for the receipt of each result it rejects and gets evidence
    that proves the lie. The honest worker signs nothing: none of its results was wrong."""
    from swarm.runtime.evidence import Evidence, check_evidence

    rng = np.random.default_rng(2)
    a = rng.standard_normal((600, 300)).astype(np.float32)   # bands of 360 KiB and more
    b = rng.standard_normal((300, 300)).astype(np.float32)
    async with swarm_of(None, "corrupt=1") as (req, hosts):
        (honest, honest_host), (liar, liar_host) = hosts
        reports: asyncio.Queue = asyncio.Queue()
        req.on_rejected = lambda peer, reason, package: reports.put_nowait((peer, package))
        c, report = await matmul(req, a, b)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
        rejected = report.peers[str(liar)].rejected
        assert rejected >= 1
        await req.reported(15)  # what a stopping node waits for: every report is made
        assert reports.qsize() == rejected
        for _ in range(rejected):
            peer, package = reports.get_nowait()
            assert peer == liar and package is not None
            evidence = Evidence.decode(package.evidence.encode())  # as it travels
            assert check_evidence(evidence, package.arrays.get).proven
        assert liar_host.stats.receipts == rejected
        assert honest_host.stats.receipts == 0 and honest_host.stats.tasks >= 1
        # every result the requester accepted was let go at once, not kept to the bound
        await asyncio.gather(*req._errands, *req._reports)
        assert await req.receipt(honest, 10**6) == b""  # answered after the verdicts, in order
        assert honest_host.store.reserved == 0 and not honest_host._unsigned


async def test_a_rejection_that_comes_with_the_jobs_last_event_is_still_reported():
    """Seen in a fresh CI run: a straggler's copy and the liar's original were checked
    together; the copy's pass finished the job, the liar's rejection waited for a poll that
    never came, and its report (with the evidence) was lost."""
    from swarm.runtime.jobcore import Check
    from swarm.runtime.requester import Arg, Call, _JobRun
    from swarm.runtime.scheduler import LOCAL

    req = Requester(PeerKey.generate().peer_id)
    liar = PeerKey.generate().peer_id
    x = np.eye(2, dtype=np.float32)

    async def verify(i, outputs):
        return True

    job = _JobRun(req, [Call("matmul", "matmul", (Arg(x), Arg(x)), cost=8.0)],
                  lambda i: [x @ x], verify, False, None, None)
    job.core.poll(0.0)
    job.core.answered(0, LOCAL, [x], 0.0, None)  # the last result: the job is done
    job.core.checked(Check(0, liar, ([2 * x], 0.1, None)), False)  # and a copy was wrong
    reports = []
    req.on_rejected = lambda peer, reason, package: reports.append((peer, reason))
    outputs, report = await job.run(5)
    await req.reported(5)
    assert outputs == [[x]] and report.peers[str(liar)].rejected == 1
    assert reports == [(liar, "shard 0 failed verification")]


async def test_held_out_of_order_calls_count_against_max_memory():
    """60 calls held for an earlier one pinned 240 MiB on a worker with a 1 MiB store; now
    every byte held for others counts against the cap and what is over is refused."""
    from swarm.runtime.protocol import RunTask, TaskArg, TaskFailed

    cap = 1 << 20
    host = ActorHost(compute.get_backend("numpy"), store_capacity=cap)
    me = PeerKey.generate()
    mine, theirs = memory_pair(me, PeerKey.generate())
    serving = asyncio.create_task(host.serve(theirs))
    chunk = np.ones((256, 256), np.float32)                      # 256 KiB inline
    try:
        for seq in range(1, 61):                                 # seq 0 never comes
            await mine.send(RunTask(seq, "matmul", 1, seq, "matmul",
                                    [TaskArg(array=chunk), TaskArg(array=chunk)]))
        refusals = []
        while len(refusals) < 60 - cap // (2 * chunk.nbytes):
            msg = await asyncio.wait_for(mine.recv(), 10)
            assert isinstance(msg, TaskFailed) and msg.kind == "busy", msg
            refusals.append(msg)
        assert "memory" in refusals[0].message and "--max-memory" in refusals[0].message
        assert host.store.reserved <= cap
    finally:
        await mine.close()
        await asyncio.wait_for(serving, 5)
        await host.close()
    assert host.store.reserved == 0                               # freed with the link


ENDLESS = """
@group(0) @binding(0) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    loop {                              // endless (llvmpipe cuts it at 65535 iterations per
        if (y[0] < -1.0) { break; }     // invocation, so the dispatch below is ~3e14 of them)
        y[1] = y[1] + 1.0;
    }
}
"""


def kernel_call():
    from swarm.runtime.requester import Arg, Call

    return Call("matmul", "kernel", (Arg(np.zeros(2, np.float32)),),
                {"wgsl": ENDLESS, "inputs": ["y"], "outputs": [["y", [2], "float32"]],
                 "dispatch": [65535, 65535, 1]})


async def test_an_endless_kernel_is_stopped_reported_and_sent_again_at_most_once():
    """An endless WGSL loop passed validation and blocked a worker's compute thread forever,
    and the straggler logic sent it on to every other worker."""
    from swarm.errors import TaskError

    async with swarm_of(None, None, None, kernel_time_limit=2.0) as (req, hosts):
        started = asyncio.get_running_loop().time()
        with pytest.raises(TaskError, match="time limit on two workers"):
            await req.run([kernel_call()], local=lambda i: pytest.fail("ran locally"),
                          verify=None, timeout=120)
        stopped = [host.kernels.timeouts for _, host in hosts]
        assert sum(stopped) == 2 and max(stopped) == 1          # sent again once, not more
        # the workers are not wedged: a matmul right after is answered
        rng = np.random.default_rng(3)
        a = rng.standard_normal((64, 32)).astype(np.float32)
        b = rng.standard_normal((32, 16)).astype(np.float32)
        c, _ = await matmul(req, a, b)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
        assert asyncio.get_running_loop().time() - started < 90


async def test_hang_chaos_is_stopped_and_the_job_completes_elsewhere():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((600, 300)).astype(np.float32)
    b = rng.standard_normal((300, 300)).astype(np.float32)
    async with swarm_of(None, "hang=1", kernel_time_limit=1.0) as (req, hosts):
        c, report = await matmul(req, a, b)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
        hung, host = hosts[1]
        assert report.peers.get(str(hung)) is None or report.peers[str(hung)].verified == 0
        async with asyncio.timeout(60):           # its dispatch is stopped at the limit
            while host.kernels.timeouts < 1:
                await asyncio.sleep(0.05)


def test_reported_waits_for_a_report_an_outlived_attempt_starts_as_it_ends():
    """A one-shot requester stops after :meth:`Requester.reported`. An attempt its job no
    longer needed (a copy another beat, :meth:`Requester.outlive`) may find its answer wrong
    and start a report as it ends, after ``reported`` began to wait: that report (which asks
    the worker for its receipt) is waited for too. Before, ``reported`` waited only for the
    tasks it saw when called, so the process closed its links under the receipt request and
    the liar's wrong answer was rejected with nothing to prove (CI: the slow-liar test)."""
    async def main() -> None:
        req = Requester(PeerKey.generate().peer_id)
        receipt_asked = asyncio.Event()
        receipt = asyncio.get_running_loop().create_future()

        async def report() -> None:  # as Requester._report: waits for the worker's receipt
            receipt_asked.set()
            await receipt

        async def beaten_attempt() -> None:  # as _JobRun._attempt then _judge_beaten
            await asyncio.sleep(0)
            req._reports.spawn(report())

        req.outlive(asyncio.ensure_future(beaten_attempt()), 5.0)
        waiting = asyncio.ensure_future(req.reported(5.0))
        await receipt_asked.wait()
        await asyncio.sleep(0.05)  # reported() must still be waiting on the receipt
        assert not waiting.done()
        receipt.set_result(b"signed")
        await asyncio.wait_for(waiting, 1.0)
        await req.close()

    asyncio.run(main())
