"""One event-loop runner for every command and entry point, and one keeper of background tasks.

Every ``swarm`` command, worker process and the client's private loop thread get their loop
here, so workers run on the same loop as the benchmarked links: uvloop where it is installed
(about twice the throughput of asyncio's own loop on TLS links), asyncio otherwise.
``SWARM_LOOP=asyncio`` forces the standard loop (debugging, or to compare); any other value
than ``asyncio``, ``uvloop`` or empty is a ConfigError, raised before anything runs.

:class:`Supervisor` holds the tasks an object starts beside its own work (a server's link
handlers, an endpoint's answers), so that none runs unowned: each failure is logged, and the
owner's close cancels what is left.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from swarm.errors import ConfigError

ENV = "SWARM_LOOP"
PROFILE_ENV = "SWARM_PROFILE"
"""``SWARM_PROFILE=path``: run the loop under cProfile and dump its stats to ``path.<pid>``
at exit (py-spy is not always at hand; finding where an idle node spends its time)."""
T = TypeVar("T")


def choice() -> str:
    """The loop kind to use: "uvloop" or "asyncio" (from ``SWARM_LOOP`` and what is installed)."""
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted not in ("", "uvloop", "asyncio"):
        raise ConfigError(f"{ENV}={wanted!r} is not a loop kind; use 'uvloop' or 'asyncio'")
    if wanted == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if wanted == "uvloop":
            raise ConfigError(f"{ENV}=uvloop but uvloop is not installed") from None
        return "asyncio"
    return "uvloop"


def factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """A callable making a new loop of the chosen kind."""
    if choice() == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the chosen kind (for a loop thread)."""
    return factory()()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on the chosen loop kind."""
    try:
        make = factory()
    except BaseException:
        coro.close()  # never started: no "coroutine was never awaited" warning
        raise
    profile = os.environ.get(PROFILE_ENV, "")
    if not profile:
        with asyncio.Runner(loop_factory=make) as runner:
            return runner.run(coro)
    import cProfile

    prof = cProfile.Profile()
    try:
        with asyncio.Runner(loop_factory=make) as runner:
            return prof.runcall(runner.run, coro)
    finally:
        prof.dump_stats(f"{profile}.{os.getpid()}")


class Supervisor:
    """The background tasks of one owner. ``spawn`` starts one; a task that fails is logged
    (as ``"<what> failed"``) and handed to its ``on_error``; a finished task is forgotten.
    ``cancel`` stops all (for an owner that cannot wait), ``close`` stops and awaits all,
    ``settle`` waits for those started so far and any they start."""

    def __init__(self, log: logging.Logger, what: str = "background task") -> None:
        self._log = log
        self._what = what
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        """The tasks running now (a copy: one may end while the caller looks)."""
        return iter(list(self._tasks))

    def spawn(self, aw: Awaitable[Any], *,
              on_error: Callable[[BaseException], object] | None = None) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if t.cancelled() or t.exception() is None:
                return
            exc = t.exception()
            self._log.error("%s failed: %r", self._what, exc)
            if on_error is not None:
                on_error(exc)  # type: ignore[arg-type]

        task.add_done_callback(done)
        return task

    def cancel(self) -> list[asyncio.Task[Any]]:
        """Cancel every task; returns them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks

    async def close(self) -> None:
        """Cancel every task and wait until all have ended."""
        while self._tasks:
            await asyncio.gather(*self.cancel(), return_exceptions=True)

    async def settle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


__all__ = ["ENV", "Supervisor", "choice", "factory", "new_loop", "run"]
