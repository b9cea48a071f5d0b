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
otherwise), the worker gets no more spans, and the step is redone elsewhere.

Weights where they are: a worker that announces the model's file (``swarm join --model``)
makes its span's bundle from its own copy (swarm.runtime.local_bundles) instead of being sent
it; the bundle is still named by the requester's content address, so the bytes are the same.

Faults: the requester keeps, per sequence and span, every input row it sent. A worker that dies
(or refuses, or lies) has its span re-placed, by swarm.placement's rule, on a live worker whose
offer has room for it beside the spans it already holds (the fastest such, the most room among
equals); that worker gets the sequence's whole past as one prefill to rebuild its cache, and
the text goes on unchanged. When no live worker has room, the request fails with
:class:`SpanLost` naming the shortfall; it never quietly runs on the requester, whose own
memory nobody offered. Each rebuild costs the requester a whole history's pass, so a sequence
is rebuilt at most :data:`MAX_REBUILDS` times (workers that keep taking spans and dying cannot
keep it going for ever).
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from identity.keys import PeerId
from models import span as llama_span
from models.llama import Llama
from models.span import Fingerprints, KVCache, Seq, SpanMismatch, TraceCheck, run_layers
from swarm.errors import LinkClosed, SpanLost
from swarm.placement import Need, Offer, PlacementError, place
from swarm.runtime.actors import SPAN_MODEL_ID, LlamaSpanActor, SpanConfig
from swarm.runtime.requester import Call, TaskFailure

CALL_TIMEOUT = 120.0
"""Seconds one span call may take before its worker counts as lost."""
CONTEXT = 2048
"""Positions of keys and values (over all the sequences running at once) each span's worker
is to have room for, beside the span's weights, when spans are placed."""


MAX_REBUILDS = 8
"""Times one sequence's caches may be rebuilt on a replacement worker before its request
fails (each rebuild re-sends and re-checks its whole past)."""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def block_bytes(weights: Any) -> list[int]:
    """Bytes each block's weights take on a worker (its share of a span's bundle: the
    file's quantized blocks, models.span.layer_bytes)."""
    c = weights.config
    return llama_span.layer_bytes(c, llama_span.model_layers(weights, 0, c.n_layers))


def cache_bytes(c: Any, positions: int) -> int:
    """Bytes of keys and values one block keeps for ``positions`` positions (float32)."""
    return 2 * c.n_kv_heads * c.head_dim * 4 * min(positions, c.context_length)


SPEED_SLACK = 1.5
"""Workers whose benchmarks are within this factor of the fastest of their group count as
equally fast (two runs of one machine's benchmark differ by tens of percent)."""


MIN_SPEED = 1e-9
"""The speed of a worker that announces none (it gets blocks only where nobody else can)."""


def announced_offers(records: dict[PeerId, Any]) -> list[Offer]:
    """Each linked worker's offer as its member record announces it: memory offered, and its
    benchmark as speed, evened out (:data:`SPEED_SLACK`: from the fastest down, each worker
    within the factor of its group's fastest takes that speed), so noise does not tilt the
    cut, while a worker twice as fast gets about twice the blocks. A worker that announces
    no memory offers none."""
    speeds = sorted((r.tflops for r in records.values() if r.tflops > 0), reverse=True)
    even: dict[float, float] = {}
    for t in speeds:
        top = next((g for g in even.values() if g / t <= SPEED_SLACK), t)
        even[t] = top
    return [Offer(peer, r.memory[0] if r.memory is not None else 0,
                  even.get(r.tflops, MIN_SPEED)) for peer, r in records.items()]


@dataclass
class _Host:
    """A span's current worker and actor instance there."""

    peer: PeerId
    instance: int
    seq: itertools.count = field(default_factory=itertools.count)
    sids: set[int] = field(default_factory=set)
    """Sequences whose cache this instance holds (rebuilt from position 0 otherwise)."""


class _Rows:
    """One sequence's rows sent to one span, in a buffer that doubles as it fills (appending
    each step's row to a fresh copy of the past cost each step the whole context)."""

    def __init__(self, width: int) -> None:
        self._buf = np.empty((16, width), np.float32)
        self.n = 0

    def keep(self, begin: int, rows: np.ndarray) -> None:
        """``rows`` at positions ``begin`` on (what followed them is dropped)."""
        end = begin + rows.shape[0]
        if end > self._buf.shape[0]:
            grown = np.empty((max(end, 2 * self._buf.shape[0]), self._buf.shape[1]),
                             np.float32)
            grown[:self.n] = self._buf[:self.n]
            self._buf = grown
        self._buf[begin:end] = rows
        self.n = end

    def rows(self) -> np.ndarray:
        return self._buf[:self.n]


@dataclass
class _History:
    """One sequence's rows as sent to each span (for rebuilding a replacement's cache)."""

    sid: int
    inputs: dict[int, _Rows] = field(default_factory=dict)
    rebuilds: int = 0
    """Times its caches were rebuilt on a replacement (at most :data:`MAX_REBUILDS`)."""


@dataclass
class SpanStats:
    """Where a step's time went, summed since the last :meth:`SpanLlama.take_stats`."""

    remote: float = 0.0
    """Round trips of span calls (worker compute and links)."""
    worker: float = 0.0
    """Of which the workers said they computed."""
    checks: float = 0.0
    """The requester's checking pass (its own non-linear steps and the fingerprint checks)."""
    calls: int = 0
    rejected: int = 0
    rebuilt: int = 0
    """Replacement caches rebuilt from the kept inputs."""
    bytes_out: int = 0
    bytes_in: int = 0
    most_in_flight: int = 0
    """The most span calls out at once (over 1: lanes ran spans side by side)."""


class SpanLlama(Llama):
    """A chat model's forward with its blocks on ``client``'s workers, every value checked;
    the embedding and the output head run here. Spans are placed by the memory and speed
    each worker announces (swarm.placement; ``offers`` stands in for the announcements),
    with room for ``context`` positions of keys and values: a model that fits no placement is
    refused here (PlacementError, naming the shortfall); a span whose worker is lost and that
    no live worker has room for fails its request (:class:`SpanLost`)."""

    def __init__(self, client: Any, weights: Any, offers: list[Offer] | None = None,
                 context: int = CONTEXT) -> None:
        super().__init__(weights)
        self._client = client
        c = self.config
        self.need = Need(tuple(block_bytes(weights)), cache_bytes(c, context))
        self._announced = offers is None
        if offers is None:
            offers = announced_offers(client.offers())
        self.placement = place(self.need, offers)  # PlacementError: refused up front
        self.plan = self.placement.plan()
        n = len(self.plan)
        self._offers = {o.worker: o for o in offers}
        self._model = bytes.fromhex(weights.address)[:SPAN_MODEL_ID]
        self._span_config = SpanConfig.of(c).params()
        self._bundles = [client.put(llama_span.bundle(weights, f, k)) for f, k in self.plan]
        self._local = [llama_span.model_layers(weights, f, k) for f, k in self.plan]
        self._hosts: list[_Host | None] = [None] * n
        self._assigned: list[PeerId] = list(self.placement.workers())
        """Each span's worker: placed, or re-placed when the placed one was lost."""
        self._excluded: set[PeerId] = set()
        self._history: weakref.WeakKeyDictionary[KVCache, _History] = \
            weakref.WeakKeyDictionary()
        self._sids = itertools.count(1)
        self._finished: set[int] = set()
        self.fingerprints = Fingerprints()
        self.stats = SpanStats()
        self._span_locks = [threading.Lock() for _ in range(n)]
        self._lock = threading.RLock()  # the stats, the sequence ids, and the sets of hosts
        self._flying = 0

    @property
    def lanes(self) -> int:
        """Batches this forward runs side by side (models.batching): one per span, so that
        while one lane's step is on span k another's is on span k-1, and every worker
        computes at once (pipelining). Each span takes one lane at a time (its worker keeps
        one instance's calls in order)."""
        return len(self.plan)

    def take_stats(self) -> SpanStats:
        with self._lock:
            stats, self.stats = self.stats, SpanStats()
        return stats

    def hosts(self) -> list[PeerId | None]:
        """Each span's worker now (None: not placed yet)."""
        return [h.peer if h else None for h in self._hosts]

    # -- the pass -------------------------------------------------------------------------------

    def layers(self, x: np.ndarray, seqs: list[Seq], first: int, count: int) -> np.ndarray:
        if (first, count) != (0, self.config.n_layers):
            raise ValueError("a SpanLlama runs all its layers, span by span")
        for k in range(len(self.plan)):
            x = self._span(k, x, seqs)
        return x

    def _hist(self, cache: KVCache) -> _History:
        with self._lock:
            h = self._history.get(cache)
            if h is None:
                h = self._history[cache] = _History(next(self._sids))
                weakref.finalize(cache, self._finish, h.sid)
            return h

    def _finish(self, sid: int) -> None:
        with self._lock:
            self._finished.add(sid)

    def _span(self, k: int, x: np.ndarray, seqs: list[Seq]) -> np.ndarray:
        """Span ``k`` over one batch's rows, one lane at a time."""
        with self._span_locks[k]:
            return self._span_locked(k, x, seqs)

    def _span_locked(self, k: int, x: np.ndarray, seqs: list[Seq]) -> np.ndarray:
        bounds = np.cumsum([0] + [s.end - s.begin for s in seqs])
        hists = [self._hist(s.cache) for s in seqs]
        for h, s, lo, hi in zip(hists, seqs, bounds[:-1], bounds[1:], strict=True):
            kept = h.inputs.setdefault(k, _Rows(x.shape[1]))
            if kept.n < s.begin:
                raise ValueError(f"sequence {h.sid}: the requester kept {kept.n} "
                                 f"inputs of span {k}, not {s.begin}")
            kept.keep(s.begin, x[lo:hi])
        tries = len(self._client.workers()) + 2  # each failed try drops a worker or a cache
        for _ in range(tries):
            out = self._try(k, self._place(k), x, seqs, hists)
            if out is not None:
                return out
        first, count = self.plan[k]
        raise SpanLost(f"blocks {first}..{first + count - 1}: {tries} tries on the swarm's "
                       "workers failed in one step")

    def _place(self, k: int) -> _Host:
        """Span ``k``'s host: its worker while that is live, else a re-placement."""
        host = self._hosts[k]
        live = [p for p in self._client.workers() if p not in self._excluded
                and p not in self._client.node.proven_liars]
        if host is not None and host.peer in live:
            return host
        if self._assigned[k] not in live:
            self._assigned[k] = self._replace(k, live)
        peer = self._assigned[k]
        record = self._client.offers().get(peer)
        if record is not None and self._model in record.models:
            # it holds the file: it makes the span's bundle from its own copy (checked by
            # content address there; if it cannot, it asks and the bundle is sent)
            self._client.held_by(peer, self._bundles[k])
        host = self._hosts[k] = _Host(peer, self._client.new_instance())
        return host

    def _replace(self, k: int, live: list[PeerId]) -> PeerId:
        """The live worker that takes span ``k`` now its worker is lost: swarm.placement's rule
        over each live worker's room (its offer less the spans it already holds), the span
        kept whole (its bundle and the inputs kept for it are per span); SpanLost when none
        has room."""
        first, count = self.plan[k]
        blocks = f"blocks {first}..{first + count - 1}"
        if self._announced:  # workers that joined since placing, and offers changed since
            self._offers.update({o.worker: o for o in announced_offers(self._client.offers())})
        need = Need((sum(self.need.blocks[first:first + count]),), self.need.cache * count)
        total = need.span_bytes(0, 1)
        if not live:
            raise SpanLost(f"{blocks} lost their worker mid-generation and no other worker is "
                           f"left to take them ({_mib(total)} needed)", total)
        rooms = [Offer(p, max(0, self._room(p)), self._offers[p].speed if p in self._offers
                       else MIN_SPEED) for p in live]
        try:
            return place(need, rooms).spans[0].worker
        except PlacementError as exc:
            most = max(o.memory for o in rooms)
            raise SpanLost(f"{blocks} lost their worker mid-generation and no live worker has "
                           f"room for them: they need {_mib(total)} (weights and caches), the "
                           f"most any of the {len(rooms)} live workers has left is "
                           f"{_mib(most)}: {_mib(exc.shortfall)} short", exc.shortfall) from None

    def _room(self, peer: PeerId) -> int:
        """Bytes ``peer`` offered that the spans assigned to it leave free (by the offer it
        announced; 0 for a worker that offered nothing)."""
        offer = self._offers.get(peer)
        held = sum(s.bytes for s, p in zip(self.placement.spans, self._assigned, strict=True)
                   if p == peer)
        return (offer.memory if offer is not None else 0) - held

    def _try(self, k: int, host: _Host, x: np.ndarray, seqs: list[Seq],
             hists: list[_History]) -> np.ndarray | None:
        """One attempt at span ``k`` on ``host``: the checked residual stream after it, or
        None (the worker was lost, refused or lied; it is dropped for this span)."""
        first, count = self.plan[k]
        rebuild = any(h.sid not in host.sids for h in hists)
        if rebuild:  # a fresh cache there: every sequence from position 0
            for h, s in zip(hists, seqs, strict=True):
                if s.begin and h.sid not in host.sids:
                    if h.rebuilds >= MAX_REBUILDS:
                        raise SpanLost(f"sequence {h.sid}: its caches were rebuilt "
                                       f"{h.rebuilds} times on replacement workers; giving up")
                    h.rebuilds += 1
            send = np.ascontiguousarray(np.concatenate([h.inputs[k].rows() for h in hists]))
            check_seqs = [Seq.span(s.cache, 0, s.end) for s in seqs]
            params_seqs = [[h.sid, 0, s.end] for h, s in zip(hists, seqs, strict=True)]
        else:
            send, check_seqs = x, seqs
            params_seqs = [[h.sid, s.begin, s.end - s.begin]
                           for h, s in zip(hists, seqs, strict=True)]
        with self._lock:
            drop = sorted(host.sids & self._finished)[:256]
        params = {"first": first, "count": count, "config": self._span_config,
                  "seqs": params_seqs, "drop": drop, "model": self._model}
        client = self._client
        started = time.perf_counter()
        try:
            with self._flight():
                call, reply = self._call(k, host, send, params).result(CALL_TIMEOUT + 10)
        except (LinkClosed, TaskFailure, TimeoutError) as exc:
            # a cache the worker no longer holds is rebuilt there (a fresh instance, every
            # sequence from position 0); a rebuild it cannot follow, or any other refusal,
            # is a worker lost or refusing: replace it
            self._drop_host(k, host, exclude=rebuild or not (
                isinstance(exc, TaskFailure) and exc.kind == "stale"))
            return None
        with self._lock:
            host.sids -= set(drop)
            self._forget_finished()
            st = self.stats
            st.remote += time.perf_counter() - started
            st.worker += reply.compute
            st.calls += 1
            st.bytes_out += send.nbytes
            st.bytes_in += sum(o.nbytes for o in reply.outputs)
        started = time.perf_counter()
        try:
            check = TraceCheck(self.config, self._local[k], reply.outputs[0]
                               if len(reply.outputs) == 1 else np.empty((0, 0), np.float32),
                               first, self.fingerprints)
            out = run_layers(self.config, self._local[k], send, check_seqs, check,
                             cache_first=first)
        except SpanMismatch as exc:
            with self._lock:
                self.stats.checks += time.perf_counter() - started
            reason = f"llama_span layers {first}..{first + count - 1}: {exc}"
            self._report(host.peer, call, reply, reason, exc.signed_lie)
            self._drop_host(k, host, exclude=True)
            return None
        client.accept(host.peer, reply.task)
        with self._lock:
            self.stats.checks += time.perf_counter() - started
            host.sids |= {h.sid for h in hists}
            if rebuild:
                self.stats.rebuilt += any(s.begin for s in seqs)
        if rebuild:
            ends = np.cumsum([s.end for s in seqs])
            out = np.concatenate([out[e - (s.end - s.begin):e] for s, e in
                                  zip(seqs, ends, strict=True)])
        return out

    def _drop_host(self, k: int, host: _Host, *, exclude: bool) -> None:
        """Span ``k``'s call on ``host`` failed: the next try places it afresh (``exclude``:
        never on that worker again)."""
        with self._lock:
            self.stats.rejected += 1
            if exclude:
                self._excluded.add(host.peer)
            self._hosts[k] = None
            self._forget_finished()

    @contextmanager
    def _flight(self) -> Iterator[None]:
        """Counts the span calls out at once (SpanStats.most_in_flight)."""
        with self._lock:
            self._flying += 1
            self.stats.most_in_flight = max(self.stats.most_in_flight, self._flying)
        try:
            yield
        finally:
            with self._lock:
                self._flying -= 1

    def _forget_finished(self) -> None:
        """Keep a finished sequence's id only while a current host still holds its cache: one
        host dropping it must not make the others keep theirs, and a replaced host's ids
        would otherwise stay here for good (called under ``_lock``)."""
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
