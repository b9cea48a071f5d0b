"""Verified model outputs from untrusted workers: liars get no wrong embedding into the output.

A real local swarm (worker processes over TLS): one honest worker, and one that corrupts every
result (``SWARM_CHAOS=corrupt=1``) or runs the layers with a plausible wrong layer's weights
(the next layer's, ``layer=1``). Every embedding equals the local forward's; each liar is
caught, proven by the trace it signed, and given no more work; the job completes on the
honest worker.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import swarm
from models.minilm import MiniLM
from swarm.runtime.chaos import Chaos, parse

pytestmark = [pytest.mark.system]

TEXTS = ["hello world", "Verified model outputs from untrusted machines.", "Москва", "",
         "word " * 40]


@pytest.mark.parametrize("liar", ["corrupt=1", "layer=1"])
def test_a_liar_gets_no_wrong_embedding_in_and_is_blocked_on_evidence(liar):
    want = MiniLM.load().embed(TEXTS)
    with swarm.local(2, threads=1, chaos=[None, liar]) as client:
        honest, liar_id = client.worker_ids
        run = client.embedder().run(TEXTS)
        assert np.abs(run.vectors - want).max() <= 1e-5
        mine = run.peers.get(str(liar_id))
        assert mine is not None and mine.rejected >= 1 and mine.verified == 0, run.peers
        assert run.peers[str(honest)].verified > 0
        deadline = time.monotonic() + 30
        while liar_id not in client.node.proven_liars and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.node.proven_liars == {liar_id}
        # proven: later jobs go to the honest worker only, and are still right
        again = client.embedder().run(TEXTS)
        assert np.abs(again.vectors - want).max() <= 1e-5
        assert str(liar_id) not in again.peers and honest not in client.node.proven_liars


def test_wrong_layer_is_plausible():
    """What ``layer=1`` sends is a real product of the right shape, not noise."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 4)).astype(np.float32)
    w, other = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    c = Chaos(parse("layer=1,seed=1"))
    assert c.next_task().layer
    assert c.wrong_layer(a, w, [w, other]) is other                    # another layer's weight
    assert np.array_equal(a @ c.wrong_layer(a, w, [w]), a)             # a skipped layer
    tall = rng.standard_normal((4, 6)).astype(np.float32)
    assert c.wrong_layer(a, tall, []).shape == tall.shape
