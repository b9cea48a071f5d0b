"""The swarm as a model executor (:class:`models.executor.Executor`): verified matmuls on workers.

Each :class:`~models.executor.Weight` is stored once in the client's object store
(``Client.put``: content-addressed, pinned while this executor lives); the first product that
uses it sends it to a worker, which keeps it cached by that address, so later products send
only their activations. Every product is an ordinary ``client.matmul`` job: row bands over the
workers, each band Freivalds-checked against exactly what the worker was sent before it is
used; a band that fails is re-run elsewhere and the evidence goes to the swarm's coordinator
(docs/architecture.md, "Models on the swarm").
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from models.executor import ExecutorError, Product, Weight
from swarm.runtime.jobcore import PeerReport
from swarm.runtime.options import TASK_OPTIONS, validate
from swarm.runtime.refs import ObjectRef


class SwarmExecutor:
    """Runs a model's products as matmul jobs on ``client``'s workers, products of one call
    at once.

    ``verify`` is a matmul ``verify`` option: ``"freivalds"`` (default: every band checked)
    or ``"none"`` (benchmarks only: results unchecked, never for user-facing output).
    """

    def __init__(self, client: Any, *, verify: str = "freivalds", timeout: float = 300.0
                 ) -> None:
        # client: a swarm.api.Client (not imported: api imports this module, and the layout
        # test forbids the loop)
        self._client = client
        self._opts = validate(TASK_OPTIONS, {"verify": verify, "timeout": timeout},
                              "SwarmExecutor")
        self._timeout = timeout
        self._refs: dict[str, ObjectRef] = {}
        self._lock = threading.Lock()  # guards _refs (shared with sessions)
        self._totals: dict[str, PeerReport] = {}
        self._totals_lock = threading.Lock()

    def _ref(self, w: Weight) -> ObjectRef:
        with self._lock:
            ref = self._refs.get(w.digest)
            if ref is None:
                ref = self._refs[w.digest] = self._client.put(w.array)
            return ref

    def prepare(self, weights: Sequence[Weight]) -> None:
        for w in weights:
            self._ref(w)
        # the check keeps b @ R per weight: a model cycling through more weights than the
        # cache holds would recompute it for every product (24 for MiniLM against 8)
        self._client.keep_fingerprints(len(self._refs) + 8)

    def matmuls(self, products: Sequence[Product]) -> list[np.ndarray]:
        futs = []
        for p in products:
            p.check()
            right = self._ref(p.w) if isinstance(p.w, Weight) else p.w
            futs.append(self._client.matmul_job(np.ascontiguousarray(p.x), right, **self._opts))
        try:
            done = [f.result(self._timeout) for f in futs]
        except cf.TimeoutError:
            for f in futs:
                f.cancel()
            raise ExecutorError(f"the swarm gave no checked result within {self._timeout} s"
                                ) from None
        with self._totals_lock:
            for _, report in done:
                for peer, r in report.peers.items():
                    self._totals.setdefault(peer, PeerReport()).add(r)
        return [np.ascontiguousarray(c, np.float32) for c, _ in done]

    def session(self) -> SwarmExecutor:
        """An executor on the same client and weights (sent once, shared) whose report counts
        only the products run through it: one per run, so that runs at once keep apart."""
        view = copy.copy(self)
        view._totals, view._totals_lock = {}, threading.Lock()
        return view

    def take_report(self) -> dict[str, PeerReport]:
        """Per-peer totals of every job since the last call (shards, bytes, verdicts)."""
        with self._totals_lock:
            totals, self._totals = self._totals, {}
            return totals
