"""POST /v1/chat/completions and GET /v1/models driven by the official ``openai`` client
against a node's web server on loopback."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

import swarm
from models.generate import generator
from swarm.processes.member import openai_api
from swarm.web.server import SwarmInfo, WebServer

pytestmark = [pytest.mark.system]
MODEL = "SmolLM2-135M-Instruct"
HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]


@pytest.fixture(scope="module")
def served():
    with swarm.local(1, threads=1) as client:
        info = SwarmInfo(client.swarm_id, "local", "00" * 32, False, client.uri)

        async def start():
            server = WebServer(client.node, info, "127.0.0.1", 0, api=openai_api(client.node))
            await server.start()
            return server

        server = client._loop.run(start(), 30)
        key = (Path(client.node.config.data_dir) / "api-key").read_text().strip()
        try:
            yield f"http://127.0.0.1:{server.port}/v1", key, client
        finally:
            client._loop.run(server.stop(), 30)


@pytest.fixture(scope="module")
def api(served):
    url, key, _ = served
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)


def test_non_stream_and_stream_agree(api):
    got = api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12,
                                      temperature=0)
    text = got.choices[0].message.content
    want = generator().complete(generator().chat_prompt(HELLO), max_tokens=12)[0]
    assert text == want and text and got.choices[0].message.role == "assistant"
    n_prompt = len(generator().chat_prompt(HELLO))
    assert got.usage.prompt_tokens == n_prompt
    assert got.usage.total_tokens == n_prompt + got.usage.completion_tokens
    assert 1 <= got.usage.completion_tokens <= 12 and got.object == "chat.completion"
    chunks = list(api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert sum(1 for p in pieces if p) > 1 and "".join(pieces) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == got.usage.total_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] \
        == got.choices[0].finish_reason


def test_the_blocks_ran_on_the_worker(api, served):
    """The member had a worker: the chat's 30 blocks went there as one span, whose weight
    bundle (all 30 blocks, put once) is in the member's store; the reply is the local
    forward's, token for token (greedy)."""
    got = api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6,
                                      temperature=0)
    assert got.choices[0].message.content == \
        generator().complete(generator().chat_prompt(HELLO), max_tokens=6)[0]
    store = served[2].node.requester.store
    assert any(a.nbytes > 400e6 for a in store.arrays()), [a.nbytes for a in store.arrays()]


def test_capital_of_france(api):
    got = api.chat.completions.create(model=MODEL, max_tokens=24, temperature=0, messages=[
        {"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in got.choices[0].message.content


def test_models_lists_both(api):
    ids = {m.id for m in api.models.list()}
    assert ids == {MODEL, "all-MiniLM-L6-v2"}


def test_no_key_is_401(served):
    url, _, _ = served
    bad = openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=HELLO)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    req = urllib.request.Request(url + "/chat/completions", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 401


def test_unknown_model_is_404(api):
    with pytest.raises(openai.NotFoundError) as exc:
        api.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert exc.value.body["code"] == "model_not_found"


LONG = "word " * 9000


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"messages": []}, "messages", "non-empty"),
    ({}, "messages", "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages", "wizard"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages", "content"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"messages": HELLO, "max_tokens": 10**9}, "max_tokens", "8192"),
    ({"messages": HELLO, "temperature": -1}, "temperature", "temperature"),
    ({"messages": HELLO, "temperature": "hot"}, "temperature", "temperature"),
    ({"messages": [{"role": "user", "content": LONG}]}, "messages", "8192"),
])
def test_bad_requests_are_400(served, body, param, says):
    url, key, _ = served
    req = urllib.request.Request(url + "/chat/completions",
                                 data=json.dumps({"model": MODEL, **body}).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=60)
    err = json.loads(exc.value.read())["error"]
    assert exc.value.code == 400 and err["param"] == param and says in err["message"], err
