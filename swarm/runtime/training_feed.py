"""What a worker saw of the training it served: per model, the loss and accuracy of the MLP
blocks it computed, second by second, for the node's status panel (sans-IO).

A training job's curve lives in its trainer's process (``swarm train --http`` serves it);
the panel of a node, the page its owner opens, can still draw the job live from the blocks
this node computed: each block's loss and correct count are the worker's own pass (its
softmax on its own logits), so nothing here is anybody else's word. The points are the
training samples of those blocks: a share of each step, so the curves follow the job's
and are noisier.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable

SECONDS = 600
"""Seconds of points kept per model (one point a second: ten minutes)."""
MAX_MODELS = 8
"""Models tracked at once (the least recently served is dropped first)."""


class TrainingFeed:
    """Per model spec, one point a second: ``[unix time, samples, mean loss, accuracy]``
    over the blocks served in that second. Thread-safe (actors run on the compute thread)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._models: collections.OrderedDict[str, collections.deque] = \
            collections.OrderedDict()
        self.samples = 0
        """Training samples served in all."""

    def record(self, model: str, rows: int, loss_sum: float, correct: int) -> None:
        """A block of ``rows`` samples was computed here: their summed loss, how many the
        model classified right."""
        if rows <= 0 or not math.isfinite(loss_sum):
            return
        second = math.floor(self._clock())
        with self._lock:
            points = self._models.pop(model, None)
            if points is None:
                points = collections.deque(maxlen=SECONDS)
                if len(self._models) >= MAX_MODELS:
                    self._models.popitem(last=False)
            self._models[model] = points
            if points and points[-1][0] == second:
                _, n, loss, right = points[-1]
                points[-1] = [second, n + rows, loss + loss_sum, right + correct]
            else:
                points.append([second, rows, loss_sum, correct])
            self.samples += rows

    def series(self) -> list[dict]:
        """``[{model, samples, points: [[t, samples, loss, accuracy], ...]}]``, the most
        recently served model first."""
        with self._lock:
            models = list(self._models.items())
        return [{"model": model, "samples": sum(p[1] for p in points),
                 "points": [[t, n, round(loss / n, 6), round(right / n, 6)]
                            for t, n, loss, right in list(points)]}
                for model, points in reversed(models)]
