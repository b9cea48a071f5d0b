"""The `swarm` command's shared behaviour: help, version, exit codes, data dir, logging."""

from __future__ import annotations

import io
import json
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


@pytest.mark.parametrize("words", [
    ["status", "URI"],
    ["owner", "show", "URI"],
    ["dht", "serve"],
    ["bench", "--quick"],
    ["doctor"],
])
def test_global_options_before_and_after_the_subcommand(words):
    parser = cli.build_parser()
    before = parser.parse_args(["-v", "--data-dir", "D1", *words])
    after = parser.parse_args([*words, "-v", "--data-dir", "D1"])
    both = parser.parse_args(["-q", "--data-dir", "D0", *words, "-vv", "--data-dir", "D1"])
    plain = parser.parse_args(words)
    from swarm.commands._common import verbosity

    assert before.data_dir == after.data_dir == both.data_dir == "D1"  # the later one wins
    assert verbosity(before) == verbosity(after) == verbosity(both) == 1
    assert plain.data_dir is None and verbosity(plain) == 0


def test_global_options_before_and_after_in_a_real_run(tmp_path):
    for args in (["-q", "--data-dir", str(tmp_path / "a"), "doctor", "--no-bench", "--json"],
                 ["doctor", "--no-bench", "--json", "-q", "--data-dir", str(tmp_path / "b")]):
        res = run_swarm(*args)
        assert res.returncode == 0, res.stderr
        found = {f["check"]: f for f in json.loads(res.stdout)["findings"]}
        assert args[args.index("--data-dir") + 1] in found["data dir"]["detail"]


def test_a_missing_command_module_is_listed_and_fails_clearly(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "nosuch"))
    assert "nosuch" in cli.build_parser().format_help()
    assert cli.main(["nosuch", "anything"]) == cli.EXIT_UNAVAILABLE
    assert "lacks the module swarm.commands.nosuch" in capsys.readouterr().err


def test_packaging_metadata():
    """A distribution name free on PyPI (`swarm` is taken), an SPDX license with its file,
    py.typed in every package, and upper bounds on the libraries whose internals we use."""
    import tomllib

    from tests.conftest import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    meta = project["project"]
    assert meta["name"] == "swarm-compute" and meta["scripts"] == {"swarm": "swarm.cli:main"}
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    package_data = project["tool"]["setuptools"]["package-data"]
    for package in ("swarm", "dht", "identity", "compute"):
        assert (ROOT / package / "py.typed").exists() and "py.typed" in package_data[package]
    deps = {d.split(">")[0].split("<")[0].split("=")[0].strip(): d for d in meta["dependencies"]}
    for lib in ("kademlia", "rpcudp", "aiortc", "aioice", "wgpu"):
        assert "<" in deps[lib], f"{lib} internals are used: pin it below the next minor"


def test_the_parser_imports_nothing_heavy():
    """`swarm --help` and parsing any command line stay fast: no aiortc, aioice, wgpu, numpy,
    fido2 or rich until a command runs."""
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    probe = ("import sys; from swarm import cli; cli.build_parser().parse_args(['dht', 'serve']);"
             "print(','.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=subprocess_env(), timeout=60, check=True).stdout
    loaded = set(out.strip().split(","))
    assert not loaded & {"aiortc", "aioice", "av", "wgpu", "numpy", "fido2", "rich"}, loaded


def test_tables_print_peer_text_as_is(capsys):
    """Table cells come from peers (block reasons, names): rich markup in them is printed
    literally, never interpreted (a stray "[/x]" used to be a MarkupError)."""
    from swarm.commands._common import print_table

    print_table(("peer", "reason"), [("p1", "[/bold] [red]x[/red] :smile:"), ("p2", None)],
                title="[b]blocked")
    out = capsys.readouterr().out
    assert "[/bold] [red]x[/red] :smile:" in out and "[b]blocked" in out and "-" in out


def test_log_lines_stay_short_below_debug():
    """Issue 35 finding 6: a successful demo printed ~600-character WARNING lines."""
    import io
    import logging

    from swarm.config import MAX_LINE

    for verbosity, cut in ((0, True), (2, False)):
        out = io.StringIO()
        setup_logging(verbosity, stream=out)
        logging.getLogger("swarm.test").warning("x" * 700)
        line = out.getvalue().rstrip("\n")
        assert (len(line) <= MAX_LINE) is cut and "x" * 100 in line
    setup_logging(0)
