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
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import DEAD, swarm_cmd
from tests.control_support import Observer, Proc, stop_all

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
        self.observer: Observer | None = None

    @property
    def default_dir(self) -> Path:
        return self.home / ".local" / "share" / "swarm"

    def start(self, name: str, *args: str) -> Proc:
        p = Proc.spawn(name, swarm_cmd(*args), self.env, cwd=self.home)
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

    def join(self, name: str, *extra: str) -> Proc:
        return self.start(name, "join", self.uri, "--yes", "--backend", "numpy",
                          "--threads", "1", *extra)

    def status(self, pred=lambda s: True, timeout: float = 60) -> dict:
        """``swarm status --json`` once ``pred`` holds (bounded): waited for with one
        in-process observer (a `swarm status` process per poll cost a second of CPU and up
        to a poll's length past the moment), then shown by the CLI, until it shows it too."""
        deadline = time.monotonic() + timeout
        if self.observer is None:
            self.observer = Observer(self.uri)
        self.observer.wait(pred, timeout, "what the test waits for")
        last: object = None
        while time.monotonic() < deadline:
            res = self.run("status", self.uri, "--json")
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
        if self.observer is not None:
            self.observer.close()
        stop_all(self.procs, root)
        for p in self.procs:
            assert_clean("\n".join(p.out + p.err))


def data_dir_of(p: Proc) -> Path:
    line = p.wait_line(lambda s: s.startswith("data dir: "), 60).removeprefix("data dir: ")
    return Path(line.split(" (")[0])


@pytest.fixture
def tour(tmp_path):
    t = Tour(tmp_path / "home")
    t.home.mkdir()
    yield t
    t.close(tmp_path)


@pytest.mark.slow
def test_two_members_on_one_machine_with_the_default_dir(tour):
    """Finding 1: a join beside the publisher, same user, default options, just works: its
    own dir and identity, and both say which dir they use; the dir stays locked."""
    pub = tour.publish()
    assert data_dir_of(pub) == tour.default_dir
    w = tour.join("w1")
    assert data_dir_of(w) == tour.default_dir.with_name("swarm-2")
    assert w.wait_line(lambda s: s.startswith("data dir: "), 5).endswith(
        f"({tour.default_dir} is in use by another swarm process)")
    assert w.peer != pub.peer
    # both listed and one of them coordinating (a status run the moment w1 is listed may
    # precede the coordinator's refresh of its item onto w1's node: core.SPREAD_BELOW)
    st = tour.status(lambda s: {m["peer_id"] for m in s["members"]} == {pub.peer, w.peer}
                     and s["coordinator"] is not None)
    assert st["coordinator"] in {pub.peer, w.peer}
    # a role change is news, not a warning: nothing to act on at the default verbosity
    assert not [line for p in (pub, w) for line in p.err if "-> coordinator" in line]
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


def _short(peer: str) -> str:
    return peer[:12]  # what `swarm status` and the web panel show


@pytest.mark.slow
def test_the_readme_tour(tour, tmp_path):
    """The README's tour with default data dirs, as a newcomer runs it: every exit code,
    no traceback, and the swarm outliving its publisher for status and submit."""
    home = tour.home
    pub = tour.publish()
    # w2 is kicked and blocked below: it never coordinates (blocking the coordinator itself
    # is another story), so w1 or the publisher does
    w1, w2 = tour.join("w1"), tour.join("w2", "--no-coordinate")
    everyone = {pub.peer, w1.peer, w2.peer}
    tour.status(lambda s: {m["peer_id"] for m in s["members"]} == everyone
                and s["coordinator"] in everyone, 90)

    # status as a table, its ids the 12-character ones; into a closed pipe (`| head`) it
    # stops quietly
    res = tour.run("status", tour.uri)
    assert_clean(res, code=0)
    assert _short(w1.peer) in res.stdout
    r, w = os.pipe()  # a reader that is gone before the first line: quietly 1
    os.close(r)
    closed = subprocess.run(swarm_cmd("status", tour.uri), stdout=w, stderr=subprocess.PIPE,
                            text=True, env=tour.env, cwd=home, timeout=60)
    os.close(w)
    assert closed.returncode == 1 and closed.stderr == "", closed.stderr

    # submit, and the product is right; "waiting for workers: n/N" while it waits
    rng = np.random.default_rng(35)
    a = _save(home / "a.npy", rng.standard_normal((96, 64), dtype=np.float32))
    b = _save(home / "b.npy", rng.standard_normal((64, 80), dtype=np.float32))
    res = tour.run("submit", tour.uri, "matmul", str(a), str(b), "-o", str(home / "c.npy"),
                   "--min-workers", "2", timeout=120)
    assert_clean(res, code=0)
    np.testing.assert_allclose(np.load(home / "c.npy"), np.load(a) @ np.load(b),
                               rtol=1e-4, atol=1e-3)
    # more workers asked for than there are: it says how many it has while it waits
    res = tour.run("submit", tour.uri, "matmul", str(a), str(b), "-o", str(home / "c.npy"),
                   "--min-workers", "4", "--timeout", "3")
    assert_clean(res, code=1)
    assert re.search(r"^waiting for workers: [0-3]/4$", res.stderr, re.M), res.stderr
    assert "of the 4 workers asked for" in res.stderr

    owner = f"soft:{home / 'owner.key'}"
    # the wrong owner key: exit 3, "not authorised", no CTAP jargon
    from identity import open_authenticator

    open_authenticator(f"soft:{home / 'other.key'}").close()
    res = tour.run("kick", tour.uri, _short(w2.peer), "--owner-key", f"soft:{home / 'other.key'}")
    assert_clean(res, code=3)
    assert "not authorised" in res.stderr and "CTAP" not in res.stderr
    assert "NO_CREDENTIALS" not in res.stderr and "INELIGIBLE" not in res.stderr
    res = tour.run("owner", "add-admin", tour.uri, _short(w1.peer), "--owner-key",
                   f"soft:{home / 'other.key'}")
    assert_clean(res, code=3)
    assert "not authorised" in res.stderr and "NO_CREDENTIALS" not in res.stderr
    # an ambiguous prefix is refused, listing the matches
    res = tour.run("block", tour.uri, "p", "--owner-key", owner)
    assert_clean(res, code=2)
    assert "ambiguous" in res.stderr and _short(w1.peer) in res.stderr

    # kick by short id: w2 leaves with 3 and may rejoin (the same free dir, swarm-3, so
    # the same identity); block it by short id (3 again), unblock it by short id
    res = tour.run("kick", tour.uri, _short(w2.peer), "--owner-key", owner)
    assert_clean(res, code=0)
    assert w2.wait_exit(60) == 3
    w2b = tour.join("w2b", "--no-coordinate")
    assert w2b.peer == w2.peer
    tour.status(lambda s: w2.peer in {m["peer_id"] for m in s["members"]}, 60)
    res = tour.run("block", tour.uri, _short(w2.peer), "--owner-key", owner, "--reason", "x")
    assert_clean(res, code=0)
    assert w2b.wait_exit(60) == 3
    res = tour.run("unblock", tour.uri, _short(w2.peer), "--owner-key", owner)
    assert_clean(res, code=0)
    assert f"unblocked {_short(w2.peer)}" in res.stdout

    # the publisher leaves (SIGTERM: 0); status and submit with the original URI still work
    pub.signal(signal.SIGTERM)
    assert pub.wait_exit(60) == 0
    st = tour.status(lambda s: s["coordinator"] == w1.peer, 90)
    assert w1.peer in {m["peer_id"] for m in st["members"]}
    res = tour.run("submit", tour.uri, "matmul", str(a), str(b), "-o", str(home / "c2.npy"),
                   timeout=120)
    assert_clean(res, code=0)
    np.testing.assert_allclose(np.load(home / "c2.npy"), np.load(a) @ np.load(b),
                               rtol=1e-4, atol=1e-3)
    # bad input through a real process: one line, exit 2
    bad = _save(home / "nan.npy", np.full((96, 64), np.nan, np.float32))
    res = tour.run("submit", tour.uri, "matmul", str(bad), str(b), "-o", str(home / "x.npy"))
    assert_clean(res, code=2)
    res = tour.run("status", "garbage")
    assert_clean(res, code=2)
    w1.signal(signal.SIGTERM)
    assert w1.wait_exit(60) == 0


def test_nothing_answering_says_what_to_do(tour):
    """Finding 2: when no peer answers, the error names --bootstrap and join_uri."""
    dead = f"magnet:?xs=urn:btpk:{'ab' * 32}&x.op={'cd' * 16}&x.pe={DEAD}"
    for cmd in (["status", dead], ["kick", dead, "p" + "a" * 11, "--owner-key", "fido2"]):
        res = tour.run(*cmd)
        assert_clean(res, code=1)
        assert "--bootstrap" in res.stderr and "join_uri" in res.stderr, res.stderr


def test_make_demo_installs_only_the_runtime(tmp_path):
    """Finding 9: a first `make demo` installed the test extras (playwright, libtorrent,
    hypothesis, ruff) that the demo never uses."""
    root = Path(__file__).resolve().parent.parent
    res = subprocess.run(["make", "-n", "-B", "-C", str(root), "demo",
                          f"VENV={tmp_path / 'venv'}"], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    installs = [line for line in res.stdout.splitlines() if "pip install" in line]
    assert installs and all("[test" not in line for line in installs), res.stdout
    res = subprocess.run(["make", "-n", "-B", "-C", str(root), "test",
                          f"VENV={tmp_path / 'venv'}"], capture_output=True, text=True,
                         timeout=30)
    assert "'.[test]'" in res.stdout, res.stdout  # `make test` still brings them


def test_the_readme_quotes_the_current_headline_figures():
    """Finding 9: the README's headline figures disagreed with docs/benchmarks.md (tuned
    WebRTC 210-250 vs 160 MB/s, tiled/naive ~7x vs 5.2x ...). The README's list is the
    benchmarks' "Headline ratios" list, line for line: after `make bench` copy it over."""
    root = Path(__file__).resolve().parent.parent
    bench = (root / "docs" / "benchmarks.md").read_text()
    theirs = bench.split("## Headline ratios\n", 1)[1].strip().split("\n\n", 1)[0]
    readme = (root / "README.md").read_text()
    ours = readme.split("<!-- headline: from docs/benchmarks.md -->\n", 1)[1]
    ours = ours.split("<!-- /headline -->", 1)[0].strip()
    assert ours == theirs, "README.md's headline list differs from docs/benchmarks.md's"
