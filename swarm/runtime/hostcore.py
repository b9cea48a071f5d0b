"""The sans-IO core of the worker side: every decision :class:`~swarm.runtime.host.ActorHost`
makes about a call, taken without I/O.

:class:`HostCore` admits or refuses each RunTask (``--max-memory``, actor instances per
requester, one requester's share of calls held out of order), keeps one actor instance's calls
in the caller's order (:class:`~swarm.runtime.actors.CallOrder`), hands out the next call to
run, and turns it into a :class:`Plan` (inputs resolved from the store, method, this task's
chaos :class:`~swarm.runtime.chaos.Fault`), a :class:`Crash` or a refusal. Once the adapter ran
the plan, :meth:`HostCore.answer` says what goes back and when (:class:`Answer`), or
:meth:`HostCore.failed` which error. Refusals are the :class:`TaskFailed` messages to send.

The adapter, :class:`~swarm.runtime.host.ActorHost`, moves bytes: it reads links, hashes
objects, runs plans on its compute thread, signs receipts and sends what the core returns.
Nothing here depends on time: the adapter measures a task's seconds with its own clock and
carries out a fault's delay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from identity.keys import PeerId
from swarm import wire
from swarm.runtime.actors import CallOrder, MatmulActor, MemoryFull, StaleCache
from swarm.runtime.chaos import Chaos, Fault
from swarm.runtime.kernels import KernelTimeout
from swarm.runtime.objects import ObjectId, ObjectStore
from swarm.runtime.protocol import MAX_PARAMS, RunTask, TaskFailed

MAX_INSTANCES = 256
"""Actor instances one requester may create on this worker."""
MAX_HELD = 1024
"""Out-of-order calls held for one actor instance, and for one requester over all of its
instances."""
HELD_SHARE = 4
"""One requester's out-of-order calls may hold at most ``1/HELD_SHARE`` of ``--max-memory``
(issue 34: calls that can never run, held in a cap shared by all, had made the worker answer
"busy" to every other requester)."""
INLINE_MATMUL_FLOPS = 1 << 18
"""numpy matmuls of at most this many flops run on the loop (tens of microseconds; the hop
to the compute thread and back costs ~0.1 ms on a small VM, most of a tiny task)."""


class _Missing(Exception):
    def __init__(self, oids: list[bytes]) -> None:
        self.oids = oids


@dataclass(eq=False)
class Call:
    """One RunTask as the worker holds it."""

    link: Any
    """The link it came on (opaque here; only ``link.remote``, the requester, is read)."""
    msg: RunTask
    """The task."""
    nbytes: int = 0
    """Inline array bytes this call holds, reserved in the store until it is done or dropped."""


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


@dataclass(frozen=True)
class Crash:
    """Exit the process now (``SWARM_CHAOS`` crash_after)."""


@dataclass
class Plan:
    """One call, ready to run."""

    call: Call
    """The call it runs."""
    actor: Any
    """The actor instance it runs on."""
    method: Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]] | None
    """What to call with ``(arrays, params)``; None: the fault says hang (the adapter runs a
    kernel that never finishes, for its time limit to stop)."""
    arrays: list[np.ndarray]
    """The inputs, resolved and restored to their precision."""
    params: dict[str, Any]
    """The decoded parameters."""
    fault: Fault
    """This task's chaos dice."""
    inline: bool
    """Run it on the loop (a tiny numpy matmul), not on the compute thread."""


@dataclass
class Answer:
    """What goes back for a plan that ran."""

    outputs: list[np.ndarray]
    """The results to send (contiguous; corrupted if the fault says so)."""
    delay_s: float
    """Wait this long first."""
    drop: bool
    """Send nothing at all."""
    hold: str = ""
    """Wait for this directory's ``release`` file first (``SWARM_CHAOS`` hold)."""


class HostCore:
    """The worker's queue of calls, actor instances and their call order, and the decisions on
    them (sans-IO; see the module docstring)."""

    def __init__(self, store: ObjectStore, chaos: Chaos, registry: dict[str, type],
                 make: Callable[[type], Any], *, inline_numpy: bool = False) -> None:
        self.store = store
        """Objects and the bytes reserved for queued calls (``--max-memory``)."""
        self.chaos = chaos
        self.registry = registry
        self._make = make
        """Creates an actor instance of a class."""
        self._inline_numpy = inline_numpy
        """The backend is numpy, so tiny matmuls may run on the loop."""
        self.queue: deque[Call] = deque()
        """Calls ready to run, in order (each requester's; :meth:`next` picks whose)."""
        self.spent: dict[PeerId, float] = {}
        """Seconds of this worker each requester with calls queued has had (kernels stopped
        at their time limit included): the next call is the first of the requester that has
        had least, so one requester's endless kernels delay another's work by one kernel,
        not by all of them."""
        self._level = 0.0
        """The share clock of the call started last (the least of those waiting then): where
        a requester that comes, or comes back, starts."""
        self.instances: dict[tuple[PeerId, str, int], _Instance] = {}
        self.current: Call | None = None
        """The call running now."""
        self.draining = False
        self.stats = HostStats()

    # -- admission --------------------------------------------------------------------------

    def admit(self, call: Call) -> TaskFailed | None:
        """Queue ``call`` (when it is next in its actor's order, else hold it), or refuse it."""
        msg, peer = call.msg, call.link.remote
        if self.draining:
            return TaskFailed(msg.task, "busy", "worker is shutting down")
        cls = self.registry.get(msg.actor)
        if cls is None or msg.method not in cls.METHODS:
            return TaskFailed(msg.task, "invalid",
                              f"no installed actor method {msg.actor}.{msg.method}")
        if msg.seq < 0 or msg.instance == 0:
            refused = self._reserve(call)
            if refused is None:
                self.queue.append(call)
            return refused
        if (peer, msg.actor, msg.instance) not in self.instances and sum(
                k[0] == peer for k in self.instances) >= MAX_INSTANCES:
            return TaskFailed(msg.task, "invalid", f"more than "
                              f"{MAX_INSTANCES} actors for one requester")
        inst = self.instance(peer, msg.actor, msg.instance)
        if inst.order.held >= MAX_HELD or msg.seq > inst.order.next_seq + MAX_HELD:
            return TaskFailed(msg.task, "invalid", "call is too far ahead of the actor's order")
        if msg.seq != inst.order.next_seq:
            refused = self._held_share(call)
            if refused is not None:
                return refused
        refused = self._reserve(call)
        if refused is not None:
            return refused
        stale = inst.order.stale
        self.queue.extend(inst.order.offer(msg.seq, call))
        if inst.order.stale != stale:   # a duplicate: dropped, holds nothing
            self.store.release(call.nbytes)
        return None

    def _held_share(self, call: Call) -> TaskFailed | None:
        """Refuse one more call held out of order when it does not fit its requester's share
        (the share frees as its earlier calls arrive)."""
        peer = call.link.remote
        held = [c for (p, _, _), inst in self.instances.items() if p == peer
                for c in inst.order.held_calls()]
        share = self.store.capacity // HELD_SHARE
        nbytes = sum(c.nbytes for c in held)
        if len(held) < MAX_HELD and nbytes + call.nbytes <= share:
            return None
        return TaskFailed(
            call.msg.task, "busy", f"worker memory for calls held out of order is shared: "
            f"you hold {len(held)} ({nbytes} bytes) waiting for earlier calls of their actors, "
            f"one requester's share is {MAX_HELD} calls and {share} bytes (1/{HELD_SHARE} of "
            f"--max-memory); send the earlier calls first")

    def _reserve(self, call: Call) -> TaskFailed | None:
        """Count the call's inline arrays against ``--max-memory``; refuse it when over."""
        if self.store.reserve(call.nbytes):
            return None
        return TaskFailed(
            call.msg.task, "busy", f"worker memory is full: the call's {call.nbytes} bytes do "
            f"not fit beside {self.store.reserved} bytes already held for queued calls "
            f"(--max-memory {self.store.capacity} bytes); send it later or elsewhere")

    def instance(self, peer: PeerId, actor: str, instance: int) -> _Instance:
        key = (peer, actor, instance)
        inst = self.instances.get(key)
        if inst is None:
            made = self._make(self.registry[actor])
            if hasattr(made, "budget"):  # state it keeps counts against --max-memory
                made.budget = self.store
            inst = self.instances[key] = _Instance(made)
        return inst

    def hosted(self) -> list[tuple[bytes, int, int]]:
        """Spans of model blocks this worker's actors host (their ``hosting``): (model id,
        first block, count), each once, in block order."""
        spans = {inst.actor.hosting for inst in self.instances.values()
                 if getattr(inst.actor, "hosting", None) is not None}
        return sorted(spans, key=lambda s: (s[1], s[2], s[0]))

    # -- taking calls back ------------------------------------------------------------------

    def drop(self, which: Callable[[Call], bool]) -> list[Call]:
        """Take the queued calls ``which`` selects off the queue, free their bytes, and
        return them."""
        keep: deque[Call] = deque()
        dropped = []
        for call in self.queue:
            if which(call):
                self.store.release(call.nbytes)
                dropped.append(call)
            else:
                keep.append(call)
        self.queue = keep
        return dropped

    def forget(self, link: Any) -> None:
        """``link`` closed: drop its queued calls, and its requester's actor instances with the
        calls they hold."""
        self.drop(lambda c: c.link is link)
        for key in [k for k in self.instances if k[0] == link.remote]:
            inst = self.instances.pop(key)
            for call in inst.order.held_calls():
                self.store.release(call.nbytes)
            if hasattr(inst.actor, "close"):
                inst.actor.close()

    # -- running ----------------------------------------------------------------------------

    def next(self) -> Call | None:
        """The next call to run (now :attr:`current`), or None when none is queued: the
        first queued call of the requester that has had least of this worker's time."""
        if not self.queue:
            return None
        first: dict[PeerId, int] = {}
        for i, call in enumerate(self.queue):
            first.setdefault(call.link.remote, i)
        self.spent = {p: self.spent.get(p, self._level) for p in first}
        peer = min(first, key=lambda p: (self.spent[p], first[p]))
        self._level = self.spent[peer]
        i = first[peer]
        self.current = self.queue[i]
        del self.queue[i]
        return self.current

    def done(self, call: Call, seconds: float = 0.0) -> None:
        """``call`` finished (answered or not) after ``seconds`` of this worker's time: free
        what it held, and count the time against its requester's share."""
        self.store.release(call.nbytes)
        self.current = None
        peer = call.link.remote
        self.spent[peer] = self.spent.get(peer, self._level) + seconds

    def activity(self) -> tuple[int, list[tuple[PeerId, int]]]:
        """Tasks queued or running now, and per requester (busiest first, then by id)."""
        calls = list(self.queue) + ([self.current] if self.current is not None else [])
        per: dict[PeerId, int] = {}
        for call in calls:
            per[call.link.remote] = per.get(call.link.remote, 0) + 1
        return len(calls), sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))

    def plan(self, call: Call) -> Plan | Crash | TaskFailed:
        """Roll this task's dice and resolve it: what to run, a crash, or the refusal to send.
        A call whose objects are missing takes its actor's later calls back (order kept)."""
        msg, link = call.msg, call.link
        fault = self.chaos.next_task()
        if fault.crash:
            return Crash()
        try:
            arrays, params = self._resolve(msg)
            actor = (self.instance(link.remote, msg.actor, msg.instance).actor
                     if msg.instance else self.instance(link.remote, msg.actor, 0).actor)
            spec = type(actor).METHODS[msg.method]
            spec.check(arrays, params)
        except _Missing as exc:
            if msg.instance and msg.seq >= 0:  # keep the actor's order: hold later calls back
                inst = self.instance(link.remote, msg.actor, msg.instance)
                later = [c for c in self.queue if c.link is link
                         and c.msg.instance == msg.instance and c.msg.actor == msg.actor]
                self.queue = deque(c for c in self.queue if all(c is not x for x in later))
                inst.order.rewind(msg.seq, {c.msg.seq: c for c in later})
            return TaskFailed(msg.task, "missing", "objects not held", missing=exc.oids)
        except (TypeError, ValueError, AttributeError) as exc:
            return TaskFailed(msg.task, "invalid", str(exc)[:500])
        if fault.invalid:
            return TaskFailed(msg.task, "invalid", "SWARM_CHAOS: refused")
        if fault.stale:
            return TaskFailed(msg.task, "invalid", "SWARM_CHAOS: invalid: this actor holds 0 "
                              "positions; send its rows from position 0")
        if fault.layer and msg.method == "matmul" and len(arrays) == 2:
            arrays = [arrays[0], self.chaos.wrong_layer(arrays[0], arrays[1],
                                                        self.store.arrays())]
        method = getattr(actor, msg.method)
        if fault.layer and hasattr(actor, f"{msg.method}_wrong_layer"):
            method = getattr(actor, f"{msg.method}_wrong_layer")
        if fault.hang:
            return Plan(call, actor, None, arrays, params, fault, inline=False)
        return Plan(call, actor, method, arrays, params, fault,
                    inline=self._tiny(actor, msg.method, arrays))

    def failed(self, plan: Plan, exc: Exception) -> TaskFailed:
        """The answer to a plan whose method raised: a timeout when its kernel's time limit
        stopped it, else the method's own error."""
        task = plan.call.msg.task
        if isinstance(exc, KernelTimeout):
            return TaskFailed(task, "timeout", str(exc))
        if isinstance(exc, StaleCache):
            return TaskFailed(task, "stale", str(exc)[:500])
        if isinstance(exc, MemoryFull):
            return TaskFailed(task, "busy", str(exc)[:500])
        return TaskFailed(task, "error", f"{type(exc).__name__}: {str(exc)[:500]}")

    def answer(self, plan: Plan, outputs: list[np.ndarray]) -> Answer:
        """What goes back for ``outputs``, and when (the fault's corruption, delay, drop)."""
        fault = plan.fault
        if fault.corrupt:
            outputs = [self.chaos.corrupt(o) for o in outputs]
        if fault.nan:
            outputs = [self.chaos.nan(o) for o in outputs]
        return Answer([np.ascontiguousarray(o) for o in outputs], fault.delay_s, fault.drop,
                      fault.hold)

    def _tiny(self, actor: object, method: str, arrays: list[np.ndarray]) -> bool:
        """Whether a task is a numpy matmul small enough to run on the loop itself."""
        if (method != "matmul" or not isinstance(actor, MatmulActor) or len(arrays) != 2
                or not self._inline_numpy):
            return False
        a, b = arrays
        return (a.ndim == 2 and b.ndim == 2
                and 2 * a.shape[0] * a.shape[1] * b.shape[1] <= INLINE_MATMUL_FLOPS)

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
