"""The runtime's wire messages: objects, tasks, results (see :mod:`swarm.wire` for framing).

A requester sends :class:`PutObject` for a large input a worker does not hold yet, then
:class:`RunTask` naming it by id; the worker answers :class:`TaskResult` or
:class:`TaskFailed`. A large result comes without its receipt; the requester's :class:`Verdict`
lets it go, or asks for the receipt of one it rejected (answered by :class:`TaskReceipt`). Nothing here
carries code: a task names an installed actor class and method, and its parameters are a
small msgpack map checked by that method's spec.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np

from swarm import wire

MAX_PARAMS = 96 * 1024
"""Largest msgpack parameter map (WGSL source included)."""


@wire.message("rt.put")
class PutObject(wire.Message):
    """Store an array in the receiver's object store under its content address."""

    oid: bytes
    """BLAKE3 content address of ``array`` (the receiver checks it)."""
    array: np.ndarray
    """The array, in its transfer precision."""


@wire.message("rt.arg")
class TaskArg(wire.Message):
    """One array input of a task: by id (from the object store) or inline."""

    oid: bytes | None = None
    """Content address of an object the worker holds (sent earlier with PutObject)."""
    array: np.ndarray | None = None
    """The array itself, for inputs used once (activation rows)."""


@wire.message("rt.task")
class RunTask(wire.Message):
    """Run one method of an installed actor class."""

    task: int
    """Requester-chosen id, unique on this link; echoed in the answer."""
    actor: str
    """Installed actor class name (e.g. "matmul")."""
    instance: int
    """Actor instance id chosen by the requester; 0 = the worker's shared stateless one."""
    seq: int
    """Position of this call among the instance's calls (ordered delivery); -1 = unordered."""
    method: str
    """Method name."""
    args: list[TaskArg]
    """Array inputs in order."""
    params: bytes = b""
    """msgpack map of the method's parameters (at most MAX_PARAMS bytes)."""
    precision: str = "f32"
    """Transfer precision for the result arrays ("f32", "f16", "bf16")."""


@wire.message("rt.result")
class TaskResult(wire.Message):
    """A task's outputs."""

    task: int
    """The RunTask's id."""
    outputs: list[np.ndarray]
    """Output arrays, in their transfer precision."""
    seconds: float
    """Compute time on the worker (its claim; the requester measures its own round trip)."""
    receipt: bytes = b""
    """The worker's signed :class:`~swarm.runtime.evidence.Receipt` for these outputs; empty
    for a large result, whose receipt the requester asks for when it rejects the result."""


@wire.message("rt.verdict")
class Verdict(wire.Message):
    """The requester's word on a large result that came without its receipt: accepted (the
    worker lets it go) or rejected (the worker signs it and answers :class:`TaskReceipt`)."""

    task: int
    """The RunTask's id."""
    accepted: bool
    """True: the result passed (or is no longer needed); False: send its receipt."""


@wire.message("rt.receipt")
class TaskReceipt(wire.Message):
    """The answer to a rejecting :class:`Verdict`."""

    task: int
    """The RunTask's id."""
    receipt: bytes = b""
    """The signed :class:`~swarm.runtime.evidence.Receipt`; empty when the worker no longer
    holds that result (it keeps the last few, see ``ActorHost``)."""


@wire.message("rt.evidence")
class EvidenceMsg(wire.Message):
    """A rejected result, for the coordinator to re-check (arrays sent before, by address)."""

    evidence: bytes
    """An encoded :class:`~swarm.runtime.evidence.Evidence`."""


@wire.message("rt.evidence_ack")
class EvidenceAck(wire.Message):
    """The answer to :class:`EvidenceMsg`: whether the receiver took it as coordinator.

    A peer that is not (or no longer) coordinating says so, and the sender tries again with
    whoever coordinates next: evidence is never dropped on the word of a stale DHT state."""

    key: bytes
    """The evidence's :attr:`~swarm.runtime.evidence.Evidence.key`."""
    taken: bool
    """True: the receiver coordinates and judged (or is judging) it."""


@wire.message("rt.failed")
class TaskFailed(wire.Message):
    """A task that did not produce outputs."""

    task: int
    """The RunTask's id."""
    kind: str
    """"missing" (resend the objects in ``missing``), "invalid" (bad request), "error"
    (the method raised), "busy" (draining, or memory full: run it elsewhere), "timeout"
    (a kernel ran past the worker's time limit and was stopped), "stale" (the actor's state
    does not follow the call, e.g. a span cache it no longer holds: rebuild it)."""
    message: str
    """What went wrong, in words."""
    missing: list[bytes] = field(default_factory=list)
    """For kind "missing": ids of objects the worker does not hold (evicted or never sent)."""


@wire.message("rt.cancel")
class CancelTask(wire.Message):
    """The requester no longer needs this task's result (another copy won)."""

    task: int
    """The RunTask's id."""


@wire.message("rt.draining")
class Draining(wire.Message):
    """The worker is stopping: it finishes what it started and takes no new tasks."""

    reason: str
    """Why, in words."""
