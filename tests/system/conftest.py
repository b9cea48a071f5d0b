"""Fixtures of the system tests: test hosts (network namespaces) and the swarm processes
on them, both always torn down."""

from __future__ import annotations

import pytest

from tests.system.netns import Net, unavailable
from tests.system.support import NetCluster

_WHY = unavailable()


@pytest.fixture
def net():
    if _WHY:
        pytest.skip(_WHY)
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
