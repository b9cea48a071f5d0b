"""The paged blocklist (issue 12): what a block costs as the list grows.

    python bench/blocklist.py [--rounds 5] [--json]

For N blocked peers, medians over rounds of: split (the list into chained pages), item
(encode the signed state item, its pages already split), resolve (rebuild the full state from its pages, all in
memory: the DHT round trips are not measured), and the page count and the item's size.
Both are computed once per state object (heartbeats resend the same item), so only a
change of the list pays them. What one more block costs in DHT traffic: the pages it
changes (the coordinator puts those) and the pages a follower holding the list before
fetches (one lookup each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from identity import PeerKey  # noqa: E402
from swarm.control.state import (  # noqa: E402
    BlockEntry,
    CoordinatorState,
    StateItem,
    resolve,
)

SIZES = (12, 100, 1000, 10000)


def _state(n: int) -> CoordinatorState:
    blocked = tuple(BlockEntry(PeerKey.from_seed(i.to_bytes(32, "big")).peer_id,
                               "wrong result", "coordinator", 1_700_000_000 + i)
                    for i in range(n))
    return CoordinatorState(bytes(20), 7, 99, PeerKey.from_seed(b"c" * 32).peer_id, blocked)


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(n: int, rounds: int, loop: asyncio.AbstractEventLoop) -> dict:
    base = _state(n)
    pages_t, item_t, resolve_t = [], [], []
    for _ in range(rounds):
        st = replace(base)  # a fresh object: nothing cached from the last round
        pages_t.append(_time(st.pages))
        item_t.append(_time(st.encode_item))
        store = {p.target: p.encode() for p in st.pages()}
        item = StateItem.decode(st.encode_item())

        async def fetch(target: bytes, store=store) -> bytes | None:
            return store.get(target)

        resolve_t.append(_time(lambda item=item, fetch=fetch: loop.run_until_complete(
            resolve(item, fetch))))
    more = base.with_block(BlockEntry(PeerKey.from_seed(b"m" * 32).peer_id, "wrong result",
                                      "coordinator", 1_800_000_000))
    store = {p.target: p.encode() for p in more.pages()}
    fetched: list[bytes] = []

    async def fetch_more(target: bytes) -> bytes | None:
        fetched.append(target)
        return store.get(target)

    loop.run_until_complete(resolve(StateItem.decode(more.encode_item()), fetch_more, base))
    changed = len({p.target for p in more.pages()} - {p.target for p in base.pages()})
    return {"blocked": n, "pages": len(base.pages()), "item_bytes": len(base.encode_item()),
            "block_changes_pages": changed, "follower_fetches": len(fetched),
            "split_ms": statistics.median(pages_t) * 1e3,
            "item_ms": statistics.median(item_t) * 1e3,
            "resolve_ms": statistics.median(resolve_t) * 1e3}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    loop = asyncio.new_event_loop()
    try:
        rows = [measure(n, args.rounds, loop) for n in SIZES]
    finally:
        loop.close()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'blocked':>8} {'pages':>6} {'item B':>7} {'split ms':>9} {'item ms':>8} "
          f"{'resolve ms':>11} {'+1: pages put':>14} {'+1: fetched':>12}")
    for r in rows:
        print(f"{r['blocked']:>8} {r['pages']:>6} {r['item_bytes']:>7} {r['split_ms']:>9.2f} "
              f"{r['item_ms']:>8.2f} {r['resolve_ms']:>11.2f} {r['block_changes_pages']:>14} "
              f"{r['follower_fetches']:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
