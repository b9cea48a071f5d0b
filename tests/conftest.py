"""Shared test helpers: run the `swarm` command as a real subprocess from this tree."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
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
    if not report.skipped or not ci_on():
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


# --- the order of files: longest first (issue 43) ----------------------------------------
# `make test` runs three xdist workers, one whole file at a time each: a long file started last
# would run alone at the end. The files go longest first by tests/file_costs.py's estimates.
# xdist would sort them again by how many tests each has (its --loadscope-reorder default),
# which put the one-test, 50 s files last: that is turned off here, for any command line.


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    from tests.file_costs import longest_first

    longest_first(items)


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


# --- issue 43 (tests43fix): shared helpers (a dead address, held tasks, cluster, bounded
# readline, one BLAS thread, the web server); the block runs to the end of the file --------

def _hold_dead_port() -> tuple[int, list[socket.socket]]:
    """A loopback port held for this test process by a TCP socket that never listens (a
    connect is refused at once) and a UDP socket that never reads (a datagram gets no reply),
    so no other process can take it; 127.0.0.1:9 was assumed closed, not known to be."""
    while True:
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.bind(("127.0.0.1", 0))
        port = tcp.getsockname()[1]
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            udp.bind(("127.0.0.1", port))
        except OSError:
            tcp.close()
            udp.close()
            continue
        return port, [tcp, udp]


DEAD_PORT, _DEAD_SOCKETS = _hold_dead_port()
DEAD_ADDR = ("127.0.0.1", DEAD_PORT)
"""(host, port) that refuses TCP and never answers UDP, for as long as the tests run."""
DEAD = f"127.0.0.1:{DEAD_PORT}"


def wait_held(hold: Path, count: int, timeout: float = 30.0) -> list[str]:
    """The ``held-TASK`` files once ``count`` tasks are held at a ``hold=`` worker: each
    reached the worker, was computed and waits for ``hold/release`` to be answered."""
    deadline = time.monotonic() + timeout
    while len(held := sorted(p.name for p in hold.glob("held-*"))) < count:
        assert time.monotonic() < deadline, f"{len(held)} of {count} tasks held"
        time.sleep(0.02)
    return held


@pytest.fixture
def cluster(tmp_path: Path):
    """A :class:`tests.control_support.Cluster` of real processes, stopped after the test."""
    from tests.control_support import Cluster

    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The next line ``proc`` writes to its stdout pipe, waiting at most ``timeout`` s; a
    child that prints nothing in time is killed and the test fails (a bare readline() waits
    until pytest's own timeout, with no word of which child hung)."""
    import threading

    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        proc.kill()
        reader.join(10)
        raise AssertionError(f"process {proc.pid} ({proc.args!r:.120}) printed no line "
                             f"in {timeout} s")
    return got[0]


@pytest.fixture(scope="module")
def one_blas_thread():
    """One BLAS thread for a module's tests, as models.generate runs: two BLAS threads on
    busy cores are several times slower."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        yield


@contextlib.contextmanager
def served_api(workers: int, make_api):
    """A node's web server on loopback with ``make_api(node)`` mounted, as a member runs it
    (a client attached to the member's own node and loop, the key in its data dir), over a
    ``swarm.local(workers)``: (base URL, API key, client)."""
    import swarm
    from swarm.web.server import SwarmInfo, WebServer

    with swarm.local(workers, threads=1) as client:
        info = SwarmInfo(client.swarm_id, "local", "00" * 32, False, client.uri)

        async def start():
            server = WebServer(client.node, info, "127.0.0.1", 0, api=make_api(client.node))
            await server.start()
            return server

        server = client._loop.run(start(), 30)
        key = (Path(client.node.config.data_dir) / "api-key").read_text().strip()
        try:
            yield f"http://127.0.0.1:{server.port}/v1", key, client
        finally:
            client._loop.run(server.stop(), 30)
