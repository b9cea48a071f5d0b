"""The shared JSON request reader of the embeddings and chat endpoints, without a socket:
the body arrives in parts, as TCP delivers a large one."""

from __future__ import annotations

import asyncio
import json
from unittest import mock

from aiohttp import streams, web
from aiohttp.test_utils import make_mocked_request

from swarm.web.embeddings import json_request

KEY = b"sk-swarm-test"


def _request(length: int | None) -> tuple[web.Request, streams.StreamReader]:
    protocol = mock.Mock(_reading_paused=False)
    stream = streams.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    headers = {"Authorization": f"Bearer {KEY.decode()}"}
    if length is not None:
        headers["Content-Length"] = str(length)
    return make_mocked_request("POST", "/v1/chat/completions", headers=headers,
                               payload=stream), stream


async def _read_in_parts(body: bytes, parts: int, limit: int) -> object:
    request, stream = _request(len(body))
    reading = asyncio.ensure_future(json_request(request, KEY, limit))
    step = -(-len(body) // parts)
    for i in range(0, len(body), step):
        stream.feed_data(body[i:i + step])
        for _ in range(5):  # let the reader take what has come (no I/O: runs in order)
            await asyncio.sleep(0)
    stream.feed_eof()
    return await asyncio.wait_for(reading, 10)


async def test_a_body_in_parts_is_read_whole():
    """A body that comes in several parts is read to its end (the reader took the first
    part alone and answered 'the body is not JSON': CI's chat test with a long message)."""
    body = json.dumps({"messages": [{"role": "user", "content": "word " * 4000}]}).encode()
    got = await _read_in_parts(body, 4, 1 << 20)
    assert got == json.loads(body)


async def test_a_body_over_the_limit_in_parts_is_413_without_a_length():
    body = b'{"x": "' + b"a" * 5000 + b'"}'
    request, stream = _request(None)
    reading = asyncio.ensure_future(json_request(request, KEY, 4096))
    for i in range(0, len(body), 1000):
        stream.feed_data(body[i:i + 1000])
        await asyncio.sleep(0)
    stream.feed_eof()
    got = await asyncio.wait_for(reading, 10)
    assert isinstance(got, web.Response) and got.status == 413


async def test_a_declared_length_over_the_limit_is_413_before_reading():
    request, stream = _request(10_000)
    got = await json_request(request, KEY, 4096)
    assert isinstance(got, web.Response) and got.status == 413
    assert stream.total_bytes == 0
