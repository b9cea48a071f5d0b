"""Run inside a test namespace whose loopback carries public-looking addresses (TEST-NET-3,
203.0.113.0/24, existing only there): libtorrent sessions on .1-.6, a swarm DHT node on .10,
and a libtorrent session with ``dht_enforce_node_id`` on .20 that knows only the swarm node.
Prints one JSON line: the swarm node's id before and after, whether it is bound to its
address (BEP 42), and which queries the enforcing session sent the swarm node while it ran
lookups (a node it refuses is asked once, while bootstrapping, then never again)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter

from dht import DHTNode
from dht.addresses import bep42_valid
from tests.libtorrent_support import lt, session

NET = "203.0.113"
PORT = 6881


async def main() -> None:
    # TEST-NET is "dark internet" to libtorrent, which would ignore it
    sessions = [session(dht_ignore_dark_internet=False, listen_interfaces=f"{NET}.{i}:{PORT}")
                for i in range(1, 7)]
    for s in sessions:
        for i in range(1, 7):
            s.add_dht_node((f"{NET}.{i}", PORT))
    node = DHTNode(rpc_timeout=1.0)
    await node.listen(PORT, f"{NET}.10")
    before = node.node_id
    await node.bootstrap([(f"{NET}.1", PORT)])
    end = time.monotonic() + 20
    while not bep42_valid(f"{NET}.10", node.node_id) and time.monotonic() < end:
        await node.bootstrap([(f"{NET}.{i}", PORT) for i in range(1, 7)])
        await asyncio.sleep(0.2)
    strict = session(dht_ignore_dark_internet=False, dht_enforce_node_id=True,
                     listen_interfaces=f"{NET}.20:{PORT}")
    asked: Counter[str] = Counter()  # what the enforcing node asked us, by method
    handle = node.protocol._krpc_handle

    def counting(q: bytes, a: dict, sender: tuple[str, int], now: float) -> dict:
        if sender[0] == f"{NET}.20":
            asked[q.decode(errors="replace")] += 1
        return handle(q, a, sender, now)

    node.protocol._krpc_handle = counting
    strict.add_dht_node(node.address)
    end = time.monotonic() + 30
    while time.monotonic() < end and asked["get"] < 3:  # lookups: libtorrent's own pace
        strict.dht_get_immutable_item(lt.sha1_hash(os.urandom(20)))
        await asyncio.sleep(1)
        strict.pop_alerts()
    print(json.dumps({"before": before.hex(), "after": node.node_id.hex(),
                      "bound": bep42_valid(f"{NET}.10", node.node_id),
                      "external": node.external.current, "asked": dict(asked),
                      "contacts": len(node.protocol.router.contacts())}), flush=True)
    await node.stop()
    del strict, sessions


if __name__ == "__main__":
    asyncio.run(main())
