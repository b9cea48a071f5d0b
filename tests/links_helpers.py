"""Helpers for link tests: a child echo peer process with bounded waits and cleanup."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys

from identity.keys import PeerKey
from tests.conftest import subprocess_env


@contextlib.contextmanager
def echo_peer(kind: str, *extra: str, timeout: float = 20.0, prefix: tuple[str, ...] = ()):
    """Start ``python -m swarm.links.echo KIND``; yield (key, port, process); kill after.

    ``prefix`` runs it through another command (``ip netns exec NS``)."""
    key = PeerKey.generate()
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "swarm.links.echo", kind, "--seed", key.seed().hex(),
         *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=subprocess_env())
    try:
        line = _readline(proc, timeout)
        info = json.loads(line)
        assert info["peer"] == str(key.peer_id)
        yield key, info["port"], proc
    finally:
        if proc.stdin:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """The child's first stdout line, or a failure carrying its stderr."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        proc.kill()
        raise AssertionError(f"echo peer said nothing in {timeout} s: {proc.stderr.read()!r}")
    line = proc.stdout.readline().decode()
    if not line:
        proc.wait(5)
        raise AssertionError(f"echo peer exited: {proc.stderr.read().decode()[-2000:]}")
    return line


def memfds() -> int:
    """Our own open shared-memory descriptors (after dropping unreachable arrays)."""
    gc.collect()
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:swarm-shm")
        except OSError:
            pass
    return n


def mapping_at(address: int) -> str:
    """What /proc/self/maps names at ``address`` ("" for anonymous or nothing mapped)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else ""
    return ""
