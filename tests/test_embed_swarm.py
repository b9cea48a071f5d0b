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


def test_concurrent_runs_each_report_their_own_jobs(client, monkeypatch):
    """Two runs of one embedder at once (two threads calling ``client.embed``): each run's
    per-peer report is exactly the sum of its own jobs' reports, none of the other's. Each
    run's batches have their own token count, so every job tells whose it is by its rows."""
    import threading

    from swarm.runtime import jobs

    embedder = client.embedder()
    a_texts, b_texts = ["alpha beta"] * 8, ["gamma delta epsilon zeta eta theta"] * 8
    tokenize = embedder.model.tokenizer.encode
    rows_a, rows_b = tokenize(a_texts[:2]).tokens, tokenize(b_texts[:2]).tokens
    assert rows_a != rows_b
    rows_of: dict[int, int] = {}
    seen: dict[int, list] = {rows_a: [], rows_b: []}
    a_done_one = threading.Event()
    plan, run = jobs.matmul_job, client._node.requester.run

    def planned(a, b, **kw):
        job = plan(a, b, **kw)
        rows_of[id(job.calls)] = a.shape[0]
        return job

    async def ran(calls, **kw):
        rows = rows_of.pop(id(calls))
        results, report = await run(calls, **kw)
        seen[rows].append(report)
        if rows == rows_a:
            a_done_one.set()
        return results, report

    monkeypatch.setattr(jobs, "matmul_job", planned)
    monkeypatch.setattr(client._node.requester, "run", ran)
    got = {}
    a = threading.Thread(target=lambda: got.setdefault("a", embedder.run(a_texts, batch=2)))
    a.start()
    assert a_done_one.wait(60)  # B starts while A is under way
    got["b"] = embedder.run(b_texts, batch=2)
    a.join(120)
    counts = ("shards", "bytes_out", "bytes_in", "verified", "rejected", "failed")
    for key, rows in (("a", rows_a), ("b", rows_b)):
        want: dict[str, list[int]] = {}
        for report in seen[rows]:
            for peer, r in report.peers.items():
                total = want.setdefault(peer, [0] * len(counts))
                for i, c in enumerate(counts):
                    total[i] += getattr(r, c)
        assert len(seen[rows]) == 4 * 24  # 4 batches, 24 weight products each
        assert {p: [getattr(r, c) for c in counts] for p, r in got[key].peers.items()} == want


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
