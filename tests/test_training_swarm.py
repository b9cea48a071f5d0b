"""Training on a real local swarm (worker processes over TLS), every gradient checked.

Two honest workers train the same loss curve as this process alone with the same seed; beside
a worker that corrupts every result (``SWARM_CHAOS=corrupt=1``) the curve is still the honest
one, none of its gradients used, and the worker is proven by the trace it signed.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import swarm
from models.data import load_mnist
from swarm.training import RankTally, TrainConfig, Trainer, local_compute, train
from tests.conftest import subprocess_env

pytestmark = [pytest.mark.system]

CONFIG = dict(model="mlp:784-128-10", epochs=1, batch=64, lr=0.05, momentum=0.9, seed=3)
STEPS = 25
"""Steps compared (a shorter run than an epoch keeps the test quick)."""


@pytest.fixture(scope="module")
def data():
    d = load_mnist()
    n = STEPS * CONFIG["batch"]
    return type(d)(d.x[:n], d.y[:n], d.x_test, d.y_test, d.name)


@pytest.fixture(scope="module")
def reference(data):
    t = Trainer(TrainConfig(**CONFIG), data)
    train(t, local_compute(t.sizes))
    return t


def same_curve(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want) == STEPS
    rel = np.abs(np.array(got) - want) / np.abs(want)
    assert rel.max() <= 1e-5, rel


def test_two_workers_train_the_local_curve(data, reference):
    with swarm.local(2, threads=1) as client:
        job = client.train(data, **CONFIG)
        result = job.result(300)
        same_curve(result.losses, reference.losses)
        assert np.allclose(job.trainer.params, reference.params, rtol=1e-4, atol=1e-5)
        workers = {str(w) for w in client.worker_ids}
        assert result.rejected == 0
        done = {p: t.samples for p, t in result.ranks.items() if t.samples}
        assert set(done) <= workers | {"local"} and sum(done.values()) >= len(data.y)
        assert len(set(done) & workers) == 2, result.ranks  # both took part
        assert job.history[0].epoch == 1 and job.progress.step == STEPS


def test_a_corrupting_worker_changes_nothing_and_is_proven(data, reference):
    with swarm.local(2, threads=1, chaos=[None, "corrupt=1"]) as client:
        honest, liar = client.worker_ids
        result = client.train(data, **CONFIG).result(300)
        same_curve(result.losses, reference.losses)
        assert result.ranks[str(liar)].rejected >= 1 and result.ranks[str(liar)].samples == 0
        assert result.rejected == result.ranks[str(liar)].rejected
        deadline = time.monotonic() + 30
        while liar not in client.node.proven_liars and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.node.proven_liars == {liar}
        assert honest not in client.node.proven_liars
        # blocked: it is offered no more work, and the next run goes on without it
        assert liar not in client.node.requester.workers()
        few = type(data)(data.x[:320], data.y[:320], data.x_test, data.y_test, data.name)
        again = client.train(few, **CONFIG).result(300)
        assert str(liar) not in again.ranks and again.rejected == 0
        assert again.ranks[str(honest)].samples > 0


def test_a_worker_killed_and_one_joining_mid_training_leave_the_curve_as_it_was(
        data, reference, tmp_path):
    """SIGKILL one worker after step 8; start another at step 16 and let it join: every
    step's loss is still the local one, and the newcomer computed blocks from then on."""
    import os
    import signal
    import subprocess
    import sys

    from swarm.api import _read_ready
    from swarm.training import start

    with swarm.local(2, threads=1) as client:
        newcomer: list = []

        def on_step(p) -> None:
            if p.step == 8:
                os.kill(client.processes[0].pid, signal.SIGKILL)
            elif p.step == 16:
                proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "swarm.processes.worker", "--swarm-id",
                     client.swarm_id.hex(), "--bootstrap", client.bootstrap, "--data-dir",
                     str(tmp_path / "late"), "--backend", "numpy", "--threads", "1",
                     "--dht-timeout", "1", "--bench-size", "256", "--exit-with-parent"],
                    stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                    env=subprocess_env())
                client.processes.append(proc)  # stopped with the swarm
                newcomer.append(_read_ready(proc, 60))
                deadline = time.monotonic() + 60   # the client dials members every 2 s
                while newcomer[0] not in client.node.requester.workers() \
                        and time.monotonic() < deadline:
                    time.sleep(0.05)

        job = start(client, data, TrainConfig(**CONFIG), on_step=on_step)
        result = job.result(300)
        same_curve(result.losses, reference.losses)
        assert client.processes[0].wait(10) == -signal.SIGKILL
        assert result.ranks[str(newcomer[0])].samples > 0, result.ranks
        assert result.rejected == 0


def test_two_workers_train_mnist_past_92_percent():
    """A shorter run than the issue's 10 epochs (bench/train.py --epochs 10 runs that):
    4 epochs of mlp:784-128-10 on the 4,000 training digits, tested on the 1,000 held out."""
    with swarm.local(2, threads=1) as client:
        result = client.train("mnist", model="mlp:784-128-10", epochs=4, batch=64, lr=0.1,
                              momentum=0.9, seed=0).result(600)
    assert result.test_accuracy >= 0.92, result.as_json()
    assert [e.epoch for e in result.epochs] == [1, 2, 3, 4] and result.rejected == 0


def test_f16_traces_keep_the_curve_within_the_stated_bound_of_f32(data, reference):
    """Products travel in f16 (half the bytes), each rounded on the worker as the local f16
    run rounds it: the curve stays within the stated 1e-3 per step of the f32 curve over
    these steps, and within 1e-4 of the local f16 run's (not 1e-5: where two honest f32 sums
    differ in the last bit, the rounding to f16 of that element can differ by one f16 step)."""
    local = Trainer(TrainConfig(**{**CONFIG, "precision": "f16"}), data)
    train(local, local_compute(local.sizes, "f16"))
    with swarm.local(2, threads=1) as client:
        result = client.train(data, **{**CONFIG, "precision": "f16"}).result(300)
    assert result.rejected == 0 and len(result.losses) == STEPS
    got = np.array(result.losses)
    assert (np.abs(got - reference.losses) / reference.losses).max() <= 1e-3
    assert (np.abs(got - local.losses) / np.array(local.losses)).max() <= 1e-4


def test_a_slow_worker_has_its_blocks_redone_and_the_curve_stays(data, reference):
    """One worker answers every call 1.5 s late (``SWARM_CHAOS=delay=1500``): its blocks are
    copied to the other worker when it falls behind, no step waits for it every time, and
    the curve is the local one."""
    with swarm.local(2, threads=1, chaos=[None, "delay=1500"]) as client:
        fast, slow = (str(w) for w in client.worker_ids)
        t0 = time.monotonic()
        result = client.train(data, **CONFIG).result(300)
        seconds = time.monotonic() - t0
    same_curve(result.losses, reference.losses)
    assert result.ranks[fast].samples > result.ranks.get(slow, RankTally()).samples
    assert seconds < STEPS * 1.5, seconds  # not a full delay a step
