"""A user's own GGUF served everywhere SmolLM2 is: ``client.generate(model=PATH)`` through
``swarm.local(2)`` spans (every value checked) gives the local forward's tokens for both
architectures; ``swarm generate --model``; the chat API's ``/v1/models`` and its choice by
``model``; bad files and bad requests refused with exit 2 / HTTP 400 before any work."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

import openai
import pytest

import swarm
from models import catalog
from models.generate import generator
from swarm.cli import main
from swarm.errors import EXIT_UNAVAILABLE, EXIT_USAGE
from tests.conftest import run_swarm, subprocess_env
from tests.gguf_support import write_tiny

URI = f"magnet:?xs=urn:btpk:{'ab' * 32}&x.op={'cd' * 16}&x.pe=127.0.0.1:9"  # nobody there
PROMPTS = ["the cat", "hello there", "12 34 56"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    return {"llama": write_tiny(d / "llama.gguf", "llama", "Q8_0", seed=1, layers=3,
                                name="Tiny Llama"),
            "qwen2": write_tiny(d / "qwen2.gguf", "qwen2", "F16", seed=2, layers=3,
                                name="Tiny Qwen"),
            "escape": write_tiny(d / "escape.gguf", "llama", "F32", seed=3, name="Escape",
                                 template="{{ ''.__class__.__mro__[1].__subclasses__() }}")}


def _cli(*args: str) -> tuple[int, str]:
    """``swarm ARGS`` in this process: exit code and stderr (no traceback allowed)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(list(args))
        except SystemExit as exc:
            rc = exc.code
    assert "Traceback" not in err.getvalue() + out.getvalue(), err.getvalue()
    return rc, err.getvalue()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_spans_on_workers_give_the_local_forwards_tokens(files, arch):
    local = generator(files[arch])
    want = [local.complete(p, max_tokens=12)[0] for p in PROMPTS]
    with swarm.local(2, threads=1) as client:
        got = ["".join(client.generate(p, model=str(files[arch]), chat=False, max_tokens=12))
               for p in PROMPTS]
        stats = client.span_model(str(files[arch])).take_stats()
        chat = "".join(client.generate("hi", model=str(files[arch]), max_tokens=4))
    assert got == want
    assert stats.calls >= 2 * len(PROMPTS) and stats.rejected == 0
    assert chat == local.complete(local.chat_prompt([{"role": "user", "content": "hi"}]),
                                  max_tokens=4)[0]


def test_two_clients_of_one_node_both_run_spans_on_its_workers(files):
    """A member's chat API runs on its own client of the member's node; a second client of
    that node numbered its actor instances from 1 too, so its span calls collided with the
    first's on the workers, timed out, and every span ran here (the test failed before)."""
    from swarm.api import attach

    with swarm.local(2, threads=1) as client:
        other = attach(client.node, client._loop.loop)
        for c, arch in ((other, "qwen2"), (client, "llama")):
            "".join(c.generate(PROMPTS[0], model=str(files[arch]), chat=False, max_tokens=4))
            st = c.span_model(str(files[arch])).take_stats()
            assert st.calls >= 2 and st.rejected == 0, (arch, st)


def test_a_lying_qwen2_span_changes_no_token_and_is_proven(files):
    """The bundle carries Qwen2's biases and the evidence reads them back: a worker that
    signs a wrong product is caught by the requester and proven by the judge."""
    local = generator(files["qwen2"])
    want = local.complete(PROMPTS[0], max_tokens=8)[0]
    with swarm.local(2, threads=1, chaos=[None, "corrupt=1"]) as client:
        honest, liar = client.worker_ids
        assert "".join(client.generate(PROMPTS[0], model=str(files["qwen2"]), chat=False,
                                       max_tokens=8)) == want
        model = client.span_model(str(files["qwen2"]))
        assert model.take_stats().rejected >= 1 and model.hosts() == [honest, honest]
        deadline = time.monotonic() + 30
        while liar not in client.node.proven_liars and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.node.proven_liars == {liar}


@pytest.mark.system
def test_swarm_generate_with_a_model_file(files, tmp_path):
    with swarm.local(workers=0) as empty:
        r = run_swarm("generate", empty.uri, "the cat", "--raw", "--json", "--max-tokens", "5",
                      "--min-workers", "0", "--model", str(files["qwen2"]),
                      env=subprocess_env(SWARM_HOME=str(tmp_path / "home")), timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    want = generator(files["qwen2"]).complete("the cat", max_tokens=5)
    assert (out["text"], out["finish_reason"]) == want
    assert out["model"] == "Tiny Qwen" and out["model_id"] == catalog.describe(
        str(files["qwen2"])).address


def test_bad_model_files_exit_2_before_joining(files, tmp_path):
    """The URI names a swarm nobody serves: each refusal comes before any join attempt."""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 100)
    short = tmp_path / "short.gguf"
    short.write_bytes(files["llama"].read_bytes()[:5000])
    for model, says in ((junk, "not a GGUF"), (short, "truncated"),
                        (tmp_path / "absent.gguf", "no such model file"),
                        ("gpt5", "smollm2, qwen2.5-0.5b")):
        rc, err = _cli("generate", URI, "hi", "--model", str(model))
        assert rc == EXIT_USAGE and says in err, err
    rc, err = _cli("generate", URI, "hi", "--model", str(files["escape"]))
    assert rc == EXIT_USAGE and "chat template" in err, err
    rc, err = _cli("generate", URI, "x" * 100, "--raw", "--model", str(files["llama"]))
    assert rc == EXIT_USAGE and "context is 64 tokens" in err, err


def test_publish_and_join_check_their_models_first(files, tmp_path, monkeypatch):
    for http in ([], ["--http", "127.0.0.1:0"]):  # held for spans, or served too
        rc, err = _cli("--data-dir", str(tmp_path / "d"), "join", URI, "--yes", *http,
                       "--model", str(tmp_path / "absent.gguf"))
        assert rc == EXIT_USAGE and "no such model file" in err, err
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path / "empty-cache"))
    rc, err = _cli("--data-dir", str(tmp_path / "d"), "publish", "--name", "x", "--http",
                   "127.0.0.1:0", "--model", "qwen2.5-0.5b", "--owner-key",
                   f"soft:{tmp_path / 'owner.key'}")
    assert rc == EXIT_UNAVAILABLE and "make qwen-model" in err, err
    assert not (tmp_path / "owner.key").exists()  # refused before any key was made


@pytest.fixture(scope="module")
def chat(files):
    from swarm.processes.member import openai_api
    from swarm.web.server import SwarmInfo, WebServer

    refs = [catalog.describe(str(files[k])) for k in ("llama", "qwen2", "escape")]
    with swarm.local(0) as client:
        info = SwarmInfo(client.swarm_id, "local", "00" * 32, False, client.uri)

        async def start():
            server = WebServer(client.node, info, "127.0.0.1", 0,
                               api=openai_api(client.node, refs))
            await server.start()
            return server

        server = client._loop.run(start(), 30)
        key = (Path(client.node.config.data_dir) / "api-key").read_text().strip()
        try:
            yield openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=key,
                                max_retries=0, timeout=120), refs
        finally:
            client._loop.run(server.stop(), 30)


def test_models_lists_what_is_served_and_chat_picks_by_model(chat, files):
    api, refs = chat
    assert {m.id for m in api.models.list()} == \
        {"Tiny Llama", "Tiny Qwen", "Escape", "all-MiniLM-L6-v2"}
    hi = [{"role": "user", "content": "hi"}]
    for ref in refs[:2]:
        gen = generator(ref.path)
        want = gen.complete(gen.chat_prompt(hi), max_tokens=5)[0]
        for asked in (ref.name, ref.address):
            got = api.chat.completions.create(model=asked, messages=hi, max_tokens=5,
                                              temperature=0)
            assert got.model == ref.name and got.choices[0].message.content == want


def test_a_template_leaving_its_sandbox_and_a_long_prompt_are_400(chat):
    api, _ = chat
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="chat template"):
        api.chat.completions.create(model="Escape", messages=hi, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context"):
        api.chat.completions.create(model="Tiny Qwen", max_tokens=2,
                                    messages=[{"role": "user", "content": "x" * 200}])
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="SmolLM2-135M-Instruct", messages=hi)


def test_a_known_model_not_assembled_is_exit_4(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path / "empty-cache"))
    rc, err = _cli("generate", URI, "hi", "--model", "qwen2.5-0.5b")
    assert rc == EXIT_UNAVAILABLE and "make qwen-model" in err, err
