"""Multi-process swarms on loopback for the control-plane tests: real `swarm publish` and
`swarm join` processes, their output collected by threads, waits bounded by deadlines."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from dht.errors import DHTError
from swarm.control import observer
from swarm.errors import SwarmError
from swarm.uri import JoinURI, parse
from tests.conftest import subprocess_env, swarm_cmd


@dataclass
class Proc:
    """One swarm process and everything it printed."""

    name: str
    popen: subprocess.Popen
    started: float
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    threads: list[threading.Thread] = field(default_factory=list)

    def _pump(self, stream, sink: list[str]) -> None:
        for line in stream:
            with self.cond:
                sink.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pred, timeout: float, stream: str = "err") -> str:
        sink = self.err if stream == "err" else self.out
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in sink:
                    if pred(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and not self._alive_pumps()):
                    raise AssertionError(f"{self.name}: no matching line in {timeout} s; "
                                         f"rc={self.popen.poll()}; stderr tail:\n"
                                         + "\n".join(self.err[-25:]))
                self.cond.wait(min(left, 0.2))

    def _alive_pumps(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    @property
    def peer(self) -> str:
        return self.wait_line(lambda s: s.startswith("peer: "), 60).split()[1]

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name}: still running after {timeout} s; stderr tail:\n"
                                 + "\n".join(self.err[-40:])) from None

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    @classmethod
    def spawn(cls, name: str, argv: list[str], env: dict[str, str],
              cwd: Path | None = None) -> Proc:
        """Start ``argv`` with both output streams pumped into ``out`` and ``err``."""
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, text=True, env=env, cwd=cwd)
        p = cls(name, popen, time.monotonic())
        p.threads = [threading.Thread(target=p._pump, args=(popen.stdout, p.out), daemon=True),
                     threading.Thread(target=p._pump, args=(popen.stderr, p.err), daemon=True)]
        for t in p.threads:
            t.start()
        return p


def stop_all(procs: list[Proc], root: Path) -> None:
    """Kill what still runs, reap everything, and keep each process's output in ``root``
    (pytest's tmp dir) for post-mortems."""
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
    for p in procs:
        try:
            p.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (p.popen.stdout, p.popen.stderr):
            if stream:
                stream.close()
        (root / f"{p.name}-{p.popen.pid}.log").write_text(
            "\n".join(p.out + ["--- stderr ---"] + p.err))


class Cluster:
    """Processes started by one test; :meth:`close` kills whatever is left."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = env or {}
        self.procs: list[Proc] = []
        self.uri: str = ""
        self.observers: list[Observer] = []

    def observer(self) -> Observer:
        """A fresh observer bootstrapped through the URI (closed with the cluster)."""
        obs = Observer(self.uri)
        self.observers.append(obs)
        return obs

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> Proc:
        p = Proc.spawn(name, swarm_cmd(*args, "--data-dir", str(self.root / name)),
                       subprocess_env(**self.env, **(env or {})))
        self.procs.append(p)
        return p

    def publish(self, name: str = "pub", port: int = 0) -> Proc:
        p = self.start(name, "publish", "--name", "lab", "--owner-key",
                       f"soft:{self.root / 'owner.key'}", "--backend", "numpy",
                       "--port", str(port), "-v")
        self.uri = p.wait_line(lambda s: s.startswith("magnet:?"), 90, "out")
        return p

    def join(self, name: str, uri: str | None = None, env: dict[str, str] | None = None
             ) -> Proc:
        return self.start(name, "join", uri or self.uri, "--yes", "--backend", "numpy",
                          "--threads", "1", "-vv", env=env)

    def close(self) -> None:
        for obs in self.observers:
            try:
                obs.close()
            except Exception:  # noqa: S110 - best effort at teardown
                pass
        stop_all(self.procs, self.root)


class Observer:
    """One long-lived observer DHT node on its own loop thread (short-lived ones would
    leave dead contacts behind in every routing table, slowing lookups)."""

    def __init__(self, uri: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.join = parse(uri)
        self._cm = observer.dht_observer(self.join)
        self.node = self._run(self._cm.__aenter__(), 30)

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def status(self) -> dict:
        return self._run(observer.observe(self.node, self.join), 30).to_json()

    def wait(self, pred, timeout: float, what: str) -> dict:
        """Poll status until ``pred(status)``; bounded."""
        deadline = time.monotonic() + timeout
        last: dict | Exception = {}
        while time.monotonic() < deadline:
            try:
                last = self.status()
            except (SwarmError, DHTError, TimeoutError) as exc:  # no charter in the DHT yet,
                last = exc                                   # a lookup that found nobody
            else:
                if pred(last):  # a predicate's own error is a test bug: it is raised
                    return last
            time.sleep(0.2)
        raise AssertionError(f"status never showed {what} in {timeout} s; last: {last}")

    def send(self, signed, sender, wait: float = 4.0):
        async def go():
            view = await observer.observe(self.node, self.join)
            return await observer.send_command(self.node, self.join, view, signed, sender,
                                               wait=wait)

        return self._run(go(), wait + 30)

    def close(self) -> None:
        try:
            self._run(self._cm.__aexit__(None, None, None), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


def uri_via(uri: str, st: dict, peer: str) -> str:
    """The same URI, bootstrapping through ``peer``'s DHT node instead."""
    j = parse(uri)
    dht = next(m["dht"] for m in st["members"] if m["peer_id"] == peer)
    return str(JoinURI(j.pubkey, j.name, j.salt, ((dht[0], dht[1]),), j.owner))


SIGKILL = signal.SIGKILL
SIGTERM = signal.SIGTERM


class FakeNode(SimpleNamespace):
    """The node a ControlPlane runs on (``control.plane.ControlledNode``), for plane tests
    without sockets."""

    host = None

    def follow(self, term, coordinator) -> None:
        self.following = (term, coordinator)

    def attach_control(self, plane) -> None:
        self.accept_peer = plane.accept_peer
        self.liar_cb = plane.lying_peer

    def on_control(self, message_type, handler) -> None:
        self.control = {**getattr(self, "control", {}), message_type: handler}
