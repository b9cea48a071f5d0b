"""`swarm embed URI --input FILE -o OUT.npy`: real processes, a local swarm, bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import swarm
from models.minilm import MiniLM
from swarm.commands.embed import read_sentences
from swarm.errors import ConfigError
from tests.conftest import DEAD, run_swarm, subprocess_env

pytestmark = [pytest.mark.system]


@pytest.fixture(scope="module")
def uri():
    with swarm.local(2, threads=1) as c:
        yield c.uri


def _embed(tmp_path, uri, path, *extra):
    out = tmp_path / "out.npy"
    r = run_swarm("embed", uri, "--input", str(path), "-o", str(out), "--json", *extra,
                  timeout=240, env=subprocess_env(SWARM_HOME=str(tmp_path / "home")))
    return r, out


def test_text_file_with_a_10mb_line(tmp_path, uri):
    lines = ["hello world", "", "Café 🍕 Москва", "long " * 2_000_000, "the last one"]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    r, out = _embed(tmp_path, uri, path, "--batch", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["truncated"] == [4] and report["shape"] == [5, 384]
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (5, 384)
    want = MiniLM.load().embed(lines)
    assert np.abs(got - want).max() <= 1e-5
    assert sum(p["verified"] for p in report["peers"]) > 0
    assert not any(p["rejected"] for p in report["peers"])


def test_jsonl(tmp_path, uri):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "first", "id": 1}\n{"text": "second"}\n', encoding="utf-8")
    r, out = _embed(tmp_path, uri, path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert np.abs(np.load(out) - MiniLM.load().embed(["first", "second"])).max() <= 1e-5


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty"),
    (b"fine\ncaf\xe9\n", "not UTF-8: byte 8 (line 2)"),
    (b'{"text": "ok"}\n{"txt": "no"}\n', ':2: needs an object with a string "text"'),
    (b'{"text": "ok"}\n{"text": 3}\n', ':2: needs an object with a string "text"'),
    (b'{"text": "ok"}\n{broken\n', ":2: not JSON"),
])
def test_bad_input_exit_2_and_nothing_written(tmp_path, content, message):
    path = tmp_path / "in.txt"
    path.write_bytes(content)
    out = tmp_path / "out.npy"
    # the input is read before anything connects: a URI nobody answers is fine here
    r = run_swarm("embed", DEAD, "--input", str(path), "-o", str(out),
                  env=subprocess_env(SWARM_HOME=str(tmp_path / "home")))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() and list(tmp_path.glob("*.tmp")) == []


def test_the_commands_batch_limits_are_the_embedders():
    from swarm import embedding
    from swarm.commands import embed

    assert (embed.DEFAULT_BATCH, embed.MAX_BATCH) == (embedding.DEFAULT_BATCH,
                                                      embedding.MAX_BATCH)


def test_lines_keep_their_rows(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"\xef\xbb\xbfa\r\n\r\nb")
    assert read_sentences(path) == ["a", "", "b"]
    with pytest.raises(ConfigError, match="no such file"):
        read_sentences(tmp_path / "missing.txt")
