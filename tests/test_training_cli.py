"""`swarm train URI --data ... -o MODEL.safetensors`: bad data refused before anything is
sent (exit 2, the field named), and a real run on a local swarm (worker processes) with its
--json report, its weights and a resumed run."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest
from safetensors.numpy import load_file

import swarm
from swarm.cli import EXIT_USAGE, main
from tests.conftest import run_swarm, subprocess_env, swarm_cmd

DEAD = "127.0.0.1:9"
URI = f"magnet:?xs=urn:btpk:{'ab' * 32}&x.op={'cd' * 16}&x.pe={DEAD}"
"""A closed port: a command that went on the network would fail with exit 1, not 2."""


def blobs(n: int = 300, features: int = 12, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, features)).astype(np.float32)
    y = rng.integers(0, classes, n)
    return centres[y] + 0.3 * rng.standard_normal((n, features)).astype(np.float32), y


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SWARM_HOME", str(tmp_path / "data"))


def _usage(tmp_path, *args: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(["train", URI, "-o", str(tmp_path / "m.safetensors"), *args])
        except SystemExit as exc:
            rc = exc.code
    assert rc == EXIT_USAGE, err.getvalue()[-2000:]
    assert "Traceback" not in err.getvalue()
    return err.getvalue()


def test_bad_data_and_arguments_name_the_field_before_anything_is_sent(tmp_path):
    x, y = blobs()
    cases = {"no_y.npz": dict(x=x), "no_x.npz": dict(y=y), "short.npz": dict(x=x, y=y[:-1])}
    nan = x.copy()
    nan[7, 3] = np.nan
    cases["nan.npz"] = dict(x=nan, y=y)
    cases["labels.npz"] = dict(x=x, y=y + 5)
    for name, arrays in cases.items():
        np.savez(tmp_path / name, **arrays)
    model = ["--model", "mlp:12-8-3"]
    said = {name: _usage(tmp_path, "--data", str(tmp_path / name), *model) for name in cases}
    assert "'y'" in said["no_y.npz"] and "'x'" in said["no_x.npz"]
    assert "300 samples but y has 299" in said["short.npz"]
    assert "NaN" in said["nan.npz"] and "sample 7" in said["nan.npz"]
    assert "labels up to 7" in said["labels.npz"]
    np.savez(tmp_path / "ok.npz", x=x, y=y)
    ok = ["--data", str(tmp_path / "ok.npz")]
    assert "--lr" in _usage(tmp_path, *ok, *model, "--lr", "0")
    assert "--lr" in _usage(tmp_path, *ok, *model, "--lr", "-0.1")
    assert "does not parse" in _usage(tmp_path, *ok, "--model", "mlp:12-x-3")
    assert "--http" in _usage(tmp_path, *ok, *model, "--http", "nowhere")
    assert "features" in _usage(tmp_path, *ok, "--model", "mlp:13-8-3")
    assert "--resume" in _usage(tmp_path, *ok, *model, "--resume", str(tmp_path / "ok.npz"))
    assert not (tmp_path / "m.safetensors").exists()  # nothing half-written


@pytest.mark.system
def test_a_run_on_a_local_swarm_writes_its_weights_and_report_and_resumes(tmp_path):
    x, y = blobs()
    np.savez(tmp_path / "blobs.npz", x=x, y=y)
    out = tmp_path / "m.safetensors"
    env = subprocess_env(SWARM_HOME=str(tmp_path / "home"))
    args = ["--data", str(tmp_path / "blobs.npz"), "--model", "mlp:12-8-3", "--epochs", "2",
            "--batch", "16", "--lr", "0.1", "--seed", "5", "--json", "-o", str(out)]
    with swarm.local(2, threads=1) as client:
        r = run_swarm("train", client.uri, *args, "--http", "127.0.0.1:0", timeout=240,
                      env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "training panel: http://127.0.0.1:" in r.stderr  # tests/test_training_panel.py
        report = json.loads(r.stdout)
        assert [e["epoch"] for e in report["epochs"]] == [1, 2]
        assert report["epochs"][1]["loss"] < report["epochs"][0]["loss"]
        assert report["test_accuracy"] >= 0.9 and report["rejected"] == 0
        workers = {str(w) for w in client.worker_ids}
        assert {p["peer"] for p in report["ranks"] if p["samples"]} <= workers | {"local"}
        assert sum(p["samples"] for p in report["ranks"]) >= 2 * 240
        weights = load_file(str(out))
        assert weights["w0"].shape == (12, 8) and weights["b1"].shape == (3,)
        again = run_swarm("train", client.uri, *args[:-2], "-o", str(tmp_path / "m2.st"),
                          "--resume", str(out), "--epochs", "1", timeout=240, env=env)
        assert again.returncode == 0, again.stderr[-2000:]
        # resumed from trained weights: its first epoch is the third, and starts where the
        # last one ended
        resumed = json.loads(again.stdout)["epochs"]
        assert resumed[0]["epoch"] == 3 and resumed[0]["loss"] < report["epochs"][0]["loss"]
        # on a terminal: a progress bar with the step, the epoch, the loss and samples/s,
        # drawn on stderr (stdout carries the result; the bar's frames went there before)
        rc, out, tty = on_a_terminal(swarm_cmd("train", client.uri, *args[:-3],
                                               "-o", str(tmp_path / "m3.st")), env, 240)
        assert rc == 0, tty[-2000:]
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", tty)  # the terminal's colours and moves
        assert re.search(r"train \S* +\d+/\d+ epoch \d+ loss \d+\.\d{4} \d+ samples/s", plain), \
            plain[-2000:]
        assert "samples/s" not in out


def on_a_terminal(cmd: list[str], env: dict[str, str], timeout: float
                  ) -> tuple[int, str, str]:
    """Run ``cmd`` with its stderr on a pseudo-terminal (120 columns): exit code, stdout,
    and what the terminal showed."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, env={**env, "TERM": "xterm", "COLUMNS": "120"})
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            shown += chunk
        out = proc.stdout.read() if proc.wait(max(1.0, deadline - time.monotonic())) \
            is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        os.close(master)
    return proc.returncode, out.decode() if isinstance(out, bytes) else out, \
        shown.decode(errors="replace")
