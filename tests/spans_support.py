"""What the span tests share: greedy decoding through a model, and one chat request to a
member's own --http server."""

from __future__ import annotations

import numpy as np

from models.llama import Llama


def greedy(model: Llama, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``ids``."""
    cache = model.new_cache()
    logits = model.forward(ids, cache)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = model.forward([out[-1]], cache)
    return out


def chat(client, text: str, max_tokens: int = 4) -> tuple[int, dict]:
    """One /v1/chat/completions from a --http server on the client's node: (status, body)."""
    import json
    import urllib.error
    import urllib.request
    from pathlib import Path

    from swarm.processes.member import openai_api
    from swarm.web.server import SwarmInfo, WebServer

    info = SwarmInfo(client.swarm_id, "local", "00" * 32, False, client.uri)

    async def start():
        server = WebServer(client.node, info, "127.0.0.1", 0, api=openai_api(client.node))
        await server.start()
        return server

    server = client._loop.run(start(), 30)
    key = (Path(client.node.config.data_dir) / "api-key").read_text().strip()
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": text}]}
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/chat/completions",
                                 json.dumps(body).encode(), {"Authorization": f"Bearer {key}",
                                                             "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    finally:
        client._loop.run(server.stop(), 30)
