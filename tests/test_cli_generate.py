"""`swarm generate` streams the chat model's reply; bad requests exit 2 before joining; and
`client.generate` on `swarm.local()`."""

from __future__ import annotations

import json

import pytest

import swarm
from models.generate import GenerationError, Usage
from swarm.cli import main
from tests.conftest import DEAD, run_swarm, subprocess_env


@pytest.fixture(scope="module")
def cluster():
    with swarm.local(workers=2, threads=1) as c:
        yield c


@pytest.mark.system
def test_generate_streams_the_answer_as_json(cluster, tmp_path):
    """The blocks run on the swarm's two workers, a span each, every call checked."""
    r = run_swarm("generate", cluster.uri, "What is the capital of France?", "--json",
                  "--max-tokens", "24", env=subprocess_env(SWARM_HOME=str(tmp_path / "home")),
                  timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "Paris" in out["text"]
    assert out["finish_reason"] == "stop"
    assert out["usage"]["prompt_tokens"] == 37 and 1 <= out["usage"]["completion_tokens"] <= 24
    layers = [s["layers"] for s in out["spans"]]  # placed by memory and speed: any cut
    assert len(layers) == 2 and layers[0][0] == 0 and layers[1] == [layers[0][1] + 1, 29]
    assert {s["worker"] for s in out["spans"]} == {str(w) for w in cluster.workers()}
    assert out["checked_calls"] >= 2 * out["usage"]["completion_tokens"]
    assert out["rejected"] == 0


@pytest.mark.system
def test_generate_writes_text_to_stdout(cluster, tmp_path):
    r = run_swarm("generate", cluster.uri, "Count: one, two,", "--raw", "--max-tokens", "4",
                  env=subprocess_env(SWARM_HOME=str(tmp_path / "home")), timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "{" not in r.stdout
    assert "every value checked here" in r.stderr and "0 rejected" in r.stderr


@pytest.mark.system
def test_a_swarm_without_workers(tmp_path):
    """No worker: exit 1 saying so after --timeout, or, with --min-workers 0, the forward
    runs here."""
    env = subprocess_env(SWARM_HOME=str(tmp_path / "home"))
    with swarm.local(workers=0) as empty:
        r = run_swarm("generate", empty.uri, "Hi", "--timeout", "2", env=env, timeout=60)
        assert r.returncode == 1 and "--min-workers 0" in r.stderr, r.stderr
        r = run_swarm("generate", empty.uri, "Count: one, two,", "--raw", "--json",
                      "--max-tokens", "3", "--min-workers", "0", env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["spans"] == []


@pytest.mark.parametrize("extra, needle", [
    (["--max-tokens", "0"], "max_tokens must be an integer from 1 to"),
    (["--max-tokens", "100000"], "context of 8192 tokens"),
    (["--temperature", "5"], "temperature must be a number from 0 to 2"),
    (["--temperature", "nan"], "temperature"),
    (["--top-p", "0"], "top_p"),
])
def test_bad_requests_exit_2_before_joining(capsys, extra, needle):
    # an unreachable bootstrap address: a request that got as far as joining would hang
    assert main(["generate", DEAD, "--swarm", "00" * 20, "Hi", *extra]) == 2
    assert needle in capsys.readouterr().err


def test_empty_and_oversized_prompts_exit_2(capsys):
    assert main(["generate", DEAD, "--swarm", "00" * 20, ""]) == 2
    assert "prompt is empty" in capsys.readouterr().err
    assert main(["generate", DEAD, "--swarm", "00" * 20, "--raw", "7 " * 9000]) == 2
    assert "the model's context is 8192 tokens" in capsys.readouterr().err


def test_client_generate_on_local(cluster):
    usage = Usage()
    pieces = list(cluster.generate("What is the capital of France?", max_tokens=24,
                                   usage=usage))
    assert len(pieces) > 1 and "Paris" in "".join(pieces)
    assert set(cluster.span_model().hosts()) == set(cluster.workers())  # the blocks ran there
    assert usage.finish_reason == "stop" and usage.prompt_tokens == 37
    same = "".join(cluster.generate([{"role": "user", "content": "Say a word."}],
                                    max_tokens=6, temperature=0.9, seed=3))
    assert same == "".join(cluster.generate([{"role": "user", "content": "Say a word."}],
                                            max_tokens=6, temperature=0.9, seed=3))
    with pytest.raises(GenerationError, match="prompt is empty"):
        cluster.generate("")
    with pytest.raises(GenerationError, match="role"):
        cluster.generate([{"role": "robot", "content": "x"}])
    with pytest.raises(GenerationError, match="max_tokens"):
        cluster.generate("hi", max_tokens=0)
