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
