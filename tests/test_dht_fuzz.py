"""Hypothesis feeds the RPC layer random and mutated messages.

Nothing may escape as an exception, every request gets a packable reply, nothing invalid is
stored, and the honest node next door stays in the routing table and keeps getting answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
import umsgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dht import Announcement, DHTNode, MutableItem
from dht.announce import topic_target
from dht.messages import Envelope
from dht.wire import REQUESTS, announcement_to_wire, mutable_to_wire
from identity import PeerKey

FUZZ_ADDR = ("127.0.0.1", 9)  # discard port: nothing answers the pings it may trigger
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

packable = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=70),
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=15,
)


@pytest.fixture(scope="module")
def env():
    loop = asyncio.new_event_loop()
    target, honest = DHTNode(rpc_timeout=0.5), DHTNode(rpc_timeout=0.5)
    loop.run_until_complete(target.listen())
    loop.run_until_complete(honest.listen())
    loop.run_until_complete(honest.bootstrap([target.address]))
    key = PeerKey.generate()
    item = MutableItem.create(key, {b"v": 1}, 5, b"salt")
    loop.run_until_complete(honest.put_mutable(key, {b"v": 1}, salt=b"salt", seq=5))
    yield loop, target, honest, item
    loop.run_until_complete(target.stop())
    loop.run_until_complete(honest.stop())
    loop.close()


def _dispatch(loop, node, request, addr=FUZZ_ADDR):
    reply = loop.run_until_complete(node.protocol.dispatch(request, addr))
    umsgpack.packb(reply)  # whatever the handler returns must go on the wire
    return reply


def _honest_still_fine(loop, target, honest, item):
    assert honest.node_id in {n.id for n in target.protocol.router.contacts()}
    got = loop.run_until_complete(honest.get_mutable(item.pubkey, item.salt))
    assert got == item
    assert target.store.get_mutable(item.target, target.clock()) == item


@FUZZ
@given(st.binary(max_size=300))
def test_random_datagrams(env, data):
    loop, target, honest, item = env
    for datagram in (data, b"\x00" + os.urandom(20) + data, b"\x01" + os.urandom(20) + data):
        loop.run_until_complete(target.protocol._solve_datagram(datagram, FUZZ_ADDR))


@FUZZ
@given(st.sampled_from(sorted(REQUESTS)) | st.text(max_size=10),
       st.lists(packable, max_size=6), st.booleans())
def test_random_requests(env, name, args, real_id):
    loop, target, honest, item = env
    if real_id and args:
        args[0] = os.urandom(20)
    reply = _dispatch(loop, target, [name, args])
    assert isinstance(reply, dict | list | bytes)
    if isinstance(reply, dict) and "error" in reply:
        assert isinstance(reply["error"][0], int)


def _valid_requests(target: DHTNode, item: MutableItem) -> list[list]:
    """One valid request of each kind from FUZZ_ADDR (with a real token)."""
    now = target.clock()
    nid = os.urandom(20)
    key = PeerKey.generate()
    newer = MutableItem.create(key, b"fuzz", 1, b"f")
    tok_m = target.tokens.issue(FUZZ_ADDR, newer.target, now)
    imm = b"5:fuzzy"
    tok_i = target.tokens.issue(FUZZ_ADDR, hashlib.sha1(imm).digest(), now)
    ann = Announcement.create(key, key.peer_id, b"topic", b"rec", now + 60)
    tok_a = target.tokens.issue(FUZZ_ADDR, topic_target(b"topic"), now)
    env = Envelope.seal(key, key.peer_id, target.node_id, b"hi", now)
    return [
        ["ping", [nid]],
        ["find_node", [nid, item.target]],
        ["get", [nid, item.target]],
        ["put", [nid, tok_m, "m", mutable_to_wire(newer), None]],
        ["put", [nid, tok_i, "i", imm, None]],
        ["get_peers", [nid, b"topic", b""]],
        ["announce", [nid, tok_a, b"topic", announcement_to_wire(ann)]],
        ["message", [nid, env.to_wire()]],
    ]


def _mutate(value, data):
    """Replace, truncate or bit-flip one leaf of a request."""
    if isinstance(value, list) and value:
        i = data.draw(st.integers(0, len(value) - 1))
        copy = list(value)
        copy[i] = _mutate(value[i], data)
        return copy
    how = data.draw(st.sampled_from(["replace", "flip", "truncate", "grow"]))
    if how == "replace":
        return data.draw(packable)
    if isinstance(value, bytes) and value:
        if how == "flip":
            i = data.draw(st.integers(0, len(value) - 1))
            return value[:i] + bytes([value[i] ^ 1 << data.draw(st.integers(0, 7))]) + value[i + 1:]
        if how == "truncate":
            return value[: data.draw(st.integers(0, len(value) - 1))]
        return value + data.draw(st.binary(min_size=1, max_size=2000))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value + data.draw(st.sampled_from([-1, 1, 2**64, -(2**63)]))
    return data.draw(packable)


@FUZZ
@given(st.data())
def test_mutated_valid_requests(env, data):
    loop, target, honest, item = env
    for request in _valid_requests(target, item):
        mutated = _mutate(request, data)
        reply = _dispatch(loop, target, mutated)
        assert isinstance(reply, dict | list | bytes)
    # nothing invalid got in: every stored item still verifies
    for (t,) in target.store._db.execute("SELECT target FROM mutable").fetchall():
        assert target.store.get_mutable(t, target.clock()) is not None


def test_valid_requests_are_accepted(env):
    """The mutation test's starting points really are valid (so mutations test something)."""
    loop, target, honest, item = env
    for request in _valid_requests(target, item):
        reply = _dispatch(loop, target, request)
        assert not (isinstance(reply, dict) and "error" in reply), (request[0], reply)


def test_honest_node_survives_the_fuzzing(env):
    loop, target, honest, item = env
    _honest_still_fine(loop, target, honest, item)
