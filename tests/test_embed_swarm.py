"""MiniLM over a real local swarm: equal to the local forward, weights sent once."""

from __future__ import annotations

import numpy as np
import pytest

import swarm
from models.minilm import MiniLM

TEXTS = ["hello world", "", "Café au lait 🍕", "word " * 300,
         "The quick brown fox jumps over the lazy dog.", "a"]


@pytest.fixture(scope="module")
def client():
    with swarm.local(2) as c:
        yield c


def test_swarm_embeddings_equal_the_local_forward(client):
    got = client.embed(TEXTS, batch=4)
    want = np.concatenate([MiniLM.load().embed(TEXTS[i:i + 4]) for i in range(0, len(TEXTS), 4)])
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 384)
    assert np.abs(got - want).max() <= 1e-5


def test_every_band_on_workers_and_verified_and_weights_travel_once(client):
    embedder = client.embedder()
    assert client._verifier.max_entries >= 24  # the check's b @ R kept for every weight
    first = embedder.run(TEXTS[:4])
    again = embedder.run(TEXTS[:4])
    workers = {str(w) for w in client.worker_ids}
    for run in (first, again):
        assert set(run.peers) <= workers and run.peers, run.peers
        assert sum(r.verified for r in run.peers.values()) == sum(
            r.shards for r in run.peers.values()) > 0
        assert not any(r.rejected for r in run.peers.values())
    weights = sum(w.array.nbytes for w in embedder.model.weights())  # 42 MB
    # per layer the activations into Q/K/V, the attention output and FFN in (384 floats a
    # token each) and FFN out (1536): all that travels once each worker holds the weights
    activations = again.tokens * 4 * (3 * 384 + 1536) * 6
    assert activations < weights / 2
    assert activations <= sum(r.bytes_out for r in again.peers.values()) < 1.5 * activations
    assert first.truncated == [3] and again.tokens == first.tokens


def test_bad_arguments(client):
    with pytest.raises(TypeError, match="wrap a single one"):
        client.embed("hello")
    with pytest.raises(ValueError, match="batch"):
        client.embed(["x"], batch=0)
