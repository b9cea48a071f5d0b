"""Issue 12, finding 6 (unit level): bootstrap addresses from every source, in one place.

The multi-process proof (publisher SIGKILLed, newcomers still join) is
``tests/test_control_cli_attacks.py::test_newcomers_find_the_swarm_after_the_publisher_is_gone``.
"""

from __future__ import annotations

import argparse

import pytest

from swarm.cli import build_parser
from swarm.commands._network import ENV, add_network_options, bootstrap_addresses
from swarm.errors import ConfigError
from swarm.members import MAX_SEEN_PEERS, load_seen_peers, save_seen_peers
from swarm.uri import MAX_PEERS, JoinURI, parse

NETWORKED = [["publish", "--name", "x"], ["join", "U"], ["status", "U"], ["kick", "U", "P"],
             ["block", "U", "P"], ["unblock", "U", "P"], ["owner", "show", "U"],
             ["submit", "U", "matmul", "a", "b", "-o", "c"], ["dht", "serve"]]


@pytest.mark.parametrize("argv", NETWORKED, ids=lambda a: " ".join(a[:2]))
def test_every_networked_command_takes_bootstrap(argv, monkeypatch):
    monkeypatch.setenv(ENV, "10.0.0.2:7000, [::1]:7001")
    args = build_parser().parse_args([*argv, "--bootstrap", "h.example:6000",
                                      "--bootstrap", "10.0.0.2:7000"])
    assert bootstrap_addresses(args) == [("h.example", 6000), ("10.0.0.2", 7000),
                                         ("::1", 7001)]


def test_a_bad_bootstrap_address_names_where_it_came_from(monkeypatch):
    p = add_network_options(argparse.ArgumentParser())
    with pytest.raises(ConfigError, match="--bootstrap 'nowhere'"):
        bootstrap_addresses(p.parse_args(["--bootstrap", "nowhere"]))
    monkeypatch.setenv(ENV, "ok:1,bad:port")
    with pytest.raises(ConfigError, match=f"{ENV} 'bad:port'"):
        bootstrap_addresses(p.parse_args([]))


def test_uris_carry_several_peers_and_bootstrap_ones_go_first():
    j = JoinURI(b"\x01" * 32, "lab", peers=(("10.0.0.1", 1), ("10.0.0.2", 2)), owner=b"o" * 16)
    again = parse(str(j.with_peers([("10.0.0.3", 3), ("10.0.0.1", 1)])))
    assert again.peers == (("10.0.0.3", 3), ("10.0.0.1", 1), ("10.0.0.2", 2))
    many = j.with_peers([(f"10.1.0.{i}", 1000 + i) for i in range(40)])
    assert len(many.peers) == MAX_PEERS


def test_members_keep_the_peers_they_saw(tmp_path):
    sid = bytes(20)
    assert load_seen_peers(tmp_path, sid) == []
    addrs = [("10.0.0.1", 1), ("::1", 2)] + [("10.2.0.1", 100 + i) for i in range(50)]
    save_seen_peers(tmp_path, sid, addrs)
    kept = load_seen_peers(tmp_path, sid)
    assert kept[:2] == [("10.0.0.1", 1), ("::1", 2)] and len(kept) == MAX_SEEN_PEERS
    (tmp_path / f"peers-{sid.hex()}.json").write_text('[["bad host", 1], 7, ["h", 2]]')
    assert load_seen_peers(tmp_path, sid) == [("h", 2)]
