"""The training panel: a running job's loss and accuracy curves, live, served by the process
that trains (``swarm train --http HOST:PORT``), since the curves exist only there.

:func:`snapshot` (sans-IO) is what ``/training.json`` answers; :class:`TrainingPanel` is the
thin aiohttp adapter serving it, the page (``/status``) and its script from ``static/``,
behind the same DNS-rebinding guard as the node's panel.
"""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from swarm.web.hosts import allowed_names, host_guard

MAX_POINTS = 2000
"""Most loss points one answer carries (a longer curve is thinned evenly, the last kept)."""
FILES = {"/status": ("training.html", "text/html"),
         "/static/training.js": ("training.js", "text/javascript"),
         "/static/curve.js": ("curve.js", "text/javascript"),
         "/static/style.css": ("style.css", "text/css")}


def _num(v: float) -> float | None:
    return round(v, 6) if math.isfinite(v) else None


def snapshot(job: Any) -> dict[str, Any]:
    """A :class:`swarm.training.TrainJob`'s state as JSON: the model, where it is, each
    step's loss (``[step, loss]``, thinned to :data:`MAX_POINTS`), each finished epoch and
    each rank's part so far."""
    losses = job.losses
    every = max(1, -(-len(losses) // MAX_POINTS))
    points = [[i + 1, _num(v)] for i, v in enumerate(losses) if i % every == 0]
    if losses and (len(losses) - 1) % every:
        points.append([len(losses), _num(losses[-1])])
    p = job.progress
    ranks = getattr(job._compute, "ranks", {})
    return {"model": job.trainer.config.model, "done": job.done,
            "step": p.step, "steps": p.steps, "epoch": p.epoch,
            "samples_per_s": round(p.samples_per_s, 1), "lr": job.trainer.lr,
            "losses": points,
            "epochs": [{"epoch": e.epoch, "loss": _num(e.loss), "accuracy": _num(e.accuracy),
                        "seconds": round(e.seconds, 3)} for e in job.history],
            "ranks": [{"peer": str(peer), "samples": t.samples, "rejected": t.rejected,
                       "failed": t.failed} for peer, t in sorted(dict(ranks).items())]}


class TrainingPanel:
    """Serves one job's panel at ``http://host:port/status`` (port 0: any free one)."""

    def __init__(self, job: Any, host: str, port: int) -> None:
        self.job, self.host, self.port = job, host, port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/status"

    async def start(self) -> None:
        from swarm.web.server import STATIC

        app = web.Application(middlewares=[host_guard(allowed_names(self.host))])
        for path, (name, kind) in FILES.items():
            app.router.add_get(path, _file(STATIC / name, kind))
        app.router.add_get("/training.json", self._json)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


    async def _json(self, request: web.Request) -> web.Response:
        return web.json_response(snapshot(self.job), headers={"Cache-Control": "no-cache"})


def _file(path: Any, kind: str):
    body = path.read_bytes()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=kind, headers={
            "Cache-Control": "no-cache",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:"})

    return handler
