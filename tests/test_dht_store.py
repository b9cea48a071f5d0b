"""The sans-IO parts: store rules with a fed clock, tokens, replay guard, validators."""

from __future__ import annotations

import pytest

from dht import Announcement, ItemError, MutableItem
from dht.messages import Envelope, ReplayGuard
from dht.store import ItemStore, Published
from dht.tokens import TokenIssuer
from dht.validators import Validators
from identity import PeerKey

T0 = 1_000_000.0


def _code(fn) -> int:
    with pytest.raises(ItemError) as info:
        fn()
    return info.value.code


def test_mutable_rules_and_expiry():
    store = ItemStore(item_ttl=100)
    key = PeerKey.generate()
    v1, v2 = MutableItem.create(key, b"a", 1), MutableItem.create(key, b"b", 2)
    store.put_mutable(v1, None, T0)
    assert store.get_mutable(v1.target, T0) == v1
    store.put_mutable(v2, None, T0)
    assert _code(lambda: store.put_mutable(v1, None, T0)) == 302
    assert _code(lambda: store.put_mutable(MutableItem.create(key, b"c", 3), 1, T0)) == 301
    assert store.get_mutable(v1.target, T0).seq == 2
    # the same item again only refreshes its expiry
    store.put_mutable(v2, None, T0 + 90)
    assert store.get_mutable(v1.target, T0 + 150) == v2
    assert store.get_mutable(v1.target, T0 + 191) is None
    assert store.expire(T0 + 191) == 1
    assert store.counts()["mutable"] == 0


def test_immutable_and_capacity():
    store = ItemStore(item_ttl=100, max_items=2)
    t1 = store.put_immutable(b"3:one", T0)
    store.put_immutable(b"3:two", T0)
    assert store.get_immutable(t1, T0) == b"3:one"
    assert _code(lambda: store.put_immutable(b"5:three", T0)) == 202
    store.put_immutable(b"3:one", T0)  # refreshing a held item needs no room
    assert _code(lambda: store.put_immutable(b"1001:" + b"x" * 1001, T0)) == 205


def test_announcements_replace_bound_and_expire():
    store = ItemStore(max_per_topic=2)
    keys = [PeerKey.generate() for _ in range(3)]

    def ann(k, exp, record=b"r"):
        return Announcement.create(k, k.peer_id, b"t", record, exp)

    store.announce(b"t", ann(keys[0], T0 + 10), T0)
    store.announce(b"t", ann(keys[0], T0 + 20, b"newer"), T0)
    assert [a.record for a in store.get_peers(b"t", T0)] == [b"newer"]
    assert _code(lambda: store.announce(b"t", ann(keys[0], T0 + 15), T0)) == 302
    store.announce(b"t", ann(keys[1], T0 + 10), T0)
    assert _code(lambda: store.announce(b"t", ann(keys[2], T0 + 10), T0)) == 202
    assert _code(lambda: store.announce(b"t", ann(keys[2], T0 - 1), T0)) == 203
    assert len(store.get_peers(b"t", T0 + 11)) == 1  # keys[1]'s entry expired
    store.announce(b"t", ann(keys[2], T0 + 30), T0 + 11)  # its slot is free again
    page = store.get_peers(b"t", T0 + 11, after=b"", limit=1)
    rest = store.get_peers(b"t", T0 + 11, after=page[0].peer_id.raw)
    assert len(page) == 1 and len(rest) == 1 and page[0].peer_id < rest[0].peer_id
    # an entry claiming a far expiry is still dropped after MAX_TTL
    store.announce(b"u", ann(keys[0], T0 + 10**9), T0)
    assert store.get_peers(b"u", T0 + 2 * 3600 + 1) == []


def test_a_thousand_member_topic_is_held_whole_and_one_address_cannot_fill_it():
    """Issue 19: a replica keeps a 1,000-member swarm's whole list (it kept 256), while one
    address still stores at most MAX_PER_SOURCE_TOPIC entries of it."""
    from dht.store import MAX_PER_SOURCE_TOPIC

    store = ItemStore()
    keys = [PeerKey.generate() for _ in range(1000)]
    for i, k in enumerate(keys):
        store.announce(b"t", Announcement.create(k, k.peer_id, b"t", b"r", T0 + 60),
                       T0, source=f"10.0.{i // 250}.{i % 250}")
    held, after = [], b""
    while page := store.get_peers(b"t", T0, after=after, limit=300):
        held += page
        after = page[-1].peer_id.raw
    assert {a.peer_id for a in held} == {k.peer_id for k in keys}
    flood = [PeerKey.generate() for _ in range(MAX_PER_SOURCE_TOPIC + 1)]
    for k in flood[:-1]:
        store.announce(b"t", Announcement.create(k, k.peer_id, b"t", b"r", T0 + 60), T0,
                       source="192.0.2.1")
    assert _code(lambda: store.announce(b"t", Announcement.create(
        flood[-1], flood[-1].peer_id, b"t", b"r", T0 + 60), T0, source="192.0.2.1")) == 202


def test_forged_announcement_is_refused():
    k, other = PeerKey.generate(), PeerKey.generate()
    a = Announcement.create(k, k.peer_id, b"t", b"r", T0)
    with pytest.raises(ItemError) as info:
        Announcement.from_wire(b"t", other.public_bytes, a.record, a.expires_at, a.signature)
    assert info.value.code == 206
    with pytest.raises(ItemError):  # moved to another topic
        Announcement.from_wire(b"t2", k.public_bytes, a.record, a.expires_at, a.signature)
    with pytest.raises(ItemError):  # extended
        Announcement.from_wire(b"t", k.public_bytes, a.record, a.expires_at + 1, a.signature)


def test_persistence_and_tampering(tmp_path):
    path = tmp_path / "items.sqlite3"
    key = PeerKey.generate()
    item = MutableItem.create(key, {b"x": 1}, 5, b"salt")
    store = ItemStore(path)
    store.put_mutable(item, None, T0)
    store.remember_published(Published(item.target, item, None), T0 + 10)
    store.close()
    again = ItemStore(path)
    assert again.get_mutable(item.target, T0) == item
    assert again.due_published(T0 + 5) == []
    assert [p.mutable for p in again.due_published(T0 + 10)] == [item]
    # a value edited on disk no longer verifies and is dropped, not served
    again._db.execute("UPDATE mutable SET value=?", (b"d1:xi2ee",))
    assert again.get_mutable(item.target, T0) is None
    again.close()


def test_validators_run_on_store():
    def owner_proof(item):
        if not isinstance(item.value, dict) or item.value.get(b"proof") != b"ok":
            raise ItemError(206, "charter without a valid owner proof")

    def crashes(item):
        raise RuntimeError("bug")

    store = ItemStore(validators=Validators({b"swarm": owner_proof, b"buggy": crashes}))
    key = PeerKey.generate()
    assert _code(lambda: store.put_mutable(MutableItem.create(key, {b"proof": b"no"}, 1,
                                                              b"swarm"), None, T0)) == 206
    store.put_mutable(MutableItem.create(key, {b"proof": b"ok"}, 1, b"swarm"), None, T0)
    store.put_mutable(MutableItem.create(key, b"anything", 1, b"other"), None, T0)
    assert _code(lambda: store.put_mutable(MutableItem.create(key, b"x", 1, b"buggy"),
                                           None, T0)) == 201


def test_tokens_bind_address_and_target_and_rotate():
    tokens = TokenIssuer(rotate_s=300, now=T0)
    addr, target = ("10.0.0.1", 6881), b"t" * 20
    tok = tokens.issue(addr, target, T0)
    assert tokens.check(tok, addr, target, T0 + 1)
    assert not tokens.check(tok, ("10.0.0.2", 6881), target, T0 + 1)
    assert not tokens.check(tok, ("10.0.0.1", 6882), target, T0 + 1)
    assert not tokens.check(tok, addr, b"u" * 20, T0 + 1)
    assert not tokens.check(b"garbage", addr, target, T0 + 1)
    assert tokens.check(tok, addr, target, T0 + 301)  # previous secret still accepted
    assert not tokens.check(tok, addr, target, T0 + 602)


def test_replay_guard():
    guard = ReplayGuard(window_s=60)
    key = PeerKey.generate()
    me = b"n" * 20
    env = Envelope.seal(key, key.peer_id, me, b"hello", T0)
    assert guard.admit(env, me, T0 + 1) == key.peer_id
    assert _code(lambda: guard.admit(env, me, T0 + 2)) == 203  # replay
    late = Envelope.seal(key, key.peer_id, me, b"hello", T0)
    assert _code(lambda: guard.admit(late, me, T0 + 61)) == 203  # outside the window
    assert _code(lambda: guard.admit(Envelope.seal(key, key.peer_id, b"m" * 20, b"x", T0),
                                     me, T0)) == 203  # addressed to another node
    forged = Envelope(env.sender, me, T0, b"z" * 16, b"evil", env.signature)
    assert _code(lambda: guard.admit(forged, me, T0)) == 206
    # old nonces are forgotten only once they could no longer pass the window check
    guard.admit(Envelope.seal(key, key.peer_id, me, b"later", T0 + 200), me, T0 + 200)
    assert len(guard) == 1


def test_the_largest_record_an_announcement_takes_fits_its_bep44_copy():
    """An entry also travels as its peer's BEP 44 value (``entry_value``, for mainline
    nodes), which holds at most 1000 bytes; a record the announcement accepts but whose copy
    is then refused would be published half. The member record's limit is this one."""
    from dht.announce import MAX_RECORD, entry_value
    from dht.bencode import bencode
    from dht.items import MAX_VALUE
    from identity import PeerKey
    from swarm.members import MAX_RECORD as MEMBER_RECORD

    key = PeerKey.generate()
    biggest = Announcement.create(key, key.peer_id, b"t", b"r" * MAX_RECORD, 1000.0)
    assert len(bencode(entry_value(biggest))) <= MAX_VALUE
    assert MEMBER_RECORD == MAX_RECORD
    with pytest.raises(ItemError):
        Announcement.create(key, key.peer_id, b"t", b"r" * (MAX_RECORD + 1), 1000.0)
