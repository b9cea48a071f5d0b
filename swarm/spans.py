"""A chat model over the swarm: workers host spans of Llama-family blocks (SmolLM2, Qwen2.5), the
requester checks every value.

:class:`SpanLlama` is a :class:`models.llama.Llama` whose blocks run on workers, a span of
consecutive layers each (as Petals does): the span's weights go once, as one content-addressed
bundle kept in the worker's store; a call carries a batch's activations and the worker keeps
each sequence's keys and values (the ``llama_span`` actor, swarm.runtime.actors). Per span and
step one round trip, not one per product (sharding each product had cost 736 ms/token against
56.5 local: docs/architecture.md).

Nothing a worker returns is used unchecked (models.span): the requester re-runs the span's
pass with its own cache, taking each product from the worker's trace only when its output
passes Freivalds' check against that weight's fingerprint both for the worker's recorded input
and for the requester's own (within the f32 rounding of that product: SECURITY.md). A wrong product is a signed lie: its evidence goes to the node
(``report_lying_peer``: proven on the spot under ``swarm.local()``, judged by the coordinator
otherwise), the worker gets no more spans, and the step is redone elsewhere, or here.

Faults: the requester keeps, per sequence and span, every input row it sent. A worker that dies
(or refuses, or lies) is replaced by another (or by the requester itself), which gets the
sequence's whole past as one prefill to rebuild its cache; the text goes on unchanged.
"""

from __future__ import annotations

import itertools
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from identity.keys import PeerId
from models import span as llama_span
from models.llama import Llama
from models.span import Fingerprints, KVCache, Seq, SpanMismatch, TraceCheck, run_layers
from swarm.errors import LinkClosed
from swarm.runtime.actors import LlamaSpanActor, SpanConfig
from swarm.runtime.requester import Call, TaskFailure

CALL_TIMEOUT = 120.0
"""Seconds one span call may take before its worker counts as lost."""


@dataclass
class _Host:
    """A span's current worker and actor instance there."""

    peer: PeerId
    instance: int
    seq: itertools.count = field(default_factory=itertools.count)
    sids: set[int] = field(default_factory=set)
    """Sequences whose cache this instance holds (rebuilt from position 0 otherwise)."""


@dataclass
class _History:
    """One sequence's rows as sent to each span (for rebuilding a replacement's cache)."""

    sid: int
    inputs: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class SpanStats:
    """Where a step's time went, summed since the last :meth:`SpanLlama.take_stats`."""

    remote: float = 0.0
    """Round trips of span calls (worker compute and links)."""
    worker: float = 0.0
    """Of which the workers said they computed."""
    checks: float = 0.0
    """The requester's checking pass (its own non-linear steps and the fingerprint checks)."""
    local: float = 0.0
    """Spans run on the requester (no worker left)."""
    calls: int = 0
    rejected: int = 0
    rebuilt: int = 0
    """Replacement caches rebuilt from the kept inputs."""
    bytes_out: int = 0
    bytes_in: int = 0


class SpanLlama(Llama):
    """SmolLM2's forward with its blocks on ``client``'s workers (``spans`` of them, default
    one per worker), every value checked; the embedding and the output head run here."""

    def __init__(self, client: Any, weights: Any, spans: int | None = None) -> None:
        super().__init__(weights)
        self._client = client
        c = self.config
        n = spans or max(1, len(client.workers()))
        if not 1 <= n <= c.n_layers:
            raise ValueError(f"spans must be 1..{c.n_layers}, got {n}")
        cuts = np.linspace(0, c.n_layers, n + 1).round().astype(int)
        self.plan = [(int(a), int(b - a)) for a, b in itertools.pairwise(cuts)]
        self._span_config = SpanConfig.of(c).params()
        self._bundles = [client.put(llama_span.bundle(weights, f, k)) for f, k in self.plan]
        self._local = [llama_span.model_layers(weights, f, k) for f, k in self.plan]
        self._hosts: list[_Host | None] = [None] * n
        self._excluded: set[PeerId] = set()
        self._history: weakref.WeakKeyDictionary[KVCache, _History] = \
            weakref.WeakKeyDictionary()
        self._sids = itertools.count(1)
        self._finished: set[int] = set()
        self.fingerprints = Fingerprints()
        self.stats = SpanStats()

    def take_stats(self) -> SpanStats:
        stats, self.stats = self.stats, SpanStats()
        return stats

    def hosts(self) -> list[PeerId | None]:
        """Each span's worker now (None: not placed yet, or run here)."""
        return [h.peer if h else None for h in self._hosts]

    # -- the pass -------------------------------------------------------------------------------

    def layers(self, x: np.ndarray, seqs: list[Seq], first: int, count: int) -> np.ndarray:
        if (first, count) != (0, self.config.n_layers):
            raise ValueError("a SpanLlama runs all its layers, span by span")
        for k in range(len(self.plan)):
            x = self._span(k, x, seqs)
        return x

    def _hist(self, cache: KVCache) -> _History:
        h = self._history.get(cache)
        if h is None:
            h = self._history[cache] = _History(next(self._sids))
            weakref.finalize(cache, self._finished.add, h.sid)
        return h

    def _span(self, k: int, x: np.ndarray, seqs: list[Seq]) -> np.ndarray:
        bounds = np.cumsum([0] + [s.end - s.begin for s in seqs])
        hists = [self._hist(s.cache) for s in seqs]
        for h, s, lo, hi in zip(hists, seqs, bounds[:-1], bounds[1:], strict=True):
            past = h.inputs.get(k, np.empty((0, x.shape[1]), np.float32))[:s.begin]
            if past.shape[0] != s.begin:
                raise ValueError(f"sequence {h.sid}: the requester kept {past.shape[0]} "
                                 f"inputs of span {k}, not {s.begin}")
            h.inputs[k] = np.concatenate([past, x[lo:hi]])
        for _ in range(len(self._client.workers()) + 2):
            host = self._place(k)
            if host is None:
                break
            out = self._try(k, host, x, seqs, hists)
            if out is not None:
                return out
        started = time.perf_counter()
        first = self.plan[k][0]
        layers = self._local[k]

        def products(j: int, pairs: list) -> list[np.ndarray]:
            return llama_span.layer_products(layers[j], pairs)

        out = run_layers(self.config, layers, x, seqs, products, cache_first=first)
        self.stats.local += time.perf_counter() - started
        return out

    def _place(self, k: int) -> _Host | None:
        host = self._hosts[k]
        live = [p for p in self._client.workers() if p not in self._excluded
                and p not in self._client.node.proven_liars]
        if host is not None and host.peer in live:
            return host
        if not live:
            self._hosts[k] = None
            return None
        # spread spans over workers: span k prefers the k-th, any live one otherwise
        peer = live[k % len(live)]
        host = self._hosts[k] = _Host(peer, self._client.new_instance())
        return host

    def _try(self, k: int, host: _Host, x: np.ndarray, seqs: list[Seq],
             hists: list[_History]) -> np.ndarray | None:
        """One attempt at span ``k`` on ``host``: the checked residual stream after it, or
        None (the worker was lost, refused or lied; it is dropped for this span)."""
        first, count = self.plan[k]
        rebuild = any(h.sid not in host.sids for h in hists)
        if rebuild:  # a fresh cache there: every sequence from position 0
            send = np.ascontiguousarray(np.concatenate([h.inputs[k] for h in hists]))
            check_seqs = [Seq.span(s.cache, 0, s.end) for s in seqs]
            params_seqs = [[h.sid, 0, s.end] for h, s in zip(hists, seqs, strict=True)]
        else:
            send, check_seqs = x, seqs
            params_seqs = [[h.sid, s.begin, s.end - s.begin]
                           for h, s in zip(hists, seqs, strict=True)]
        drop = sorted(host.sids & self._finished)[:256]
        params = {"first": first, "count": count, "config": self._span_config,
                  "seqs": params_seqs, "drop": drop}
        client = self._client
        started = time.perf_counter()
        try:
            call, reply = self._call(k, host, send, params).result(CALL_TIMEOUT + 10)
        except (LinkClosed, TaskFailure, TimeoutError) as exc:
            self.stats.rejected += 1
            # a cache the worker no longer holds is rebuilt there (a fresh instance, every
            # sequence from position 0); a rebuild it cannot follow, or any other refusal,
            # is a worker lost or refusing: replace it
            if rebuild or not (isinstance(exc, TaskFailure) and exc.kind == "stale"):
                self._excluded.add(host.peer)
            self._hosts[k] = None
            self._forget_finished()
            return None
        host.sids -= set(drop)
        self._forget_finished()
        self.stats.remote += time.perf_counter() - started
        self.stats.worker += reply.compute
        self.stats.calls += 1
        self.stats.bytes_out += send.nbytes
        self.stats.bytes_in += sum(o.nbytes for o in reply.outputs)
        started = time.perf_counter()
        try:
            check = TraceCheck(self.config, self._local[k], reply.outputs[0]
                               if len(reply.outputs) == 1 else np.empty((0, 0), np.float32),
                               first, self.fingerprints)
            out = run_layers(self.config, self._local[k], send, check_seqs, check,
                             cache_first=first)
        except SpanMismatch as exc:
            self.stats.checks += time.perf_counter() - started
            self.stats.rejected += 1
            reason = f"llama_span layers {first}..{first + count - 1}: {exc}"
            self._report(host.peer, call, reply, reason, exc.signed_lie)
            self._excluded.add(host.peer)
            self._hosts[k] = None
            self._forget_finished()
            return None
        self.stats.checks += time.perf_counter() - started
        client.accept(host.peer, reply.task)
        host.sids |= {h.sid for h in hists}
        if rebuild:
            self.stats.rebuilt += any(s.begin for s in seqs)
            ends = np.cumsum([s.end for s in seqs])
            out = np.concatenate([out[e - (s.end - s.begin):e] for s, e in
                                  zip(seqs, ends, strict=True)])
        return out

    def _forget_finished(self) -> None:
        """Keep a finished sequence's id only while a current host still holds its cache: one
        host dropping it must not make the others keep theirs, and a replaced host's ids
        would otherwise stay here for good."""
        held = set().union(*(h.sids for h in self._hosts if h is not None))
        self._finished &= held

    def _call(self, k: int, host: _Host, send: np.ndarray, params: dict) -> Future:
        return self._client.start_call(host.peer, LlamaSpanActor.NAME, "forward",
                                       (send, self._bundles[k]), params,
                                       instance=host.instance, seq=next(host.seq),
                                       timeout=CALL_TIMEOUT)

    def _report(self, peer: PeerId, call: Call, reply: Any, reason: str,
                provable: bool) -> None:
        # not provable: nothing a third party could re-check, so it counts here only
        self._client.report(peer, call, reply if provable else None, reason)
