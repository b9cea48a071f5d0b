"""Real `swarm` processes on test hosts (network namespaces, see :mod:`tests.system.netns`):
publish/join/status/submit run through ``ip netns exec`` inside a host; output is pumped by
threads (:class:`tests.control_support.Proc`); every wait polls with a bounded deadline."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from identity.keys import SHORT_LEN
from tests.conftest import subprocess_env, swarm_cmd
from tests.control_support import Proc, stop_all
from tests.system.netns import Host, Net, NsHost

FOLLOW = re.compile(r"following (\S+) at term (\d+)")
"""A node's log line when it starts acting on a coordinator's state."""
LEAD = re.compile(r"-> coordinator at term (\d+)")
"""A node's log line when it becomes the coordinator itself."""


POLL = 0.3
"""Seconds between two `swarm status` runs of a wait."""


class NetCluster:
    """Swarm processes on the hosts of one :class:`Net`; :meth:`close` kills what is left."""

    def __init__(self, root: Path, net: Net) -> None:
        self.root = root
        self.net = net
        self.procs: list[Proc] = []
        self.uri = ""
        self.hosts: dict[str, Host] = {}

    def start(self, name: str, host: Host, argv: list[str], env: dict[str, str] | None = None
              ) -> Proc:
        p = Proc.spawn(name, host.wrap(argv), subprocess_env(**(env or {})))
        self.procs.append(p)
        self.hosts[name] = host
        return p

    def publish(self, host: Host, name: str = "pub") -> Proc:
        p = self.start(name, host, swarm_cmd(
            "publish", "--name", "lab", "--owner-key", f"soft:{self.root / 'owner.key'}",
            "--backend", "numpy", "--host", host.addr, "-v", "--data-dir", str(self.root / name)))
        self.uri = p.wait_line(lambda s: s.startswith("magnet:?"), 90, "out")
        return p

    def join(self, name: str, host: Host, env: dict[str, str] | None = None,
             extra: tuple[str, ...] = ()) -> Proc:
        return self.start(name, host, swarm_cmd(
            "join", self.uri, "--yes", "--backend", "numpy", "--threads", "1", "--host",
            host.addr, "-v", "--data-dir", str(self.root / name), *extra), env)

    def driver(self, name: str, host: Host, *args: str, uri: str = "",
               env: dict[str, str] | None = None) -> Proc:
        """A requester process running jobs (:mod:`tests.system.driver`)."""
        return self.start(name, host, [sys.executable, "-m", "tests.system.driver",
                                       uri or self.uri,
                                       "--data-dir", str(self.root / name), *args], env)

    def status(self, host: Host, uri: str = "", timeout: float = 60) -> dict:
        res = subprocess.run(host.wrap(swarm_cmd("status", uri or self.uri, "--json",
                                                 "--data-dir",
                                                 str(self.root / "obs"))),
                             capture_output=True, text=True, timeout=timeout,
                             env=subprocess_env())
        if res.returncode != 0:
            raise AssertionError(res.stderr.strip()[-500:])
        return json.loads(res.stdout)

    def wait_status(self, host: Host, pred, timeout: float, what: str, uri: str = "") -> dict:
        """Poll ``swarm status`` from ``host`` until ``pred(status)``; bounded by ``timeout``
        in all (each run too). A run is a process in ``host``'s namespace (the in-process
        observer cannot join it), so runs are spaced by POLL, not back to back."""
        deadline = time.monotonic() + timeout
        last: object = None
        while (left := deadline - time.monotonic()) > 0:
            try:
                last = self.status(host, uri, timeout=max(left, 5))
            except AssertionError as exc:  # not reachable or items not stored yet
                last = exc
            else:
                if pred(last):
                    return last
            time.sleep(POLL)
        raise AssertionError(f"status from {host.ns} never showed {what} in {timeout} s; "
                             f"last: {last}")

    def acted_on(self) -> dict[str, dict[int, set[str]]]:
        """Per process: term -> coordinators (short ids) it followed or was, from its log."""
        seen: dict[str, dict[int, set[str]]] = {}
        for p in self.procs:
            terms: dict[int, set[str]] = defaultdict(set)
            me = next((s.split()[1][:SHORT_LEN] for s in p.err if s.startswith("peer: ")), "?")
            for line in p.err:
                if m := FOLLOW.search(line):
                    terms[int(m.group(2))].add(m.group(1))
                elif m := LEAD.search(line):
                    terms[int(m.group(1))].add(me)
            seen[p.name] = dict(terms)
        return seen

    def close(self) -> None:
        stop_all(self.procs, self.root)


def members(st: dict) -> set[str]:
    return {m["peer_id"] for m in st["members"]}


def blocked(st: dict) -> set[str]:
    return {b["peer_id"] for b in st["blocked"]}


def submit_matmul(host: NsHost, uri: str, tmp_path: Path, *extra: str,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`swarm submit URI matmul` from ``host`` (bounded); a result it wrote is checked
    against numpy's. The caller reads returncode, stdout (``--json``) and stderr."""
    import numpy as np

    rng = np.random.default_rng(3)
    a = rng.standard_normal((300, 200), dtype=np.float32)
    b = rng.standard_normal((200, 260), dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    res = subprocess.run(host.wrap(swarm_cmd(
        "submit", uri, "matmul", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
        "-o", str(tmp_path / "c.npy"), "--json", "--timeout", "150",
        "--data-dir", str(tmp_path / "req"), *extra)),
        capture_output=True, text=True, timeout=240, env=subprocess_env(**(env or {})))
    if res.returncode == 0:
        np.testing.assert_allclose(np.load(tmp_path / "c.npy"), a @ b, rtol=1e-3, atol=1e-2)
    return res
