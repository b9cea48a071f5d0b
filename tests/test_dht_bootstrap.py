"""``dht.bootstrap.expand``: the shared ``--bootstrap`` parser (never contacts anything)."""

from __future__ import annotations

import pytest

from dht.bootstrap import MAINLINE_ROUTERS, expand


def test_mainline_expands_to_the_public_routers():
    assert expand(["mainline"]) == list(MAINLINE_ROUTERS)
    assert ("router.bittorrent.com", 6881) in MAINLINE_ROUTERS
    assert ("dht.transmissionbt.com", 6881) in MAINLINE_ROUTERS
    assert ("router.utorrent.com", 6881) in MAINLINE_ROUTERS


def test_host_port_pairs_in_order_without_repeats():
    assert expand(["127.0.0.1:6881", "[::1]:7000", "example.org:1", "127.0.0.1:6881"]) == [
        ("127.0.0.1", 6881), ("::1", 7000), ("example.org", 1)]
    assert expand([]) == []


@pytest.mark.parametrize("bad", ["", "host", "host:", ":80", "h:0", "h:65536", "h:x",
                                 "::1:80", "a b:1", "mainlinex"])
def test_bad_values_raise_a_clear_value_error(bad):
    with pytest.raises(ValueError, match="bootstrap"):
        expand([bad])


def test_a_bare_string_is_refused():
    with pytest.raises(ValueError):
        expand("mainline")
