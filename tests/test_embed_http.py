"""POST /v1/embeddings driven by the official ``openai`` client against a node on loopback."""

from __future__ import annotations

import base64
import json
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest

from models.minilm import MiniLM
from swarm.processes.member import embeddings_api
from swarm.web.embeddings import api_key
from tests.conftest import served_api

pytestmark = [pytest.mark.system]


@pytest.fixture(scope="module")
def served():
    """(base URL, API key) of the embeddings API as a member serves it."""
    with served_api(2, embeddings_api) as (url, key, _):
        yield url, key


def test_openai_client_float_and_base64(served):
    url, key = served
    api = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)
    texts = ["hello world", "Verified embeddings from untrusted machines."]
    want = MiniLM.load().embed(texts)
    got = api.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    assert [d.index for d in got.data] == [0, 1] and got.model == "all-MiniLM-L6-v2"
    assert np.abs(np.array([d.embedding for d in got.data], np.float32) - want).max() <= 1e-5
    tokens = MiniLM.load().tokenizer.encode(texts).tokens
    assert got.usage.prompt_tokens == got.usage.total_tokens == tokens == 17
    one = api.embeddings.create(model="all-MiniLM-L6-v2", input="hello world",
                                encoding_format="base64")
    raw = one.data[0].embedding
    vec = np.frombuffer(base64.b64decode(raw), "<f4") if isinstance(raw, str) else \
        np.asarray(raw, np.float32)  # the client may decode base64 itself
    assert np.abs(vec - want[0]).max() <= 1e-5


def test_unknown_model_is_404_with_an_openai_error(served):
    url, key = served
    api = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as exc:
        api.embeddings.create(model="text-embedding-3-small", input="x")
    assert exc.value.status_code == 404
    assert exc.value.body["code"] == "model_not_found" and exc.value.body["param"] == "model"


def test_no_key_no_service(served):
    url, _ = served
    api = openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        api.embeddings.create(model="all-MiniLM-L6-v2", input="x")
    req = urllib.request.Request(url + "/embeddings", data=b'{"model": "all-MiniLM-L6-v2"}',
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 401
    assert json.loads(exc.value.read())["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "all-MiniLM-L6-v2", "input": []}, "input"),
    ({"model": "all-MiniLM-L6-v2", "input": [[1, 2, 3]]}, "input"),
    ({"model": "all-MiniLM-L6-v2", "input": "x", "encoding_format": "int8"},
     "encoding_format"),
])
def test_bad_requests_are_400(served, body, param):
    url, key = served
    req = urllib.request.Request(url + "/embeddings", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 400 and json.loads(exc.value.read())["error"]["param"] == param


def test_a_body_that_is_not_json_is_400(served):
    """The shared request reader (web.embeddings.json_request, the chat endpoint's too)."""
    url, key = served
    req = urllib.request.Request(url + "/embeddings", data=b"\xff{not json",
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 400
    assert json.loads(exc.value.read())["error"]["message"] == "the body is not JSON"


def test_api_key_file_is_private_and_stable(tmp_path):
    key = api_key(tmp_path)
    assert key.startswith("sk-swarm-") and len(key) > 40 and api_key(tmp_path) == key
    assert stat.S_IMODE(os.stat(tmp_path / "api-key").st_mode) == 0o600


def test_an_empty_api_key_file_is_replaced_not_a_crash(tmp_path):
    """An empty api-key (a member killed between creating it and writing the key, as the
    hand-written O_EXCL writer could be) made every later start fail with FileExistsError.
    Now the key is written whole or not at all (identity.files.write_private), and an empty
    leftover is replaced by a fresh private key."""
    (tmp_path / "api-key").write_text("")
    key = api_key(tmp_path)
    assert key.startswith("sk-swarm-") and (tmp_path / "api-key").read_text().strip() == key
    assert stat.S_IMODE(os.stat(tmp_path / "api-key").st_mode) == 0o600
    assert api_key(tmp_path) == key


def _secrets(root: Path) -> dict[str, bytes]:
    """Every secret the members under ``root`` keep: peer and swarm keys (their Ed25519
    seeds), the owner's software key (its master secret) and the API key."""
    from fido2 import cbor

    from identity import PeerKey

    found = {str(p): PeerKey.load(p).seed() for p in [*root.rglob("peer.key"),
                                                    *root.rglob("swarm.key")]}
    found.update({str(p): cbor.decode(p.read_bytes())[2] for p in root.glob("owner.key")})
    found.update({str(p): p.read_text().strip().encode() for p in root.rglob("api-key")})
    return found


def _shown(secret: bytes) -> list[str]:
    """The forms a secret would take in a log line: itself, hex, base64, base32."""
    forms = [secret.hex(), base64.b64encode(secret).decode().rstrip("="),
             base64.urlsafe_b64encode(secret).decode().rstrip("="),
             base64.b32encode(secret).decode().rstrip("=")]
    if secret.isascii():
        forms.append(secret.decode())
    return forms


def test_a_published_member_serves_embeddings(tmp_path):
    """The real path: `swarm publish --http` with a worker joined; the openai client gets
    the model's embeddings with the key from the member's data dir. Invariant 5: at the
    most verbose level, through a wrong key and a right one, no secret either member keeps
    (peer, swarm and owner keys, the API key) shows in anything they print."""
    from tests.control_support import Cluster

    cluster = Cluster(tmp_path)
    owner = ["--owner-key", f"soft:{tmp_path / 'owner.key'}"]
    try:
        pub = cluster.start("pub", "publish", "--name", "lab", *owner, "--backend", "numpy",
                            "--http", "127.0.0.1:0", "--json", "-vv")
        line = pub.wait_line(lambda s: "join from a browser: " in s, 90)
        url = line.split("join from a browser: ", 1)[1].strip()
        up = json.loads(pub.wait_line(lambda s: s.startswith("{"), 30, "out"))
        w1 = cluster.start("w1", "join", up["uri"], "--yes", "--backend", "numpy",
                           "--threads", "1", "-vv")
        # joined: its keys are written (the count of secrets below needs them) and the API
        # has a worker (under load its start once outlasted every call below)
        w1.wait_line(lambda s: "joined swarm" in s, 120)
        key = (tmp_path / "pub" / "api-key").read_text().strip()
        api = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=key, max_retries=0,
                            timeout=180)
        texts = ["hello world", "a member answers OpenAI's embeddings API"]
        got = api.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
        vecs = np.array([d.embedding for d in got.data], np.float32)
        assert np.abs(vecs - MiniLM.load().embed(texts)).max() <= 1e-5
        # the chat routes ride on the same server and key (swarm/web/chat.py)
        assert "SmolLM2-135M-Instruct" in {m.id for m in api.models.list()}
        reply = api.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=4,
                                            messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="sk-guess",
                          max_retries=0).embeddings.create(model="all-MiniLM-L6-v2", input="x")
    finally:
        cluster.close()
    secrets = _secrets(tmp_path)
    assert len(secrets) == 5, secrets.keys()  # 2 peer keys, the swarm key, owner, API key
    printed = "\n".join(line for p in cluster.procs for line in p.out + p.err)
    assert "DEBUG" in printed
    for path, secret in secrets.items():
        assert not [f for f in _shown(secret) if f in printed], f"{path} shows in the output"
