"""Sentence embeddings over the swarm: MiniLM's six layers on workers, every value checked.

A batch's sentences are split into one chunk per worker (at most :data:`CALL_TOKENS` tokens
each). A worker runs the whole encoder over its chunk (the ``minilm`` actor: the layers'
weights sent once as one content-addressed bundle) and answers with the trace of every weight
product; the requester runs the same pass with its own non-linear steps, taking each product
from the trace only after Freivalds' check against the weight's fingerprint
(:mod:`models.minilm_span`). A wrong product is a signed lie: its evidence goes to the node,
the worker gets no more chunks, and the chunk is redone elsewhere, or here.

Workers that host no ``minilm`` actor (browser tabs: they run only matmul shards) still take
part: one chunk a batch then runs product by product, each product a verified matmul job over
every worker (:class:`swarm.executor.SwarmExecutor`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from identity.keys import PeerId
from models import minilm_span
from models.minilm import DIM, Batch, MiniLM, pool, run_layers
from models.span import Fingerprints
from swarm.errors import LinkClosed
from swarm.executor import SwarmExecutor
from swarm.links import shm
from swarm.runtime.actors import MiniLMActor
from swarm.runtime.jobcore import PeerReport
from swarm.runtime.requester import TaskFailure

DEFAULT_BATCH = 32
MAX_BATCH = 1024
PIPELINE = 2
"""Batches in flight at once (see :meth:`Embedder.run`)."""
MIN_CHUNK_TOKENS = 128
"""Fewest tokens worth a call of their own."""
CHECKERS = 4
"""Threads that wait for chunks and check them, as they come (two cores' worth, and two
waiting)."""
CALL_TOKENS = 512
"""Most tokens in one worker call: a trace of 42 MB (smaller ones cost more calls; larger
ones, fresh pages on both ends: 2,048 took 10% more CPU)."""
CALL_TIMEOUT = 120.0
"""Seconds one call may take before its worker counts as lost."""
PRODUCTS = "products"
"""The route of a chunk run product by product (matmul jobs over every worker)."""


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
    """MiniLM bound to a client: the model loaded once, its weights pinned for the client.

    ``verify="none"`` (benchmarks only): workers answer with their last hidden states and
    nothing is checked."""

    def __init__(self, client: Any, *, verify: str = "freivalds") -> None:
        self.model = MiniLM.load()
        self._client = client
        self.executor = SwarmExecutor(client, verify=verify)
        self._verify = verify != "none"
        self._bundle = client.put(minilm_span.bundle(self.model.layers))
        self.fingerprints = Fingerprints()
        self._lock = threading.Lock()  # guards the two sets below (batches run at once)
        self._excluded: set[PeerId] = set()
        """Workers lost, refusing or lying: no more chunks."""
        self._matmul_only: set[PeerId] = set()
        """Workers without the ``minilm`` actor (tabs): they take the products route."""

    def run(self, texts: Sequence[str], *, batch: int = DEFAULT_BATCH,
            progress: Callable[[int], None] | None = None) -> Embeddings:
        """Embed ``texts`` ``batch`` at a time; ``progress(done)`` after each batch."""
        texts = check_texts(texts)
        batch = check_batch(batch)
        out = np.empty((len(texts), DIM), np.float32)
        truncated: list[int] = []
        tokens = 0
        run = _Run(self.executor.session(),  # this run's report, apart from runs at once
                   ThreadPoolExecutor(CHECKERS, thread_name_prefix="embed-check"))

        def one(start: int):
            enc = self.model.tokenizer.encode(texts[start:start + batch])
            return start, enc, self._forward(enc, run)

        # PIPELINE batches in flight: one batch's checks run here while another's layers run
        # on the workers (numpy and the checks release the GIL)
        with ThreadPoolExecutor(PIPELINE, thread_name_prefix="embed") as pool_:
            starts = list(range(0, len(texts), batch))
            futures = [pool_.submit(one, s) for s in starts[:PIPELINE]]
            for i in range(len(starts)):
                start, enc, vecs = futures[i].result()
                if i + PIPELINE < len(starts):
                    futures.append(pool_.submit(one, starts[i + PIPELINE]))
                out[start:start + enc.lengths.size] = vecs
                truncated += [start + int(j) for j in np.flatnonzero(enc.truncated)]
                tokens += enc.tokens
                if progress is not None:
                    progress(start + enc.lengths.size)
        run.checks.shutdown()
        return Embeddings(out, truncated, tokens, run.report())

    # -- one batch --------------------------------------------------------------------------

    def _routes(self) -> list[PeerId | str]:
        """Where chunks may go now: each worker hosting the actor, and the products route
        when some worker computes only matmul shards."""
        client = self._client
        links = client.node.requester.links
        with self._lock:
            live = [p for p in client.workers() if p not in self._excluded
                    and p not in client.node.proven_liars]
            only = {p for p in live if p in self._matmul_only
                    or getattr(links.get(p), "tab", False)}
            routes: list[PeerId | str] = [p for p in live if p not in only]
            if only:
                routes.append(PRODUCTS)
        return routes

    def _forward(self, enc: Batch, run: _Run) -> np.ndarray:
        if enc.lengths.size == 0:
            return np.zeros((0, DIM), np.float32)
        x = self.model.embed_tokens(enc)
        routes = self._routes()
        # at least two chunks a route (a worker's next chunk computes while one is checked,
        # and the batch's last check is short), at most CALL_TOKENS each, as many per route
        n = max(1, len(routes))
        per_route = max(2, -(-enc.tokens // (n * CALL_TOKENS)))
        parts = max(n, min(n * per_route, enc.tokens // MIN_CHUNK_TOKENS))
        chunks = _chunks(enc.lengths, parts, CALL_TOKENS)
        done = []
        for i, chunk in chunks.items():
            route = routes[i % len(routes)] if routes else None
            fut = self._call(route, x, enc, chunk) if isinstance(route, PeerId) else None
            done.append((chunk, run.checks.submit(self._chunk, x, enc, chunk, run, route, fut)))
        out = np.empty((enc.lengths.size, DIM), np.float32)
        for chunk, fut in done:
            out[chunk.sentences] = fut.result()
        return out

    def _chunk(self, x: np.ndarray, enc: Batch, chunk: _Chunk, run: _Run,
               route: PeerId | str | None, fut: _Started | None) -> np.ndarray:
        """The chunk's checked embeddings: from ``route`` (a worker, whose call ``fut`` is
        under way; the products route; None: here), or retried elsewhere."""
        tries = 0
        while isinstance(route, PeerId):
            if fut is None:
                fut = self._call(route, x, enc, chunk)
            got = self._take(route, fut, x, chunk, run)
            if isinstance(got, np.ndarray):
                return got
            fut, tries = None, tries + 1
            if got == "matmul only":
                route = PRODUCTS
            else:
                routes = self._routes() if tries <= len(self._client.workers()) + 2 else []
                route = routes[(chunk.index + tries) % len(routes)] if routes else None
        sub = Batch(enc.ids[chunk.rows], chunk.lengths, enc.truncated[chunk.sentences])
        if route == PRODUCTS:
            self.executor.prepare(self.model.weights())  # once; later calls find them
            return self.model.forward(sub, run.executor)
        started = time.perf_counter()  # no worker left: here
        vecs = self.model.forward(sub)
        run.add("local", PeerReport(shards=1, seconds=time.perf_counter() - started))
        return vecs

    def _call(self, peer: PeerId, x: np.ndarray, enc: Batch, chunk: _Chunk) -> _Started:
        report = PeerReport()  # counts the bundle too, the first time this worker is sent it
        fut = self._client.start_call(
            peer, MiniLMActor.NAME, "forward",
            (np.ascontiguousarray(x[chunk.rows]), self._bundle),
            {"lengths": chunk.lengths.tolist(), "trace": self._verify}, report=report,
            timeout=CALL_TIMEOUT)
        return _Started(fut, report)

    def _take(self, peer: PeerId, fut: _Started, x: np.ndarray, chunk: _Chunk, run: _Run
              ) -> np.ndarray | str:
        """Wait for a chunk's call and check it: its embeddings, or why not ("matmul only":
        the worker hosts no ``minilm`` actor; else it was lost, refused or lied, and gets no
        more chunks)."""
        client = self._client
        try:
            (call, reply), report = fut.future.result(CALL_TIMEOUT + 10), fut.report
        except (LinkClosed, TaskFailure, TimeoutError) as exc:
            if isinstance(exc, TaskFailure) and exc.kind == "invalid" \
                    and "no installed actor" in str(exc):
                with self._lock:
                    self._matmul_only.add(peer)  # products route from now on
                return "matmul only"
            with self._lock:
                self._excluded.add(peer)
            run.add(str(peer), PeerReport(failed=1))
            return "lost"
        (result,) = reply.outputs
        shm.populate(result)  # the check's pass then reads memory, not page faults
        report.shards, report.seconds = 1, reply.seconds
        xs = np.ascontiguousarray(x[chunk.rows])
        try:
            if not self._verify:
                hidden = np.asarray(result, np.float32).reshape(xs.shape)
            else:
                checked = minilm_span.TraceCheck(result, xs.shape[0], self.model.layers,
                                                 self.fingerprints)
                hidden = run_layers(self.model.layers, xs, chunk.lengths, checked, checked)
        except (minilm_span.TraceMismatch, ValueError) as exc:
            report.rejected = 1
            run.add(str(peer), report)
            with self._lock:
                self._excluded.add(peer)
            client.report(peer, call, reply, f"minilm: {exc}")
            return "lied"
        report.verified = int(self._verify)
        run.add(str(peer), report)
        client.accept(peer, reply.task)
        return pool(hidden, chunk.lengths)



@dataclass(frozen=True)
class _Started:
    """A chunk's call under way (``future`` gives ``(call, reply)``) and its byte counts."""

    future: Future
    report: PeerReport


@dataclass(frozen=True)
class _Chunk:
    """Consecutive sentences of a batch: one call's share."""

    index: int
    sentences: slice
    rows: slice
    lengths: np.ndarray


def _chunks(lengths: np.ndarray, parts: int, most: int) -> dict[int, _Chunk]:
    """Cut a batch into ``parts`` runs of sentences with about equal tokens (fewer when it has
    fewer sentences; more when a run would exceed ``most`` tokens)."""
    n = lengths.size
    ends = np.cumsum(lengths)
    total = int(ends[-1])
    parts = min(n, max(parts, -(-total // most)))
    bounds = [0]
    for k in range(1, parts):  # the sentence boundary nearest k/parts of the tokens
        b = int(np.abs(ends - k * total / parts).argmin()) + 1
        bounds.append(min(max(b, bounds[-1] + 1), n - (parts - k)))
    bounds.append(n)
    chunks, row = {}, 0
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        size = int(ends[b - 1] - (ends[a - 1] if a else 0))
        chunks[i] = _Chunk(i, slice(a, b), slice(row, row + size), lengths[a:b])
        row += size
    return chunks


class _Run:
    """One run's per-peer report (its batches add to it from their threads)."""

    def __init__(self, executor: SwarmExecutor, checks: ThreadPoolExecutor) -> None:
        self.executor = executor
        self.checks = checks
        self._peers: dict[str, PeerReport] = {}
        self._lock = threading.Lock()

    def add(self, peer: str, r: PeerReport) -> None:
        with self._lock:
            self._peers.setdefault(peer, PeerReport()).add(r)

    def report(self) -> dict[str, PeerReport]:
        for peer, r in self.executor.take_report().items():
            self.add(peer, r)
        return self._peers
