"""The worker side of the runtime: serve tasks arriving on peer links with installed actors.

One :class:`ActorHost` per worker process. Each incoming link is served by
:meth:`ActorHost.serve`; objects land in the worker's :class:`ObjectStore` (after their
content address is checked), tasks run one at a time on a compute thread so the event loop
keeps moving data, and calls to one actor instance run in the caller's order.
A small result is sent with its signed receipt; a large one is sent at once and kept until
its requester's :class:`Verdict`, and hashed and signed only if the requester rejected it.
:meth:`ActorHost.activity` says what is queued or running, per requester (the node looks at
it every few seconds and re-announces its member record when it changed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from identity.keys import PeerId, PeerKey
from swarm import wire
from swarm.errors import LinkClosed
from swarm.links import shm
from swarm.links.base import PeerLink
from swarm.loop import Supervisor
from swarm.runtime.actors import REGISTRY
from swarm.runtime.chaos import Chaos, ChaosSpec, hold
from swarm.runtime.evidence import Receipt, input_ids, output_ids
from swarm.runtime.hostcore import (  # noqa: F401 - the limits, re-exported for their users
    HELD_SHARE,
    INLINE_MATMUL_FLOPS,
    MAX_HELD,
    MAX_INSTANCES,
    Call,
    Crash,
    HostCore,
    HostStats,
)
from swarm.runtime.kernels import KERNEL_TIME_LIMIT, KernelRunner
from swarm.runtime.local_bundles import LocalBundles
from swarm.runtime.objects import ObjectId, ObjectStore, object_id
from swarm.runtime.protocol import (
    CancelTask,
    Draining,
    PutObject,
    RunTask,
    TaskFailed,
    TaskReceipt,
    TaskResult,
    Verdict,
)
from swarm.runtime.training_feed import TrainingFeed

log = logging.getLogger("swarm.runtime.host")
CRASH_EXIT = 70
INLINE_RECEIPT_BYTES = 64 << 10
"""Results over at most this many array bytes (inputs and outputs) go with their receipt,
signed on the loop (hashing them takes microseconds; a hop to a thread and back costs more
on small tasks). Larger ones are signed only when asked (:data:`UNSIGNED_KEEP`)."""
UNSIGNED_KEEP = 8
"""Large results kept, with their inputs, until their requester's :class:`Verdict` (the
most recent ones, should a requester never say; their bytes count against
``--max-memory``). Why unsigned: a receipt is read only when its result is wrong, and
hashing every result for one took ~26 ms of CPU per 2048-row band at n=4096 (two 32 MiB
hashes) and 2.2 ms per 256-row inference call (6% of the inference row on two cores). Why
until the verdict: a requester judges a result within its check, milliseconds after it came;
kept longer, their memory is not there for the next tasks' (on a VM that hands freed memory
back to its host, fresh pages cost ~2.5 ms per MiB: keeping the last eight without
verdicts made warm n=4096 jobs 15% slower)."""


@dataclass(eq=False)
class _Unsigned:
    msg: RunTask
    outputs: list[np.ndarray]
    nbytes: int
    """Its inputs' and outputs' bytes, reserved in the store while kept."""


KEEP_MAPPED = 64 << 20
"""A received shared-memory object this large is stored as mapped (the sender's sealed
segment, copy-on-write) instead of copied: the copy held it twice while it ran, and a span
bundle's copy took a worker of ``--max-memory 450M`` about 130 MB over its offer (issue 46).
At most ``--max-memory`` / 64 MiB such objects, one descriptor each."""

class ActorHost:
    """Serves RunTask/PutObject/CancelTask on any number of links."""

    def __init__(
        self,
        backend: Any,
        *,
        store_capacity: int = 4 << 30,
        chaos: ChaosSpec | None = None,
        registry: dict[str, type] | None = None,
        crash: Callable[[int], None] = os._exit,
        key: PeerKey | None = None,
        kernel_time_limit: float = KERNEL_TIME_LIMIT,
        clock: Callable[[], float] = time.perf_counter,
        local_bundles: LocalBundles | None = None,
    ) -> None:
        self.backend = backend
        self.local_bundles = local_bundles
        """Span bundles made from the model files this worker holds (``--model``)."""
        self.key = key or PeerKey.generate()
        self.kernels = KernelRunner(kernel_time_limit)
        """User kernels run in a child process that a time limit can stop."""
        """Signs a receipt for every result (the node's own key, so receipts name it)."""
        self.store = ObjectStore(store_capacity)
        self.chaos = Chaos(chaos or ChaosSpec())
        self.registry = REGISTRY if registry is None else registry
        self.core = HostCore(self.store, self.chaos, self.registry, self._make,
                             inline_numpy=backend.name == "numpy")
        """Admission, call order, chaos: every decision on a call (sans-IO)."""
        self.stats = self.core.stats
        self.training = TrainingFeed()
        """The MLP blocks served here, second by second (the node's status panel)."""
        self._clock = clock
        """Measures a task's seconds."""
        self._crash = crash
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="swarm-compute")
        self._wake = asyncio.Event()
        self._links: set[PeerLink] = set()
        self._runner: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._unsigned: OrderedDict[tuple[PeerLink, int], _Unsigned] = OrderedDict()
        """Large results sent without a receipt, oldest first (:data:`UNSIGNED_KEEP`)."""
        self._signing = Supervisor(log, "receipt signing")

    # -- serving a link -------------------------------------------------------------------

    async def serve(self, link: PeerLink,
                    fallback: Callable[[PeerLink, Any], Awaitable[None]] | None = None) -> None:
        """Answer ``link``'s messages until it closes; other messages go to ``fallback``."""
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run(), name="actor-host")
        self._links.add(link)
        try:
            async for msg in link:
                if isinstance(msg, PutObject):
                    await self._put(msg)
                elif isinstance(msg, RunTask):
                    await self._accept(link, msg)
                elif isinstance(msg, CancelTask):  # a running task cannot be stopped
                    self.core.drop(lambda c, t=msg.task: c.link is link and c.msg.task == t)
                elif isinstance(msg, Verdict):
                    await self._verdict(link, msg)
                elif fallback is not None:
                    await fallback(link, msg)
        finally:
            self._links.discard(link)
            self.core.forget(link)
            for key in [k for k in self._unsigned if k[0] is link]:
                self.store.release(self._unsigned.pop(key).nbytes)

    @property
    def draining(self) -> bool:
        """Shutting down: new calls are refused."""
        return self.core.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.core.draining = value

    async def _put(self, msg: PutObject) -> None:
        if len(msg.oid) == 32 and self.store.get(ObjectId(msg.oid)) is not None:
            return  # held already: its bytes are not read (hashing a mapped copy paged it in:
            # each new requester of a span sent its bundle again, ~300 MB for 1.5B's spans)
        arr = msg.array
        loop = asyncio.get_running_loop()
        oid = await loop.run_in_executor(None, object_id, arr)
        if oid.raw != msg.oid:
            log.warning("object %s does not match its content; dropped", msg.oid[:6].hex())
            return
        if shm.mapped(arr):
            if arr.nbytes >= KEEP_MAPPED:
                shm.settle(arr)  # stored as mapped: the one descriptor the mapping holds
            else:  # a private copy: a mapping holds a descriptor while it lives, and stored
                arr = np.array(arr)  # objects live up to --max-memory's worth of them
                # (issue 34: one descriptor, or two, per object of 1 MiB or more)
        self.store.put(wire.restore_precision(arr) if wire.precision_of(arr) else arr, oid)
        self.stats.objects_received += 1
        self.stats.bytes_received += arr.nbytes

    async def _accept(self, link: PeerLink, msg: RunTask) -> None:
        nbytes = 0
        for arg in msg.args:
            if arg.array is not None:
                nbytes += arg.array.nbytes
                shm.settle(arg.array)  # held until the call runs: no descriptor needed
        refused = self.core.admit(Call(link, msg, nbytes))
        if refused is not None:
            await self._reply(link, refused)
            return
        self._wake.set()

    def _make(self, cls: type) -> Any:
        """A new actor instance of ``cls`` on this worker's backend (and kernel runner, or
        training feed, where it takes one)."""
        wants = inspect.signature(cls).parameters
        extra = {name: value for name, value in (("kernels", self.kernels),
                                                 ("feed", self.training)) if name in wants}
        return cls(self.backend, **extra)

    # -- running tasks ----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            while (call := self.core.next()) is None:
                self._wake.clear()
                await self._wake.wait()
            self._idle.clear()
            started = self._clock()
            try:
                await self._execute(call)
            finally:
                self.core.done(call, self._clock() - started)
                self._idle.set()

    def activity(self) -> tuple[int, list[tuple[PeerId, int]]]:
        """Tasks queued or running now, and per requester (busiest first, then by id)."""
        return self.core.activity()

    async def _execute(self, call: Call) -> None:
        """Carry out the core's plan for ``call``: run it, send its answer."""
        msg, link = call.msg, call.link
        build = self.local_bundles.wanted(msg, self.store) if self.local_bundles else None
        if build is not None:  # the span's weights from our own file, not the requester
            flat = await asyncio.get_running_loop().run_in_executor(
                self._pool, self.local_bundles.make, build)
            if flat is not None:
                self.store.put(flat, build.oid)
        plan = self.core.plan(call)
        if isinstance(plan, Crash):
            log.warning("SWARM_CHAOS: crashing as asked (crash_after)")
            self._crash(CRASH_EXIT)
            return
        if isinstance(plan, TaskFailed):
            await self._reply(link, plan)
            return
        loop = asyncio.get_running_loop()
        started = self._clock()
        method = plan.method
        if method is None:
            def method(arrays, params):  # noqa: ARG001 - a dispatch that never finishes
                return self.kernels.run("", {}, {}, (1, 1, 1), hang=True)
        try:
            if plan.inline:
                outputs = method(plan.arrays, plan.params)
            else:
                outputs = await loop.run_in_executor(self._pool, method, plan.arrays,
                                                     plan.params)
        except Exception as exc:  # the method's own failure is reported, not fatal
            failed = self.core.failed(plan, exc)
            if failed.kind == "timeout":
                log.warning("task %d %s.%s stopped: %s", msg.task, msg.actor, msg.method, exc)
            else:
                log.info("task %d %s.%s failed: %s", msg.task, msg.actor, msg.method, exc)
            await self._reply(link, failed)
            return
        seconds = self._clock() - started
        answer = self.core.answer(plan, outputs)
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        if answer.hold:
            await hold(answer.hold, msg.task, lambda: self.draining)
        if answer.drop:
            return
        self.stats.tasks += 1
        outputs = answer.outputs
        nbytes = sum(o.nbytes for o in outputs) + call.nbytes
        hashing = None if self._keep(link, msg, outputs, nbytes) else \
            self._hash(msg, outputs, nbytes)
        # results bound for this host's requester are written to shared memory off the loop
        async with shm.SEGMENTS.prepared(outputs if getattr(link, "shm", None) is not None else []):
            receipt = b"" if hashing is None else self._sign(link, msg, *await hashing)
            await self._reply(link, TaskResult(msg.task, outputs, seconds, receipt))

    def _keep(self, link: PeerLink, msg: RunTask, outputs: list[np.ndarray],
              nbytes: int) -> bool:
        """Keep a large result to sign if asked; False (sign it now) for a small one, or when
        its bytes do not fit beside what ``--max-memory`` already holds."""
        if nbytes <= INLINE_RECEIPT_BYTES or not self.store.reserve(nbytes):
            return False
        self._unsigned[(link, msg.task)] = _Unsigned(msg, outputs, nbytes)
        while len(self._unsigned) > UNSIGNED_KEEP:
            self.store.release(self._unsigned.popitem(last=False)[1].nbytes)
        return True

    async def _verdict(self, link: PeerLink, msg: Verdict) -> None:
        """Let an accepted result go; answer a rejected one with its receipt, once, or with
        none when it is not kept (never sent, judged already, or pushed out by newer
        results). Only a kept result costs hashing, in a task of its own (at most
        :data:`UNSIGNED_KEEP` at once); other answers wait in line, so a flood of verdicts
        is held back by the link's own flow control."""
        kept = self._unsigned.pop((link, msg.task), None)
        if msg.accepted:
            if kept is not None:
                self.store.release(kept.nbytes)
        elif kept is None:
            await self._reply(link, TaskReceipt(msg.task, b""))
        else:
            self._signing.spawn(self._receipt(link, msg.task, kept))

    async def _receipt(self, link: PeerLink, task: int, kept: _Unsigned) -> None:
        try:
            receipt = self._sign(link, kept.msg,
                                 *await self._hash(kept.msg, kept.outputs, kept.nbytes))
        finally:
            self.store.release(kept.nbytes)
        await self._reply(link, TaskReceipt(task, receipt))

    def _sign(self, link: PeerLink, msg: RunTask, ins: list[bytes], outs: list[bytes]
              ) -> bytes:
        self.stats.receipts += 1
        return Receipt.sign(self.key, link.remote, msg.task, msg.actor, msg.method,
                            msg.params, ins, outs).encode()

    @staticmethod
    def _hash(msg: RunTask, outputs: list[np.ndarray], nbytes: int
              ) -> asyncio.Future[tuple[list[bytes], list[bytes]]]:
        """What the receipt names: the inputs as received, the outputs as sent. Hashed on
        the loop when that takes microseconds (a thread hop costs more), else in a thread
        each (beside the results' shared-memory write, when memory is too full to keep the
        result unsigned: a 2048-row n=4096 band's two 32 MiB hashes and write had taken the
        worker 55-75 ms one after another)."""
        loop = asyncio.get_running_loop()
        if nbytes <= INLINE_RECEIPT_BYTES:
            done = loop.create_future()
            done.set_result((input_ids(msg.args), output_ids(outputs)))
            return done
        return asyncio.gather(loop.run_in_executor(None, input_ids, msg.args),
                              loop.run_in_executor(None, output_ids, outputs))

    async def _reply(self, link: PeerLink, msg: Any) -> None:
        if isinstance(msg, TaskFailed):
            self.stats.failed += 1
        try:
            await link.send(msg)
        except LinkClosed:
            pass

    # -- lifecycle ------------------------------------------------------------------------

    async def drain(self, timeout: float = 30.0) -> None:
        """Graceful stop: tell requesters, hand back queued tasks, finish the running one."""
        self.draining = True
        handback = self.core.drop(lambda c: True)
        for call in handback:
            await self._reply(call.link, TaskFailed(call.msg.task, "busy",
                                                    "worker is shutting down"))
        for link in list(self._links):
            try:
                await link.send(Draining("shutting down"))
            except LinkClosed:
                pass
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("drain: the running task did not finish within %g s", timeout)

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
        self._signing.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        await asyncio.get_running_loop().run_in_executor(None, self.kernels.close)
