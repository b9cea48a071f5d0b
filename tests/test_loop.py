"""One event-loop runner (swarm.loop) for every command and entry point."""

from __future__ import annotations

import ast
import asyncio
import logging
import warnings

import pytest

from swarm import loop as swarm_loop
from swarm.errors import ConfigError
from tests.conftest import ROOT


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_run_uses_uvloop_by_default(monkeypatch):
    pytest.importorskip("uvloop")  # a declared dependency on every platform the CI uses
    monkeypatch.delenv(swarm_loop.ENV, raising=False)
    assert swarm_loop.run(_loop_module()) == "uvloop"


def test_env_forces_asyncio(monkeypatch):
    monkeypatch.setenv(swarm_loop.ENV, "asyncio")
    assert swarm_loop.choice() == "asyncio"
    assert swarm_loop.run(_loop_module()) == "asyncio"
    assert isinstance(swarm_loop.new_loop(), asyncio.BaseEventLoop)


def test_bad_env_is_a_clear_error_and_leaves_no_dangling_coroutine(monkeypatch):
    monkeypatch.setenv(swarm_loop.ENV, "trio")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine was never awaited" would fail here
        with pytest.raises(ConfigError, match="SWARM_LOOP"):
            swarm_loop.run(_loop_module())


def test_no_entry_point_calls_asyncio_run_directly():
    """Commands and worker processes start their loops through swarm.loop.run only."""
    offenders = []
    for py in (ROOT / "swarm").rglob("*.py"):
        if py.name == "loop.py":
            continue
        for node in ast.walk(ast.parse(py.read_text(), str(py))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "run" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in ("asyncio", "uvloop")):
                offenders.append(f"{py.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"use swarm.loop.run instead of asyncio.run: {offenders}"


# -- Supervisor: the one keeper of background tasks ------------------------------------

async def test_a_failure_is_logged_and_handed_on_and_the_task_forgotten(caplog):
    seen: list[BaseException] = []
    tasks = swarm_loop.Supervisor(logging.getLogger("test.supervisor"), "handler")

    async def boom() -> None:
        raise ValueError("broken handler")

    with caplog.at_level(logging.ERROR, "test.supervisor"):
        task = tasks.spawn(boom(), on_error=seen.append)
        await tasks.settle()
    assert task.done() and len(tasks) == 0
    assert [type(e) for e in seen] == [ValueError]
    assert "handler failed" in caplog.text and "broken handler" in caplog.text


async def test_cancel_stops_every_task_and_close_awaits_them():
    tasks = swarm_loop.Supervisor(logging.getLogger("test.supervisor"))
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    first = tasks.spawn(forever())
    await started.wait()
    cancelled = tasks.cancel()
    assert cancelled == [first]
    second = tasks.spawn(forever())
    await tasks.close()
    assert first.cancelled() and second.cancelled() and len(tasks) == 0
    with pytest.raises(asyncio.CancelledError):
        await first
