"""The charter in the DHT: published with the owner's FIDO2 proof, refused by every DHT node
when forged, verified against the owner pinned in the join URI; coordinator-state items."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from dht import DHTNode, ItemError
from identity import Charter, PeerKey, Policy, Signed
from swarm.control import charter
from swarm.control.state import BlockEntry, CoordinatorState, StateItem
from tests.identity_support import owner_key


async def _cluster(n: int, validators: bool = True) -> list[DHTNode]:
    nodes = []
    for _ in range(n):
        node = DHTNode(PeerKey.generate(), rpc_timeout=1.0)
        if validators:
            charter.register_validators(node)
        await node.listen(0)
        nodes.append(node)
    for node in nodes[1:]:
        await node.bootstrap([nodes[0].address])
    return nodes


async def _stop(nodes) -> None:
    await asyncio.gather(*(n.stop() for n in nodes))


@pytest.fixture
def owner(tmp_path):
    return owner_key(tmp_path, "owner")


def _genesis(swarm: PeerKey, owner, name="lab", counter=1) -> Signed:
    stmt = Charter(swarm=swarm.public_bytes, counter=counter, name=name,
                   owners=(owner.credential,), policy=Policy(), admins=())
    return owner.sign(stmt)


async def test_publish_and_fetch_verified(owner):
    nodes = await _cluster(4)
    try:
        swarm = PeerKey.generate()
        await charter.publish(nodes[0], swarm, _genesis(swarm, owner))
        rec = await charter.fetch(nodes[3], swarm.public_bytes,
                                  owner_pin=owner.credential.fingerprint())
        assert rec.ownership.name == "lab"
        assert rec.ownership.owner.same_key(owner.credential)
        assert not rec.ownership.owner.hardware_backed
    finally:
        await _stop(nodes)


async def test_forged_charters_are_refused_by_every_dht_node(owner, tmp_path):
    honest = await _cluster(3)
    attacker = DHTNode(PeerKey.generate(), rpc_timeout=1.0)  # runs no validators
    await attacker.listen(0)
    await attacker.bootstrap([honest[0].address])
    try:
        swarm = PeerKey.generate()
        good = _genesis(swarm, owner)
        # 1. Statement altered after the owner signed it.
        tampered = Signed(replace(good.statement, name="evil"), good.proofs)
        # 2. No owner proof at all.
        bare = Signed(good.statement, ())
        # 3. Signed by a key the charter does not list.
        other = owner_key(tmp_path, "other")
        wrong = Signed(good.statement, other.sign(good.statement).proofs)
        for forged in (tampered, bare, wrong):
            with pytest.raises(ItemError):
                await charter.publish(attacker, swarm, forged)
        # Honest nodes refuse it on store and never return it.
        for node in honest:
            assert await node.get_mutable(swarm.public_bytes, charter.CHARTER_SALT) is None
        with pytest.raises(charter.CharterError, match="no charter"):
            await charter.fetch(honest[1], swarm.public_bytes)
        # An honest node also refuses to publish it itself (validators run locally first).
        with pytest.raises(ItemError, match="charter refused"):
            await charter.publish(honest[0], swarm, tampered)
    finally:
        await _stop([*honest, attacker])


async def test_stolen_swarm_key_cannot_found_a_new_chain(owner, tmp_path):
    nodes = await _cluster(3)
    try:
        swarm = PeerKey.generate()
        thief = owner_key(tmp_path, "thief")
        await charter.publish(nodes[0], swarm, _genesis(swarm, thief, name="mine now"))
        with pytest.raises(charter.CharterError, match="pinned owner"):
            await charter.fetch(nodes[1], swarm.public_bytes,
                                owner_pin=owner.credential.fingerprint())
    finally:
        await _stop(nodes)


async def test_charter_update_chains_through_history_and_stale_seq_is_refused(owner):
    nodes = await _cluster(3)
    try:
        swarm = PeerKey.generate()
        first = _genesis(swarm, owner)
        await charter.publish(nodes[0], swarm, first)
        old_item = await nodes[0].get_mutable(swarm.public_bytes, charter.CHARTER_SALT)
        admin = PeerKey.generate()
        second = owner.sign(Charter(swarm=swarm.public_bytes, counter=2, name="lab",
                                    owners=(owner.credential,), policy=Policy(),
                                    admins=(admin.peer_id,)))
        target = await charter.append_history(nodes[0], first)
        await charter.publish(nodes[0], swarm, second, (target,))
        rec = await charter.fetch(nodes[2], swarm.public_bytes,
                                  owner_pin=owner.credential.fingerprint())
        assert admin.peer_id in rec.ownership.admins and rec.seq == old_item.seq + 1
        # Replaying the older (validly signed) item at its old seq is refused.
        with pytest.raises(ItemError) as err:
            await nodes[1].put_mutable(swarm, old_item.value, salt=charter.CHARTER_SALT,
                                       seq=old_item.seq)
        assert err.value.code == 302
    finally:
        await _stop(nodes)


async def test_coordinator_state_items_must_be_signed_by_their_coordinator():
    nodes = await _cluster(3)
    attacker = DHTNode(PeerKey.generate(), rpc_timeout=1.0)
    await attacker.listen(0)
    await attacker.bootstrap([nodes[0].address])
    try:
        sid = bytes(range(20))
        coord = PeerKey.generate()
        good = CoordinatorState(sid, 1, 1, coord.peer_id)
        await nodes[0].put_mutable(coord, good.encode_item(), salt=charter.state_salt(sid),
                                   seq=1)
        item = await nodes[2].get_mutable(coord.public_bytes, charter.state_salt(sid))
        assert StateItem.decode(item.value).head == good
        # A state naming another coordinator, under the attacker's key: refused.
        mallory = PeerKey.generate()
        lie = good.with_block(BlockEntry(coord.peer_id, "coup"))
        with pytest.raises(ItemError):
            await attacker.put_mutable(mallory, lie.encode_item(),
                                       salt=charter.state_salt(sid), seq=lie.seq)
        for node in nodes:
            assert await node.get_mutable(mallory.public_bytes, charter.state_salt(sid)) is None
    finally:
        await _stop([*nodes, attacker])
