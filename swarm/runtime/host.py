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
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from identity.keys import PeerId, PeerKey
from swarm import wire
from swarm.errors import LinkClosed
from swarm.links import shm
from swarm.links.base import PeerLink
from swarm.loop import Supervisor
from swarm.runtime.actors import REGISTRY, CallOrder, MatmulActor
from swarm.runtime.chaos import Chaos, ChaosSpec
from swarm.runtime.evidence import Receipt, input_ids, output_ids
from swarm.runtime.kernels import KERNEL_TIME_LIMIT, KernelRunner, KernelTimeout
from swarm.runtime.objects import ObjectId, ObjectStore, object_id
from swarm.runtime.protocol import (
    MAX_PARAMS,
    CancelTask,
    Draining,
    PutObject,
    RunTask,
    TaskFailed,
    TaskReceipt,
    TaskResult,
    Verdict,
)

log = logging.getLogger("swarm.runtime.host")
CRASH_EXIT = 70
MAX_INSTANCES = 256
"""Actor instances one requester may create on this worker."""
MAX_HELD = 1024
"""Out-of-order calls held for one actor instance, and for one requester over all of its
instances."""
HELD_SHARE = 4
"""One requester's out-of-order calls may hold at most ``1/HELD_SHARE`` of ``--max-memory``
(issue 34: calls that can never run, held in a cap shared by all, had made the worker answer
"busy" to every other requester)."""
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
INLINE_MATMUL_FLOPS = 1 << 18
"""numpy matmuls of at most this many flops run on the loop (tens of microseconds; the hop
to the compute thread and back costs ~0.1 ms on a small VM, most of a tiny task)."""


class _Missing(Exception):
    def __init__(self, oids: list[bytes]) -> None:
        self.oids = oids


@dataclass(eq=False)
class _Call:
    link: PeerLink
    msg: RunTask
    nbytes: int = 0
    """Inline array bytes this call holds, reserved in the store until it is done or dropped."""


@dataclass(eq=False)
class _Unsigned:
    msg: RunTask
    outputs: list[np.ndarray]
    nbytes: int
    """Its inputs' and outputs' bytes, reserved in the store while kept."""


@dataclass
class _Instance:
    actor: Any
    order: CallOrder = field(default_factory=CallOrder)


@dataclass
class HostStats:
    """What this worker did, for status and tests."""

    tasks: int = 0
    """Tasks completed."""
    failed: int = 0
    """Tasks answered with TaskFailed."""
    objects_received: int = 0
    """PutObject messages accepted."""
    bytes_received: int = 0
    """Array bytes received in PutObject and inline args."""
    receipts: int = 0
    """Receipts signed (every small result; a large one only when its requester asked)."""


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
    ) -> None:
        self.backend = backend
        self.key = key or PeerKey.generate()
        self.kernels = KernelRunner(kernel_time_limit)
        """User kernels run in a child process that a time limit can stop."""
        """Signs a receipt for every result (the node's own key, so receipts name it)."""
        self.store = ObjectStore(store_capacity)
        self.chaos = Chaos(chaos or ChaosSpec())
        self.registry = REGISTRY if registry is None else registry
        self._crash = crash
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="swarm-compute")
        self._queue: deque[_Call] = deque()
        self._wake = asyncio.Event()
        self._instances: dict[tuple[PeerId, str, int], _Instance] = {}
        self._links: set[PeerLink] = set()
        self._runner: asyncio.Task | None = None
        self._current: _Call | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self.stats = HostStats()
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
                    self._drop(lambda c, t=msg.task: c.link is link and c.msg.task == t)
                elif isinstance(msg, Verdict):
                    await self._verdict(link, msg)
                elif fallback is not None:
                    await fallback(link, msg)
        finally:
            self._links.discard(link)
            self._drop(lambda c: c.link is link)
            for key in [k for k in self._unsigned if k[0] is link]:
                self.store.release(self._unsigned.pop(key).nbytes)
            for key in [k for k in self._instances if k[0] == link.remote]:
                for call in self._instances.pop(key).order.held_calls():
                    self.store.release(call.nbytes)

    def _drop(self, which: Callable[[_Call], bool]) -> None:
        """Take the queued calls ``which`` selects off the queue and free their bytes."""
        keep = deque()
        for call in self._queue:
            if which(call):
                self.store.release(call.nbytes)
            else:
                keep.append(call)
        self._queue = keep

    async def _put(self, msg: PutObject) -> None:
        arr = msg.array
        loop = asyncio.get_running_loop()
        oid = await loop.run_in_executor(None, object_id, arr)
        if oid.raw != msg.oid:
            log.warning("object %s does not match its content; dropped", msg.oid[:6].hex())
            return
        if shm.mapped(arr):  # a private copy: a mapping holds a descriptor while it lives,
            arr = np.array(arr)  # and stored objects live up to --max-memory's worth of
            # them (issue 34: one descriptor, or two, per object of 1 MiB or more)
        self.store.put(wire.restore_precision(arr) if wire.precision_of(arr) else arr, oid)
        self.stats.objects_received += 1
        self.stats.bytes_received += arr.nbytes

    async def _accept(self, link: PeerLink, msg: RunTask) -> None:
        if self.draining:
            await self._reply(link, TaskFailed(msg.task, "busy", "worker is shutting down"))
            return
        cls = self.registry.get(msg.actor)
        if cls is None or msg.method not in cls.METHODS:
            await self._reply(link, TaskFailed(msg.task, "invalid",
                                               f"no installed actor method {msg.actor}.{msg.method}"))
            return
        nbytes = 0
        for arg in msg.args:
            if arg.array is not None:
                nbytes += arg.array.nbytes
                shm.settle(arg.array)  # held until the call runs: no descriptor needed
        call = _Call(link, msg, nbytes)
        if msg.seq < 0 or msg.instance == 0:
            if not await self._reserve(call):
                return
            self._queue.append(call)
        else:
            if (link.remote, msg.actor, msg.instance) not in self._instances and sum(
                    k[0] == link.remote for k in self._instances) >= MAX_INSTANCES:
                await self._reply(link, TaskFailed(msg.task, "invalid", f"more than "
                                                   f"{MAX_INSTANCES} actors for one requester"))
                return
            inst = self._instance(link.remote, msg.actor, msg.instance)
            if inst.order.held >= MAX_HELD or msg.seq > inst.order.next_seq + MAX_HELD:
                await self._reply(link, TaskFailed(msg.task, "invalid",
                                                   "call is too far ahead of the actor's order"))
                return
            if msg.seq != inst.order.next_seq and not await self._held_share(call):
                return
            if not await self._reserve(call):
                return
            stale = inst.order.stale
            self._queue.extend(inst.order.offer(msg.seq, call))
            if inst.order.stale != stale:   # a duplicate: dropped, holds nothing
                self.store.release(call.nbytes)
        self._wake.set()

    async def _held_share(self, call: _Call) -> bool:
        """Whether one more call held out of order fits its requester's share (refused
        clearly otherwise; the share frees as its earlier calls arrive)."""
        peer = call.link.remote
        held = [c for (p, _, _), inst in self._instances.items() if p == peer
                for c in inst.order.held_calls()]
        share = self.store.capacity // HELD_SHARE
        nbytes = sum(c.nbytes for c in held)
        if len(held) < MAX_HELD and nbytes + call.nbytes <= share:
            return True
        await self._reply(call.link, TaskFailed(
            call.msg.task, "busy", f"worker memory for calls held out of order is shared: "
            f"you hold {len(held)} ({nbytes} bytes) waiting for earlier calls of their actors, "
            f"one requester's share is {MAX_HELD} calls and {share} bytes (1/{HELD_SHARE} of "
            f"--max-memory); send the earlier calls first"))
        return False

    async def _reserve(self, call: _Call) -> bool:
        """Count the call's inline arrays against ``--max-memory``; refuse it when over."""
        if self.store.reserve(call.nbytes):
            return True
        await self._reply(call.link, TaskFailed(
            call.msg.task, "busy", f"worker memory is full: the call's {call.nbytes} bytes do "
            f"not fit beside {self.store.reserved} bytes already held for queued calls "
            f"(--max-memory {self.store.capacity} bytes); send it later or elsewhere"))
        return False

    def _instance(self, peer: PeerId, actor: str, instance: int) -> _Instance:
        key = (peer, actor, instance)
        inst = self._instances.get(key)
        if inst is None:
            cls = self.registry[actor]
            made = (cls(self.backend, kernels=self.kernels)
                    if "kernels" in inspect.signature(cls).parameters else cls(self.backend))
            inst = self._instances[key] = _Instance(made)
        return inst

    # -- running tasks ----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            call = self._current = self._queue.popleft()
            self._idle.clear()
            try:
                await self._execute(call)
            finally:
                self.store.release(call.nbytes)
                self._current = None
                self._idle.set()

    def activity(self) -> tuple[int, list[tuple[PeerId, int]]]:
        """Tasks queued or running now, and per requester (busiest first, then by id)."""
        calls = list(self._queue) + ([self._current] if self._current is not None else [])
        per: dict[PeerId, int] = {}
        for call in calls:
            per[call.link.remote] = per.get(call.link.remote, 0) + 1
        return len(calls), sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))

    async def _execute(self, call: _Call) -> None:
        msg, link = call.msg, call.link
        fault = self.chaos.next_task()
        if fault.crash:
            log.warning("SWARM_CHAOS: crashing as asked (crash_after)")
            self._crash(CRASH_EXIT)
            return
        try:
            arrays, params = self._resolve(msg)
            actor = (self._instance(link.remote, msg.actor, msg.instance).actor
                     if msg.instance else self._instance(link.remote, msg.actor, 0).actor)
            spec = type(actor).METHODS[msg.method]
            spec.check(arrays, params)
        except _Missing as exc:
            if msg.instance and msg.seq >= 0:  # keep the actor's order: hold later calls back
                inst = self._instance(link.remote, msg.actor, msg.instance)
                later = [c for c in self._queue if c.link is link
                         and c.msg.instance == msg.instance and c.msg.actor == msg.actor]
                self._queue = deque(c for c in self._queue if all(c is not x for x in later))
                inst.order.rewind(msg.seq, {c.msg.seq: c for c in later})
            await self._reply(link, TaskFailed(msg.task, "missing", "objects not held",
                                               missing=exc.oids))
            return
        except (TypeError, ValueError, AttributeError) as exc:
            await self._reply(link, TaskFailed(msg.task, "invalid", str(exc)[:500]))
            return
        if fault.invalid:
            await self._reply(link, TaskFailed(msg.task, "invalid", "SWARM_CHAOS: refused"))
            return
        if fault.layer and msg.method == "matmul" and len(arrays) == 2:
            arrays = [arrays[0], self.chaos.wrong_layer(arrays[0], arrays[1],
                                                        self.store.arrays())]
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        method = getattr(actor, msg.method)
        if fault.layer and hasattr(actor, f"{msg.method}_wrong_layer"):
            method = getattr(actor, f"{msg.method}_wrong_layer")
        if fault.hang:
            def method(arrays, params):  # noqa: ARG001 - a dispatch that never finishes
                return self.kernels.run("", {}, {}, (1, 1, 1), hang=True)
        try:
            if not fault.hang and self._tiny(actor, msg.method, arrays):
                outputs = method(arrays, params)
            else:
                outputs = await loop.run_in_executor(self._pool, method, arrays, params)
        except KernelTimeout as exc:
            log.warning("task %d %s.%s stopped: %s", msg.task, msg.actor, msg.method, exc)
            await self._reply(link, TaskFailed(msg.task, "timeout", str(exc)))
            return
        except Exception as exc:  # the method's own failure is reported, not fatal
            log.info("task %d %s.%s failed: %s", msg.task, msg.actor, msg.method, exc)
            await self._reply(link, TaskFailed(msg.task, "error", f"{type(exc).__name__}: "
                                               f"{str(exc)[:500]}"))
            return
        seconds = time.perf_counter() - started
        if fault.corrupt:
            outputs = [self.chaos.corrupt(o) for o in outputs]
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault.drop:
            return
        self.stats.tasks += 1
        outputs = [np.ascontiguousarray(o) for o in outputs]
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

    def _tiny(self, actor: object, method: str, arrays: list[np.ndarray]) -> bool:
        """Whether a task is a numpy matmul small enough to run on the loop itself."""
        if (method != "matmul" or not isinstance(actor, MatmulActor) or len(arrays) != 2
                or self.backend.name != "numpy"):
            return False
        a, b = arrays
        return (a.ndim == 2 and b.ndim == 2
                and 2 * a.shape[0] * a.shape[1] * b.shape[1] <= INLINE_MATMUL_FLOPS)

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

    def _resolve(self, msg: RunTask) -> tuple[list[np.ndarray], dict[str, Any]]:
        arrays, missing = [], []
        for arg in msg.args:
            if arg.array is not None:
                arr = arg.array
                arrays.append(wire.restore_precision(arr) if wire.precision_of(arr) else arr)
                self.stats.bytes_received += arr.nbytes
            elif arg.oid is not None and len(arg.oid) == 32:
                held = self.store.get(ObjectId(arg.oid))
                if held is None:
                    missing.append(arg.oid)
                arrays.append(held)
            else:
                raise ValueError("a task argument needs an object id or an array")
        if missing:
            raise _Missing(missing)
        if len(msg.params) > MAX_PARAMS:
            raise ValueError(f"parameters over {MAX_PARAMS} bytes")
        params = msgpack.unpackb(msg.params, raw=False) if msg.params else {}
        if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
            raise ValueError("parameters must be a map with string keys")
        return arrays, params

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
        handback = list(self._queue)
        self._drop(lambda c: True)
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
