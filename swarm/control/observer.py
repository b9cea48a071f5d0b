"""Looking at a swarm from outside: a throwaway read-only DHT node (BEP 43: no member keeps
it as a contact), no membership, no compute.

``swarm status`` reports what :func:`observe` finds; ``swarm kick|block|unblock`` use it
to find the coordinator, then :func:`send_command` delivers a signed command to it and
waits until the coordinator's state in the DHT shows the change.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from dht import DHTNode
from dht.errors import DHTError
from identity import PeerId, PeerKey, Signed
from swarm.control import charter
from swarm.control.election import candidate
from swarm.control.follow import (
    REREAD_PAUSE,
    STATE_READS,
    deciding_voters,
    followers,
    newest_counted,
    rereads,
)
from swarm.control.state import CoordinatorState, seal
from swarm.errors import ProtocolError, RemoteError
from swarm.members import MemberRecord, membership_topic, swarm_id
from swarm.netaddr import source_address
from swarm.uri import JoinURI


@asynccontextmanager
async def dht_observer(uri: JoinURI, key: PeerKey | None = None):
    """A DHT node joined through the URI's bootstrap peers (stopped on exit)."""
    if not uri.peers:
        raise RemoteError("the URI names no bootstrap peer (x.pe=host:port); cannot reach "
                          "the swarm")
    node = DHTNode(key or PeerKey.generate(), None, rpc_timeout=1.0, read_only=True)
    charter.register_validators(node)
    await node.listen(0, source_address(uri.peers))
    try:
        try:
            await node.bootstrap(list(uri.peers))
        except DHTError as exc:
            raise RemoteError(f"no bootstrap peer answered: {exc}") from None
        yield node
    finally:
        await node.stop()


@dataclass
class View:
    """What an observer sees."""

    charter: charter.CharterRecord
    """The verified charter."""
    members: list[tuple[MemberRecord, float]]
    """Live member records with their announcement expiry (unix time)."""
    state: CoordinatorState | None
    """The coordinator state among the members' DHT items that count (entitled signers,
    terms within the bound) which most members say they follow."""
    addrs: dict[PeerId, tuple[str, int]]
    """DHT addresses of members."""

    @property
    def coordinator(self) -> PeerId | None:
        return self.state.coordinator if self.state else None

    def to_json(self) -> dict:
        own = self.charter.ownership
        st = self.state
        return {
            "swarm": swarm_id(own.swarm).hex(),
            "name": own.name,
            "owner": {"fingerprint": own.owner.fingerprint().hex(),
                      "hardware_backed": own.owner.hardware_backed,
                      "attestation": own.owner.attestation,
                      "keys": len(own.owners)},
            "admins": sorted(str(p) for p in own.admins),
            "policy": {"require_hardware": own.policy.require_hardware},
            "coordinator": str(st.coordinator) if st else None,
            "term": st.term if st else 0,
            "coordinator_admins": sorted(str(p) for p in st.admins) if st else [],
            "members": [{
                "peer_id": str(r.peer_id), "tflops": round(r.tflops, 6),
                "role": "coordinator" if st and r.peer_id == st.coordinator else
                        ",".join(r.roles),
                "health": {"load": r.health.load, "battery": r.health.battery,
                           "plugged": r.health.plugged, "thermal": r.health.thermal},
                "kind": r.kind,
                "via": str(r.via) if r.via else None,
                "link": ("relay" if r.via else "tls") if r.links else "none",
                "dht": list(r.dht) if r.dht else None,
                "version": r.version,
                "expires_in": round(exp - time.time(), 1),
                "tasks": r.tasks,
                "memory": None if r.memory is None else
                          {"offered": r.memory[0], "used": r.memory[1]},
                "models": [m.hex() for m in r.models],
                "spans": [{"model": m.hex() or None, "blocks": [first, first + count - 1]}
                          for m, first, count in r.hosted],
            } for r, exp in self.members],
            "running_tasks": sum(r.tasks for r, _ in self.members),
            "jobs": jobs(r for r, _ in self.members),
            "placements": placements(r for r, _ in self.members),
            "blocked": [{"peer_id": str(b.peer), "reason": b.reason, "by": b.by, "at": b.at}
                        for b in (st.blocked if st else ())],
        }


def jobs(records) -> list[dict]:
    """Running work per requester, from the members' announcements (busiest first):
    ``{requester, workers, tasks}``. As fresh as the records (see ACTIVITY_INTERVAL)."""
    per: dict[PeerId, tuple[list[str], int]] = {}
    for r in records:
        for requester, n in r.serving:
            workers, total = per.get(requester, ([], 0))
            per[requester] = (workers + [str(r.peer_id)], total + n)
    return [{"requester": str(p), "workers": sorted(w), "tasks": n}
            for p, (w, n) in sorted(per.items(), key=lambda kv: (-kv[1][1], kv[0]))]


def placements(records) -> list[dict]:
    """Which worker hosts which blocks of which model, from the members' announcements:
    ``{model, spans: [{worker, blocks: [first, last]}]}`` per model (its content address
    prefix; None where the requester did not say), spans in block order. Each worker's own
    word, as fresh as its record."""
    per: dict[bytes, list[tuple[int, int, str]]] = {}
    for r in records:
        for model, first, count in r.hosted:
            per.setdefault(model, []).append((first, first + count - 1, str(r.peer_id)))
    return [{"model": m.hex() or None,
             "spans": [{"worker": w, "blocks": [a, b]} for a, b, w in sorted(spans)]}
            for m, spans in sorted(per.items())]


async def counted_coordinator_state(node: DHTNode, sid: bytes,
                                    members: list[tuple[MemberRecord, float]],
                                    ) -> CoordinatorState | None:
    """The coordinator state to follow among ``members``' items (the one most members say
    they follow, among those that count), with its whole blocklist: the core's own read
    (:func:`swarm.control.charter.fetch_state`) and rules
    (:func:`swarm.control.follow.newest_counted`, :func:`swarm.control.follow.rereads`), as
    newcomers and clients use. A member that left neither votes nor signs a state that counts
    (the core's view drops it too). While none counts, the items whose read came back empty
    are read again (at most :data:`~swarm.control.follow.STATE_READS` reads in all): one missed
    read of a busy coordinator's item is not "no coordinator". Where members vote for
    different states, only those whose DHT node answers this reader count
    (:func:`~swarm.control.follow.deciding_voters`): across a split, the other side's records
    must not elect the coordinator it cut off."""
    members = [(r, e) for r, e in members if not r.left]
    view = {r.peer_id: candidate(r, e) for r, e in members}

    async def read(peers: list[PeerId]) -> dict[PeerId, CoordinatorState | None]:
        got = await asyncio.gather(*(charter.fetch_state(node, p, sid) for p in peers))
        return {p: s if s is not None and s.swarm == sid else None
                for p, s in zip(peers, got, strict=True)}

    # Records that name different states to follow: the reachability of their members may
    # decide (below), so their pings go out beside the reads (a dead member's ping waits out
    # its whole timeout: after a failover, each status call waited it out after the reads).
    voting = [r for r, _ in members if r.follows is not None]
    pings = asyncio.ensure_future(_alive(node, [r.dht for r in voting])) \
        if len({r.follows for r in voting}) > 1 else None
    try:
        return await _counted(node, sid, members, view, read, pings)
    finally:
        if pings is not None:
            pings.cancel()
            await asyncio.gather(pings, return_exceptions=True)


async def _counted(node, sid, members, view, read, pings) -> CoordinatorState | None:
    found = await read(list(view))
    for _ in range(STATE_READS - 1):
        again = rereads(view, found)
        if not again:
            break
        await asyncio.sleep(REREAD_PAUSE)
        node.forget_failures()  # a node that timed out may have been busy, not gone
        found.update(await read(list(again)))
    states = [s for s in found.values() if s is not None]
    voters = [r for r, _ in members]
    contest = deciding_voters(states, view, voters)
    if contest:  # (a member silent once the others answered counts as gone)
        alive = await (pings if pings is not None else _alive(node, [r.dht for r in contest]))
        voters = [r for r in voters if r.peer_id not in {
            c.peer_id for c in contest if c.dht is None or tuple(c.dht) not in alive}]
    return newest_counted(states, view, votes=followers(voters))


async def _alive(node: DHTNode, addrs: list[tuple[str, int] | None]) -> set[tuple[str, int]]:
    """The DHT addresses among ``addrs`` that answer a ping now; one still silent once the
    others answered counts as gone (:meth:`dht.DHTNode.answering`: a dead member's ping
    waited out its whole timeout in every ``swarm status`` after a failover)."""
    return set(await node.answering(a for a in addrs if a is not None))


async def observe(node: DHTNode, uri: JoinURI) -> View:
    sid = swarm_id(uri.pubkey)
    # the charter and the member list at once: two lookups that do not wait on each other
    # (``swarm status`` runs them on every call)
    rec, anns = await asyncio.gather(charter.fetch(node, uri.pubkey, uri.owner or None),
                                     node.get_peers(membership_topic(sid)),
                                     return_exceptions=True)
    for got in (rec, anns):
        if isinstance(got, BaseException):
            raise got
    members: list[tuple[MemberRecord, float]] = []
    for ann in anns:
        try:
            members.append((MemberRecord.decode(ann.record, ann.peer_id), ann.expires_at))
        except ProtocolError:
            continue

    best = await counted_coordinator_state(node, sid, members)
    blocked = best.blocked_ids if best else frozenset()
    addrs = {r.peer_id: r.dht for r, _ in members if r.dht is not None}
    members = [(r, e) for r, e in members if r.peer_id not in blocked and not r.left]
    return View(rec, members, best, addrs)


JOIN_PEERS = 4
"""Peers a fresh join URI names."""


async def join_uri(node: DHTNode, uri: JoinURI, view: View) -> JoinURI:
    """A fresh join URI: the swarm of ``uri``, naming up to :data:`JOIN_PEERS` live members
    whose DHT address answered a ping just now (freshest announcements first), or, when none
    did, the bootstrap peers that answered; owner pin and name as in ``uri``. A member whose
    announcement outlived it is left out once the others answered
    (:meth:`dht.DHTNode.answering`), not waited for."""
    members = sorted(view.members, key=lambda m: -m[1])
    candidates = list(dict.fromkeys(tuple(r.dht) for r, _ in members if r.dht is not None))

    for pool in (candidates, list(uri.peers)):
        alive = await node.answering(pool) if pool else []
        if alive:
            return JoinURI(uri.pubkey, uri.name, uri.salt, tuple(alive[:JOIN_PEERS]),
                           uri.owner)
    return uri


async def send_command(node: DHTNode, uri: JoinURI, view: View, signed: Signed,
                       sender: PeerKey, wait: float = 15.0) -> CoordinatorState | None:
    """Deliver a signed command to the coordinator; wait until its DHT state reflects it."""
    coord = view.coordinator
    if coord is None or coord not in view.addrs:
        raise RemoteError("the swarm has no reachable coordinator right now; try again")
    sid = swarm_id(uri.pubkey)
    msg = seal(sender, sid, "cmd", signed.encode())
    try:
        await node.send_message(view.addrs[coord], msg)
    except DHTError as exc:
        raise RemoteError(f"coordinator {coord.short()} did not take the command: {exc}") \
            from None
    cmd = signed.statement
    kind = type(cmd).__name__
    if kind == "KickCommand":
        return None
    want_blocked = kind == "BlockCommand"
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        # The highest-term state, not just this coordinator's: blocking the coordinator
        # itself shows up in its successor's state.
        state = (await observe(node, uri)).state
        if state is not None and (cmd.target in state.blocked_ids) == want_blocked:
            return state
        await asyncio.sleep(0.2)
    raise RemoteError(f"coordinator {coord.short()} did not apply the command within "
                      f"{wait:.0f} s (not authorised? see its log)")
