"""Continuous batching: every sequence streamed from one forward runs in one batch, and a
new one joins at the next step instead of waiting for the others to finish (as vLLM does).

One thread per forward runs the steps while any sequence is active (and ends when none is):
each step is one ``forward_batch`` over the sequences that joined since the last step (their
whole prompts: prefill) and every running one (its last token), then each sequence's own
:class:`models.generate.Decode` samples from its logits and hands the piece to its reader.
Each sequence keeps its own cache, sampler and stops, so its tokens are the ones it would
get alone (greedy: the same; the batch only shares the weight products). A reader that stops
reading (closes its iterator) leaves the batch at the next step. A forward that fails fails
the sequences of that step, each told the error.

A forward that runs its blocks on several workers in turn (swarm.spans: one span each) says how
many ``lanes`` it takes: that many batches then run side by side, each in its own thread and at
its own step, so that while one lane's step is on the second span the next lane's is on the
first, and every worker computes at once (pipelining, as Petals and GPipe do across stages).
A new sequence joins the lane with the fewest; each lane is a continuous batch as above.
"""

from __future__ import annotations

import functools
import queue
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from threadpoolctl import ThreadpoolController

MAX_BATCH = 64
"""Sequences one step runs at most (more wait for the next step)."""


@dataclass(eq=False)
class _Seq:
    ids: list[int]
    decode: Any
    """Its models.generate.Decode."""
    pieces: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    left: threading.Event = field(default_factory=threading.Event)
    """Its reader is gone: drop it at the next step."""
    cache: Any = None
    last: int | None = None


@dataclass
class BatchStats:
    steps: int = 0
    widest: int = 0
    """The most sequences one step ran."""
    joined_running: int = 0
    """Sequences that joined while others were running."""


class Batcher:
    """The batch of one forward (``model``: a models.llama.Llama, or a SpanLlama), in as many
    lanes as the forward takes (its ``lanes``, else one)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.lanes = max(1, int(getattr(model, "lanes", 1)))
        self.stats = BatchStats()
        self._lock = threading.Lock()
        self._joining: list[_Seq] = []
        self._sizes: dict[int, int] = {}
        """Each running lane's sequences (the lanes' threads, by number)."""

    def stream(self, ids: list[int], decode: Any) -> Iterator[Any]:
        """Run ``ids`` (a checked prompt and its models.generate.Decode: Generator.prepare)
        in the batch; its pieces (models.generate.Piece)."""
        seq = _Seq(list(ids), decode)
        with self._lock:
            self._joining.append(seq)
            lane = next((i for i in range(self.lanes) if i not in self._sizes), None)
            if lane is not None:  # a lane more, up to the forward's (each takes its share)
                self._sizes[lane] = 0
                threading.Thread(target=self._loop, args=(lane,), name=f"batch-{lane}",
                                 daemon=True).start()
        return self._read(seq)

    @staticmethod
    def _read(seq: _Seq) -> Iterator[Any]:
        try:
            while True:
                p = seq.pieces.get()
                if isinstance(p, BaseException):
                    raise p
                yield p
                if p.finish_reason:
                    return
        finally:
            seq.left.set()

    def _take(self, lane: int, active: list[_Seq]) -> list[_Seq] | None:
        """The sequences that join ``lane`` at its next step (its share of the waiting ones:
        the lanes end up even), or None when it is to end (nothing left to run)."""
        with self._lock:
            waiting = len(self._joining)
            total = sum(self._sizes.values()) - self._sizes[lane] + len(active) + waiting
            share = min(MAX_BATCH, -(-total // len(self._sizes)))
            room = max(0, share - len(active))
            joining, self._joining = self._joining[:room], self._joining[room:]
            joining = [s for s in joining if not s.left.is_set()]
            if not active and not joining:
                if self._joining:
                    return []  # those it took had left: it takes again
                del self._sizes[lane]
                return None
            self._sizes[lane] = len(active) + len(joining)
            return joining

    def _loop(self, lane: int) -> None:
        active: list[_Seq] = []
        while True:
            active = [s for s in active if not s.left.is_set()]
            joining = self._take(lane, active)
            if joining is None:
                return
            if active and joining:
                with self._lock:
                    self.stats.joined_running += len(joining)
            for s in joining:
                s.cache = self.model.new_cache(s.decode.capacity(s.ids))
            batch = active + joining
            if not batch:
                continue
            items = [([s.last], s.cache) for s in active] + [(s.ids, s.cache) for s in joining]
            try:
                with _blas().limit(limits=1, user_api="blas"):
                    logits = self.model.forward_batch(items)
            except Exception as exc:  # noqa: BLE001 - each reader is told, none hangs
                for s in batch:
                    s.pieces.put(exc)
                active = []
                continue
            with self._lock:
                self.stats.steps += 1
                self.stats.widest = max(self.stats.widest, len(batch))
            active = []
            for s, lg in zip(batch, logits, strict=True):
                try:
                    piece = s.decode.step(lg)
                except Exception as exc:  # noqa: BLE001
                    s.pieces.put(exc)
                    continue
                s.pieces.put(piece)
                if piece.finish_reason is None:
                    s.last = piece.token
                    active.append(s)


_batchers: weakref.WeakKeyDictionary[Any, Batcher] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def batcher(gen: Any) -> Batcher:
    """The one batch of ``gen``'s forward (every models.generate.Generator over the same
    forward shares it)."""
    with _lock:
        b = _batchers.get(gen.model)
        if b is None:
            b = _batchers[gen.model] = Batcher(gen.model)
        return b


@functools.cache
def _blas() -> ThreadpoolController:
    """A step runs BLAS on one thread, as models.generate does (its reasons)."""
    return ThreadpoolController()
