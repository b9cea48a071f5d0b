"""The `swarm` command's shared behaviour: help, version, exit codes, data dir, logging."""

from __future__ import annotations

import io
import logging
import stat

import pytest

from swarm import __version__, cli
from swarm.config import data_dir, setup_logging
from swarm.errors import ConfigError
from tests.conftest import run_swarm


def test_help_lists_every_subcommand():
    res = run_swarm("--help")
    assert res.returncode == 0
    for name in cli.COMMANDS:
        assert name in res.stdout
    assert "exit codes" in res.stdout


def test_version():
    res = run_swarm("--version")
    assert res.returncode == 0
    assert res.stdout.strip() == f"swarm {__version__}"


def test_no_command_is_a_usage_error(capsys):
    assert cli.main([]) == cli.EXIT_USAGE
    assert "COMMAND" in capsys.readouterr().err


def test_unknown_option_is_a_usage_error():
    res = run_swarm("--no-such-option")
    assert res.returncode == cli.EXIT_USAGE
    assert "unrecognized arguments" in res.stderr


def test_data_dir_precedence_and_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_HOME", str(tmp_path / "env"))
    assert data_dir() == tmp_path / "env"
    explicit = data_dir(tmp_path / "flag")
    assert explicit == tmp_path / "flag"
    assert stat.S_IMODE(explicit.stat().st_mode) == 0o700


def test_data_dir_is_tightened(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    data_dir(loose)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700


def test_data_dir_that_is_a_file_is_a_config_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory|cannot create"):
        data_dir(f)


def test_logging_levels_and_journald_prefix(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setenv("JOURNAL_STREAM", "8:1234")
    setup_logging(1, stream=buf)
    logging.getLogger("swarm.test").info("hello")
    logging.getLogger("swarm.test").debug("hidden")
    assert buf.getvalue() == "<6>INFO swarm.test: hello\n"
    monkeypatch.delenv("JOURNAL_STREAM")
    buf2 = io.StringIO()
    setup_logging(-1, stream=buf2)
    logging.getLogger("swarm.test").warning("quiet")
    assert buf2.getvalue() == ""


def test_routine_third_party_warnings_need_verbose():
    buf = io.StringIO()
    setup_logging(0, stream=buf)
    logging.getLogger("kademlia.protocol").warning("no response from X, removing from router")
    assert buf.getvalue() == ""
    setup_logging(1, stream=buf)
    logging.getLogger("kademlia.protocol").warning("no response from X, removing from router")
    assert "removing from router" in buf.getvalue()
