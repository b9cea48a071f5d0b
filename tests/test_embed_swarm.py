"""MiniLM over a real local swarm: equal to the local forward, weights sent once."""

from __future__ import annotations

import numpy as np
import pytest

import swarm
from models.minilm import DIM, MiniLM

pytestmark = pytest.mark.system

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


def test_every_chunk_on_workers_and_verified_and_the_bundle_travels_once():
    """Each worker runs the six layers over its chunk and is sent the weights once, as one
    bundle; after that only each token's first-layer input (384 floats) goes out, and the
    trace of every product (20,736 floats a token) comes back, every product checked."""
    from models.minilm_span import TRACE_WIDTH, bundle

    with swarm.local(2) as fresh:
        embedder = fresh.embedder()
        first = embedder.run(TEXTS[:4])
        again = embedder.run(TEXTS[:4])
        workers = {str(w) for w in fresh.worker_ids}
    for run in (first, again):
        assert set(run.peers) == workers, run.peers  # both workers had a chunk
        assert sum(r.verified for r in run.peers.values()) == sum(
            r.shards for r in run.peers.values()) >= 2
        assert not any(r.rejected or r.failed for r in run.peers.values())
        assert sum(r.bytes_in for r in run.peers.values()) == run.tokens * TRACE_WIDTH * 4
    size = bundle(embedder.model.layers).nbytes  # 42.6 MB: once to each worker
    assert sum(r.bytes_out for r in first.peers.values()) == first.tokens * DIM * 4 + 2 * size
    assert sum(r.bytes_out for r in again.peers.values()) == again.tokens * DIM * 4
    assert first.truncated == [3] and again.tokens == first.tokens


def test_a_worker_that_runs_only_matmul_takes_its_share_product_by_product(client,
                                                                          monkeypatch):
    """A worker whose link says it runs only matmul shards, as a browser tab's does (here a
    native worker's link is flagged so; a real tab: tests/system/test_browser.py), is never
    sent a ``minilm`` call (nor the 42 MB bundle), and a chunk of every batch runs product
    by product, each product a verified matmul job that it takes shards of."""
    embedder = client.embedder()
    tab, native = client.worker_ids
    monkeypatch.setattr(client._node.requester.links[tab], "tab", True, raising=False)
    seen: list[tuple] = []
    plain = client._node.requester.call

    async def call(peer, c, **kw):
        seen.append((peer, c.actor))
        return await plain(peer, c, **kw)

    monkeypatch.setattr(client._node.requester, "call", call)
    run = embedder.run(TEXTS, batch=6)
    want = MiniLM.load().embed(TEXTS)
    assert np.abs(run.vectors - want).max() <= 1e-5
    assert (tab, "minilm") not in seen and (native, "minilm") in seen
    assert (tab, "matmul") in seen
    mine = run.peers[str(tab)]
    assert mine.shards >= 1 and mine.verified == mine.shards and not mine.rejected


def test_bad_arguments(client):
    with pytest.raises(TypeError, match="wrap a single one"):
        client.embed("hello")
    with pytest.raises(ValueError, match="batch"):
        client.embed(["x"], batch=0)


def test_concurrent_runs_each_report_their_own_calls(client, monkeypatch):
    """Two runs of one embedder at once (two threads calling ``embedder.run``): each run's
    per-peer report counts exactly its own calls, none of the other's. The runs' sentences
    have different token counts, so every call tells whose it is by its rows."""
    import threading

    embedder = client.embedder()
    embedder.run(["both workers get the bundle first"] * 4, batch=4)  # not counted below
    a_texts, b_texts = ["alpha beta"] * 8, ["gamma delta epsilon zeta eta theta iota kappa"] * 8
    tokenize = embedder.model.tokenizer.encode
    size_a, size_b = tokenize(a_texts[:1]).tokens, tokenize(b_texts[:1]).tokens
    assert size_b % size_a and size_b * 2 % size_a  # no chunk of B has A's sizes
    calls: dict[str, list[int]] = {"a": [], "b": []}
    a_sent = threading.Event()
    plain = client._node.requester.call

    async def call(peer, c, **kw):
        rows = c.args[0].array.shape[0]
        calls["a" if rows % size_a == 0 and rows % size_b else "b"].append(rows)
        if rows % size_b:
            a_sent.set()
        return await plain(peer, c, **kw)

    monkeypatch.setattr(client._node.requester, "call", call)
    got = {}
    a = threading.Thread(target=lambda: got.setdefault("a", embedder.run(a_texts, batch=2)))
    a.start()
    assert a_sent.wait(60)  # B starts while A is under way
    got["b"] = embedder.run(b_texts, batch=2)
    a.join(120)
    for key in ("a", "b"):
        peers = got[key].peers.values()
        assert sum(r.shards for r in peers) == sum(r.verified for r in peers) == len(calls[key])
        assert sum(r.bytes_out for r in peers) == sum(calls[key]) * DIM * 4
        assert sum(calls[key]) == got[key].tokens


def test_the_readmes_semantic_search_runs_as_written(tmp_path):
    """The README's example, copied out of README.md and run as a user would (its own
    process, another directory): the interest-rate question finds the central bank first."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import subprocess_env

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("A small semantic search", 1)[1].split("```python\n", 1)[1]
    script = tmp_path / "search.py"
    script.write_text(block.split("```", 1)[0])
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith("The central bank raised interest rates."), lines
    scores = [float(line.split()[0]) for line in lines]
    assert scores[0] > scores[1] + 0.2, scores
