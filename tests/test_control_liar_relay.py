"""Liar reports that reach a peer which is not the coordinator are passed on, once.

A reporter's idea of the coordinator can be stale (a handoff just happened; a client follows
the coordinator through the DHT): the report must still reach the coordinator.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgpack

from dht import DHTNode
from identity import PeerKey
from swarm.control.election import Candidate
from swarm.control.plane import ControlPlane
from swarm.control.state import CoordinatorState, LiarReport, seal
from tests.control_support import FakeNode

SWARM = bytes(range(20))




async def _plane(tmp_path, key: PeerKey) -> tuple[ControlPlane, list]:
    node = FakeNode(key=key, config=SimpleNamespace(swarm_id=SWARM, announce=True),
                 dht=DHTNode(key), accept_peer=None)
    plane = ControlPlane(node, b"\x01" * 32, tmp_path)
    sent: list = []

    async def send(peer, msg):
        sent.append((peer, msg))

    plane._send = send
    return plane, sent


def _report(reporter: PeerKey, liar: PeerKey, forwarded: bool = False) -> bytes:
    body = LiarReport(liar.peer_id, "wrong shard", b"receipts", forwarded).encode()
    return seal(reporter, SWARM, "liar", body)


async def test_a_follower_passes_a_liar_report_on_to_its_coordinator(tmp_path):
    """What the plane sends is captured at ``_send`` (no DHT): the forwarded report, to the
    coordinator. Delivery itself: test_runtime_untrusted_cli (real processes)."""
    me, coord, reporter, liar = (PeerKey.generate() for _ in range(4))
    plane, sent = await _plane(tmp_path, me)
    state = CoordinatorState(swarm=SWARM, term=3, seq=1, coordinator=coord.peer_id)
    plane.controller.members([Candidate(coord.peer_id, 1.0)], plane.clock())
    plane.addrs[coord.peer_id] = ("127.0.0.1", 2)
    assert plane.controller.heartbeat(state, coord.peer_id, plane.clock())
    await plane._on_message(reporter.peer_id, ("127.0.0.1", 1), _report(reporter, liar))
    await asyncio.gather(*list(plane._tasks))
    [(to, msg)] = [(p, m) for p, m in sent if msgpack.unpackb(m)["k"] == "liar"]
    assert to == coord.peer_id
    body = LiarReport.decode(msgpack.unpackb(msg)["b"])
    assert body.peer == liar.peer_id and body.relayed and body.evidence == b"receipts"
    # A report that was already passed on once is not passed on again (no loops).
    sent.clear()
    await plane._on_message(reporter.peer_id, ("127.0.0.1", 1),
                            _report(reporter, liar, forwarded=True))
    await asyncio.gather(*list(plane._tasks))
    assert not [m for _, m in sent if msgpack.unpackb(m)["k"] == "liar"]
