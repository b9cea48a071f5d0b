"""ICE servers from SWARM_ICE_SERVERS and --ice-server: parsed in the WebRTC convention,
bad input refused with a clear error, credentials never shown."""

from __future__ import annotations

import json

import pytest

from swarm.cli import build_parser
from swarm.errors import ConfigError
from swarm.links.ice import ENV, describe, ice_servers, parse_env, parse_flag
from tests.conftest import run_swarm, subprocess_env

NETWORKED = ["publish", "join", "submit", "status", "kick", "block", "unblock"]


def test_env_and_flags_in_the_webrtc_convention():
    env = {ENV: json.dumps([{"urls": ["turn:10.0.0.1:3478"], "username": "u",
                             "credential": "pw"}, {"urls": "stun:10.0.0.1:3478"}])}
    servers = ice_servers(["turn:alice:s3cret@10.0.0.2:3478", "stun:h:19302"], env)
    assert [(s.urls, s.username, s.credential) for s in servers] == [
        (["turn:10.0.0.1:3478"], "u", "pw"), (["stun:10.0.0.1:3478"], None, None),
        (["turn:10.0.0.2:3478"], "alice", "s3cret"), (["stun:h:19302"], None, None)]
    shown = describe(servers)
    assert "pw" not in shown and "s3cret" not in shown and "alice" not in shown
    assert shown.count("turn:") == 2
    assert ice_servers([], {}) == []


@pytest.mark.parametrize("text, says", [
    ("{", "not JSON"), ('{"urls": "stun:h"}', "JSON list"),
    ('[{"urls": "http://h"}]', "not a stun:"), ('[{"urls": []}]', "urls must be"),
    ('[{"urls": "turn:h:1"}]', "needs username and credential"),
    ('[{"urls": "stun:h", "password": "x"}]', "unknown ICE server field"),
    ('[{"urls": "stun:h", "username": 5}]', "username must be a string"),
    ('[' + ",".join(['{"urls": "stun:h"}'] * 17) + ']', "at most 16"),
])
def test_bad_env_is_refused_clearly(text, says):
    with pytest.raises(ConfigError, match=says):
        parse_env(text)


@pytest.mark.parametrize("text, says", [
    ("turn:h:1", "needs credentials"), ("turn:bob@h:1", "USER:CREDENTIAL@"),
    ("stun:u:p@h:1", "only TURN URLs"), ("ftp://h", "not a stun:"), ("", "non-empty")])
def test_bad_flag_is_refused_clearly(text, says):
    with pytest.raises(ConfigError, match=says):
        parse_flag(text)


@pytest.mark.parametrize("command", NETWORKED)
def test_every_networked_command_takes_ice_servers(command):
    p = build_parser()
    extra = {"publish": ["--name", "x"], "kick": ["p"], "block": ["p"], "unblock": ["p"],
             "submit": ["matmul", "a", "b", "-o", "c"]}.get(command, [])
    uri = [] if command == "publish" else ["magnet:?xs=x"]
    args = p.parse_args([command, *uri, *extra, "--ice-server", "stun:h:1",
                         "--ice-server", "turn:u:p@h:2"])
    assert args.ice_server == ["stun:h:1", "turn:u:p@h:2"]
    owner = p.parse_args(["owner", "show", "magnet:?xs=x", "--ice-server", "stun:h:1"])
    assert owner.ice_server == ["stun:h:1"]


def test_cli_refuses_bad_servers_before_any_io_without_leaking_credentials():
    res = run_swarm("status", "magnet:?xs=bad", "--ice-server", "turn:bob:hunter2@h:1",
                    env=subprocess_env(**{ENV: '[{"urls": "turn:h:1", "username": "u", '
                                                '"credential": "topsecret", "x": 1}]'}))
    assert res.returncode == 2
    assert "unknown ICE server field" in res.stderr
    assert "topsecret" not in res.stderr + res.stdout
    assert "hunter2" not in res.stderr + res.stdout
