"""verify_chain / apply / verify_command: the accept path and every reject case."""

from __future__ import annotations

from dataclasses import replace

import pytest

from identity import (
    Action,
    AdminDelegation,
    BlockCommand,
    ChainError,
    Charter,
    CounterRegression,
    ExpiredDelegation,
    KickCommand,
    MalformedStatement,
    NotAuthorized,
    OwnershipTransfer,
    PeerKey,
    PolicyViolation,
    ReplayError,
    Revocation,
    Role,
    SignatureError,
    Signed,
    TamperedStatement,
    UnblockCommand,
    WrongRelyingParty,
    WrongSwarm,
    sign_as_peer,
    verify_chain,
    verify_command,
)
from identity.statements import Policy
from tests.identity_support import owner_key

NOW = 1_800_000_000


@pytest.fixture
def world(tmp_path):
    class World:
        swarm = PeerKey.generate()
        other_swarm = PeerKey.generate()
        a = owner_key(tmp_path, "a")
        b = owner_key(tmp_path, "b")
        admin = PeerKey.generate()
        peer = PeerKey.generate()

        def charter(self, counter=1, owners=None, admins=(), policy=None, name="lab",
                    swarm=None):
            return Charter(swarm=(swarm or self.swarm).public_bytes, counter=counter,
                           name=name, owners=owners or (self.a.credential,), policy=policy or Policy(),
                           admins=tuple(sorted(admins)))

        def genesis(self, **kw):
            return self.a.sign(self.charter(**kw))

        def verify(self, chain, **kw):
            return verify_chain(chain, swarm_pubkey=self.swarm.peer_id, now=NOW, **kw)

    return World()


def test_full_chain_is_accepted(world):
    w = world
    chain = [w.genesis(admins=[w.admin.peer_id])]
    delegated = PeerKey.generate().peer_id
    chain.append(w.a.sign(AdminDelegation(swarm=w.swarm.public_bytes, counter=2,
                                          admin=delegated, scope=(Action.KICK,),
                                          expires=NOW + 3600)))
    chain.append(w.a.sign(w.charter(counter=3, name="lab2", policy=Policy(),
                                    admins=[w.admin.peer_id])))
    chain.append(w.a.sign(Revocation(swarm=w.swarm.public_bytes, counter=4, kind="admin",
                                     target=w.admin.peer_id.raw, reason="left")))
    transfer = OwnershipTransfer(swarm=w.swarm.public_bytes, counter=5,
                                 new_owner=w.b.credential)
    chain.append(Signed(transfer, (w.a.proof(transfer), w.b.proof(transfer))))
    chain.append(w.b.sign(w.charter(counter=6, owners=(w.b.credential,), name="bob's")))

    own = w.verify([s.encode() for s in chain])  # as bytes, the way they are stored
    assert own.owner.same_key(w.b.credential) and len(own.owners) == 1
    assert own.name == "bob's" and own.counter == 6
    assert w.admin.peer_id not in own.admins
    assert own.admin_scope(delegated, NOW) == {Action.KICK}
    assert own.admin_scope(delegated, NOW + 3600) == frozenset()
    assert set(own.sign_counts) == {w.b.credential.credential_id}


def test_owner_pin_refuses_a_charter_made_with_a_stolen_swarm_key(world):
    w = world
    pin = w.a.credential.fingerprint()
    assert w.verify([w.genesis()], owner_pin=pin).owner.same_key(w.a.credential)
    thief = w.b.sign(w.charter(owners=(w.b.credential,)))
    with pytest.raises(NotAuthorized, match="pinned"):
        w.verify([thief], owner_pin=pin)


def test_empty_chain_and_chain_not_starting_with_a_charter(world):
    w = world
    with pytest.raises(WrongSwarm, match="empty"):
        w.verify([])
    delegation = w.a.sign(AdminDelegation(swarm=w.swarm.public_bytes, counter=1,
                                          admin=w.admin.peer_id, scope=(Action.KICK,),
                                          expires=NOW + 10))
    with pytest.raises(WrongSwarm, match="starts with a Charter"):
        w.verify([delegation])


def test_charter_of_another_swarm(world):
    with pytest.raises(WrongSwarm, match="another swarm"):
        world.verify([world.genesis(swarm=world.other_swarm)])


def test_statement_of_another_swarm_in_the_chain(world):
    w = world
    genesis = w.genesis()
    foreign = w.a.sign(w.charter(counter=2, swarm=w.other_swarm))
    with pytest.raises(WrongSwarm, match="statement 1"):
        w.verify([genesis, foreign])


def test_tampered_statement_in_the_chain(world):
    w = world
    signed = w.genesis()
    tampered = Signed(replace(signed.statement, name="mine now"), signed.proofs)
    with pytest.raises(TamperedStatement, match="statement 0"):
        w.verify([tampered])


def test_counter_replay(world):
    w = world
    genesis = w.genesis()
    again = w.a.sign(w.charter(counter=1, name="same counter"))
    with pytest.raises(ReplayError, match="counter 1 is not above 1"):
        w.verify([genesis, again])
    with pytest.raises(ReplayError):
        w.verify([genesis, genesis])


def test_sign_counter_regression_in_the_chain(world):
    w = world
    genesis = w.genesis()
    second = w.charter(counter=3, name="later")
    second_signed = w.a.sign(second)           # signed first: lower sign counter
    first_signed = w.a.sign(w.charter(counter=2, name="earlier"))
    with pytest.raises(CounterRegression, match="statement 2"):
        w.verify([genesis, first_signed, second_signed])


def test_wrong_rp_id_in_the_chain(world, tmp_path):
    w = world
    evil = owner_key(tmp_path, "evil", rp_id="evil.localhost", origin="http://evil.localhost")
    charter = w.charter(owners=(evil.credential,))
    signed = evil.sign(charter, rp_id="evil.localhost", origin="http://evil.localhost")
    with pytest.raises(WrongRelyingParty):
        w.verify([signed])


def test_transfer_signed_by_someone_other_than_the_owner(world, tmp_path):
    w = world
    mallory = owner_key(tmp_path, "mallory")
    transfer = OwnershipTransfer(swarm=w.swarm.public_bytes, counter=2,
                                 new_owner=mallory.credential)
    forged = Signed(transfer, (mallory.proof(transfer), mallory.proof(transfer)))
    with pytest.raises(NotAuthorized, match="not signed by a current owner"):
        w.verify([w.genesis(), forged])


def test_transfer_needs_the_new_owners_acceptance(world):
    w = world
    transfer = OwnershipTransfer(swarm=w.swarm.public_bytes, counter=2,
                                 new_owner=w.b.credential)
    with pytest.raises(NotAuthorized, match="two owner proofs"):
        w.verify([w.genesis(), Signed(transfer, (w.a.proof(transfer),))])
    with pytest.raises(NotAuthorized, match="not accepted"):
        w.verify([w.genesis(), Signed(transfer, (w.a.proof(transfer), w.a.proof(transfer)))])


def test_old_owner_is_powerless_after_a_transfer(world):
    w = world
    genesis = w.genesis()
    transfer = OwnershipTransfer(swarm=w.swarm.public_bytes, counter=2,
                                 new_owner=w.b.credential)
    handed = Signed(transfer, (w.a.proof(transfer), w.b.proof(transfer)))
    grab_back = w.a.sign(w.charter(counter=3, name="still mine"))
    with pytest.raises(NotAuthorized):
        w.verify([genesis, handed, grab_back])


def test_expired_delegation(world):
    w = world
    genesis = w.genesis()
    late = w.a.sign(AdminDelegation(swarm=w.swarm.public_bytes, counter=2,
                                    admin=w.admin.peer_id, scope=(Action.BLOCK,),
                                    expires=NOW - 1))
    with pytest.raises(ExpiredDelegation, match="expired"):
        w.verify([genesis, late])


def test_truncated_cbor_in_the_chain(world):
    w = world
    data = w.genesis().encode()
    with pytest.raises(MalformedStatement, match="statement 0"):
        w.verify([data[:-7]])


def test_require_hardware_refuses_the_software_key(world):
    w = world
    with pytest.raises(PolicyViolation, match="hardware"):
        w.verify([w.genesis(policy=Policy(require_hardware=True))])


def test_charter_update_cannot_drop_an_owner_key(world):
    w = world
    genesis = w.a.sign(w.charter(owners=(w.a.credential, w.b.credential)))
    drop = w.a.sign(w.charter(counter=2, owners=(w.a.credential,)))
    with pytest.raises(NotAuthorized, match="not drop"):
        w.verify([genesis, drop])


def test_peer_signature_cannot_make_ownership_statements(world):
    w = world
    update = w.charter(counter=2, name="coup")
    with pytest.raises(NotAuthorized, match="owner FIDO2"):
        w.verify([w.genesis(), Signed(update, (sign_as_peer(update, w.admin),))])


def test_lost_key_recovery_with_the_backup_key(world):
    """Genesis lists A and backup B; A is lost; B revokes A; A can no longer act."""
    w = world
    genesis = w.a.sign(w.charter(owners=(w.a.credential, w.b.credential)))
    revoke = w.b.sign(Revocation(swarm=w.swarm.public_bytes, counter=2, kind="owner_key",
                                 target=w.a.credential.credential_id, reason="lost"))
    own = w.verify([genesis, revoke])
    assert [c.credential_id for c in own.owners] == [w.b.credential.credential_id]
    stale = w.a.sign(w.charter(counter=3, owners=(w.b.credential,), name="thief"))
    with pytest.raises(NotAuthorized, match="current owner"):
        w.verify([genesis, revoke, stale])


def test_cannot_revoke_the_last_owner_key_or_a_non_admin(world):
    w = world
    genesis = w.genesis()
    last = w.a.sign(Revocation(swarm=w.swarm.public_bytes, counter=2, kind="owner_key",
                               target=w.a.credential.credential_id, reason="oops"))
    with pytest.raises(ChainError, match="last owner key"):
        w.verify([genesis, last])
    nobody = w.a.sign(Revocation(swarm=w.swarm.public_bytes, counter=2, kind="admin",
                                 target=w.peer.peer_id.raw, reason="?"))
    with pytest.raises(ChainError, match="not an admin"):
        w.verify([genesis, nobody])


def test_commands_are_not_chain_statements(world):
    w = world
    genesis = w.genesis()
    kick = w.a.sign(KickCommand(swarm=w.swarm.public_bytes, counter=2, target=w.peer.peer_id,
                                reason="x", role=Role.OWNER, term=1))
    with pytest.raises(ChainError, match="verify_command"):
        w.verify([genesis, kick])


# -- verify_command ------------------------------------------------------------------------


def _cmd(w, cls, role, term=5, counter=1):
    return cls(swarm=w.swarm.public_bytes, counter=counter, target=w.peer.peer_id,
               reason="spam", role=role, term=term)


def test_admin_coordinator_and_owner_commands(world):
    w = world
    own = w.verify([w.genesis(admins=[w.admin.peer_id])])
    kick = _cmd(w, KickCommand, Role.ADMIN)
    assert verify_command(Signed(kick, (sign_as_peer(kick, w.admin),)), own,
                          now=NOW) is Role.ADMIN
    block = _cmd(w, BlockCommand, Role.COORDINATOR)
    coord = PeerKey.generate()
    signed = Signed(block, (sign_as_peer(block, coord),))
    assert verify_command(signed, own, now=NOW, coordinator=coord.peer_id) is Role.COORDINATOR
    with pytest.raises(NotAuthorized, match="not the coordinator"):
        verify_command(signed, own, now=NOW, coordinator=w.admin.peer_id)
    with pytest.raises(ReplayError, match="term"):
        verify_command(signed, own, now=NOW, coordinator=coord.peer_id, min_term=6)
    unblock = _cmd(w, UnblockCommand, Role.OWNER)
    assert verify_command(w.a.sign(unblock), own, now=NOW) is Role.OWNER


def test_command_rejections(world):
    w = world
    delegated = PeerKey.generate()
    own = w.verify([
        w.genesis(),
        w.a.sign(AdminDelegation(swarm=w.swarm.public_bytes, counter=2,
                                 admin=delegated.peer_id, scope=(Action.KICK,),
                                 expires=NOW + 60))])
    kick = _cmd(w, KickCommand, Role.ADMIN)
    block = _cmd(w, BlockCommand, Role.ADMIN)
    assert verify_command(Signed(kick, (sign_as_peer(kick, delegated),)), own,
                          now=NOW) is Role.ADMIN
    with pytest.raises(NotAuthorized, match="does not cover block"):
        verify_command(Signed(block, (sign_as_peer(block, delegated),)), own, now=NOW)
    with pytest.raises(ExpiredDelegation):
        verify_command(Signed(kick, (sign_as_peer(kick, delegated),)), own, now=NOW + 61)
    with pytest.raises(NotAuthorized, match="not an admin"):
        verify_command(Signed(kick, (sign_as_peer(kick, w.peer),)), own, now=NOW)
    forged = sign_as_peer(kick, w.peer)
    forged = replace(forged, signer=delegated.peer_id)
    with pytest.raises(SignatureError):
        verify_command(Signed(kick, (forged,)), own, now=NOW)
    as_owner = _cmd(w, KickCommand, Role.OWNER)
    with pytest.raises(NotAuthorized, match="FIDO2"):
        verify_command(Signed(as_owner, (sign_as_peer(as_owner, delegated),)), own, now=NOW)
    mallory_key = w.b
    with pytest.raises(NotAuthorized, match="current owner"):
        verify_command(mallory_key.sign(as_owner), own, now=NOW)
    foreign = replace(kick, swarm=w.other_swarm.public_bytes)
    with pytest.raises(WrongSwarm):
        verify_command(Signed(foreign, (sign_as_peer(foreign, delegated),)), own, now=NOW)
