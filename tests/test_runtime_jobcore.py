"""The requester's per-job core without processes or sockets: events in, actions out."""

from __future__ import annotations

import numpy as np

from swarm.runtime.jobcore import Check, JobCore, Probe, Reject, Run, Stop, Tiebreak, twins_of
from swarm.runtime.requester import agree
from swarm.runtime.scheduler import LOCAL, JobScheduler, RateBook, ShardTask


def core(n=4, workers=("fast", "slow"), owners=None, verify=True, replicate=False):
    shards = [ShardTask(i, 1e6) for i in range(n * (2 if replicate else 1))]
    sched = JobScheduler(shards, list(workers), RateBook(), owners=owners, window=2,
                         twins=twins_of(n) if replicate else None)
    return JobCore(n, sched, verify=verify, replicate=replicate, agree=agree)


def out(i):
    return [np.full((2, 2), float(i), np.float32)]


def test_a_straggler_is_copied_at_its_deadline_and_the_late_copy_is_ignored():
    """The end-to-end straggler test's situation with a fake clock: the fast worker answers
    in 50 ms, the slow one not for 20 s; the job ends long before that."""
    job = core(owners=["fast", "slow", "fast", "slow"])
    now, inflight, stopped, probed = 0.0, {}, [], []  # (shard, peer) -> answer time
    while not job.finished and now < 20.0:
        for action in job.poll(now):
            if isinstance(action, Probe):
                probed.append(action.peer)
            elif isinstance(action, Run):
                inflight[(action.shard, action.peer)] = now + (0.05 if action.peer == "fast"
                                                               else 20.0)
            elif isinstance(action, Check):
                job.checked(action, True)
            elif isinstance(action, Stop):
                stopped.append(action)
                inflight.pop((action.shard, action.peer), None)
        if job.finished:
            break
        due = [t for t in inflight.values()] + [t for t in [job.next_wake(now)] if t]
        now = min(due)
        for key in [k for k, t in inflight.items() if t <= now]:
            del inflight[key]
            job.answered(key[0], key[1], out(key[0]), 0.05)
    assert job.finished and now < 1.0
    stopped += [a for a in job.poll(now) if isinstance(a, Stop)]
    assert {s.peer for s in stopped} == {"slow"} and len(stopped) == 2
    assert probed == ["slow", "slow"]  # each overdue shard asks: is the slow one there?
    job.answered(1, "slow", out(99), 20.0)                  # a late copy: ignored
    assert [o[0][0, 0] for o in job.outputs()] == [0.0, 1.0, 2.0, 3.0]
    assert job.report.peers["fast"].verified == 4


def test_the_stop_of_a_copy_the_last_pass_beat_outlives_the_job_and_asks_for_judging():
    """Issue 48, finding 3: the pass that finishes a job beats the straggler it copied; that
    copy's Stop sat in the core when the job ended (only rejections were taken then), the
    adapter cancelled the attempt, and a slow liar's wrong answer was never read. The Stop
    is handed out with the job's end, saying its answer is still judged."""
    job = core(owners=["fast", "slow", "fast", "slow"])
    now, inflight = 0.0, {}
    while not job.finished and now < 20.0:
        for action in job.poll(now):
            if isinstance(action, Run):
                inflight[(action.shard, action.peer)] = now + (0.05 if action.peer == "fast"
                                                               else 20.0)
            elif isinstance(action, Check):
                job.checked(action, True)
            elif isinstance(action, Stop):
                assert action.judge  # an answer checked one by one: judged when it comes
                inflight.pop((action.shard, action.peer), None)
        if job.finished:
            break  # as the adapter does: no poll after the last event
        now = min([*inflight.values(), *[t for t in [job.next_wake(now)] if t]])
        for key in [k for k, t in inflight.items() if t <= now]:
            del inflight[key]
            job.answered(key[0], key[1], out(key[0]), 0.05)
    left = job.outliving()
    assert [(a.peer, a.judge) for a in left] == [("slow", True)], left
    assert job.outliving() == [] and job.poll(now) == []  # handed out once
    assert not core(verify=False)._judges("slow")  # unchecked answers: nothing to judge


def test_an_invalid_refusal_is_misbehaviour_not_a_job_failure():
    job = core(n=2, workers=("liar", "honest"), owners=["liar", "honest"])
    job.poll(0.0)
    job.failed(0, "liar", "invalid", "no such method")
    acts = job.poll(0.1)
    assert Reject("liar", 0, "refused a valid call as invalid: no such method") in acts
    assert "liar" not in job.sched.workers()
    assert job.sched.rates.rejected["liar"] == 1
    assert Run(0, "honest") in acts or any(a.peer == "honest" for a in job.poll(0.2)
                                           if isinstance(a, Run))


def test_disagreeing_replicas_are_settled_by_our_own_run():
    job = core(n=1, workers=("a", "b"), verify=False, replicate=True)
    runs = job.poll(0.0)
    assert {r.peer for r in runs} == {"a", "b"}
    for r in runs:
        job.answered(r.shard, r.peer, out(7) if r.peer == "a" else out(8), 0.1)
    [tie] = [a for a in job.poll(0.2) if isinstance(a, Tiebreak)]
    assert not job.finished
    job.tiebroken(tie.call, out(7))
    [rej] = [a for a in job.poll(0.3) if isinstance(a, Reject)]
    assert rej.peer == "b" and job.finished and job.outputs()[0][0][0, 0] == 7.0


def test_solo_mode_runs_everything_locally():
    job = core(n=2, workers=())
    [run] = job.poll(0.0)
    assert run.peer == LOCAL
    job.answered(run.shard, LOCAL, out(run.shard), 0.01)   # local results need no check
    [run2] = job.poll(0.02)
    job.answered(run2.shard, LOCAL, out(run2.shard), 0.01)
    job.poll(0.03)
    assert job.finished
