"""`source_address`: observers and requesters bind where their bootstrap peer is reachable
(the cross-host case is tests/system/test_hosts.py: without it `swarm status` and `swarm
submit` from another host got no answer)."""

from __future__ import annotations

from swarm.netaddr import source_address


def test_loopback_peer_gives_loopback():
    assert source_address([("127.0.0.1", 9)]) == "127.0.0.1"


def test_no_peers_or_no_route_gives_the_default():
    assert source_address([]) == "127.0.0.1"
    assert source_address([("::1", 9)], default="x") == "x"


def test_first_routable_peer_wins():
    assert source_address([("::1", 9), ("127.0.0.2", 9)]).startswith("127.")
