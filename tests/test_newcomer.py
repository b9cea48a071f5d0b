"""Issue 35: a newcomer's first hour, through real processes with default data dirs.

HOME is a temporary dir and neither ``$SWARM_HOME`` nor ``--data-dir`` is given, so every
process uses the platform's default data dir (``$HOME/.local/share/swarm``) as a newcomer's
would: a publisher, a worker joined beside it in "another terminal", status, submit with a
check of the product, kick/block/unblock by the short ids the tables show, and the swarm
outliving its publisher for every client. No traceback may reach the terminal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import swarm_cmd
from tests.control_support import Proc, stop_all

pytestmark = [pytest.mark.system]


def newcomer_env(home: Path) -> dict[str, str]:
    """This tree's code, HOME in ``home``, and nothing that picks a data dir for us."""
    from tests.conftest import subprocess_env

    env = subprocess_env(HOME=str(home))
    for var in ("SWARM_HOME", "XDG_DATA_HOME", "SWARM_BOOTSTRAP"):
        env.pop(var, None)
    return env


def assert_clean(res_or_text, *, code: int | None = None) -> None:
    """No traceback in what the user saw; ``code`` when given."""
    if isinstance(res_or_text, str):
        text = res_or_text
    else:
        text = res_or_text.stdout + res_or_text.stderr
        if code is not None:
            assert res_or_text.returncode == code, (res_or_text.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    assert "Exception ignored" not in text, text[-3000:]


class Tour:
    """Processes of one test, all with the default data dir under one HOME."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = newcomer_env(home)
        self.procs: list[Proc] = []
        self.uri = ""

    @property
    def default_dir(self) -> Path:
        return self.home / ".local" / "share" / "swarm"

    def start(self, name: str, *args: str) -> Proc:
        popen = subprocess.Popen(swarm_cmd(*args), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                 env=self.env, cwd=self.home)
        p = Proc(name, popen, time.monotonic())
        p.threads = [threading.Thread(target=p._pump, args=(popen.stdout, p.out), daemon=True),
                     threading.Thread(target=p._pump, args=(popen.stderr, p.err), daemon=True)]
        for t in p.threads:
            t.start()
        self.procs.append(p)
        return p

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(swarm_cmd(*args), capture_output=True, text=True, timeout=timeout,
                              env=self.env, cwd=self.home, stdin=subprocess.DEVNULL)

    def publish(self) -> Proc:
        p = self.start("pub", "publish", "--name", "lab", "--owner-key",
                       f"soft:{self.home / 'owner.key'}", "--backend", "numpy")
        self.uri = p.wait_line(lambda s: s.startswith("magnet:?"), 90, "out")
        return p

    def join(self, name: str) -> Proc:
        return self.start(name, "join", self.uri, "--yes", "--backend", "numpy",
                          "--threads", "1")

    def status(self, pred=lambda s: True, timeout: float = 60, uri: str | None = None) -> dict:
        """``swarm status --json`` until ``pred`` holds (bounded)."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            res = self.run("status", uri or self.uri, "--json")
            assert_clean(res)
            if res.returncode == 0:
                last = json.loads(res.stdout)
                if pred(last):
                    return last
            else:
                last = res.stderr
            time.sleep(0.3)
        raise AssertionError(f"status never matched in {timeout} s; last: {last}")

    def close(self, root: Path) -> None:
        stop_all(self.procs, root)
        for p in self.procs:
            assert_clean("\n".join(p.out + p.err))


def data_dir_of(p: Proc) -> Path:
    return Path(p.wait_line(lambda s: s.startswith("data dir: "), 60).removeprefix("data dir: "))


@pytest.fixture
def tour(tmp_path):
    t = Tour(tmp_path / "home")
    t.home.mkdir()
    yield t
    t.close(tmp_path)


def test_two_members_on_one_machine_with_the_default_dir(tour):
    """Finding 1: a join beside the publisher, same user, default options, just works: its
    own dir and identity, and both say which dir they use; the dir stays locked."""
    pub = tour.publish()
    assert data_dir_of(pub) == tour.default_dir
    w = tour.join("w1")
    assert data_dir_of(w) == tour.default_dir.with_name("swarm-2")
    assert w.peer != pub.peer
    st = tour.status(lambda s: {m["peer_id"] for m in s["members"]} == {pub.peer, w.peer})
    assert st["coordinator"] in {pub.peer, w.peer}
    # an explicit dir in use is refused, naming the process that holds it
    res = tour.run("join", tour.uri, "--yes", "--data-dir", str(tour.default_dir))
    assert_clean(res, code=2)
    assert f"in use by process {pub.popen.pid}" in res.stderr
    # SIGINT is 130 for a member too (graceful leave first); SIGTERM a clean 0
    w.signal(signal.SIGINT)
    assert w.wait_exit(60) == 130
    pub.signal(signal.SIGTERM)
    assert pub.wait_exit(60) == 0
    assert os.path.exists(tour.default_dir / "lock")


def _save(path: Path, arr) -> Path:
    np.save(path, arr, allow_pickle=False)
    return path
