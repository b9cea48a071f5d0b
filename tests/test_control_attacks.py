"""Issue 12: single peers (or a few fresh keys) trying to stop or steer the swarm.

Each test is one numbered finding, driven through the sans-IO controller (and, where the
adapter holds the guard, the plane with a fake node): term inflation (1), a blocklist that
fills up (2), liar reports on anyone's word (3), replayed old blocks (4), charter rollback
(5), NaN timestamps, unpinned URIs and cloned owner keys (7). Finding 6 (bootstrap) is in
``tests/test_control_bootstrap.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from dht import DHTNode
from dht.errors import ItemError
from dht.items import MAX_VALUE
from dht.messages import Envelope, ReplayGuard
from identity import (
    BlockCommand,
    Charter,
    PeerKey,
    Role,
    Signed,
    UnblockCommand,
    sign_as_peer,
    verify_chain,
)
from identity.keys import PeerId
from identity.statements import Policy
from swarm.control import core as cc
from swarm.control import machine as control
from swarm.control.core import MAX_IGNORED
from swarm.control.election import Candidate
from swarm.control.machine import (
    MAX_SEEN_REPORTS,
    MAX_TERM_STEP,
    CheckedCommand,
    Controller,
    Duty,
    counted_states,
)
from swarm.control.plane import ControlPlane
from swarm.control.state import (
    MAX_MESSAGE,
    BlockEntry,
    BlockPage,
    CoordinatorState,
    KickOrder,
    LiarReport,
    StateItem,
    resolve,
    seal,
    unseal,
)
from swarm.errors import CharterError, NotCoordinator, ProtocolError, StaleTerm, URIError
from tests.control_support import FakeNode
from tests.identity_support import owner_key
from tests.test_control_machine import SWARM, Sim, _lie, _pid, _stable

HUGE = 2**62 - 1
NOW = 100.0


def _attacker_in_view(sim: Sim, name: str, eligible: bool) -> PeerId:
    """A peer that announced itself as a member (a requester when not ``eligible``)."""
    pid = _pid(name)
    view = [*sim.view(), Candidate(pid, 0.1, eligible=eligible)]
    for node in sim.nodes.values():
        node.members(view, sim.now)
    return pid


# -- finding 1: term inflation --------------------------------------------------------------


@pytest.mark.parametrize("eligible", [False, True])
def test_term_inflation_neither_moves_the_term_nor_names_a_coordinator(eligible):
    sim, best = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    m = _attacker_in_view(sim, "mallory", eligible)
    lie = CoordinatorState(SWARM, HUGE, 1, m)
    for n in ("a", "c"):
        with pytest.raises((NotCoordinator, StaleTerm)):
            sim.nodes[n].heartbeat(lie, m, sim.now)
        assert sim.nodes[n].term == 1 and sim.nodes[n].coordinator == sim.ids[best]
    # The coordinator does not step down for it, and reads no term from it.
    sim.nodes[best].rival(lie, sim.now)
    sim.nodes[best].dht_states([lie])
    assert sim.nodes[best].role is Duty.COORDINATOR and sim.nodes[best].term == 1
    # A newcomer and an observer read the DHT by the same rules.
    sim.add("n", 0.5)
    newcomer = sim.nodes["n"]
    newcomer.members([*sim.view(), Candidate(m, 0.1, eligible=eligible)], sim.now)
    honest = sim.nodes[best].state
    counted = newcomer.dht_states([lie, honest])
    assert counted == [honest] and newcomer.term == 1
    with pytest.raises((NotCoordinator, StaleTerm)):
        newcomer.heartbeat(lie, m, sim.now)
    view = {c.peer_id: c for c in [*sim.view(), Candidate(m, 0.1, eligible=eligible)]}
    assert counted_states([lie, honest], view, ()) == [honest]
    # Owner commands still work, and the next term is a small number.
    sim.operator(best, "block", "a", at=10)
    sim.operator(best, "unblock", "a", at=11)
    assert sim.ids["a"] not in sim.nodes[best].blocked()
    assert BlockCommand(swarm=bytes(32), counter=1, target=sim.ids["a"], reason="",
                        role=Role.OWNER, term=sim.nodes[best].term + 1)


def test_a_newcomer_with_no_state_follows_only_an_eligible_member():
    sim, best = _stable({"a": 1.0, "b": 3.0})
    m = _attacker_in_view(sim, "mallory", eligible=False)
    sim.add("n", 0.5)
    sim.nodes["n"].members([*sim.view(), Candidate(m, 100.0, eligible=False)], sim.now)
    with pytest.raises(NotCoordinator, match="eligible"):
        sim.nodes["n"].heartbeat(CoordinatorState(SWARM, 5, 1, m), m, sim.now)
    assert sim.nodes["n"].state is None and sim.nodes["n"].term == 0


def test_a_stranger_cannot_hand_a_newcomer_the_role_at_any_term():
    sim, best = _stable({"a": 1.0, "b": 3.0})
    sim.add("n", 0.5)
    offer = CoordinatorState(SWARM, HUGE, 1, sim.ids["n"])
    with pytest.raises(NotCoordinator):
        sim.nodes["n"].handoff_offer(offer, _pid("mallory"), sim.now)
    assert sim.nodes["n"].role is Duty.FOLLOWER and sim.nodes["n"].term == 0


def test_terms_advance_within_a_bound_even_for_an_elected_member():
    sim, best = _stable({"a": 1.0, "b": 3.0, "c": 2.0})
    b = sim.ids[best]
    jump = CoordinatorState(SWARM, 1 + MAX_TERM_STEP + 1, 99, b)
    with pytest.raises(StaleTerm, match="jumps"):
        sim.nodes["a"].heartbeat(jump, b, sim.now)
    assert sim.nodes["a"].term == 1
    ok = CoordinatorState(SWARM, 1 + MAX_TERM_STEP, 99, b)
    assert sim.nodes["a"].heartbeat(ok, b, sim.now)


def test_a_coordinator_steps_down_only_for_a_legitimate_rival():
    sim, best = _stable({"a": 1.0, "b": 3.0})
    m = _attacker_in_view(sim, "mallory", eligible=False)
    sim.nodes[best].rival(CoordinatorState(SWARM, 1, 5, m), sim.now)
    assert sim.nodes[best].role is Duty.COORDINATOR
    stranger = _pid("stranger")  # not even a member
    sim.nodes[best].rival(CoordinatorState(SWARM, 2, 5, stranger), sim.now)
    assert sim.nodes[best].role is Duty.COORDINATOR and sim.nodes[best].term == 1


def test_observers_pick_the_chain_most_signers_share():
    honest = [CoordinatorState(SWARM, t, t, _pid(f"h{t}")) for t in (300, 301, 302)]
    outlier = CoordinatorState(SWARM, HUGE, 1, _pid("m"))
    view = {s.coordinator: Candidate(s.coordinator, 1.0) for s in [*honest, outlier]}
    assert counted_states([outlier, *honest], view, ()) == honest
    low = CoordinatorState(SWARM, 1, 1, _pid("m"))  # a low item cannot cut the chain either
    view[low.coordinator] = Candidate(low.coordinator, 1.0)
    assert counted_states([low, *honest], view, ()) == honest


def test_a_blocked_peers_later_claim_counts_for_nobody():
    """Seen under load: a peer blocked at term 3 (it missed the block) claims term 4; the
    members refuse it, and so must a newcomer or ``swarm status``."""
    w1, w2 = _pid("w1"), _pid("w2")
    three = CoordinatorState(SWARM, 3, 5, w1, (BlockEntry(w2, "by an admin"),))
    four = CoordinatorState(SWARM, 4, 6, w2)
    view = {p: Candidate(p, 1.0) for p in (w1, w2)}
    assert counted_states([four, three], view, ()) == [three]
    assert counted_states([four, three], view, (), floor=3) == [three]


async def test_ignored_state_items_are_logged_once_each_within_a_bound(tmp_path,
                                                                       caplog):
    """A flood of state items that do not count (signers nobody lists, say) is logged once
    per coordinator named, and the memory of what was logged stays bounded (invariant 8)."""
    plane = _plane(tmp_path)
    items = [CoordinatorState(SWARM, 5, 1, p)
             for p in (_pid(f"x{i}") for i in range(MAX_IGNORED + 44))]
    with caplog.at_level(logging.INFO, logger="swarm.control"):
        assert plane.core._counted(items) == []
        assert plane.core._counted(items[-MAX_IGNORED:]) == []
    logged = [r for r in caplog.records if "ignoring the DHT's state" in r.getMessage()]
    assert len(logged) == len(items)  # the newest MAX_IGNORED are not logged again
    assert len(plane.core.ignored) == MAX_IGNORED
    await plane.close()


# -- finding 2: a blocklist without a cap ---------------------------------------------------


def test_the_blocklist_has_no_fixed_cap_and_pages_rebuild_it():
    sim, best = _stable({"a": 1.0, "b": 3.0})
    coord = sim.nodes[best]
    peers = [PeerKey.from_seed(bytes([i % 256, i // 256]) * 16).peer_id for i in range(300)]
    for i, p in enumerate(peers):
        coord.command(CheckedCommand("block", p, "r" * 100, "owner", i), sim.now)
    sim._run(best)
    st = coord.state
    assert st.blocked_ids >= set(peers)
    assert sim.nodes["a"].blocked() >= set(peers)  # heartbeats carried it
    item = st.encode_item()
    assert len(item) <= MAX_VALUE - 20 and len(seal(PeerKey.generate(), SWARM, "hb", item,
                                                    b"e" * 300)) <= MAX_MESSAGE
    pages = {p.target: p.encode() for p in st.pages()}
    assert len(pages) > 1 and all(len(v) <= 900 for v in pages.values())

    async def fetch(target: bytes) -> bytes | None:
        return pages.get(target)

    import asyncio
    assert asyncio.run(resolve(StateItem.decode(item), fetch)) == st
    # A page that does not match the signed item is refused.
    last = StateItem.decode(item).last_page
    pages[last] = BlockPage((BlockEntry(peers[0]),), b"").encode()
    with pytest.raises(ProtocolError):
        asyncio.run(resolve(StateItem.decode(item), fetch))


def _listed(n: int, start: int = 0) -> CoordinatorState:
    st = CoordinatorState(SWARM, 1, 1, PeerKey.generate().peer_id)
    for i in range(start, start + n):
        peer = PeerKey.from_seed(i.to_bytes(4, "big") * 8).peer_id
        st = st.with_block(BlockEntry(peer, "r" * 100, "owner", i))
    return st


def test_a_new_block_changes_one_page_and_a_follower_fetches_one():
    """Issue 33, finding 3: pages chained from the first and a list sorted by peer id made
    every block change every page, so a follower fetched the whole list (one lookup a page)
    and the coordinator put it again, per block. Now a block changes the last page alone
    (or starts a new one), a follower holding the list before fetches that page only, and
    the coordinator's publish carries that page only."""
    old = _listed(300)
    assert len(old.pages()) >= 10
    st = old
    for i in range(12):  # fills the last page, then starts the next one
        new = st.with_block(BlockEntry(PeerKey.from_seed(bytes([7, i]) * 16).peer_id,
                                       "r" * 100, "owner", 1000 + i))
        changed = {p.target for p in new.pages()} - {p.target for p in st.pages()}
        assert len(changed) == 1 and len(new.pages()) - len(st.pages()) in (0, 1), i
        st = new
    new = old.with_block(BlockEntry(PeerKey.generate().peer_id, "late", "owner", 5000))
    pages = {p.target: p.encode() for p in new.pages()}
    fetched = []

    async def fetch(target: bytes) -> bytes | None:
        fetched.append(target)
        return pages.get(target)

    import asyncio
    item = StateItem.decode(new.encode_item())
    assert asyncio.run(resolve(item, fetch, known=old)) == new and len(fetched) == 1
    fetched.clear()
    assert asyncio.run(resolve(item, fetch)) == new and len(fetched) == len(new.pages())
    # an unblock in the middle: the pages from there on are fetched, the ones before not
    mid = new.without_block(new.blocked[len(new.blocked) // 2].peer)
    pages.update({p.target: p.encode() for p in mid.pages()})
    fetched.clear()
    assert asyncio.run(resolve(StateItem.decode(mid.encode_item()), fetch, known=new)) == mid
    assert len(fetched) <= len(mid.pages()) // 2 + 2


def test_a_coordinators_block_puts_only_the_page_that_changed():
    key = PeerKey.generate()
    core = cc.ControlCore(key, SWARM, NOW)
    st = replace(_listed(300), coordinator=key.peer_id)
    puts = list(core._pages(st))  # the pages it put for the list before (its claim)
    assert len(puts) == len(st.pages())
    new = st.with_block(BlockEntry(PeerKey.generate().peer_id, "r", "owner", 9))
    core._put_state(control.PutState(new, claim=False))
    [put] = [a for a in core._out if isinstance(a, cc.PutItem)]
    assert len(put.pages) == 1 and put.pages[0].target == new.pages()[-1].target


def test_a_state_naming_a_peer_twice_is_refused():
    st = _listed(2)
    o = st.to_obj()
    o["b"].append(o["b"][0])
    with pytest.raises(ProtocolError, match="twice"):
        CoordinatorState.from_obj(o)


# -- finding 3: liar reports ----------------------------------------------------------------


def test_bare_reports_from_fresh_keys_block_nobody():
    sim, best = _stable({"a": 1.0, "b": 3.0})
    coord = sim.nodes[best]
    for _ in range(24):
        fresh = PeerKey.generate().peer_id
        coord.liar_report(LiarReport(sim.ids["a"], "wrong"), fresh, sim.now, 100)
        coord.liar_report(LiarReport(PeerKey.generate().peer_id, "wrong"), fresh, sim.now, 100)
    sim._run(best)
    assert coord.blocked() == frozenset()
    # Checked evidence is acted on (two distinct proofs), and the block says which evidence.
    coord.liar_report(_lie(sim.ids["a"], 7), _pid("anyone"), sim.now, 100)
    coord.liar_report(_lie(sim.ids["a"], 7), _pid("anyone"), sim.now, 100)  # same: once
    assert sim.ids["a"] not in coord.blocked()
    coord.liar_report(_lie(sim.ids["a"], 8), _pid("anyone"), sim.now, 100)
    assert sim.ids["a"] in coord.blocked()
    assert b"proof7".hex()[:12] in coord.state.blocked[0].reason


def test_seen_reports_are_bounded_and_relayed_once():
    sim, best = _stable({"a": 1.0, "b": 3.0})
    follower = sim.nodes["a"]
    for i in range(MAX_SEEN_REPORTS + 50):
        follower.liar_report(_lie(_pid("x"), i), _pid("r"), sim.now, 100)
    relays = [a for a in follower.actions() if type(a).__name__ == "RelayReport"]
    assert len(relays) == MAX_SEEN_REPORTS + 50 and all(r.report.relayed for r in relays)
    assert len(follower._reports) <= MAX_SEEN_REPORTS
    follower.liar_report(relays[0].report, _pid("r"), sim.now, 100)  # relayed: not again
    follower.liar_report(LiarReport(_pid("x"), "bare"), _pid("r"), sim.now, 100)  # no proof
    assert not follower.actions()


# -- finding 4: replayed old blocks ---------------------------------------------------------


def test_a_replayed_owner_block_after_a_failover_is_refused():
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.5})
    sim.operator("b", "block", "x", at=100)
    block = sim.issued[sim.ids["x"]]
    sim.operator("b", "unblock", "x", at=110)
    sim.run_until(lambda: sim.ids["x"] not in sim.nodes["c"].blocked())
    sim.alive.discard("b")  # b dies; c takes over at term 2
    sim.run_until(lambda: sim.agreed("c", but=frozenset({"b"})))
    with pytest.raises(StaleTerm, match="replay"):
        sim.nodes["c"].forwarded_block(block, sim.ids["b"], sim.now, 120)
    assert sim.ids["x"] not in sim.nodes["c"].blocked()
    with pytest.raises(NotCoordinator):  # not from a peer that never coordinated
        sim.nodes["c"].forwarded_block(block, _pid("stranger"), sim.now, 120)
    with pytest.raises(StaleTerm):  # nor days later
        sim.nodes["c"].forwarded_block(block, sim.ids["b"], sim.now, 100 + 86400)


def test_a_replayed_or_stranger_forwarded_unblock_is_refused():
    """An owner's unblock forwarded after a heal undoes only an older block, and only from a
    peer that coordinated here, within the forward age and the term window."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.5})
    sim.operator("b", "unblock", "x", at=100)
    unblock = sim.unblocks[sim.ids["x"]]
    sim.operator("b", "block", "x", at=110)  # the owner changed their mind: blocked again
    sim.run_until(lambda: sim.ids["x"] in sim.nodes["c"].blocked())
    sim.alive.discard("b")  # b dies; c takes over at term 2
    sim.run_until(lambda: sim.agreed("c", but=frozenset({"b", "x"})))
    with pytest.raises(StaleTerm, match="newer"):
        sim.nodes["c"].forwarded_unblock(unblock, sim.ids["b"], sim.now, 120)
    with pytest.raises(NotCoordinator):  # not from a peer that never coordinated
        sim.nodes["c"].forwarded_unblock(unblock, _pid("stranger"), sim.now, 120)
    with pytest.raises(StaleTerm):  # nor days later
        sim.nodes["c"].forwarded_unblock(unblock, sim.ids["b"], sim.now, 100 + 86400)
    with pytest.raises(NotCoordinator):  # and only the coordinator takes one
        sim.nodes["a"].forwarded_unblock(unblock, sim.ids["b"], sim.now, 120)
    assert sim.ids["x"] in sim.nodes["c"].blocked()


async def test_a_forwarded_unblock_travels_with_the_owners_proof_and_is_checked(tmp_path):
    """The planes' side: the deposed coordinator sends the owner's signed unblock it applied;
    the winner verifies that signature against the charter before it lifts its older block,
    and a command signed by anybody else lifts nothing."""
    owner, swarm_key = owner_key(tmp_path, "owner"), PeerKey.generate()
    charter = Charter(swarm=swarm_key.public_bytes, counter=1, name="t",
                      owners=(owner.credential,), policy=Policy(), admins=())
    own = verify_chain([owner.sign(charter)], swarm_pubkey=swarm_key.peer_id, now=time.time())
    x, now = _pid("x"), int(time.time())

    def unblock(signer=None) -> Signed:
        cmd = UnblockCommand(swarm=swarm_key.public_bytes, counter=now * 1000, target=x,
                             reason="", role=Role.OWNER, term=1)
        return owner.sign(cmd) if signer is None else Signed(cmd, (sign_as_peer(cmd, signer),))

    for n in "bc":
        (tmp_path / n).mkdir()
    b, c = (_plane(tmp_path / n, swarm=swarm_key.public_bytes) for n in "bc")
    b.ownership = c.ownership = own
    sent: list[bytes] = []

    async def send(addr, msg: bytes) -> None:
        sent.append(msg)

    b.node.dht.send_message = send
    b.addrs[c.key.peer_id] = ("127.0.0.1", 9)
    b.core.unblocked(x, unblock())
    b.controller._actions.append(control.ForwardUnblocks((x,), c.key.peer_id))
    await b._do(b.core.pump())
    await asyncio.gather(*b._tasks)
    assert [unseal(SWARM, m).kind for m in sent] == ["fwd"]
    # c coordinates term 2 with x blocked since before the unblock (set up directly here; the
    # state machine's way there is tested in test_control_machine)
    ctl = c.controller
    ctl.state = CoordinatorState(SWARM, 2, 3, c.key.peer_id,
                                 (BlockEntry(x, "r", "owner", now - 50),))
    ctl.role = Duty.COORDINATOR
    ctl.past_coordinators.add(b.key.peer_id)
    forged = seal(b.key, SWARM, "fwd", unblock(signer=b.key).encode())
    await c._on_message(b.key.peer_id, ("127.0.0.1", 9), forged)
    assert x in ctl.blocked()  # b's own signature is no owner's
    await c._on_message(b.key.peer_id, ("127.0.0.1", 9), sent[0])
    assert x not in ctl.blocked() and x in c.core.unblock_proofs
    await b.close()
    await c.close()


# -- finding 5: charter rollback ------------------------------------------------------------




def _plane(tmp_path, key: PeerKey | None = None, wall=time.time,
           swarm: bytes = b"\x01" * 32) -> ControlPlane:
    key = key or PeerKey.generate()
    node = FakeNode(key=key, config=SimpleNamespace(swarm_id=SWARM, announce=True),
                 dht=DHTNode(key), accept_peer=None)
    return ControlPlane(node, swarm, tmp_path, wall=wall)


def _ownership(counter: int) -> SimpleNamespace:
    return SimpleNamespace(counter=counter, admins={}, sign_counts={},
                           policy=SimpleNamespace(require_hardware=False))


def test_the_charter_counter_only_moves_forward_across_restarts(tmp_path):
    plane = _plane(tmp_path)
    plane.accept_charter(_ownership(3))
    with pytest.raises(CharterError, match="rollback"):
        plane.accept_charter(_ownership(2))
    again = _plane(tmp_path)  # a restart keeps the floor
    assert again.charter_floor == 3
    with pytest.raises(CharterError):
        again.accept_charter(_ownership(1))


# -- finding 7: NaN, unpinned URIs, cloned owner keys ---------------------------------------


def test_nan_timestamps_fail_both_replay_guards():
    key = PeerKey.generate()
    me = bytes(20)
    nan = Envelope.seal(key, key.peer_id, me, b"x", math.nan)  # validly signed
    with pytest.raises(ItemError, match="window"):
        ReplayGuard().admit(nan, me, 1000.0)
    sim, best = _stable({"a": 1.0, "b": 3.0})
    order = KickOrder(1, sim.ids["a"], "x", 100)
    with pytest.raises(StaleTerm):
        sim.nodes["a"].kick_order(order, sim.ids[best], sim.now, math.nan)


def test_a_uri_without_the_owner_pin_is_refused_with_a_clear_error():
    from swarm import uri
    text = f"magnet:?xs=urn:btpk:{'11' * 32}&x.pe=127.0.0.1:4000"
    with pytest.raises(URIError, match="x.op: missing"):
        uri.parse(text)
    assert uri.parse(text, require_owner=False).owner == b""


def test_owner_commands_check_the_authenticator_sign_counter(tmp_path):
    owner = owner_key(tmp_path, "owner")
    now = time.time()

    def block(ms: int):
        return owner.sign(BlockCommand(swarm=b"\x01" * 32, counter=ms, target=_pid("x"),
                                       reason="", role=Role.OWNER, term=1))

    first, second = block(int(now * 1000)), block(int(now * 1000) + 1)
    plane = _plane(tmp_path)
    plane.core.admit(second, now)
    with pytest.raises(StaleTerm, match="sign counter"):  # signed earlier: a cloned key
        plane.core.admit(first, now)
    with pytest.raises(StaleTerm, match="replayed"):
        plane.core.admit(second, now)


def test_a_controller_keeps_no_unchecked_state_from_fresh_reports():
    c = Controller(_pid("me"), SWARM, 0.0)
    for _ in range(100):
        c.liar_report(LiarReport(_pid("w"), "x"), PeerKey.generate().peer_id, 0.0, 1)
    assert not c._liars


def test_validators_verify_each_item_once_and_a_borrowed_signature_poisons_nothing(
        monkeypatch):
    """Issue 19 groundwork: the charter/state validators cache their verdict per (target,
    seq, signature, value); an item with the real signature but another value is judged on
    its own."""
    from dht.items import MutableItem
    from swarm.control import charter

    coord = PeerKey.generate()
    good = CoordinatorState(SWARM, 1, 1, coord.peer_id)
    salt = charter.state_salt(SWARM)
    item = MutableItem(coord.public_bytes, salt, 1, good.encode_item(), b"s" * 64)
    calls = []
    real = StateItem.decode
    monkeypatch.setattr(charter.StateItem, "decode",
                        lambda data: calls.append(1) or real(data))
    for _ in range(5):
        charter.validate_state_item(item)
    assert len(calls) == 1
    lie = MutableItem(coord.public_bytes, salt, 1, b"\x00junk", b"s" * 64)
    with pytest.raises(ItemError):
        charter.validate_state_item(lie)
    charter.validate_state_item(item)  # still fine


async def test_a_strangers_heartbeat_costs_no_dht_lookup(tmp_path):
    """A heartbeat naming blocklist pages is judged by its head first: from a peer that
    may not coordinate here, no page is fetched."""
    plane = _plane(tmp_path)
    fetched = []

    async def page(target: bytes) -> bytes | None:
        fetched.append(target)
        return None

    plane._page = page
    mallory = PeerKey.generate()
    lie = CoordinatorState(SWARM, 3, 1, mallory.peer_id, (BlockEntry(_pid("x")),))
    await plane._on_message(mallory.peer_id, ("127.0.0.1", 9),
                            seal(mallory, SWARM, "hb", lie.encode_item()))
    assert fetched == [] and plane.controller.state is None
    assert mallory.peer_id not in plane.addrs
    await plane.close()


async def test_a_suspected_member_is_not_asked_in_dht_lookups(tmp_path):
    """The plane tells its DHT node whom the controller takes for dead, before a failover
    claim's lookups start; a claim that waited on the dead coordinator's node in each of its
    three lookups outlasted the claim deadline (5.2 s in bench/control.py)."""
    from dht.node import node_id_of
    from swarm.members import MemberRecord

    plane = _plane(tmp_path)
    dead = PeerKey.generate().peer_id
    plane.records[dead] = MemberRecord(dead, 1.0, dht=("127.0.0.1", 9))
    plane.core._note_suspects()
    plane._do_now(plane.core.pump())
    assert node_id_of(dead.raw) not in plane.node.dht._recently_failed()
    plane.controller.suspects[dead] = 0.0
    plane.core._note_suspects()
    plane._do_now(plane.core.pump())
    assert node_id_of(dead.raw) in plane.node.dht._recently_failed()
    await plane.close()


async def test_a_heartbeat_leaves_at_once_its_pages_held_by_its_sender(tmp_path):
    """A block changes the state; its pages go to the DHT with the item. A follower that
    resolves the heartbeat must find them, but a heartbeat that waited for the DHT put
    waited out a lookup's grace for each node that had died since it was listed (5 s for
    the exiting `swarm block` CLI's node): every member took the live coordinator for dead,
    and the blocked peer claimed the role before its one notice came (CI). The pages are
    held in the sender's own node before the heartbeat leaves, at once; the follower asks
    the sender first (`_resolve`), the DHT after."""
    (tmp_path / "b").mkdir()
    b = _plane(tmp_path / "b")
    x = _pid("x")
    gate, sent = asyncio.Event(), []

    async def put_immutable(value: bytes) -> bytes:
        await gate.wait()  # the DHT put hangs
        return b"\0" * 20

    async def put_mutable(*args, **kwargs) -> None:
        return None

    now = int(time.time())
    st = CoordinatorState(SWARM, 1, 2, b.key.peer_id, (BlockEntry(_pid("y"), "r", "owner", now),))
    pages = st.pages()

    async def send(addr, msg: bytes) -> None:
        held = [b.node.dht.store.get_immutable(p.target, b.node.dht.clock()) for p in pages]
        sent.append((all(h is not None for h in held), unseal(SWARM, msg).kind))

    b.node.dht.put_immutable = put_immutable
    b.node.dht.put_mutable = put_mutable
    b.node.dht.send_message = send
    b.addrs[x] = ("127.0.0.1", 9)
    b.controller.state = st
    b.controller._actions += [control.PutState(st, claim=False),
                              control.SendHeartbeat(st, (x,))]
    await b._do(b.core.pump())
    async with asyncio.timeout(5):
        while not sent:
            await asyncio.sleep(0.01)
    assert sent == [(True, "hb")]  # gone while the DHT put hangs, its pages held here
    got = await b.node.dht.get_immutable_from(("127.0.0.1", 9), pages[-1].target)
    assert BlockPage.decode(got).target == pages[-1].target
    gate.set()
    await asyncio.gather(*b._tasks)
    await b.close()


def test_a_replayed_owner_block_is_refused_by_a_coordinator_that_never_saw_the_unblock():
    """Issue 33, finding 8: the owner blocked x, then unblocked it; d joined after that, so
    it never saw x blocked or unblocked, and took over when b failed. b, a former
    coordinator, replays the owner's old block (within the hour a forward stays fresh): d
    applied it, and x was blocked again. The state now carries the chain's recent unblocks,
    so d refuses the replay."""
    sim, _ = _stable({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.5})
    sim.operator("b", "block", "x", at=100)
    block = sim.issued[sim.ids["x"]]
    sim.operator("b", "unblock", "x", at=110)
    sim.run_until(lambda: sim.ids["x"] not in sim.nodes["c"].blocked())
    sim.add("d", 2.5)  # elected once b is gone; never saw x blocked
    sim.run_until(lambda: sim.nodes["d"].coordinator == sim.ids["b"])
    sim.alive.discard("b")
    sim.run_until(lambda: sim.agreed("d", but=frozenset({"b"})))
    d = sim.nodes["d"]
    assert sim.ids["b"] in d.past_coordinators
    with pytest.raises(StaleTerm, match="superseded"):
        d.forwarded_block(block, sim.ids["b"], sim.now, 120)
    assert sim.ids["x"] not in d.blocked()
    # a block issued after the unblock still stands when forwarded
    later = replace(block, at=130)
    d.forwarded_block(later, sim.ids["b"], sim.now, 130)
    assert sim.ids["x"] in d.blocked()
