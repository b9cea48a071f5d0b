"""Continuous batching in the chat API: total completion tokens/s of N concurrent streaming
``openai`` clients against one ChatAPI on loopback, beside one client alone, in one run
(the member's local forward, SmolLM2 by default; medians of ``--runs``).

    python bench/chat_batch.py [--clients 16] [--tokens 32] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's packages, not bench/compute.py

ASKS = ["Write a short poem about the sea.", "Describe a forest in spring.",
        "Tell a story about a brave mouse.", "Explain how rain forms.",
        "Write a letter to a friend about a trip.", "Describe your ideal city."]
MODEL = "SmolLM2-135M-Instruct"
KEY = "k" * 32


def serve(gen) -> tuple[str, asyncio.AbstractEventLoop]:
    from aiohttp import web

    from swarm.web.chat import ChatAPI, ServedModel

    loop = asyncio.new_event_loop()
    ready: list[str] = []

    async def start():
        app = web.Application()
        ChatAPI(KEY, [ServedModel(MODEL, (MODEL,), lambda: gen)]).add_routes(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ready.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1")

    threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()),
                     daemon=True).start()
    while not ready:
        time.sleep(0.01)
    return ready[0], loop


def run(url: str, clients: int, tokens: int) -> float:
    """Total completion tokens/s of ``clients`` concurrent streams."""
    import openai

    api = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=600)
    counts = [0] * clients

    def one(i: int) -> None:
        for c in api.chat.completions.create(
                model=MODEL, max_tokens=tokens, temperature=0, stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": ASKS[i % len(ASKS)]}]):
            if c.usage is not None:
                counts[i] = c.usage.completion_tokens

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from models.generate import generator

    gen = generator()
    url, _ = serve(gen)
    run(url, 1, 4)  # warm up
    one, many = [], []
    for _ in range(args.runs):  # alternating, so both see the same machine
        one.append(run(url, 1, args.tokens))
        many.append(run(url, args.clients, args.tokens))
    a, b = statistics.median(one), statistics.median(many)
    if args.json:
        print(json.dumps({"one_client_tok_s": a, "clients": args.clients,
                          "concurrent_tok_s": b, "ratio": b / a}))
        return
    print(f"| clients | total completion tok/s (median of {args.runs}) | vs one |")
    print("|---|---|---|")
    print(f"| 1 | {a:.1f} | 1.00x |")
    print(f"| {args.clients} | {b:.1f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
