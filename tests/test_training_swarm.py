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
from swarm.training import TrainConfig, Trainer, local_compute, train

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
