"""The requester side of the runtime: send shards to workers, verify, retry, merge.

:class:`Requester` owns the outgoing half of every link to a worker. It keeps the
requester's :class:`ObjectStore` (with where each object lives, so a cached input is never
sent twice), the :class:`RateBook` of measured worker rates, and runs jobs: a
:class:`~swarm.runtime.scheduler.JobScheduler` decides, this adapter sends, awaits,
verifies and feeds the outcome back. Every remote result is verified before it is used (a
``verify`` callback, Freivalds for matmul; or two replicas compared); a wrong one is
redone, counted against the peer and reported through ``on_rejected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import msgpack
import numpy as np

from identity.keys import PeerId
from swarm.errors import LinkClosed
from swarm.links import shm
from swarm.links.base import PeerLink
from swarm.loop import Supervisor
from swarm.runtime.evidence import Evidence, Receipt, output_ids, params_digest
from swarm.runtime.jobcore import (
    MISSING_TRIES,
    Check,
    JobCore,
    JobReport,
    PeerReport,
    Probe,
    Reject,
    Run,
    Stop,
    Tiebreak,
    twins_of,
)
from swarm.runtime.objects import ObjectId, ObjectStore, object_id
from swarm.runtime.protocol import (
    CancelTask,
    Draining,
    PutObject,
    RunTask,
    TaskArg,
    TaskFailed,
    TaskReceipt,
    TaskResult,
    Verdict,
)
from swarm.runtime.scheduler import (
    LOCAL,
    JobScheduler,
    RateBook,
    ServiceClock,
    ShardTask,
    SlotBook,
)

log = logging.getLogger("swarm.runtime.requester")
RECEIPT_TIMEOUT = 10.0
"""Seconds a worker has to sign a result it answered when the requester rejected it."""
BEATEN_WAIT = 5.0
"""Seconds a copy that another beat is still waited for, to judge its answer
(:attr:`swarm.runtime.jobcore.Stop.judge`); one-shot requesters wait for it as they stop."""


@dataclass(frozen=True, slots=True)
class Arg:
    """One array input of a call."""

    array: np.ndarray
    """The array as it travels (transfer precision already applied)."""
    oid: ObjectId | None = None
    """Set for inputs worth caching on workers (weights): sent once per peer, then by id."""


@dataclass(frozen=True, slots=True)
class Call:
    """One task: an installed actor method with its inputs."""

    actor: str
    """Actor class name."""
    method: str
    """Method name."""
    args: tuple[Arg, ...]
    """Array inputs."""
    params: dict[str, Any] = field(default_factory=dict)
    """Method parameters (msgpack-able)."""
    cost: float = 1.0
    """Work in flops, for rates."""


class Reply(NamedTuple):
    """A task's answer as the requester keeps it."""

    outputs: list[np.ndarray]
    """The output arrays."""
    seconds: float
    """Round trip as the requester measured it."""
    task: int
    """The task id it was sent under."""
    receipt: bytes
    """The worker's encoded signed receipt (checked only when the result is rejected);
    empty for a large result, whose receipt is asked for then (:meth:`Requester.receipt`)."""
    compute: float = 0.0
    """Seconds the worker says it computed (its word: for breakdowns, never for decisions)."""


@dataclass(frozen=True, slots=True)
class EvidencePackage:
    """A rejected result's evidence and the arrays it names, for the coordinator."""

    evidence: Evidence
    """Receipt and parameters."""
    arrays: dict[bytes, np.ndarray]
    """Every array the receipt names, by content address, as it travelled."""


def evidence_for(local: PeerId, peer: PeerId, call: Call, reply: Reply,
                 reason: str) -> EvidencePackage | None:
    """Evidence of a rejected result, or None when its receipt does not bind the worker to
    exactly what was sent and received (then nothing can be proven; the result counts
    against the worker here only)."""
    try:
        receipt = Receipt.decode(reply.receipt)
    except ValueError:
        return None
    inputs = [a.oid.raw if a.oid is not None else object_id(a.array).raw for a in call.args]
    outputs = output_ids(reply.outputs)
    params = msgpack.packb(call.params, use_bin_type=True) if call.params else b""
    if (receipt.worker != peer or receipt.requester != local or receipt.task != reply.task
            or (receipt.actor, receipt.method) != (call.actor, call.method)
            or list(receipt.inputs) != inputs or list(receipt.outputs) != outputs
            or receipt.params != params_digest(params) or not receipt.valid()):
        return None
    arrays = dict(zip(inputs, (a.array for a in call.args), strict=True))
    arrays.update(zip(outputs, reply.outputs, strict=True))
    return EvidencePackage(Evidence(receipt, params, reason), arrays)


class TaskFailure(Exception):
    """A worker answered TaskFailed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class Slot:
    """A task counted at its peer from the moment a job assigns it, before its call starts.

    Jobs planned in one loop turn (many ``.remote()`` calls at once) otherwise saw none of
    each other's tasks: every call went out at once, far past the window, and the tasks
    queued at a worker looked like stragglers and were copied to another one."""

    __slots__ = ("_req", "peer", "held")

    def __init__(self, req: Requester, peer: PeerId) -> None:
        self._req, self.peer, self.held = req, peer, True
        req.slots.enter(peer)

    def take(self) -> bool:
        """The call this slot was booked for starts: it counts the task from now on."""
        held, self.held = self.held, False
        return held

    def release(self, _: object = None) -> None:
        """The call never started (cancelled, no link): give the slot back."""
        if self.take():
            self._req._leave(self.peer)
            self._req._slot_freed(self.peer)


class Requester:
    """Sends calls over worker links; runs verified, scheduled jobs."""

    def __init__(
        self,
        local: PeerId,
        *,
        rates: RateBook | None = None,
        store_capacity: int = 8 << 30,
        accept_peer: Callable[[PeerId], bool] = lambda peer: True,
        on_rejected: Callable[[PeerId, str, EvidencePackage | None], None] | None = None,
        window: int = 2,
        task_timeout: float = 120.0,
    ) -> None:
        self.local = local
        self.rates = rates or RateBook()
        self.instances = itertools.count(1)
        """Actor instance numbers for this node's clients: one counter, so two clients of
        one node (a member's API and its user's) never address the same instance."""
        self.store = ObjectStore(store_capacity)
        self.accept_peer = accept_peer
        self.on_rejected = on_rejected
        self.window = window
        self.task_timeout = task_timeout
        self.links: dict[PeerId, PeerLink] = {}
        self._draining: set[PeerId] = set()
        self._pending: dict[tuple[PeerId, int], asyncio.Future] = {}
        self.slots = SlotBook()
        """Tasks at each peer: calls pending plus :class:`Slot` s booked (the window), and
        the jobs waiting for a freed slot, oldest first (:meth:`_slot_freed`)."""
        self._puts: dict[tuple[PeerId, ObjectId], asyncio.Future] = {}
        self.objects_sent = 0
        """Objects sent to workers (PutObject), for tests and benchmarks."""
        self._ids = itertools.count(1)
        self._jobs: set[_JobRun] = set()
        """Jobs running now (woken when the worker set changes)."""
        self._readers = Supervisor(log, "link reader")
        self._probes = Supervisor(log, "link probe")
        self._errands = Supervisor(log, "requester errand")
        """Verdicts being sent on the side (:meth:`accept`)."""
        self._reports = Supervisor(log, "evidence report")
        """Rejected results being reported (:meth:`report`, :meth:`reported`)."""
        self._receipts: dict[tuple[PeerId, int], asyncio.Future] = {}
        """Receipts asked for and not answered yet (:meth:`receipt`)."""
        self.on_task_sent: Callable[[PeerId, RunTask], None] | None = None
        """Observer called after each RunTask is sent (progress displays, tests)."""
        self.clock = ServiceClock()
        """Rates count each answer's time at the worker, not its wait in the worker's queue
        (behind this job's or another job's tasks)."""
        self.assigned: Counter[PeerId] = Counter()
        """Bands planned for each worker by jobs not finished yet (plans weigh by it)."""

    @contextlib.contextmanager
    def assigning(self, owners: Sequence[PeerId]) -> Iterator[None]:
        """Count ``owners``' bands in :attr:`assigned` while the block (a job) runs."""
        self.assigned.update(owners)
        try:
            yield
        finally:
            self.assigned.subtract(owners)
            for peer in set(owners):
                if self.assigned[peer] <= 0:
                    del self.assigned[peer]

    # -- links ----------------------------------------------------------------------------

    def attach(self, link: PeerLink,
               fallback: Callable[[PeerLink, Any], Awaitable[None]] | None = None) -> None:
        """Use ``link`` to reach a worker (replaces an older link to the same peer).

        Messages that are not task answers go to ``fallback(link, msg)`` (control plane)."""
        self.links[link.remote] = link
        self.rates.heard(link.remote)  # linked again: no longer held as silent
        self._draining.discard(link.remote)
        self._readers.spawn(asyncio.get_running_loop().create_task(
            self._read(link, fallback), name=f"requester-{link.remote.short()}"))
        self._workers_changed()

    def _workers_changed(self) -> None:
        """A link came, went or is draining: every running job looks at the workers again."""
        for job in self._jobs:
            job.kick()

    def _slot_freed(self, peer: PeerId) -> None:
        """A task at ``peer`` ended (or never started): offer its slot to the jobs that
        want one there, oldest first, until one starts a task.

        Waking them all instead cost more than the work: with 64 one-call jobs through two
        peers of window 2 (inference) each answer woke ~30 jobs that polled, found no slot
        and slept again (4.5 ms of the event loop per call)."""
        for job in self.slots.waiting():
            if job.offer(peer):
                return

    def inflight(self, peer: PeerId) -> int:
        """Tasks at ``peer`` not answered yet, all jobs: sent, or assigned and about to be."""
        return self.slots.at(peer)

    def book(self, peer: PeerId) -> Slot:
        """Count a task at ``peer`` now, for a call that starts later (pass it to :meth:`call`)."""
        return Slot(self, peer)

    def _leave(self, peer: PeerId) -> None:
        self.slots.leave(peer)

    def workers(self) -> list[PeerId]:
        """Peers a new shard may go to now (linked, not draining, accepted by the hooks)."""
        return sorted(p for p, link in self.links.items()
                      if not link.closed and p not in self._draining and self.accept_peer(p))

    def nearby(self) -> set[PeerId]:
        """Linked peers on this host that share memory with us (arrays travel as memfds)."""
        return {p for p, link in self.links.items() if link.shm is not None}

    async def _read(self, link: PeerLink, fallback) -> None:
        peer = link.remote
        try:
            async for msg in link:
                if isinstance(msg, TaskResult | TaskFailed):
                    fut = self._pending.get((peer, msg.task))
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    elif isinstance(msg, TaskResult) and msg.outputs and not msg.receipt:
                        self.accept(peer, [msg.task])  # nobody waits for it: let it go
                elif isinstance(msg, TaskReceipt):
                    fut = self._receipts.get((peer, msg.task))
                    if fut is not None and not fut.done():
                        fut.set_result(msg.receipt)
                elif isinstance(msg, Draining):
                    self._draining.add(peer)
                    self._workers_changed()
                elif fallback is not None:
                    await fallback(link, msg)
        finally:
            closed = LinkClosed(link.close_reason or "link closed") if link.closed else \
                LinkClosed("link closed")
            for (p, _), fut in list(self._pending.items()):
                if p == peer and not fut.done():
                    fut.set_exception(closed)
                    fut.exception()  # retrieved: a call still sending fails on its send instead
            for (p, _), fut in list(self._receipts.items()):
                if p == peer and not fut.done():
                    fut.set_result(b"")
            if self.links.get(peer) is link:
                del self.links[peer]
                self.store.forget_peer(peer.raw)
            self._workers_changed()

    async def close(self) -> None:
        for link in list(self.links.values()):
            await link.close("requester closing")
        for tasks in (self._readers, self._probes, self._errands, self._reports):
            tasks.cancel()

    # -- one call -------------------------------------------------------------------------

    async def _send_objects(self, peer: PeerId, link: PeerLink, args: Sequence[Arg],
                            report: PeerReport | None) -> None:
        for arg in args:
            if arg.oid is None or peer.raw in self.store.holders(arg.oid):
                continue
            key = (peer, arg.oid)
            inflight = self._puts.get(key)
            if inflight is not None:
                await asyncio.shield(inflight)
                continue
            fut = asyncio.get_running_loop().create_future()
            self._puts[key] = fut
            try:
                async with self._shared(link, [arg.array]):
                    await link.send(PutObject(arg.oid.raw, arg.array))
                self.store.add_holder(arg.oid, peer.raw)
                self.objects_sent += 1
                if report is not None:
                    report.bytes_out += arg.array.nbytes
                fut.set_result(None)
            except BaseException as exc:
                fut.set_exception(exc)
                fut.exception()  # retrieved: waiters get it through shield
                raise
            finally:
                del self._puts[key]

    @staticmethod
    def _shared(link: PeerLink, arrays: list[np.ndarray]):
        """A block within which ``link`` sends ``arrays`` from shared segments written once
        per array, off the loop (nothing to do on a link without shared memory)."""
        return shm.SEGMENTS.prepared(arrays if getattr(link, "shm", None) is not None else [])

    async def call(self, peer: PeerId, call: Call, *, instance: int = 0, seq: int = -1,
                   report: PeerReport | None = None, slot: Slot | None = None) -> Reply:
        """Run ``call`` on ``peer``; returns its outputs, round trip and receipt. ``slot``:
        the task was already counted at ``peer`` (:meth:`book`).

        Raises TaskFailure for a worker's refusal or error, LinkClosed when the link breaks.
        """
        params = msgpack.packb(call.params, use_bin_type=True) if call.params else b""
        loop = asyncio.get_running_loop()
        for attempt in range(MISSING_TRIES):
            link = self.links.get(peer)
            if link is None or link.closed:
                raise LinkClosed(f"no link to {peer.short()}")
            started = time.perf_counter()
            tid = next(self._ids)
            args = [TaskArg(oid=a.oid.raw) if a.oid is not None else TaskArg(array=a.array)
                    for a in call.args]
            fut = loop.create_future()
            self._pending[(peer, tid)] = fut
            if slot is None or not slot.take():
                self.slots.enter(peer)
            try:
                msg = RunTask(tid, call.actor, instance, seq, call.method, args, params)
                await self._send_objects(peer, link, call.args, report)
                async with self._shared(link, [a.array for a in call.args if a.oid is None]):
                    await link.send(msg)
                if self.on_task_sent is not None:
                    self.on_task_sent(peer, msg)
                if report is not None:
                    report.bytes_out += sum(a.array.nbytes for a in call.args if a.oid is None)
                reply = await fut
            except asyncio.CancelledError:
                if not link.closed:
                    loop.create_task(self._cancel(link, tid))
                raise
            finally:
                self._pending.pop((peer, tid), None)
                self._leave(peer)
                self._slot_freed(peer)
            if isinstance(reply, TaskResult):
                if report is not None:
                    report.bytes_in += sum(o.nbytes for o in reply.outputs)
                return Reply(list(reply.outputs), time.perf_counter() - started, tid,
                             reply.receipt, float(reply.seconds))
            if reply.kind == "missing" and attempt < MISSING_TRIES - 1:
                for raw in reply.missing:
                    if len(raw) == 32:
                        self.store.remove_holder(ObjectId(raw), peer.raw)
                continue
            raise TaskFailure(reply.kind, reply.message)
        raise TaskFailure("missing", "worker keeps losing the task's inputs")

    @staticmethod
    async def _cancel(link: PeerLink, tid: int) -> None:
        try:
            await link.send(CancelTask(tid))
        except LinkClosed:
            pass

    # -- a job ------------------------------------------------------------------------------

    async def run(
        self,
        calls: Sequence[Call],
        *,
        local: Callable[[int], list[np.ndarray]],
        verify: Callable[[int, list[np.ndarray]], Awaitable[bool]] | None,
        replicate: bool = False,
        owners: Sequence[PeerId] | None = None,
        timeout: float | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[list[list[np.ndarray]], JobReport]:
        """Run every call somewhere, verified; returns outputs per call and a report.

        ``local(i)`` computes call ``i`` on the requester (solo mode, tiebreaks).
        ``await verify(i, outputs)`` checks a remote result (the worker's slot is refilled
        meanwhile). With ``replicate`` each call runs on two different peers and their
        outputs must agree (a disagreement is settled by ``local``). Raises TimeoutError
        after ``timeout`` seconds. A worker that refuses a call as invalid is treated like one
        that returned a wrong result: banned for this job, its shards redone elsewhere.
        """
        job = _JobRun(self, list(calls), local, verify, replicate, owners, progress)
        return await job.run(timeout)

    def probe(self, peer: PeerId) -> None:
        """A task is overdue at ``peer``: probe its link (which closes it when silent, and
        the node dials the peer again). Concurrent probes of one link share one ping."""
        link = self.links.get(peer)
        if link is None or link.closed:
            return
        self._probes.spawn(self._probe(peer, link))

    async def _probe(self, peer: PeerId, link: PeerLink) -> None:
        if await link.probe():  # (a silent link closes: the node logs the loss)
            self.rates.heard(peer)  # slow, not silent: its rate says how slow

    def report(self, peer: PeerId, call: Call, reply: Reply | None, reason: str) -> None:
        """Report a rejected result (:attr:`on_rejected`), with evidence when the worker's
        receipt binds it to that result; asks for the receipt when the result came without
        one (a large result: the worker signs only what is rejected). Runs on its own, so a
        job that ends meanwhile does not stop it."""
        self._reports.spawn(self._report(peer, call, reply, reason))

    def outlive(self, attempt: asyncio.Task, timeout: float) -> None:
        """Let an attempt its job no longer needs run on, at most ``timeout`` s (then it is
        cancelled), counted with the reports that :meth:`reported` waits for."""
        self._reports.spawn(self._outlive(attempt, timeout))

    @staticmethod
    async def _outlive(attempt: asyncio.Task, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(attempt, timeout)

    async def reported(self, timeout: float) -> None:
        """Wait, at most ``timeout`` s, for rejected results still being reported (a report
        may wait for its receipt): a one-shot requester that stops right after its job must
        not cut its evidence off. Reports that start meanwhile (an outlived attempt that
        finds its answer wrong as it ends) are waited for too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._reports and (left := deadline - loop.time()) > 0:
            await asyncio.wait(list(self._reports), timeout=left)

    def accept(self, peer: PeerId, tasks: Iterable[int]) -> None:
        """Tell ``peer`` that its results to ``tasks``, sent without receipts, were accepted
        (or are no longer needed): it lets them go. Sent on the side."""
        link = self.links.get(peer)
        if link is not None and not link.closed:
            self._errands.spawn(self._accept(link, list(tasks)))

    @staticmethod
    async def _accept(link: PeerLink, tasks: list[int]) -> None:
        with contextlib.suppress(LinkClosed):
            for task in tasks:
                await link.send(Verdict(task, True))

    async def _report(self, peer: PeerId, call: Call, reply: Reply | None, reason: str) -> None:
        package = None
        if reply is not None:
            if not reply.receipt:
                reply = reply._replace(receipt=await self.receipt(peer, reply.task))
            package = await asyncio.to_thread(evidence_for, self.local, peer, call, reply,
                                              reason)
        self._reject(peer, reason, package)

    async def receipt(self, peer: PeerId, task: int) -> bytes:
        """Ask ``peer`` to sign what it answered to ``task``: the receipt, or empty (it no
        longer holds that result, will not sign, or did not answer in RECEIPT_TIMEOUT)."""
        link = self.links.get(peer)
        if link is None or link.closed or (peer, task) in self._receipts:
            return b""
        fut = self._receipts[(peer, task)] = asyncio.get_running_loop().create_future()
        try:
            await link.send(Verdict(task, False))
            return await asyncio.wait_for(fut, RECEIPT_TIMEOUT)
        except (LinkClosed, TimeoutError):
            return b""
        finally:
            del self._receipts[(peer, task)]

    def _reject(self, peer: PeerId, reason: str,
                evidence: EvidencePackage | None = None) -> None:
        log.warning("rejected a result from %s: %s%s", peer.short(), reason,
                    "" if evidence is not None else " (no valid receipt: nothing to prove)")
        if self.on_rejected is not None:
            try:
                self.on_rejected(peer, reason, evidence)
            except Exception:
                log.exception("on_rejected hook failed")


class _JobRun:
    """The asyncio adapter around one :class:`~swarm.runtime.jobcore.JobCore`: carry out its
    actions, turn what comes back into its events, wake it at its deadlines."""

    def __init__(self, req: Requester, calls: list[Call], local, verify, replicate: bool,
                 owners: Sequence[PeerId] | None, progress) -> None:
        self.req = req
        self.calls = calls
        self.n = n = len(calls)
        self.local = local
        self.verify = verify
        self.progress = progress
        tasks = [ShardTask(i, c.cost, tuple(a.oid for a in c.args if a.oid is not None))
                 for i, c in enumerate(calls * (2 if replicate else 1))]
        holds = {p: {a.oid for c in calls for a in c.args
                     if a.oid is not None and p.raw in req.store.holders(a.oid)}
                 for p in req.links}
        if owners is not None and replicate:
            owners = list(owners) + [None] * n  # the twins: any other peer
        sched = JobScheduler(
            tasks, req.workers(), req.rates, holds=holds, owners=owners,
            twins=twins_of(n) if replicate else None,
            window=req.window, task_timeout=req.task_timeout, inflight=req.inflight)
        self.core = JobCore(n, sched, verify=verify is not None, replicate=replicate,
                            agree=agree)
        self.events: deque[Any] = deque()
        """What came back (core events to apply, or a local failure to raise)."""
        self._kick = asyncio.Event()
        self._deadline: float | None = None
        """When the job times out (loop time)."""
        self._timer: asyncio.TimerHandle | None = None
        """Kicks the job at its next deadline (the core's, or its timeout)."""
        self.running: dict[tuple[int, Any], asyncio.Task] = {}
        self.beaten: set[tuple[int, Any]] = set()
        """(shard, peer) of attempts another copy beat whose answers are still judged."""
        self.side: set[asyncio.Task] = set()
        """Checks and tiebreaks in flight."""
        self.unsigned: set[tuple[Any, int]] = set()
        """(peer, task) of answers that came without a receipt and got no verdict yet."""

    async def run(self, timeout: float | None) -> tuple[list[list[np.ndarray]], JobReport]:
        core, loop = self.core, asyncio.get_running_loop()
        started = time.perf_counter()
        self._deadline = None if timeout is None else loop.time() + timeout
        self.req._jobs.add(self)
        try:
            while not core.finished:
                now = loop.time()
                self._poll(now)
                for key in [k for k, t in self.running.items() if t.done()]:
                    task = self.running.pop(key)
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # a local failure: nothing to retry
                if core.finished:
                    break
                if self._deadline is not None and now >= self._deadline:
                    raise TimeoutError(f"job did not finish within {timeout} s "
                                       f"({len(core.results)} of {self.n} calls done)")
                await self._wait(now)
                while self.events:
                    event = self.events.popleft()
                    if isinstance(event, BaseException):
                        raise event
                    event()
                if self.progress is not None:
                    self.progress(len(core.sched.done), len(core.sched.shards))
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self.req._jobs.discard(self)
            self.req.slots.want(self, False)
            for action in core.outliving():  # reports, and copies whose answers are judged
                self._act(action)
            for task in [*self.running.values(), *self.side]:
                task.cancel()
            for peer in {p for p, _ in self.unsigned}:  # never checked, or no longer needed
                self.req.accept(peer, [t for p, t in self.unsigned if p == peer])
        core.report.seconds = time.perf_counter() - started
        return core.outputs(), core.report

    def _poll(self, now: float) -> bool:
        """Carry out the core's actions now; whether one started a task. Keeps this job's
        place among those waiting for a slot (:meth:`Requester._slot_freed`)."""
        core = self.core
        core.workers(set(self.req.workers()))
        started = False
        for action in core.poll(now):
            self._act(action)
            started = started or isinstance(action, Run)
        self.req.slots.want(self, core.wants_slot(now))
        return started

    def offer(self, peer: PeerId) -> bool:
        """A slot came free at ``peer``: start a task there if this job can (see
        :meth:`_poll`)."""
        now = asyncio.get_running_loop().time()
        if self.core.finished or not self.core.wants_slot(now, peer) or not self._poll(now):
            return False
        self._arm(now)  # the new task has deadlines of its own
        return True

    def kick(self) -> None:
        """Look again now (the worker set changed, or something came back)."""
        self._kick.set()

    def _post(self, event: Any) -> None:
        self.events.append(event)
        self._kick.set()

    def _act(self, action) -> None:
        loop = asyncio.get_running_loop()
        if isinstance(action, Run):
            # counted at the peer now: jobs that plan before this task starts see it
            slot = self.req.book(action.peer) if action.peer != LOCAL else None
            task = loop.create_task(self._attempt(action.shard, action.peer, slot))
            if slot is not None:
                task.add_done_callback(slot.release)
            task.add_done_callback(lambda _: self._kick.set())  # a local failure, too
            self.running[(action.shard, action.peer)] = task
        elif isinstance(action, Stop):
            task = self.running.pop((action.shard, action.peer), None)
            if task is not None and action.judge:  # left to answer, apart from the job
                self.beaten.add((action.shard, action.peer))
                self.req.outlive(task, BEATEN_WAIT)
            elif task is not None:
                task.cancel()
        elif isinstance(action, Check):
            self._side(self._check(action))
        elif isinstance(action, Probe):
            self.req.probe(action.peer)
        elif isinstance(action, Tiebreak):
            self._side(self._tiebreak(action.call))
        elif isinstance(action, Reject):  # outlives the job: it may ask for a receipt
            if action.answer is not None:
                self.unsigned.discard((action.peer, action.answer.task))
            self.req.report(action.peer, self.calls[action.shard % self.n], action.answer,
                            action.reason)

    def _side(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.side.add(task)
        task.add_done_callback(self._side_done)

    def _side_done(self, task: asyncio.Task) -> None:
        self.side.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # a check failed by itself (our inputs are not finite): fail the job with it
            self._post(task.exception())

    async def _wait(self, now: float) -> None:
        """Until something comes back, the job is kicked, or its next deadline passes."""
        if self.events:
            return
        self._kick.clear()
        self._arm(now)
        await self._kick.wait()

    def _arm(self, now: float) -> None:
        """Kick the job at its next deadline (and not at an older one)."""
        if self._timer is not None:
            self._timer.cancel()
        wake = [t for t in (self.core.next_wake(now), self._deadline) if t is not None]
        self._timer = (asyncio.get_running_loop().call_at(min(wake), self._kick.set)
                       if wake else None)

    async def _attempt(self, shard: int, peer: Any, slot: Slot | None = None) -> None:
        core, t0 = self.core, time.perf_counter()
        turn = 1 if peer == LOCAL else self.req.inflight(peer)  # this task counts from its deal
        try:
            if peer == LOCAL:
                outs = await asyncio.to_thread(self.local, shard % self.n)
                reply = None
            else:
                reply = await self.req.call(peer, self.calls[shard % self.n],
                                            report=core.report.peer(peer), slot=slot)
                outs = reply.outputs
                if (shard, peer) in self.beaten:
                    await self._judge_beaten(shard, peer, reply)
                    return
                if not reply.receipt:
                    self.unsigned.add((peer, reply.task))
            seconds = (time.perf_counter() - t0 if peer == LOCAL
                       else self.req.clock.seconds(peer, t0, time.perf_counter(), turn))
            self._post(partial(core.answered, shard, peer, outs, seconds, reply,
                               asyncio.get_running_loop().time()))
        except TaskFailure as exc:
            if (shard, peer) not in self.beaten:
                self._post(partial(core.failed, shard, peer, exc.kind, str(exc)))
        except LinkClosed as exc:
            if (shard, peer) not in self.beaten:
                self._post(partial(core.failed, shard, peer, "lost", str(exc)))

    async def _judge_beaten(self, shard: int, peer: Any, reply: Reply) -> None:
        """The answer of a copy another beat (never used): a wrong one is reported, with its
        evidence, as the job's own rejections are; a right one is let go at the worker."""
        i = shard % self.n
        if await self.verify(i, reply.outputs):
            if not reply.receipt:
                self.req.accept(peer, [reply.task])
            return
        self.req.rates.reject(peer)
        self.req.report(peer, self.calls[i], reply,
                        f"shard {i} failed verification (a copy beaten by another)")

    async def _check(self, check: Check) -> None:
        outputs, _, reply = check.answer
        ok = await self.verify(check.shard % self.n, outputs)
        if ok and reply is not None and (check.peer, reply.task) in self.unsigned:
            self.unsigned.discard((check.peer, reply.task))
            self.req.accept(check.peer, [reply.task])
        self._post(partial(self.core.checked, check, ok, asyncio.get_running_loop().time()))

    async def _tiebreak(self, call: int) -> None:
        truth = await asyncio.to_thread(self.local, call)
        self._post(partial(self.core.tiebroken, call, truth))



def agree(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Whether two replicas' outputs match (float tolerance for reordered sums)."""
    if len(a) != len(b):
        return False
    return all(x.shape == y.shape and np.allclose(x, y, rtol=1e-4, atol=1e-6, equal_nan=False)
               for x, y in zip(a, b, strict=True))
