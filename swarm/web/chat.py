"""OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models`` on ``--http``.

``openai.OpenAI(base_url="http://HOST:PORT/v1", api_key=KEY).chat.completions.create(
model="SmolLM2-135M-Instruct", messages=[...])`` works unchanged (``model``: any chat model
this member serves, by its name, content address or alias; ``/v1/models`` lists them), with ``stream=True`` as
server-sent events in OpenAI's chunk format ending in ``data: [DONE]``. The same API key as
/v1/embeddings (``<data dir>/api-key``) is required, checked before the body is read.

Requests run together, batched continuously (:mod:`models.batching`): a new request joins
the running batch at its next decode step instead of waiting for the others, each with its
own sampler and stops (its tokens are the ones it would get alone). At most
:data:`MAX_CHATS` run at once here (more: 429). Every field is checked before any work: a bad request is an
OpenAI-style 400 naming the parameter (a prompt over the context, a chat the model's template
refuses), an unknown model a 404.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from swarm.web.embeddings import MODEL as EMBED_MODEL
from swarm.web.embeddings import _error, authorised, json_request, no_key

log = logging.getLogger("swarm.web.chat")
MAX_CHAT_BODY = 1 << 20
"""Largest chat request body (bytes)."""
MAX_STOPS = 4
MAX_CHATS = 16
"""Chats running here at once (in one batch per model; each holds its own K/V cache)."""
HANGUP_POLL = 0.25
"""Seconds between looks at whether a non-streamed chat's client is still connected."""


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse(req: object) -> dict:
    """The generation arguments of a chat request, or :class:`BadRequest` naming the field."""
    if not isinstance(req, dict):
        raise BadRequest("the body must be a JSON object")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise BadRequest(f"messages[{i}] needs a string 'content'", "messages")
        try:
            m["content"].encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"): no text to tokenise
            raise BadRequest(f"messages[{i}]: 'content' is not valid Unicode text (a lone "
                             "surrogate)", "messages") from None
        if m.get("role") not in ("system", "user", "assistant"):
            raise BadRequest(f"messages[{i}]: role {str(m.get('role'))[:40]!r} is not "
                             "system, user or assistant", "messages")
    out: dict = {"messages": [{"role": m["role"], "content": m["content"]} for m in messages],
                 "text_bytes": sum(len(m["content"].encode("utf-8")) for m in messages)}
    max_tokens = req.get("max_completion_tokens", req.get("max_tokens", 256))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f"'max_tokens' must be a positive integer, got {max_tokens!r}"[:200],
                         "max_tokens")
    out["max_tokens"] = max_tokens
    for name, lo, hi, default in (("temperature", 0.0, 2.0, 1.0), ("top_p", 0.0, 1.0, 1.0)):
        v = req.get(name, default)
        if v is None:
            v = default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi \
                or (name == "top_p" and v == 0):
            raise BadRequest(f"'{name}' must be a number in {'(' if name == 'top_p' else '['}"
                             f"{lo:g}, {hi:g}], got {v!r}"[:200], name)
        out[name] = float(v)
    seed = req.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("'seed' must be an integer", "seed")
    out["seed"] = seed
    stop = req.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOPS \
            or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest(f"'stop' must be a string or a list of up to {MAX_STOPS} non-empty "
                         "strings", "stop")
    out["stop"] = stop
    n = req.get("n", 1)
    if n != 1:
        raise BadRequest("only n=1 is served", "n")
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", "stream")
    out["stream"] = stream
    opts = req.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    out["include_usage"] = bool(opts.get("include_usage"))
    return out


@dataclass(frozen=True)
class ServedModel:
    """A chat model this member serves: ``generator()`` gives its
    :class:`models.generate.Generator` (loaded on first use, in a thread)."""

    name: str
    """The id ``/v1/models`` lists and replies carry."""
    ids: tuple[str, ...]
    """Every id a request may name it by (name, content address, aliases)."""
    generator: Callable[[], object]


class ChatAPI:
    """The handlers for the chat ``models`` served here."""

    def __init__(self, key: str, models: Sequence[ServedModel]) -> None:
        self._key = key.encode()
        self._models = list(models)
        self._waiting = 0
        self._threads = ThreadPoolExecutor(MAX_CHATS + 2, thread_name_prefix="chat")
        """Each running chat reads its pieces on a thread of its own (asyncio's default
        pool has cores + 4 threads: it would cap the chats running at once, and starve
        everything else that uses it)."""

    def _thread(self, fn: Callable[[], Any]) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._threads, fn)

    def _find(self, asked: object) -> ServedModel | None:
        return next((m for m in self._models if asked in m.ids), None)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/v1/models", self.models)

    async def models(self, request: web.Request) -> web.Response:
        if not authorised(request, self._key):
            return no_key()
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "swarm"}
            for m in [m.name for m in self._models] + [EMBED_MODEL]]})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        req = await json_request(request, self._key, MAX_CHAT_BODY)
        if isinstance(req, web.Response):
            return req
        served = self._find(req.get("model")) if isinstance(req, dict) else None
        if isinstance(req, dict) and served is None:
            names = ", ".join(repr(m.name) for m in self._models)
            return _error(404, f"The model {str(req.get('model'))[:100]!r} does not exist here; "
                               f"this member serves {names}", "invalid_request_error",
                          "model_not_found", "model")
        try:
            args = parse(req)
        except BadRequest as e:
            return _error(400, str(e), "invalid_request_error", None, e.param)
        if self._waiting >= MAX_CHATS:
            return _error(429, "too many chat requests running here; retry later",
                          "rate_limit_error")
        self._waiting += 1
        try:
            return await self._run(request, args, served)
        finally:
            self._waiting -= 1

    async def _run(self, request: web.Request, args: dict,
                   served: ServedModel) -> web.StreamResponse:
        from models.generate import GenerationError, Usage
        from swarm.errors import SpanLost

        try:
            gen = await self._thread(served.generator)
        except Exception as e:  # e.g. the model wheel is not installed on this member
            log.warning("chat model unavailable: %s", e)
            return _error(503, f"the chat model is not available here: {e}"[:500],
                          "server_error")
        usage = Usage()
        most = _most_text_bytes(gen)
        if most is not None and args["text_bytes"] > most:  # known before any tokenising
            return _error(400, f"the messages are {args['text_bytes']} bytes: more tokens "
                          f"than the model's context of {gen.context_length} tokens",
                          "invalid_request_error", "context_length_exceeded", "messages")

        def start():  # tokenising a long text takes seconds: never on the loop
            ids = gen.chat_prompt(args["messages"])
            # in the running batch (a generator that cannot batch streams alone)
            stream = getattr(gen, "stream_batched", gen.stream)
            return stream(ids, max_tokens=args["max_tokens"],
                              temperature=args["temperature"], top_p=args["top_p"],
                              seed=args["seed"], stop=args["stop"], usage=usage)

        try:
            pieces = await self._thread(start)
        except (GenerationError, ValueError) as e:
            param = "max_tokens" if "max_tokens" in str(e) else "messages"
            return _error(400, str(e), "invalid_request_error", "context_length_exceeded"
                          if "context" in str(e) else None, param)
        rid, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())
        base = {"id": rid, "created": created, "model": served.name}
        if not args["stream"]:
            text: list[str] = []
            gone = threading.Event()  # the client hung up: stop generating for it

            def collect() -> None:
                try:
                    for p in pieces:
                        text.append(p.text)
                        if gone.is_set():
                            break
                finally:
                    getattr(pieces, "close", lambda: None)()

            job = asyncio.ensure_future(self._thread(collect))
            try:
                while not job.done():
                    await asyncio.wait({job}, timeout=HANGUP_POLL)
                    if request.transport is None or request.transport.is_closing():
                        gone.set()
            finally:
                gone.set()
            try:
                await job
            except SpanLost as e:  # a worker lost mid-text, its blocks placeable nowhere
                log.warning("chat request failed: %s", e)
                return _error(503, f"the chat model is not available here: {e}"[:500],
                              "server_error")
            reason = usage.finish_reason or "length"
            return web.json_response({**base, "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "".join(text)},
                 "finish_reason": reason, "logprobs": None}], "usage": _usage(usage)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        chunk = {**base, "object": "chat.completion.chunk"}

        async def send(obj) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        async def delta(d: dict, reason: str | None) -> None:
            c = {**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": reason,
                                       "logprobs": None}]}
            if args["include_usage"]:
                c["usage"] = None
            await send(c)

        await delta({"role": "assistant", "content": ""}, None)
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        cancel = threading.Event()

        def produce() -> None:
            try:
                for p in pieces:
                    loop.call_soon_threadsafe(queue.put_nowait, p)
                    if cancel.is_set():
                        break
            except Exception as e:  # reported in the stream, not lost
                loop.call_soon_threadsafe(queue.put_nowait, e)
            loop.call_soon_threadsafe(queue.put_nowait, None)

        worker = asyncio.ensure_future(self._thread(produce))
        try:
            while (p := await queue.get()) is not None:
                if isinstance(p, Exception):
                    await send({"error": {"message": str(p)[:500], "type": "server_error"}})
                    break
                if p.text:
                    await delta({"content": p.text}, None)
                if p.finish_reason:
                    await delta({}, p.finish_reason)
            if args["include_usage"]:
                await send({**chunk, "choices": [], "usage": _usage(usage)})
            await resp.write(b"data: [DONE]\n\n")
        finally:
            cancel.set()
            await worker
        await resp.write_eof()
        return resp


def _most_text_bytes(gen) -> int | None:
    """The most bytes of message text that can fit ``gen``'s context (None: unknown)."""
    per = getattr(getattr(gen, "tokenizer", None), "max_token_bytes", None)
    ctx = getattr(gen, "context_length", None)
    return None if per is None or ctx is None else per * ctx


def _usage(u) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens}


class Routes:
    """Several APIs served together at /v1 (WebServer takes one ``api``)."""

    def __init__(self, *apis) -> None:
        self.apis = apis

    def add_routes(self, app: web.Application) -> None:
        for api in self.apis:
            api.add_routes(app)
