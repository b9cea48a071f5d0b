"""Restarts and republishing: items, node id, key and neighbours survive in the data dir."""

from __future__ import annotations

import asyncio
import json

import pytest

from dht import DHTError, DHTNode
from identity import PeerKey

pytestmark = pytest.mark.timeout(60)


async def _network(n: int, **kw) -> list[DHTNode]:
    nodes = [DHTNode(rpc_timeout=2, **kw) for _ in range(n)]
    for node in nodes:
        await node.listen()
    for node in nodes[1:]:
        await node.bootstrap([nodes[0].address])
    return nodes


async def test_restart_keeps_items_identity_and_rejoins(tmp_path):
    others = await _network(5)
    data = tmp_path / "node"
    node = DHTNode(data_dir=data, rpc_timeout=2)
    await node.listen()
    await node.bootstrap([others[0].address])
    owner = PeerKey.generate()
    item = await others[1].put_mutable(owner, {b"kept": b"yes"}, salt=b"restart")
    target = await others[2].put_immutable(b"immutable too")
    assert node.store.get_mutable(item.target, node.clock()) == item  # k > nodes: all hold it
    old_id, old_peer = node.node_id, node.peer_id
    await node.stop()
    await node.stop()  # idempotent

    state = json.loads((data / "node.json").read_text())
    assert state["node_id"] == old_id.hex() and len(state["neighbours"]) == 5
    again = DHTNode(data_dir=data, rpc_timeout=2)
    try:
        assert (again.node_id, again.peer_id) == (old_id, old_peer)
        await again.listen()
        # its own store answers before it rejoins anything
        assert await again.get_mutable(owner.public_bytes, b"restart") == item
        assert await again.get_immutable(target) == b"immutable too"
        assert await again.bootstrap() == 5  # from the saved neighbours alone
        newer = await others[3].put_mutable(owner, b"v2", salt=b"restart")
        assert await again.get_mutable(owner.public_bytes, b"restart") == newer
    finally:
        await again.stop()
        for n in others:
            await n.stop()


async def test_publisher_reputs_after_items_expire_elsewhere(tmp_path):
    nodes = await _network(6)
    publisher = DHTNode(data_dir=tmp_path / "pub", rpc_timeout=2, republish_interval=3600)
    await publisher.listen()
    try:
        await publisher.bootstrap([nodes[0].address])
        owner = PeerKey.generate()
        item = await publisher.put_mutable(owner, b"keep me alive")
        for n in [*nodes, publisher]:  # two hours later every node has dropped it
            n.store.expire(n.clock() + 2 * 3600 + 1)
        assert await nodes[0].get_mutable(owner.public_bytes) is None
        await publisher.stop()
        # the publisher restarts from its data dir and re-puts once the hour has passed
        publisher = DHTNode(data_dir=tmp_path / "pub", rpc_timeout=2)
        await publisher.listen()
        await publisher.bootstrap()
        real = publisher.clock
        publisher.clock = lambda: real() + 3601
        await publisher.maintain_once()
        got = await asyncio.gather(*(n.get_mutable(owner.public_bytes) for n in nodes))
        assert got == [item] * len(nodes)
        # a newer seq from elsewhere ends the old publisher's re-puts
        await nodes[1].put_mutable(owner, b"superseded")
        publisher.clock = lambda: real() + 2 * 3601
        await publisher.maintain_once()
        assert publisher.store.due_published(real() + 10**6) == []
        assert (await nodes[2].get_mutable(owner.public_bytes)).value == b"superseded"
    finally:
        await publisher.stop()
        for n in nodes:
            await n.stop()


async def test_a_lone_node_is_its_own_dht():
    node = DHTNode()
    await node.listen()
    try:
        key = PeerKey.generate()
        await node.put_mutable(key, b"alone")
        assert (await node.get_mutable(key.public_bytes)).value == b"alone"
        await node.announce(b"t", b"me")
        assert [a.record for a in await node.get_peers(b"t")] == [b"me"]
        assert await node.bootstrap() == 0
    finally:
        await node.stop()


@pytest.mark.parametrize("name", ["get", "set", "set_digest", "save_state",
                                  "save_state_regularly", "load_state", "refresh_table"])
async def test_kademlias_unsafe_api_is_closed(name, tmp_path):
    node = DHTNode()
    with pytest.raises(DHTError):
        result = getattr(node, name)(str(tmp_path / "state"), 1)
        if asyncio.iscoroutine(result):
            await result
    await node.stop()
    assert list(tmp_path.iterdir()) == []
