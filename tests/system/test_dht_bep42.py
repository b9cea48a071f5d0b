"""Issue 14, point 2: our node id follows BEP 42 from the address others see us at, so a
libtorrent node that enforces BEP 42 (``dht_enforce_node_id``) keeps a swarm node in its
routing table and routes its lookups through it.

BEP 42 exempts private and loopback addresses, so the test needs public-looking ones: one
network namespace whose loopback carries 203.0.113.x (TEST-NET-3) addresses, which exist
only inside it; :mod:`tests.system.bep42_probe` runs there.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import subprocess_env
from tests.libtorrent_support import lt  # noqa: F401 - skip (or fail in CI) without it
from tests.system.netns import unavailable

pytestmark = pytest.mark.timeout(180)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@pytest.fixture
def public_ns():
    why = unavailable()
    if why:
        pytest.skip(why)
    ns = f"sw{os.getpid()}bep42"
    _ip("netns", "add", ns)
    try:
        _ip("-n", ns, "link", "set", "lo", "up")
        for last in (1, 2, 3, 4, 5, 6, 10, 20):
            _ip("-n", ns, "addr", "add", f"203.0.113.{last}/32", "dev", "lo")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def test_an_enforcing_libtorrent_node_keeps_our_node(public_ns):
    import sys

    res = subprocess.run(["ip", "netns", "exec", public_ns, sys.executable, "-m",
                          "tests.system.bep42_probe"], capture_output=True, text=True,
                         timeout=150, env=subprocess_env())
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["external"] == "203.0.113.10", out
    assert out["bound"] and out["before"] != out["after"], out
    # it keeps asking us in its lookups (with a node id not bound to our address it asks
    # once, while bootstrapping, and then drops us)
    assert out["asked"].get("get", 0) >= 3, out
