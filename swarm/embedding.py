"""Sentence embeddings over the swarm: MiniLM's forward with every matmul a verified job.

The forward pass (:mod:`models.minilm`) runs in the requester; its weight products go to the
workers through :class:`swarm.executor.SwarmExecutor` (weights sent once, cached by content
address, every band Freivalds-checked). Sentences go in batches: one batch's products are one
job each, so per-call overhead is spread over all the batch's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.minilm import DIM, MiniLM
from swarm.executor import SwarmExecutor
from swarm.runtime.jobcore import PeerReport

DEFAULT_BATCH = 32
MAX_BATCH = 1024
PIPELINE = 2
"""Batches in flight at once (see :meth:`Embedder.run`)."""


@dataclass(frozen=True)
class Embeddings:
    """What one embedding run made."""

    vectors: np.ndarray
    """float32 [n, 384], L2-normalised, in input order."""
    truncated: list[int]
    """Indices of the sentences cut at 256 tokens."""
    tokens: int
    """Tokens the model read (after truncation), [CLS] and [SEP] included."""
    peers: dict[str, PeerReport]
    """Per peer ("local": the requester): shards, bytes, verified and rejected results."""


def check_texts(texts: object) -> list[str]:
    """``texts`` as a list of str, or a TypeError saying what to pass."""
    if isinstance(texts, str):
        raise TypeError("embed() takes a list of sentences; wrap a single one: embed([text])")
    if not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        raise TypeError("embed() takes a list of str")
    return list(texts)


def check_batch(batch: object) -> int:
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be an int from 1 to {MAX_BATCH}, got {batch!r}")
    return batch


class Embedder:
    """MiniLM bound to a client: the model loaded once, its weights pinned for the client."""

    def __init__(self, client: Any, *, verify: str = "freivalds") -> None:
        self.model = MiniLM.load()
        self.executor = SwarmExecutor(client, verify=verify)
        self.executor.prepare(self.model.weights())

    def run(self, texts: Sequence[str], *, batch: int = DEFAULT_BATCH,
            progress: Callable[[int], None] | None = None) -> Embeddings:
        """Embed ``texts`` ``batch`` at a time; ``progress(done)`` after each batch."""
        texts = check_texts(texts)
        batch = check_batch(batch)
        out = np.empty((len(texts), DIM), np.float32)
        truncated: list[int] = []
        tokens = 0
        executor = self.executor.session()  # this run's report, apart from runs at once

        def one(start: int):
            enc = self.model.tokenizer.encode(texts[start:start + batch])
            return start, enc, self.model.forward(enc, executor)

        # PIPELINE batches in flight: one batch's attention, GELU and LayerNorm run here
        # while another's products run on the workers (numpy releases the GIL)
        with ThreadPoolExecutor(PIPELINE, thread_name_prefix="embed") as pool:
            starts = list(range(0, len(texts), batch))
            futures = [pool.submit(one, s) for s in starts[:PIPELINE]]
            for i in range(len(starts)):
                start, enc, vecs = futures[i].result()
                if i + PIPELINE < len(starts):
                    futures.append(pool.submit(one, starts[i + PIPELINE]))
                out[start:start + enc.lengths.size] = vecs
                truncated += [start + int(j) for j in np.flatnonzero(enc.truncated)]
                tokens += enc.tokens
                if progress is not None:
                    progress(start + enc.lengths.size)
        return Embeddings(out, truncated, tokens, executor.take_report())
