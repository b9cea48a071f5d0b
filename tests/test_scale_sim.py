"""The control plane simulated at tens of members (issue 19 b): real Controllers, real
signatures, a simulated clock, network and DHT (:mod:`swarm.control.sim`). Seeded, no
sockets, no sleeps; each case runs in well under a second of wall time."""

from __future__ import annotations

import logging

import pytest

from swarm.control.machine import Duty
from swarm.control.sim import PollingAdapter, Sim, SyncAdapter, scenario

K = 8
"""DHT replication in these small swarms (below the real 20, so that a swarm of 20 is
already larger than one replica set, as 100-1,000 members are with k = 20)."""


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.ERROR, logger="swarm")


def settled(members: int, adapter, seed: int = 3) -> Sim:
    sim = Sim(members, seed=seed, adapter=adapter, k=K)
    sim.start()
    assert sim.converge(30.0) is not None, "no coordinator that every member follows"
    sim.loop.run_until(sim.loop.now + 3.0)
    return sim


@pytest.mark.parametrize("adapter", [PollingAdapter, SyncAdapter])
def test_cold_start_elects_one_coordinator_followed_by_all(adapter):
    sim = settled(30, adapter)
    coord = sim.coordinator()
    assert coord is not None
    assert [m for m in sim.members if m.controller.role is Duty.COORDINATOR] == [coord]
    assert {m.controller.coordinator for m in sim.live()} == {coord.peer_id}
    assert {m.controller.term for m in sim.live()} == {coord.controller.term}


def test_same_seed_same_run():
    a, b = (scenario(20, seed=5, window=2.0, adapter=SyncAdapter, k=K) for _ in range(2))
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_block_and_charter_reach_every_member_and_failover_elects_again():
    out = scenario(40, seed=3, window=2.0, adapter=SyncAdapter, k=K)
    assert out["block_s"] is not None and out["block_s"] < 10.0
    assert out["charter_s"] is not None and out["charter_s"] < 15.0
    assert out["failover_s"] is not None and out["failover_s"] < 10.0


def member_bytes(members: int, adapter) -> float:
    """Median control bytes per member per second (the coordinator apart), steady state."""
    sim = settled(members, adapter)
    return sim.measure(10.0)["total"]["bytes_median"]


def test_member_traffic_flat_from_20_to_50_members():
    """The shipped adapter (the sync core): a member's control traffic does not grow with the
    swarm (it grew 1.8x from 20 to 50 members while every member polled the topic)."""
    small, large = member_bytes(20, SyncAdapter), member_bytes(50, SyncAdapter)
    assert large <= 1.3 * small, f"{small:.0f} -> {large:.0f} bytes/s per member"


def test_the_traffic_check_tells_polling_apart():
    """The same figure for the polling policy grows with the swarm: the check above can
    fail."""
    small, large = member_bytes(20, PollingAdapter), member_bytes(50, PollingAdapter)
    assert large > 1.5 * small, f"{small:.0f} -> {large:.0f} bytes/s per member"
