"""Fixtures of the system tests: test hosts (network namespaces) and the swarm processes
on them, both always torn down."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.nat import NatNet
from tests.system.nat import unavailable as nat_unavailable
from tests.system.netns import Net, unavailable
from tests.system.support import NetCluster

_WHY = unavailable()
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """Every test in this folder starts processes, a browser or network namespaces."""
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.system)


@pytest.fixture
def net():
    if _WHY:
        pytest.skip(_WHY)  # a failure under CI (tests/conftest.py)
    n = Net()
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def cluster(tmp_path, net):
    c = NetCluster(tmp_path, net)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def natnet(tmp_path):
    """Public segment, NAT routers, LAN hosts, coturn (:mod:`tests.system.nat`)."""
    why = nat_unavailable()
    if why:
        pytest.skip(why)  # a failure under CI (tests/conftest.py)
    n = NatNet(tmp_path)
    try:
        yield n
    finally:
        n.close()
