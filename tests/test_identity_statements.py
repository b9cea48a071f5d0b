"""Statement encoding: canonical round trips, sizes, and fuzzed decoding that never crashes."""

from __future__ import annotations

import json
import struct

import pytest
from fido2 import cbor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from identity import (
    Action,
    AdminDelegation,
    BlockCommand,
    Charter,
    IdentityError,
    KickCommand,
    MalformedStatement,
    OwnerProof,
    OwnershipTransfer,
    PeerId,
    PeerKey,
    Revocation,
    Role,
    Signed,
    UnblockCommand,
    decode_statement,
    sign_as_peer,
    verify_chain,
)
from identity.encoding import decode
from identity.statements import MAX_CHARTER_ADMINS, MAX_NAME, PEER_SIGNING_PREFIX, Policy
from tests.identity_support import owner_key

CHARTER_ITEM_BUDGET = 850  # a charter + owner proof must fit one BEP 44 item (<= 1000 B)


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    return owner_key(tmp_path_factory.mktemp("owner"), "owner")


@pytest.fixture(scope="module")
def samples(key):
    swarm = PeerKey.generate().public_bytes
    peer = PeerKey.generate().peer_id
    common = {"swarm": swarm, "counter": 7}
    cmd = {"target": peer, "reason": "abuse", "role": Role.COORDINATOR, "term": 3, **common}
    return [
        Charter(name="lab", owners=(key.credential,), policy=Policy(True), admins=(peer,),
                **common),
        AdminDelegation(admin=peer, scope=(Action.BLOCK, Action.KICK), expires=10**9,
                        **common),
        OwnershipTransfer(new_owner=key.credential, **common),
        Revocation(kind="admin", target=peer.raw, reason="gone", **common),
        KickCommand(**cmd), BlockCommand(**cmd), UnblockCommand(**cmd),
    ]


def test_every_statement_round_trips_canonically(samples):
    for stmt in samples:
        data = stmt.encode()
        assert decode_statement(data) == stmt
        assert decode_statement(data).encode() == data
        assert len(stmt.digest()) == 32
    assert len({s.TYPE for s in samples}) == len(samples)
    assert len({s.digest() for s in samples}) == len(samples)


def test_signed_envelope_round_trips(key, samples):
    signed = Signed(samples[0], (key.proof(samples[0]),))
    again = Signed.decode(signed.encode())
    assert again == signed
    peer = PeerKey.generate()
    sig = sign_as_peer(samples[4], peer)
    assert Signed.decode(Signed(samples[4], (sig,)).encode()).proofs[0].verifies(samples[4])


def test_peer_signatures_are_domain_separated(samples):
    peer = PeerKey.generate()
    sig = sign_as_peer(samples[4], peer)
    assert not peer.peer_id.public_key().verify(sig.signature, samples[4].peer_signing_bytes())
    assert samples[4].peer_signing_bytes().startswith(PEER_SIGNING_PREFIX)
    with pytest.raises(Exception):  # noqa: B017 - cryptography's InvalidSignature
        peer.peer_id.public_key().verify(sig.signature, samples[4].encode())


def _charter_item(key, *, admins: int, name: str, backup=None) -> bytes:
    swarm = PeerKey.generate()
    owners = (key.credential,) + ((backup.credential,) if backup else ())
    charter = Charter(swarm=swarm.public_bytes, counter=1, name=name, owners=owners,
                      policy=Policy(False),
                      admins=tuple(sorted(PeerKey.generate().peer_id for _ in range(admins))))
    item = Signed(charter, (key.proof(charter),)).encode()
    verify_chain([item], swarm_pubkey=swarm.public_bytes, now=0)  # and it still verifies
    return item


def test_charter_with_owner_proof_fits_a_dht_item(key, tmp_path):
    """ES256 (the larger key): one owner key, or the worst case with a recovery key."""
    typical = _charter_item(key, admins=2, name="research lab")
    assert len(typical) < CHARTER_ITEM_BUDGET, len(typical)
    backup = owner_key(tmp_path, "backup")
    worst = _charter_item(key, admins=MAX_CHARTER_ADMINS, name="x" * MAX_NAME, backup=backup)
    assert len(worst) < CHARTER_ITEM_BUDGET, len(worst)


@pytest.mark.parametrize("mutate, why", [
    (lambda m: {**m, 9: 1}, "expected fields"),
    (lambda m: {k: v for k, v in m.items() if k != 3}, "expected fields"),
    (lambda m: {**m, 0: 99}, "unknown type"),
    (lambda m: {**m, 1: b"short"}, "32-byte"),
    (lambda m: {**m, 2: -1}, "unsigned"),
    (lambda m: {**m, 3: "x" * 100}, "at most"),
    (lambda m: {**m, 3: "tab\there"}, "printable"),
    (lambda m: {**m, 6: [b"\x02" * 32, b"\x01" * 32]}, "sorted"),
    (lambda m: {**m, 5: {1: True, 2: False}}, "require_hardware"),
    (lambda m: {**m, 4: [{**m[4][0], 2: {1: 2, 3: -7, -1: 1, -2: b"\x01" * 32,
                                         -3: b"\x01" * 32}}]}, "not on the curve"),
    (lambda m: {**m, 4: [{**m[4][0], 2: {1: 3, 3: -257, -1: b"n", -2: b"e"}}]}, "only ES256"),
    (lambda m: {**m, 4: [{**m[4][0], 5: True}]}, "hardware"),
    (lambda m: {**m, 4: []}, "owner keys"),
])
def test_semantic_garbage_is_refused(samples, mutate, why):
    m = cbor.decode(samples[0].encode())
    with pytest.raises(MalformedStatement, match=why):
        decode_statement(cbor.encode(mutate(m)))


def test_delegation_scope_cannot_exceed_the_admin_role(samples):
    m = cbor.decode(samples[1].encode())
    m[4] = ["appoint_admins"]
    with pytest.raises(MalformedStatement, match="cannot be given"):
        decode_statement(cbor.encode(m))


def test_commands_cannot_claim_worker_or_requester_roles(samples):
    m = cbor.decode(samples[4].encode())
    m[5] = "worker"
    with pytest.raises(MalformedStatement, match="owner, admin or coordinator"):
        decode_statement(cbor.encode(m))


@pytest.mark.parametrize("data, why", [
    (b"", "empty"),
    (b"\xa1\x00", "not valid CBOR"),                  # truncated map
    (b"\xa1\x00\x01\x00", "not valid CBOR|Extraneous|canonical"),
    (b"\xb8\x01\x00\x01", "canonical"),               # non-minimal map length
    (b"\xa2\x02\x00\x01\x00", "canonical"),           # map keys out of order
    (b"\xf6", "canonical"),                           # null
    (b"\xfb" + b"\x00" * 8, "canonical|not valid"),   # float
    (b"\xc1\x00", "not valid CBOR"),                  # tag
    (b"\x81" * 5000, "limit"),
])
def test_bad_cbor_is_refused(data, why):
    with pytest.raises(MalformedStatement, match=why):
        decode(data)


@given(st.binary(max_size=600))
@settings(max_examples=400, deadline=None)
def test_fuzzed_bytes_only_ever_raise_malformed(data):
    for parse in (decode_statement, Signed.decode):
        try:
            parse(data)
        except MalformedStatement:
            pass


cbor_values = st.recursive(
    st.integers(-(2**64) + 1, 2**64 - 1) | st.binary(max_size=40) | st.text(max_size=10)
    | st.booleans(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.integers(-3, 9), children, max_size=8),
    max_leaves=30)


@given(st.integers(0, 8), st.dictionaries(st.integers(0, 8), cbor_values, max_size=9))
@settings(max_examples=200, deadline=None)
def test_fuzzed_statement_maps_only_ever_raise_malformed(kind, fields):
    """Well-formed CBOR of the right shape but random content: refused cleanly, or valid."""
    data = cbor.encode({**fields, 0: kind})
    try:
        stmt = decode_statement(data)
    except MalformedStatement:
        return
    assert stmt.encode() == data


@pytest.fixture(scope="module")
def signed_charter(key):
    swarm = PeerKey.generate()
    charter = Charter(swarm=swarm.public_bytes, counter=1, name="lab", owners=(key.credential,),
                      policy=Policy(False), admins=())
    return swarm, Signed(charter, (key.proof(charter),)).encode()


@given(data=st.data())
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_mutated_signed_charters_never_crash_or_verify(data, signed_charter):
    swarm, good = signed_charter
    verify_chain([good], swarm_pubkey=swarm.public_bytes, now=0)
    cut = data.draw(st.integers(0, len(good) - 1))
    flip = data.draw(st.integers(0, len(good) - 1))
    bit = data.draw(st.integers(0, 7))
    for bad in (good[:cut], good[:flip] + bytes([good[flip] ^ (1 << bit)]) + good[flip + 1:]):
        try:
            verify_chain([bad], swarm_pubkey=swarm.public_bytes, now=0)
        except MalformedStatement:
            pass
        except IdentityError:  # every other refusal is one of ours, never a crash
            pass
        else:
            pytest.fail("a mutated charter verified")


peer_ids = st.binary(min_size=32, max_size=32).map(PeerId)
texts = st.text(max_size=20).filter(str.isprintable)


@given(peer_ids, st.integers(0, 2**53 - 1), texts,
       st.sampled_from([Role.OWNER, Role.ADMIN, Role.COORDINATOR]),
       st.integers(0, 2**53 - 1), st.sampled_from([KickCommand, BlockCommand, UnblockCommand]))
def test_generated_commands_round_trip(target, counter, reason, role, term, cls):
    """Any command that can be built decodes back to itself (construction checks the same)."""
    cmd = cls(swarm=b"\x05" * 32, counter=counter, target=target, reason=reason, role=role,
              term=term)
    assert decode_statement(cmd.encode()) == cmd


@pytest.mark.parametrize("kwargs, why", [
    ({"reason": "\x00"}, "printable"),
    ({"term": -1}, "unsigned"),
    ({"target": b"\x01" * 32}, "wrong type"),
])
def test_invalid_statements_cannot_be_built(samples, kwargs, why):
    fields = {"swarm": b"\x05" * 32, "counter": 1, "target": samples[4].target,
              "reason": "r", "role": Role.ADMIN, "term": 1, **kwargs}
    with pytest.raises(MalformedStatement, match=why):
        KickCommand(**fields)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["type", "challenge", "origin", "crossOrigin", "x"]),
                      children, max_size=5),
    max_leaves=20)


@given(json_values, st.integers(0, 255), st.binary(max_size=120))
@settings(max_examples=300, deadline=None)
def test_fuzzed_client_and_authenticator_data_only_raise_malformed(client, flags, auth_tail):
    auth_data = b"\x00" * 32 + struct.pack(">BI", flags, 5) + auth_tail
    m = {0: 0, 1: b"id", 2: auth_data, 3: json.dumps(client).encode(), 4: b"sig"}
    try:
        OwnerProof.from_cbor(m)
    except MalformedStatement:
        pass


def test_integer_challenge_is_refused_without_allocating():
    """Regression: fido2 would turn an integer challenge into bytes(26306674688)."""
    m = {0: 0, 1: b"id", 2: b"\x00" * 37,
         3: json.dumps({"type": "webauthn.get", "challenge": 26306674688,
                         "origin": "http://swarm.localhost"}).encode(), 4: b"sig"}
    with pytest.raises(MalformedStatement, match="challenge"):
        OwnerProof.from_cbor(m)
