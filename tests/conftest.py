"""Shared test helpers: run the `swarm` command as a real subprocess from this tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes that import this tree (not an installed copy)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("JOURNAL_STREAM", None)
    env.update(extra)
    return env


def swarm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "swarm", *args]


def run_swarm(*args: str, timeout: float = 60, env: dict[str, str] | None = None,
              input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `swarm ARGS...` to completion with a bounded timeout."""
    return subprocess.run(
        swarm_cmd(*args), capture_output=True, text=True, timeout=timeout,
        env=env or subprocess_env(), input=input, stdin=None if input else subprocess.DEVNULL,
    )


# --- CI: a skip for a missing required component fails the run (issue 43) -------------------
# Under CI (CI=1/true/yes, any case; .ci/run exports it) every skip is a failure unless its
# reason says no install can fix it (a fact about the machine: the kernel lacks sch_netem, the
# adapter lacks shader-f16, a HID key is plugged in). A runner without Chromium, coturn,
# iptables, conntrack, libtorrent, a wgpu adapter, uvloop, root and iproute2, IPv6 on loopback
# or shared memory thus fails instead of passing with those tests silently skipped.

NO_INSTALL_FIXES = "no install fixes this"


def ci_on(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether this run is CI's, where a skipped required component is a failure."""
    return env.get("CI", "").strip().lower() in ("1", "true", "yes")


def no_install_fixes(reason: str) -> str:
    """A skip reason for what this machine is, not what it lacks: it stays a skip in CI."""
    return f"{reason} ({NO_INSTALL_FIXES})"


def _ci_fails_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail") or not ci_on():
        return
    longrepr = report.longrepr
    reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
    reason = reason.removeprefix("Skipped: ")
    if NO_INSTALL_FIXES in reason:
        return
    report.outcome = "failed"
    report.longrepr = (f"CI must run this, but it was skipped: {reason}\n(install what it "
                       "names; a skip no install can fix says so with no_install_fixes())")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _ci_fails_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _ci_fails_skip(outcome.get_result())


# --- the order of files: the slow ones first (issue 43) ------------------------------------
# `make test` runs two xdist workers, one file at a time each: a slow file started last would
# run alone at the end. Files with a test marked system or slow go first; the order inside a
# file and among the others is kept (both workers must collect the same order).


def pytest_collection_modifyitems(config, items):
    slow = {item.path for item in items
            if item.get_closest_marker("system") or item.get_closest_marker("slow")}
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
    items.sort(key=lambda item: (item.path not in slow, first[item.path]))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A fresh SWARM_HOME for one test."""
    d = tmp_path / "home"
    return d


@pytest.fixture
def even_rates(client):
    """The module's ``client`` with rates started afresh, for a test that counts how bands
    were dealt: a stall earlier in the module (a busy CI host) holds a worker's rate down for
    RATE_HOLD seconds, and such a worker is dealt a band under the inline budget, or none (a
    stall-free deal is what these tests check, not the deal itself)."""
    from swarm.runtime.scheduler import RateBook

    client.node.requester.rates = RateBook()
    return client
