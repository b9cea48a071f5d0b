"""Receipts and evidence: a wrong result is provable by anyone, a false report is not.

Sans-IO: receipts signed as a worker signs them, evidence built as a requester builds it,
re-checked as the coordinator does (``check_evidence``); then a coordinator's control plane
that blocks on proof alone, never on claims from fresh keys.
"""

from __future__ import annotations

import numpy as np
import pytest

from identity.keys import PeerKey
from swarm.runtime.evidence import Evidence, Receipt, check_evidence
from swarm.runtime.objects import object_id
from swarm.runtime.protocol import TaskArg
from swarm.runtime.requester import Arg, Call, Reply, evidence_for
from tests.control_support import FakeNode


def job(seed: int = 0, wrong: bool = True):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((32, 48)).astype(np.float32)
    b = rng.standard_normal((48, 40)).astype(np.float32)
    c = a @ b
    if wrong:
        c[3, 4] += 1.0
    return a, b, c


def signed(worker: PeerKey, requester: PeerKey, a, b, c, task: int = 7) -> tuple[Call, Reply]:
    """A call as a requester sends it and the reply a worker signs for it."""
    call = Call("matmul", "matmul", (Arg(a), Arg(b, object_id(b))))
    args = [TaskArg(array=a), TaskArg(oid=object_id(b).raw)]
    from swarm.runtime.evidence import input_ids

    receipt = Receipt.sign(worker, requester.peer_id, task, "matmul", "matmul", b"",
                           input_ids(args), [object_id(c).raw])
    return call, Reply([c], 0.1, task, receipt.encode())


def test_a_wrong_signed_result_is_proven_and_a_right_one_is_not():
    worker, me = PeerKey.generate(), PeerKey.generate()
    for wrong, verdict in ((True, "proven"), (False, "correct")):
        a, b, c = job(wrong=wrong)
        call, reply = signed(worker, me, a, b, c)
        package = evidence_for(me.peer_id, worker.peer_id, call, reply, "failed check")
        assert package is not None
        again = Evidence.decode(package.evidence.encode())    # as it travels
        assert check_evidence(again, package.arrays.get).kind == verdict


def test_evidence_that_does_not_bind_the_worker_proves_nothing():
    worker, me, other = (PeerKey.generate() for _ in range(3))
    a, b, c = job()
    call, reply = signed(worker, me, a, b, c)
    # a receipt from someone else, for another requester or task, or with other digests
    assert evidence_for(me.peer_id, other.peer_id, call, reply, "") is None
    assert evidence_for(other.peer_id, worker.peer_id, call, reply, "") is None
    assert evidence_for(me.peer_id, worker.peer_id, call, reply._replace(task=8), "") is None
    assert evidence_for(me.peer_id, worker.peer_id, call,
                        reply._replace(outputs=[c + 1]), "") is None
    assert evidence_for(me.peer_id, worker.peer_id, call, reply._replace(receipt=b"x"),
                        "") is None
    package = evidence_for(me.peer_id, worker.peer_id, call, reply, "")
    ev = package.evidence
    # forged signature: a fresh key claims to be the worker
    forged = Receipt.sign(other, me.peer_id, 7, "matmul", "matmul", b"", list(ev.receipt.inputs),
                          list(ev.receipt.outputs))
    import dataclasses

    forged = dataclasses.replace(forged, worker=worker.peer_id)
    assert check_evidence(Evidence(forged, b""), package.arrays.get).kind == "unproven"
    # arrays that do not match their addresses, or are missing
    swapped = dict(package.arrays)
    swapped[ev.receipt.outputs[0]] = c * 2
    assert check_evidence(ev, swapped.get).kind == "unproven"
    assert check_evidence(ev, lambda oid: None).kind == "unproven"
    # parameters that are not the signed ones
    assert check_evidence(Evidence(ev.receipt, b"\x80"), package.arrays.get).kind == "unproven"


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02\x03", b"\xc1", b"x" * 300_000,
                                  Evidence.__name__.encode()])
def test_garbage_evidence_is_a_clear_value_error(data):
    with pytest.raises(ValueError):
        Evidence.decode(data)


async def _coordinator_plane(tmp_path, key: PeerKey):
    """A real ControlPlane (no network) that has become its swarm's coordinator."""
    from types import SimpleNamespace

    from dht import DHTNode
    from swarm.control.election import Candidate
    from swarm.control.machine import Duty
    from swarm.control.plane import ControlPlane


    node = FakeNode(key=key, config=SimpleNamespace(swarm_id=bytes(range(20)), announce=True),
                 dht=DHTNode(key), accept_peer=None, host=None)
    plane = ControlPlane(node, b"\x01" * 32, tmp_path)

    async def nothing(actions) -> None:
        return None

    plane._do = nothing
    c = plane.controller
    now = plane.clock()
    for _ in range(100):
        if c.role is Duty.COORDINATOR:
            break
        c.members([Candidate(key.peer_id, 1.0)], now)
        c.tick(now)
        c.claim_result(True, now)
        now += 5.0
    assert c.role is Duty.COORDINATOR
    return plane


async def test_the_coordinator_blocks_on_proof_and_never_on_claims(tmp_path):
    import msgpack

    from swarm.control.election import Candidate
    from swarm.control.state import seal

    me, honest, liar = (PeerKey.generate() for _ in range(3))
    plane = await _coordinator_plane(tmp_path, me)
    # both workers are members (evidence against a key that never joined counts nothing)
    plane.controller.members([Candidate(k.peer_id, 1.0) for k in (me, honest, liar)],
                             plane.clock())
    sid = bytes(range(20))
    # Claims ("liar" messages) from many fresh keys against an honest worker: nothing.
    for _ in range(10):
        reporter = PeerKey.generate()
        body = msgpack.packb({"p": honest.public_bytes, "r": "wrong"}, use_bin_type=True)
        await plane._on_message(reporter.peer_id, ("127.0.0.1", 1),
                                seal(reporter, sid, "liar", body))
    # Evidence from fresh keys against the honest worker's right results: not proven.
    for seed in range(5):
        requester = PeerKey.generate()
        a, b, c = job(seed, wrong=False)
        call, reply = signed(honest, requester, a, b, c)
        package = evidence_for(requester.peer_id, honest.peer_id, call, reply, "lie")
        await plane.judge_evidence(package.evidence, package.arrays.get)
    assert honest.peer_id not in plane.controller.blocked()
    # The same proof twice counts once; two different proofs block the liar.
    a, b, c = job(1)
    call, reply = signed(liar, me, a, b, c, task=1)
    package = evidence_for(me.peer_id, liar.peer_id, call, reply, "failed")
    for _ in range(3):
        await plane.judge_evidence(package.evidence, package.arrays.get)
    assert liar.peer_id not in plane.controller.blocked()
    call, reply = signed(liar, PeerKey.generate(), a, b, c, task=2)
    assert evidence_for(me.peer_id, liar.peer_id, call, reply, "") is None  # not our receipt
    requester = PeerKey.generate()
    call, reply = signed(liar, requester, a, b, c, task=2)
    package = evidence_for(requester.peer_id, liar.peer_id, call, reply, "failed")
    await plane.judge_evidence(package.evidence, package.arrays.get)
    assert liar.peer_id in plane.controller.blocked()
    await plane.close()


async def test_a_peer_not_coordinating_refuses_evidence_out_loud(tmp_path):
    """Evidence that reaches a follower is answered "not taken" (the sender tries the next
    coordinator), and taken once it coordinates."""
    from swarm.control.election import Candidate
    from swarm.control.machine import Duty
    from swarm.control.plane import ControlPlane
    from swarm.runtime.protocol import EvidenceAck, EvidenceMsg

    me, liar, requester = (PeerKey.generate() for _ in range(3))
    plane = await _coordinator_plane(tmp_path, me)
    plane.controller.members([Candidate(k.peer_id, 1.0) for k in (me, liar)], plane.clock())
    a, b, c = job(3)
    call, reply = signed(liar, requester, a, b, c, task=3)
    package = evidence_for(requester.peer_id, liar.peer_id, call, reply, "failed")
    sent: list = []

    class Link:
        remote = requester.peer_id

        async def send(self, msg) -> None:
            sent.append(msg)

    assert isinstance(plane, ControlPlane)
    plane.controller._set_state(Duty.HANDING_OFF, plane.clock(), why="test")
    await plane._on_evidence(Link(), EvidenceMsg(package.evidence.encode()))
    assert sent == [EvidenceAck(package.evidence.key, False)]
    assert package.evidence.key not in plane.core.judged    # not judged, so not lost either
    plane.controller._set_state(Duty.COORDINATOR, plane.clock(), why="test")
    await plane._on_evidence(Link(), EvidenceMsg(package.evidence.encode()))
    assert sent[-1] == EvidenceAck(package.evidence.key, True)
    assert package.evidence.key in plane.core.judged
    await plane.close()


def test_an_honest_sum_of_crafted_inputs_is_never_proven_wrong():
    """A requester can craft inputs whose honest f32 sum in order is far from exact (a large
    partial sum absorbs a thousand small terms): the worker's receipt for that result must
    never become proof against it, though Freivalds' probabilistic model may flag it."""
    worker, me = PeerKey.generate(), PeerKey.generate()
    a = np.zeros((4, 8002), np.float32)
    a[:, 0], a[:, 1:8001], a[:, 8001] = 2.0**25, 1.0, -(2.0**25)
    b = np.ones((8002, 8), np.float32)
    c = np.zeros((4, 8), np.float32)
    for t in range(a.shape[1]):           # the naive kernel's order: every 1.0 is absorbed
        c += np.outer(a[:, t], b[t])
    assert float(c[0, 0]) == 0.0          # honest, and off by 8000 from the exact 8000
    from compute import verify_matmul

    assert not verify_matmul(a, b, c)     # the probabilistic model does flag it
    call, reply = signed(worker, me, a, b, c)
    package = evidence_for(me.peer_id, worker.peer_id, call, reply, "")
    assert check_evidence(package.evidence, package.arrays.get).kind != "proven"
    bad = c.copy()
    bad[2, 3] += 1e6                      # beyond any order's worst case: proven
    call, reply = signed(worker, me, a, b, bad)
    package = evidence_for(me.peer_id, worker.peer_id, call, reply, "")
    assert check_evidence(package.evidence, package.arrays.get).kind == "proven"


def test_delivered_evidence_goes_to_each_new_coordinator_and_stays_bounded():
    from swarm.runtime.evidence import DeliveredEvidence

    kept = DeliveredEvidence(per_worker=2, workers=2, max_bytes=100, keep_s=10.0)
    w1, w2, w3 = (PeerKey.generate().peer_id for _ in range(3))
    c1, c2 = PeerKey.generate().peer_id, PeerKey.generate().peer_id
    assert kept.delivered(w1, b"e1", "E1", 10, c1, 0.0) == []
    assert kept.delivered(w1, b"e2", "E2", 10, c2, 1.0) == ["E1"]  # c2 never had e1
    assert kept.delivered(w1, b"e1", "E1", 10, c2, 1.5) == []  # now it has
    assert kept.delivered(w1, b"e3", "E3", 10, c1, 2.0) == ["E2"]  # 2 per worker: e1 gone
    assert kept.delivered(w2, b"f1", "F1", 10, c2, 3.0) == []  # not another worker's
    assert kept.delivered(w3, b"g1", "G1", 10, c1, 4.0) == []  # 2 workers: w1 forgotten
    assert kept.delivered(w1, b"e4", "E4", 10, c2, 5.0) == []  # so e3 is not sent again
    assert kept.delivered(w3, b"g2", "G2", 10, c2, 20.0) == []  # g1 is past keep_s
    assert kept.delivered(w2, b"f2", "F2", 95, c1, 21.0) == []
    assert kept.held_bytes == 95  # past max_bytes the oldest arrays go first (g2)


async def test_evidence_against_a_member_not_listed_yet_is_refused_until_it_is(tmp_path):
    """Issue 48, finding 3: evidence that reaches the coordinator before its topic read lists
    the worker (a requester can reach a newcomer first) is refused out loud and judged once
    the worker is listed; it was answered "taken" and then dropped as "not a member here",
    so the requester never sent it again and a proven liar stayed unblocked. A key that a
    topic read made after the refusal still does not list counts for nothing (and is not
    asked for again)."""
    from swarm.control import core as cc
    from swarm.control.election import Candidate
    from swarm.control.sync import Fetch
    from swarm.members import MemberRecord
    from swarm.runtime.protocol import EvidenceAck, EvidenceMsg

    me, liar, requester, stranger = (PeerKey.generate() for _ in range(4))
    plane = await _coordinator_plane(tmp_path, me)
    core = plane.core
    core.controller.members([Candidate(me.peer_id, 1.0)], plane.clock())
    sent: list = []

    class Link:
        remote = requester.peer_id

        async def send(self, msg) -> None:
            sent.append(msg)

    store: dict = {}  # the arrays, sent before the evidence, in our object store
    plane._stored_array = store.get

    def evidence(worker: PeerKey, task: int):
        a, b, c = job(task)
        call, reply = signed(worker, requester, a, b, c, task=task)
        package = evidence_for(requester.peer_id, worker.peer_id, call, reply, "failed")
        store.update(package.arrays)
        return package.evidence

    first, second, alien = evidence(liar, 1), evidence(liar, 2), evidence(stranger, 3)
    for ev in (first, second, alien):
        await plane._on_evidence(Link(), EvidenceMsg(ev.encode()))
    assert sent == [EvidenceAck(ev.key, False) for ev in (first, second, alien)]
    assert not core.judged and liar.peer_id not in plane.controller.blocked()
    # the coordinator reads the topic soon (a refusal brought its next read forward)
    assert Fetch.VIEW in core.sync.due(core.now + 1.5)
    core._viewing = True
    core._view_began = core.now + 1.5
    rec = lambda k: (MemberRecord(k.peer_id, 1.0, roles=("worker",)), 2e9)  # noqa: E731
    core.handle(cc.ViewRead((rec(me), rec(liar)), None), core.now + 2.0, 1.8e9)
    sent.clear()
    for ev in (first, second, alien):  # the requester sends it again
        await plane._on_evidence(Link(), EvidenceMsg(ev.encode()))
    assert sent == [EvidenceAck(first.key, True), EvidenceAck(second.key, True),
                    EvidenceAck(alien.key, True)]  # the stranger: no member, nothing kept
    assert liar.peer_id in plane.controller.blocked()
    assert stranger.peer_id not in plane.controller.blocked() and alien.key not in core.judged
    await plane.close()
