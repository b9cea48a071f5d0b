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

from dht import Announcement, DHTNode, MutableItem, errors
from dht.announce import topic_target
from dht.messages import Envelope
from dht.wire import REQUESTS, announcement_to_wire, mutable_to_wire
from identity import PeerKey
from tests.conftest import DEAD_ADDR

FUZZ_ADDR = DEAD_ADDR  # nothing answers the pings it may trigger
KNOWN_CODES = {errors.GENERIC, errors.SERVER, errors.PROTOCOL, 204, errors.VALUE_TOO_BIG,
               errors.BAD_SIGNATURE, errors.SALT_TOO_BIG, errors.CAS_MISMATCH,
               errors.SEQ_TOO_LOW}
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


def _check_reply(request, reply) -> None:
    """A reply fit for the wire that a handler produced without failing: a result, a retry
    token, or a refusal with a known error number (a handler that raised is answered with
    202, "server error", so that code means a crash the fuzzing found)."""
    assert isinstance(reply, dict | list | bytes), (request, reply)
    if isinstance(reply, dict) and "error" in reply:
        code, message = reply["error"]
        assert code in KNOWN_CODES and isinstance(message, str), (request, reply)
        assert message != "server error", ("a handler raised", request)
    well_formed = (isinstance(request, list) and len(request) == 2
                   and isinstance(request[0], str) and isinstance(request[1], list))
    if not well_formed:
        assert reply == {"error": [errors.PROTOCOL, "malformed request"]}, (request, reply)
    elif request[0] not in REQUESTS:
        assert reply["error"][0] == 204, (request, reply)


def _fuzz_datagrams(env, data):
    loop, target, honest, item = env
    for datagram in (data, b"\x00" + os.urandom(20) + data, b"\x01" + os.urandom(20) + data):
        loop.run_until_complete(target.protocol._solve_datagram(datagram, FUZZ_ADDR))


def _fuzz_requests(env, name, args, real_id):
    loop, target, honest, item = env
    if real_id and args:
        args[0] = os.urandom(20)
    _check_reply([name, args], _dispatch(loop, target, [name, args]))


REQUEST_ARGS = (st.sampled_from(sorted(REQUESTS)) | st.text(max_size=10),
                st.lists(packable, max_size=6), st.booleans())
test_random_datagrams = FUZZ(given(st.binary(max_size=300))(_fuzz_datagrams))
test_random_requests = FUZZ(given(*REQUEST_ARGS)(_fuzz_requests))


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


def _fuzz_mutations(env, data):
    loop, target, honest, item = env
    for request in _valid_requests(target, item):
        mutated = _mutate(request, data)
        _check_reply(mutated, _dispatch(loop, target, mutated))
    # nothing invalid got in: every stored item still verifies
    for (t,) in target.store._db.execute("SELECT target FROM mutable").fetchall():
        assert target.store.get_mutable(t, target.clock()) is not None


test_mutated_valid_requests = FUZZ(given(st.data())(_fuzz_mutations))


def test_valid_requests_are_accepted(env):
    """The mutation test's starting points really are valid (so mutations test something)."""
    loop, target, honest, item = env
    for request in _valid_requests(target, item):
        reply = _dispatch(loop, target, request)
        assert not (isinstance(reply, dict) and "error" in reply), (request[0], reply)


def test_honest_node_survives_the_fuzzing(env):
    """Fuzzes the target itself (a shorter run of each fuzz test above), so that it checks
    the same whether it runs alone, first or last."""
    loop, target, honest, item = env
    short = settings(FUZZ, max_examples=40)
    short(given(st.binary(max_size=300))(_fuzz_datagrams))(env)
    short(given(*REQUEST_ARGS)(_fuzz_requests))(env)
    short(given(st.data())(_fuzz_mutations))(env)
    _honest_still_fine(loop, target, honest, item)


async def test_a_request_read_as_the_node_stops_is_dropped_without_an_error(caplog):
    """A datagram read just before the node stopped, handled just after (its store closed):
    the handler raised 'Cannot operate on a closed database' and the node logged it as an
    error with its traceback, which a CLI command printed on exit (the README tour's
    `swarm kick` failed CI so). A stopping node now drops what it has not handled yet."""
    node = DHTNode()
    port = await node.listen()
    request = b"\x00" + os.urandom(20) + umsgpack.packb(["get", [os.urandom(20),
                                                                  os.urandom(20)]])
    protocol = node.protocol
    await node.stop()
    with caplog.at_level("ERROR", logger="dht"):
        # the task datagram_received made for it runs once stop() has closed the store
        await protocol._solve_datagram(request, ("127.0.0.1", port))
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
