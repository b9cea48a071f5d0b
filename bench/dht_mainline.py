"""Swarm nodes and libtorrent side by side in one mainline (KRPC) network on loopback.

Half the nodes are libtorrent 2.x sessions, half swarm ``DHTNode``\\ s in KRPC mode, all on
127.0.0.1 (nothing is sent elsewhere). Each side puts mutable BEP 44 items and gets the
other side's and its own; then 30% of the nodes (of both kinds) are stopped and the gets
run again. Per operation: median and p90 latency, request datagrams sent by the node doing
it, and the share of gets that return the newest value. libtorrent's get time is to its
first alert carrying the value (or its final one). Then membership as the control plane
uses it: a few swarm nodes announce under one topic (swarm nodes keep the signed entries,
libtorrent nodes the announcers' addresses, BEP 5) and random swarm nodes list the topic;
libtorrent's BEP 5 get_peers of the topic's info-hash (addresses only, unsigned, to its
first reply) is beside it. Run with ``--nodes 52``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import libtorrent as lt  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from dht import DHTNode, topic_target  # noqa: E402

SETTINGS = {
    "listen_interfaces": "127.0.0.1:0", "enable_dht": True, "enable_lsd": False,
    "enable_upnp": False, "enable_natpmp": False, "dht_bootstrap_nodes": "",
    "enable_outgoing_utp": False, "enable_incoming_utp": False,
    "dht_restrict_routing_ips": False, "dht_restrict_search_ips": False,
    "dht_block_ratelimit": 1_000_000, "dht_upload_rate_limit": 10_000_000,
    "alert_queue_size": 100_000,
    "alert_mask": lt.alert_category.dht | lt.alert_category.dht_operation
    | lt.alert_category.error | lt.alert_category.stats}
OUT = "dht.dht_messages_out"


def _keypair():
    seed = os.urandom(32)
    key = Ed25519PrivateKey.from_private_bytes(seed)
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw)
    h = bytearray(hashlib.sha512(seed).digest())
    h[0] &= 248
    h[31] &= 63
    h[31] |= 64
    return key, pub, bytes(h)


async def _alert(s, kind, match=lambda a: True, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for a in s.pop_alerts():
            if isinstance(a, kind) and match(a):
                return a
        await asyncio.sleep(0.002)
    return None


async def _sent(s) -> int:
    s.pop_alerts()
    s.post_session_stats()
    a = await _alert(s, lt.session_stats_alert, timeout=5)
    return int(a.values[OUT]) if a is not None else 0


async def _lt_op(s, start, kind, match, extract):
    """(seconds, datagrams sent, ``extract(alert)`` or None). An alert is only valid until
    the next ``pop_alerts``, so what is needed is read out at once."""
    before = await _sent(s)
    t0 = time.perf_counter()
    start()
    a = await _alert(s, kind, match)
    dt = time.perf_counter() - t0
    value = extract(a) if a is not None else None
    return dt, await _sent(s) - before, value


async def _swarm_op(node, coro_fn):
    before = node.stats.requests
    t0 = time.perf_counter()
    try:
        result = await coro_fn()
    except Exception as exc:  # a failed put or get counts as a failure
        result = exc
    return time.perf_counter() - t0, node.stats.requests - before, result


def _summary(rows, ok) -> dict:
    times = sorted(t for t, _, _ in rows)
    return {"count": len(rows), "median_ms": 1000 * statistics.median(times),
            "p90_ms": 1000 * times[min(len(times) - 1, int(0.9 * len(times)))],
            "requests_per_op": statistics.median(r for _, r, _ in rows),
            "success": sum(1 for row in rows if ok(row)) / len(rows)}


async def run(n: int, items: int, churn: float, seed: int) -> dict:
    rng = random.Random(seed)
    sessions = [lt.session(SETTINGS) for _ in range(n // 2)]
    nodes = [DHTNode(rpc_timeout=2.0, krpc=True) for _ in range(n - n // 2)]
    report: dict = {"nodes": n, "libtorrent": len(sessions), "swarm": len(nodes),
                    "items": items, "churn": churn}
    try:
        t0 = time.perf_counter()
        ports = [s.listen_port() for s in sessions]
        for s in sessions:
            for p in rng.sample(ports, 8):
                if p != s.listen_port():
                    s.add_dht_node(("127.0.0.1", p))
        for node in nodes:
            await node.listen()
        for node in nodes:
            await node.bootstrap([("127.0.0.1", p) for p in rng.sample(ports, 3)])
        for s in sessions:
            for node in rng.sample(nodes, 3):
                s.add_dht_node(node.address)
        await asyncio.sleep(5)  # libtorrent refreshes its table on its own schedule
        for node in nodes:
            await node.bootstrap([("127.0.0.1", rng.choice(ports))])
        report["bootstrap_s"] = time.perf_counter() - t0

        lt_items, sw_items = [], []
        rows_lt, rows_sw = [], []
        for i in range(items):
            key, pub, secret = _keypair()
            salt = b"bench-%d" % i
            value = b"lt-%d" % i
            s = rng.choice(sessions)
            rows_lt.append(await _lt_op(
                s, lambda s=s, secret=secret, pub=pub, value=value, salt=salt:
                s.dht_put_mutable_item(secret, pub, value, salt), lt.dht_put_alert,
                lambda a, pub=pub: bytes(a.public_key) == pub, lambda a: a.num_success))
            lt_items.append((pub, salt, value))
            key2, pub2, _ = _keypair()
            node = rng.choice(nodes)
            rows_sw.append(await _swarm_op(node, lambda node=node, key2=key2, salt=salt, i=i:
                                           node.put_mutable(key2, b"sw-%d" % i, salt=salt)))
            sw_items.append((pub2, salt, b"sw-%d" % i))
        report["put"] = {
            "libtorrent": _summary(rows_lt, lambda r: bool(r[2])),
            "swarm": _summary(rows_sw, lambda r: not isinstance(r[2], Exception))}

        async def gets(alive_sessions, alive_nodes) -> dict:
            rows_lt, rows_sw = [], []
            for pub, salt, value in lt_items + sw_items:
                s = rng.choice(alive_sessions)
                row = await _lt_op(
                    s, lambda s=s, pub=pub, salt=salt: s.dht_get_mutable_item(pub, salt),
                    lt.dht_mutable_item_alert,
                    # the first answer with the value, or the final (authoritative) one
                    lambda a, pub=pub, value=value: bytes(a.key) == pub
                    and (a.authoritative or a.item == value),
                    lambda a: a.item)
                rows_lt.append((*row[:2], row[2] == value))
                node = rng.choice(alive_nodes)
                row = await _swarm_op(node, lambda node=node, pub=pub, salt=salt:
                                      node.get_mutable(pub, salt))
                got = row[2]
                rows_sw.append((*row[:2], not isinstance(got, Exception) and got is not None
                                and got.value == value))
            return {"libtorrent": _summary(rows_lt, lambda r: r[2]),
                    "swarm": _summary(rows_sw, lambda r: r[2])}

        report["get"] = await gets(sessions, nodes)
        report["membership"] = await membership(rng, sessions, nodes, items)
        dead_s = rng.sample(sessions, int(churn * len(sessions)))
        dead_n = rng.sample(nodes, int(churn * len(nodes)))
        for s in dead_s:
            s.apply_settings({"enable_dht": False})
        await asyncio.gather(*(x.stop() for x in dead_n))
        report["get_after_churn"] = await gets([s for s in sessions if s not in dead_s],
                                               [x for x in nodes if x not in dead_n])
    finally:
        await asyncio.gather(*(x.stop() for x in nodes))
    return report


async def membership(rng: random.Random, sessions, nodes, lists: int,
                     members: int = 5) -> dict:
    """Topic announce and get_peers by swarm nodes among libtorrent nodes."""
    topic = b"swarm/members/" + rng.randbytes(20)
    target = topic_target(topic)
    announcers = rng.sample(nodes, min(members, len(nodes)))
    rows = [await _swarm_op(m, lambda m=m: m.announce(topic, b"r" * 200, ttl=600))
            for m in announcers]
    report = {"members": len(announcers),
              "announce": {"swarm": _summary(rows, lambda r: not isinstance(r[2], Exception))}}
    want = {m.peer_id for m in announcers}
    rows_sw, rows_lt = [], []
    for _ in range(lists):
        node = rng.choice(nodes)
        row = await _swarm_op(node, lambda node=node: node.get_peers(topic))
        rows_sw.append((*row[:2], not isinstance(row[2], Exception)
                        and {a.peer_id for a in row[2]} >= want))
        s = rng.choice(sessions)
        row = await _lt_op(s, lambda s=s: s.dht_get_peers(lt.sha1_hash(target)),
                           lt.dht_get_peers_reply_alert,
                           lambda a: bytes.fromhex(str(a.info_hash)) == target,
                           lambda a: len(a.peers()))
        rows_lt.append((*row[:2], bool(row[2])))
    report["get_peers"] = {"swarm": _summary(rows_sw, lambda r: r[2]),
                           "libtorrent": _summary(rows_lt, lambda r: r[2])}
    return report


def _amplification(tree: str | None) -> list[dict]:
    """bench/dht_amplification.py's rows, run on ``tree`` (this one when None)."""
    env = dict(os.environ, DHT_TREE=tree or "")
    out = subprocess.run([sys.executable, str(Path(__file__).parent / "dht_amplification.py"),
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    return json.loads(out.stdout)


def print_table(r: dict) -> None:
    print(f"Mainline DHT on loopback: {r['libtorrent']} libtorrent sessions + {r['swarm']} "
          f"swarm nodes (KRPC), {r['items']} mutable items per side, "
          f"bootstrap {r['bootstrap_s']:.1f} s")
    head = (f"{'operation':<30}{'who':<12}{'count':>6}{'median ms':>11}{'p90 ms':>9}"
            f"{'requests/op':>13}{'success':>9}")
    print(head)
    print("-" * len(head))
    for name, key in (("BEP 44 put (mutable)", "put"), ("BEP 44 get (mutable)", "get"),
                      (f"get after {int(r['churn'] * 100)}% killed", "get_after_churn")):
        for who in ("libtorrent", "swarm"):
            s = r[key][who]
            print(f"{name:<30}{who:<12}{s['count']:>6}{s['median_ms']:>11.1f}"
                  f"{s['p90_ms']:>9.1f}{s['requests_per_op']:>13.0f}"
                  f"{100 * s['success']:>8.1f}%")
    m = r.get("membership")
    if m:
        print(f"\nmembership: {m['members']} swarm members under one topic; swarm's get_peers "
              "succeeds with every signed entry, libtorrent's BEP 5 get_peers with any address")
        for name, key, who in (("topic announce", "announce", "swarm"),
                               ("topic get_peers", "get_peers", "swarm"),
                               ("BEP 5 get_peers (1st reply)", "get_peers", "libtorrent")):
            s = m[key][who]
            print(f"{name:<30}{who:<12}{s['count']:>6}{s['median_ms']:>11.1f}"
                  f"{s['p90_ms']:>9.1f}{s['requests_per_op']:>13.0f}"
                  f"{100 * s['success']:>8.1f}%")
    amp = r.get("amplification", {})
    before = {row["request"]: row for row in amp.get("before", [])}
    print("\nreply/request bytes from a never-seen address (before -> after):")
    for row in amp.get("after", []):
        old = before.get(row["request"])
        was = f"{old['ratio']:.1f} -> " if old else ""
        print(f"  {row['request']:<18}{was}{row['ratio']:.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=52)
    p.add_argument("--items", type=int, default=15)
    p.add_argument("--churn", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.add_argument("--before-tree", metavar="DIR",
                   help="also measure reflection amplification on an older checkout")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args.nodes, args.items, args.churn, args.seed))
    report["amplification"] = {"after": _amplification(None)}
    if args.before_tree:
        report["amplification"]["before"] = _amplification(args.before_tree)
        report["amplification"]["before_commit"] = subprocess.run(
            ["git", "-C", args.before_tree, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True).stdout.strip()
    print(json.dumps(report, indent=1) if args.json else "", end="")
    if not args.json:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
