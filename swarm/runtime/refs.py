"""ObjectRefs and the blocking ``get`` / ``wait`` calls, in Ray's manner.

A ref is a handle to an array that exists now (``client.put``) or will exist when a task
finishes. It is backed by a thread-safe :class:`concurrent.futures.Future`, so the same ref
can be waited on from plain code (:func:`get`, :func:`wait`) and awaited in any asyncio
event loop (``await ref``), and it can be passed as the input of another task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from swarm.errors import GetTimeoutError, TaskCancelledError
from swarm.runtime.objects import ObjectId


class ObjectRef:
    """A future array. Get it with ``swarm.get(ref)`` or ``await ref``."""

    __slots__ = ("id", "_future", "owner", "__weakref__")

    def __init__(self, oid: ObjectId, future: cf.Future, owner: object = None) -> None:
        self.id = oid
        """Content address (``put``) or task output id."""
        self._future = future
        self.owner = owner
        """The client that made the ref (refs are only meaningful to it)."""

    @classmethod
    def ready(cls, oid: ObjectId, value: np.ndarray, owner: object = None) -> ObjectRef:
        f: cf.Future = cf.Future()
        f.set_result(value)
        return cls(oid, f, owner)

    def __repr__(self) -> str:
        state = "ready" if self._future.done() else "pending"
        return f"ObjectRef({self.id.raw[:6].hex()}, {state})"

    def __await__(self) -> Generator[Any, None, np.ndarray]:
        return asyncio.wrap_future(self._future).__await__()

    def done(self) -> bool:
        return self._future.done()

    def future(self) -> cf.Future:
        """The underlying thread-safe future (for adapters)."""
        return self._future

    def __reduce__(self):
        raise TypeError("an ObjectRef cannot be pickled; pass it to a task of the same client")


def _as_list(refs: ObjectRef | Sequence[ObjectRef], what: str) -> tuple[list[ObjectRef], bool]:
    if isinstance(refs, ObjectRef):
        return [refs], True
    if isinstance(refs, (list, tuple)) and all(isinstance(r, ObjectRef) for r in refs):
        return list(refs), False
    raise TypeError(f"{what}() takes an ObjectRef or a list of ObjectRefs, "
                    f"got {type(refs).__name__}; make refs with client.put() or .remote()")


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")


def get(refs: ObjectRef | Sequence[ObjectRef], *, timeout: float | None = None):
    """The array (or list of arrays) behind ``refs``; blocks up to ``timeout`` seconds.

    Raises :class:`~swarm.errors.GetTimeoutError` when they are not all ready in time,
    :class:`~swarm.errors.TaskCancelledError` for a cancelled task, and the task's own error
    when a task failed for good.
    """
    items, single = _as_list(refs, "get")
    _check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    out = []
    for ref in items:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            out.append(ref._future.result(left))
        except cf.CancelledError:
            raise TaskCancelledError(f"the task behind {ref!r} was cancelled") from None
        except cf.TimeoutError:
            raise GetTimeoutError(
                f"get() timed out after {timeout} s with {sum(not r.done() for r in items)} "
                f"of {len(items)} refs not ready"
            ) from None
    return out[0] if single else out


def wait(refs: Sequence[ObjectRef], *, num_returns: int = 1,
         timeout: float | None = None) -> tuple[list[ObjectRef], list[ObjectRef]]:
    """Split ``refs`` into (ready, not ready) once ``num_returns`` are ready or at ``timeout``.

    Order within each list follows ``refs``. A failed task counts as ready (``get`` raises).
    """
    items, single = _as_list(refs, "wait")
    if single:
        raise TypeError("wait() takes a list of ObjectRefs; wrap a single ref: wait([ref])")
    if len({id(r) for r in items}) != len(items):
        raise ValueError("wait() got the same ObjectRef twice; pass each ref once")
    if not isinstance(num_returns, int) or not 1 <= num_returns <= len(items):
        raise ValueError(f"num_returns must be between 1 and len(refs)={len(items)}, "
                         f"got {num_returns!r}")
    _check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        ready = [r for r in items if r.done()]
        if len(ready) >= num_returns:
            break
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        cf.wait([r._future for r in items if not r.done()], timeout=left,
                return_when=cf.FIRST_COMPLETED)
    ready = [r for r in items if r.done()][:num_returns]
    chosen = {id(r) for r in ready}
    return ready, [r for r in items if id(r) not in chosen]
