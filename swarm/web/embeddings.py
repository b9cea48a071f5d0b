"""OpenAI-compatible ``POST /v1/embeddings`` on a member's ``--http`` server.

Existing clients work unchanged (``openai.OpenAI(base_url="http://HOST:PORT/v1",
api_key=KEY).embeddings.create(model="all-MiniLM-L6-v2", input=[...])``). Each request runs
MiniLM's layers on the swarm's workers, every product checked on this member
(:mod:`swarm.embedding`).

Who may use it: only holders of this member's API key (``Authorization: Bearer KEY``), from
anywhere the ``--http`` address is reachable. The key is made on first use, 32 random bytes,
in ``<data dir>/api-key`` (mode 0600): the member's operator hands it out. Each request
spends this member's CPU and the swarm's workers' time, so the key is required on loopback
too (any local process or a DNS-rebinding page could otherwise spend them); a wrong key is
401 before the body is read. Requests are capped (:data:`MAX_EMBED_BODY`, :data:`MAX_INPUTS`) and
run one at a time with at most :data:`MAX_WAITING` queued (more: 429).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import secrets
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from identity.files import write_private

log = logging.getLogger("swarm.web.embeddings")
MODEL = "all-MiniLM-L6-v2"
KEY_FILE = "api-key"
MAX_EMBED_BODY = 8 << 20
"""Largest request body (bytes)."""
MAX_INPUTS = 2048
"""Most inputs per request (OpenAI's own limit)."""
MAX_WAITING = 8
"""Requests queued behind the running one before the next is refused with 429 (here and
in :mod:`swarm.web.chat`)."""


def api_key(data_dir: Path) -> str:
    """This member's API key: read from ``data_dir/api-key``, made (0600) when absent or
    empty. Two members starting at once on one data dir get the same key: the first file
    put in place wins."""
    path = Path(data_dir) / KEY_FILE
    key = _read_key(path)
    if key:
        return key
    new = "sk-swarm-" + secrets.token_urlsafe(32)
    data = (new + "\n").encode()
    if write_private(path, data, exclusive=True):
        return new
    key = _read_key(path)  # another process made it first, or an empty leftover stands
    if key:
        return key
    write_private(path, data)
    return new


def _read_key(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _error(status: int, message: str, kind: str, code: str | None = None,
           param: str | None = None) -> web.Response:
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
    return web.json_response({"error": {"message": message, "type": kind, "param": param,
                                        "code": code}}, status=status)


def authorised(request: web.Request, key: bytes) -> bool:
    """Whether the request carries this member's API key (``Authorization: Bearer KEY``)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)


async def json_request(request: web.Request, key: bytes, limit: int) -> object:
    """The JSON body of an authorised request of at most ``limit`` bytes, or the error
    response to send instead (401, 413, 400): nothing over the limit is read."""
    if not authorised(request, key):
        return no_key()
    too_big = _error(413, f"request body over {limit} bytes", "invalid_request_error")
    if request.content_length is not None and request.content_length > limit:
        return too_big
    body = bytearray()
    while len(body) <= limit:  # read() gives what has come so far, not the whole body
        part = await request.content.read(limit + 1 - len(body))
        if not part:
            break
        body += part
    if len(body) > limit:
        return too_big
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return _error(400, "the body is not JSON", "invalid_request_error")


def no_key() -> web.Response:
    return _error(401, "a valid API key is needed (Authorization: Bearer KEY; the "
                       "member's operator has it in its data dir, file api-key)",
                  "invalid_request_error", "invalid_api_key")


class EmbeddingsAPI:
    """The handler; ``embedder()`` gives the :class:`swarm.embedding.Embedder` to run on."""

    def __init__(self, key: str, embedder: Callable[[], object]) -> None:
        self._key = key.encode()
        self._embedder = embedder
        self._lock = asyncio.Lock()
        self._waiting = 0

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/embeddings", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        req = await json_request(request, self._key, MAX_EMBED_BODY)
        if isinstance(req, web.Response):
            return req
        parsed = _parse(req)
        if isinstance(parsed, web.Response):
            return parsed
        texts, fmt = parsed
        if self._waiting >= MAX_WAITING:
            return _error(429, "too many embedding requests queued here; retry later",
                          "rate_limit_error")
        self._waiting += 1
        try:
            async with self._lock:
                embedder = await asyncio.to_thread(self._embedder)
                result = await asyncio.to_thread(embedder.run, texts)
        except Exception as exc:
            log.warning("embedding request failed: %s", exc)
            return _error(503, f"the swarm could not compute the embeddings: {exc}"[:500],
                          "server_error")
        finally:
            self._waiting -= 1
        data = []
        for i, v in enumerate(result.vectors):
            value = base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" \
                else [float(x) for x in v]
            data.append({"object": "embedding", "index": i, "embedding": value})
        return web.json_response({"object": "list", "data": data, "model": MODEL,
                                  "usage": {"prompt_tokens": result.tokens,
                                            "total_tokens": result.tokens}})


def _parse(req: object) -> tuple[list[str], str] | web.Response:
    if not isinstance(req, dict):
        return _error(400, "the body must be a JSON object", "invalid_request_error")
    model = req.get("model")
    if model != MODEL and model != f"sentence-transformers/{MODEL}":
        return _error(404, f"The model {str(model)[:100]!r} does not exist here; this "
                           f"member serves {MODEL!r}", "invalid_request_error",
                      "model_not_found", "model")
    texts = req.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if (not isinstance(texts, list) or not texts or len(texts) > MAX_INPUTS
            or not all(isinstance(t, str) for t in texts)):
        return _error(400, f"'input' must be a string or a list of 1 to {MAX_INPUTS} "
                           "strings (token arrays are not taken)", "invalid_request_error",
                      None, "input")
    fmt = req.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        return _error(400, "'encoding_format' must be 'float' or 'base64'",
                      "invalid_request_error", None, "encoding_format")
    dims = req.get("dimensions")
    if dims is not None and dims != 384:
        return _error(400, f"{MODEL} makes 384 dimensions only", "invalid_request_error",
                      None, "dimensions")
    return texts, fmt
