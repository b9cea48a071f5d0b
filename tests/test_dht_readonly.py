"""Read-only DHT nodes (BEP 43): a short-lived client leaves no dead contact behind.

Before, every `swarm status`, one-shot submit or `swarm dht get` joined the members' routing
tables like a member and stayed there after it exited: each member lookup that met it then
waited out an RPC timeout (issue 43, and failover claims in issue 48).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from dht import DHTNode, krpc
from identity import PeerKey
from tests.conftest import subprocess_env, swarm_cmd
from tests.dht_support import loopback_dht

pytestmark = pytest.mark.timeout(120)


class _Recording:
    """A node's UDP transport that notes where each datagram goes."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.sent: list[tuple[str, int]] = []

    def sendto(self, data: bytes, addr=None) -> None:
        self.sent.append((str(addr[0]), int(addr[1])))
        self.inner.sendto(data, addr)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _contacts(node: DHTNode) -> set[tuple[str, int]]:
    return {(c.ip, c.port) for c in node.protocol.router.contacts()}


async def _settle(nodes: list[DHTNode]) -> None:
    """Wait for the members' background work (challenge pings, write-backs) to end."""
    for n in nodes:
        await asyncio.wait_for(n.settle(), 30)


async def _client_round(members: list[DHTNode], read_only: bool) -> tuple[str, int]:
    """A client that joins, puts and gets an item, then exits; its address."""
    client = DHTNode(rpc_timeout=2, read_only=read_only)
    try:
        await client.listen(0, "127.0.0.1")
        await client.bootstrap([members[-1].address])
        key = PeerKey.generate()
        await client.put_mutable(key, b"from a passing client", salt=b"ro")
        assert (await client.get_mutable(key.public_bytes, b"ro")).value == \
            b"from a passing client"
        address = client.address
    finally:
        await client.stop()
    # the write landed on the members (a read-only node's own store is nobody's copy)
    assert (await members[0].get_mutable(key.public_bytes, b"ro")).value == \
        b"from a passing client"
    return address


async def test_a_read_only_clients_get_and_put_leave_no_contact_behind():
    async with loopback_dht(5, rpc_timeout=2) as members:
        gone = await _client_round(members, read_only=True)
        await _settle(members)
        assert all(gone not in _contacts(m) for m in members)
        # the same client, not read-only, does become a contact (what the check can see)
        seen = await _client_round(members, read_only=False)
        await _settle(members)
        assert any(seen in _contacts(m) for m in members)


async def test_a_members_lookup_after_a_read_only_client_left_sends_it_nothing():
    async with loopback_dht(5, rpc_timeout=2) as members:
        gone = await _client_round(members, read_only=True)
        await _settle(members)
        recorders = [_Recording(m.protocol.transport) for m in members]
        for m, r in zip(members, recorders, strict=True):
            m.protocol.transport = r
        for m in members:
            await m.get_mutable(PeerKey.generate().public_bytes)
            await m.maintain_once()  # bucket refresh: lookups over the whole table
        await _settle(members)
        assert sum(len(r.sent) for r in recorders) > 0
        assert all(gone not in r.sent for r in recorders)


async def test_a_read_only_node_answers_no_queries():
    async with loopback_dht(2, rpc_timeout=1) as members:
        client = DHTNode(rpc_timeout=1, read_only=True)
        try:
            await client.listen(0, "127.0.0.1")
            await client.bootstrap([members[0].address])
            ok, _ = await members[0].protocol.request(client.address, "ping")
            assert not ok
            ok, _ = await members[0].protocol._krpc_request(client.address, "ping", ())
            assert not ok
            ok, reply = await client.protocol.request(members[1].address, "ping")
            assert ok and reply == members[1].node_id  # while it asks and gets answers
        finally:
            await client.stop()


async def test_a_spoofed_read_only_query_removes_no_contact():
    """The flag is the sender's word about itself: it keeps the sender out of the table,
    never takes an existing contact out (a forged source address could name anyone)."""
    async with loopback_dht(2, rpc_timeout=1) as (a, b):
        await _settle([a, b])
        assert b.address in _contacts(a)
        reply = await a.protocol.dispatch(["ping", [b.node_id], {"ro": 1}], b.address)
        assert reply == a.node_id
        assert a.protocol.router.by_address(b.address) is not None


def test_krpc_queries_carry_bep43s_ro_flag():
    q = krpc.query(b"aa", "get", {b"id": b"x" * 20, b"target": b"t" * 20}, ro=True)
    assert b"2:roi1e" in q and krpc.decode(q).ro
    plain = krpc.query(b"aa", "ping", {b"id": b"x" * 20})
    assert b"2:ro" not in plain and not krpc.decode(plain).ro


async def _swarm(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *swarm_cmd(*args), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, env=subprocess_env())
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.system
async def test_swarm_dht_get_and_put_processes_leave_no_contact_behind():
    async with loopback_dht(4, rpc_timeout=2) as members:
        ours = {m.address for m in members}
        boot = ["--bootstrap", f"127.0.0.1:{members[0].address[1]}", "--json"]
        rc, out, err = await _swarm("dht", "put", "--value", '"passing by"', *boot)
        assert rc == 0, err
        rc, out, err = await _swarm("dht", "get", "--target", json.loads(out)["target"], *boot)
        assert rc == 0 and json.loads(out)["value"] == "passing by", err
        await _settle(members)
        assert all(_contacts(m) <= ours for m in members), [_contacts(m) - ours
                                                             for m in members]
