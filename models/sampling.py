"""Choosing the next token from logits: greedy, or sampled with temperature and top-p
(nucleus) from a seeded generator, so that the same seed gives the same text."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_TEMPERATURE = 2.0  # OpenAI's range for chat completions


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy (argmax)
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        t, p = self.temperature, self.top_p
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) \
                or not 0 <= t <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be a number from 0 to {MAX_TEMPERATURE:g} "
                             f"(0 picks the likeliest token), got {t!r}")
        if isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p) \
                or not 0 < p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")


class Sampler:
    """One generation's choices; holds the generator so a seed fixes the whole sequence."""

    def __init__(self, sampling: Sampling):
        self.sampling = sampling
        self._rng = np.random.default_rng(sampling.seed)

    def __call__(self, logits: np.ndarray) -> int:
        s = self.sampling
        if s.temperature == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / s.temperature
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        sorted_p = p[order]
        if s.top_p < 1:
            # the smallest set of likeliest tokens whose mass reaches top_p
            keep = int(np.searchsorted(np.cumsum(sorted_p), s.top_p)) + 1
            order, sorted_p = order[:keep], sorted_p[:keep]
        cdf = np.cumsum(sorted_p)
        i = int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"))
        return int(order[min(i, len(order) - 1)])
