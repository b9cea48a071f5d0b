"""The training panel (`swarm train --http`): a running job's curves, live, as JSON and a page."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np

from models.data import Dataset
from swarm import training
from swarm.web.training import MAX_POINTS, TrainingPanel, snapshot


def blobs(n: int = 400, features: int = 12, classes: int = 3, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, features)).astype(np.float32)
    y = rng.integers(0, classes, n)
    x = centres[y] + 0.3 * rng.standard_normal((n, features)).astype(np.float32)
    return Dataset(x[:320], y[:320], x[320:], y[320:], "blobs")


def test_the_panel_serves_the_running_jobs_curves_as_they_grow():
    config = training.TrainConfig(model="mlp:12-8-3", epochs=30, batch=8, lr=0.05, seed=1)

    async def main() -> tuple[list[dict], str, str]:
        job = training.start(None, blobs(), config)
        panel = TrainingPanel(job, "127.0.0.1", 0)
        await panel.start()
        seen = []
        try:
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{panel.port}"
                while True:  # each answer as the run goes on, then the finished run's
                    async with http.get(f"{base}/training.json") as r:
                        seen.append(await r.json())
                    if seen[-1]["done"]:
                        break
                    await asyncio.sleep(0.05)
                async with http.get(f"{base}/status") as r:
                    page = await r.text()
                async with http.get(f"{base}/static/training.js") as r:
                    script = await r.text()
        finally:
            await panel.stop()
            job.result(60)
        return seen, page, script

    seen, page, script = asyncio.run(main())
    live = [s for s in seen if not s["done"] and s["losses"]]
    assert live, "no answer while the run went on"
    assert len(live[0]["losses"]) < len(seen[-1]["losses"]) == 30 * 40
    last = seen[-1]
    assert [e["epoch"] for e in last["epochs"]] == list(range(1, 31))
    assert last["epochs"][-1]["accuracy"] >= 0.9 and last["model"] == "mlp:12-8-3"
    assert [p[0] for p in last["losses"]] == list(range(1, 1201))
    assert last["ranks"] == [] or last["ranks"][0]["peer"] == "local"
    assert 'src="/static/training.js"' in page and "/training.json" in script
    json.dumps(last)  # no NaN (not JSON) in it


def test_a_long_curve_is_thinned_keeping_its_last_point():
    config = training.TrainConfig(model="mlp:12-8-3", epochs=1, batch=8, lr=0.05, seed=1)
    job = training.start(None, blobs(), config)
    job.result(60)
    job.trainer.losses[:] = [float(i) for i in range(5001)] + [float("nan")]
    points = snapshot(job)["losses"]
    assert len(points) <= MAX_POINTS + 1
    assert points[0] == [1, 0.0] and points[-1] == [5002, None]


def test_the_feed_bins_a_workers_blocks_per_second_and_keeps_few_models():
    from swarm.runtime.training_feed import MAX_MODELS, TrainingFeed

    now = [100.2]
    feed = TrainingFeed(clock=lambda: now[0])
    feed.record("mlp:4-3", 8, 8 * 1.0, 2)
    feed.record("mlp:4-3", 8, 8 * 0.5, 6)      # the same second: one point
    now[0] = 101.7
    feed.record("mlp:4-3", 16, 16 * 0.25, 12)
    feed.record("mlp:4-3", 4, float("nan"), 0)  # not a loss: left out
    [m] = feed.series()
    assert m == {"model": "mlp:4-3", "samples": 32,
                 "points": [[100, 16, 0.75, 0.5], [101, 16, 0.25, 0.75]]}
    for k in range(MAX_MODELS + 1):
        feed.record(f"mlp:{k + 5}-2", 1, 0.1, 1)
    names = [s["model"] for s in feed.series()]
    assert len(names) == MAX_MODELS and names[0] == f"mlp:{MAX_MODELS + 5}-2"
    assert "mlp:4-3" not in names  # the least recently served went first


def test_the_nodes_status_panel_serves_the_curves_of_the_blocks_it_computed():
    """The node's own panel (/status, the page its owner opens): the loss and accuracy of
    the MLP blocks its worker computed, from the real actor on the real host, in
    /status.json, and the page's script that draws them (drawn in a browser:
    tests/system/test_browser.py)."""
    import compute
    from identity.keys import PeerKey
    from swarm.runtime.actors import MLPActor
    from swarm.runtime.host import ActorHost
    from swarm.web.server import SwarmInfo, WebServer

    class Node:  # what the web server reads of a node, its host real
        key = PeerKey.generate()
        peer_id = key.peer_id
        config = type("Config", (), {"host": "127.0.0.1"})
        host = ActorHost(compute.get_backend("numpy"))
        _accepts = staticmethod(lambda peer: True)

    data = blobs()
    sizes = [12, 8, 3]
    params = training.mlp.init_params(sizes, 0)
    actor = Node.host._make(MLPActor)
    for i in range(0, 64, 16):
        actor.grad([data.x[i:i + 16], params],
                   {"sizes": sizes, "labels": data.y[i:i + 16].tolist()})

    async def main() -> tuple[dict, str]:
        server = WebServer(Node(), SwarmInfo(bytes(20), "lab", "ab" * 16, False, "magnet:?"),
                           "127.0.0.1", 0)
        await server.start()
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{server.url}status.json") as r:
                    status = await r.json()
                async with http.get(f"{server.url}static/status.js") as r:
                    script = await r.text()
                async with http.get(f"{server.url}static/curve.js") as r:
                    assert r.status == 200 and "export function curve" in await r.text()
        finally:
            await server.stop()
        return status, script

    status, script = asyncio.run(main())
    [m] = status["training"]
    assert m["model"] == "mlp:12-8-3" and m["samples"] == 64
    loss = sum(p[1] * p[2] for p in m["points"]) / 64
    want = training.mlp.run_block(params, sizes, data.x[:64], data.y[:64],
                                  training.mlp.local_products)
    assert abs(loss - want.loss / 64) < 1e-5  # the worker's own pass, the trainer's loss
    assert "s.training" in script and "curve(" in script
