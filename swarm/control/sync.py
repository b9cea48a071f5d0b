"""What a node reads from the DHT, and when (sans-IO): fed heartbeat digests and ``now``, it
answers with the fetches to start.

Polling the whole membership topic and the charter every second on every member cost each
node O(members) and the swarm O(members²). Instead the coordinator alone reads the topic
(O(members) for it; from every second while its view changes to every ``view_idle`` s while
it does not, a newcomer's hello bringing the next read forward) and every heartbeat carries a :class:`Digest` of what it holds: its
member view, its charter counter (the state head, term and blocklist digest travel in the
heartbeat already). A follower fetches only what differs from its own copy, at most once per
``min_gap`` (doubling while it still differs after a fetch: the coordinator may simply be
behind), plus a jittered safety-net refresh every ``safety`` seconds. When heartbeats stop
(``silence``), a follower falls back to reading the DHT itself, first at once, then backing
off from ``view`` to ``backoff_max`` seconds: a dead coordinator's successor is elected on a
fresh view, and a blocked member (who gets no more heartbeats) reads its block from the
coordinator's state item. Passive clients get no heartbeats and poll at a fixed ``view``.

Nothing here is done by every member to every other member on a timer: a follower's fetches
are lookups of one topic or one item, and only when something changed or the coordinator is
silent.
"""

from __future__ import annotations

import enum
import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass

import msgpack

from identity.keys import PeerId
from swarm.errors import ProtocolError

VIEW_DIGEST_BYTES = 16
MAX_DIGEST = 64


def view_digest(peers: Iterable[PeerId]) -> bytes:
    """A digest of a member view's peer ids (order-free): equal views, equal digests."""
    h = hashlib.sha256(b"swarm-view/v1\0")
    for raw in sorted(p.raw for p in peers):
        h.update(raw)
    return h.digest()[:VIEW_DIGEST_BYTES]


@dataclass(frozen=True)
class Digest:
    """What the coordinator holds, carried (signed) in each heartbeat."""

    view: bytes
    """:func:`view_digest` of the coordinator's member view."""
    members: int
    """How many members that view holds (for logs and the simulation's checks)."""
    charter: int
    """The highest charter counter the coordinator accepted."""

    def encode(self) -> bytes:
        return msgpack.packb({"v": self.view, "n": self.members, "c": self.charter},
                             use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> Digest:
        """Parse a heartbeat's digest; :class:`ProtocolError` when it is malformed."""
        if not isinstance(data, bytes) or len(data) > MAX_DIGEST:
            raise ProtocolError("sync digest is not bytes or too long")
        try:
            o = msgpack.unpackb(data, raw=False, strict_map_key=True)
            v, n, c = o["v"], o["n"], o["c"]
            if not (isinstance(v, bytes) and len(v) == VIEW_DIGEST_BYTES and type(n) is int
                    and 0 <= n < 1 << 31 and type(c) is int and 0 <= c < 1 << 63):
                raise ValueError("bad fields")
        except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"malformed sync digest: {exc}") from None
        return cls(v, n, c)


def rival_batch(peers: Iterable[PeerId], after: PeerId | None, batch: int) -> list[PeerId]:
    """The next ``batch`` of ``peers`` (in id order) after ``after``, wrapping round: the
    members whose state items a coordinator's rival check reads this time."""
    ordered = sorted(set(peers), key=lambda p: p.raw)
    if len(ordered) <= batch:
        return ordered
    start = 0 if after is None else next(
        (i for i, p in enumerate(ordered) if p.raw > after.raw), 0)
    return [ordered[(start + i) % len(ordered)] for i in range(batch)]


class Fetch(enum.Enum):
    """A read the adapter starts (and reports back with :meth:`Sync.done`)."""

    VIEW = "view"
    """get_peers of the membership topic, then the controller's ``members``."""
    CHARTER = "charter"
    """Fetch and verify the charter chain (raising the counter floor)."""
    STATE = "state"
    """The state items: our coordinator's (catch up on a missed heartbeat, or a block of
    ourselves), or all members' when we follow nobody yet."""
    RIVALS = "rivals"
    """A coordinator's check of the members' state items for a rival (split brain)."""


class Mode(enum.Enum):
    """How this node reads the DHT now."""

    COORDINATING = "coordinating"
    """Reads the charter and the rivals itself on fixed periods, and the topic backing off
    while its view does not change (hellos bring it forward)."""
    FOLLOWING = "following"
    """Hears digests; fetches what differs, plus the jittered safety net."""
    SILENT = "silent"
    """No heartbeat for ``silence`` s (or none yet): reads the DHT itself, backing off."""
    PASSIVE = "passive"
    """A client that does not announce itself: no heartbeats, fixed-period reads."""


@dataclass(frozen=True)
class SyncTiming:
    """Periods in seconds."""

    view: float = 1.0
    """A passive client's topic read; a coordinator's while its view changes; the
    fallback's first step."""
    view_idle: float = 8.0
    """The longest gap between a coordinator's topic reads while its view does not change
    (doubling from ``view``): every replica answers each read with the whole list, so a
    read a second cost every node of a small swarm O(members) bytes. A newcomer's hello
    (:meth:`Sync.nudged`) brings the next read forward, so joins are not slowed."""
    charter: float = 5.0
    """A coordinator's (and a passive client's) charter refresh."""
    rivals: float = 5.0
    """A coordinator's read of members' state items (``rival_batch`` of them each time)."""
    rival_batch: int = 20
    """Members whose state items one rival check reads, round robin (:func:`rival_batch`):
    a lookup per member every 5 s cost a 1,000-member swarm's coordinator ~8 MB/s; a whole
    sweep now takes ``rivals * members / rival_batch`` s (swarms up to 20: every check)."""
    silence: float = 1.0
    """No heartbeat for this long: the follower reads the DHT itself (the plane uses half
    of Timing.failover: the view is fresh before the election runs)."""
    backoff_max: float = 8.0
    """The longest gap between a silent follower's reads."""
    min_gap: float = 1.0
    """The shortest gap between two fetches of one kind that a digest asks for."""
    safety: float = 30.0
    """A following member's refresh of each item, whatever the digests say."""
    view_batch: int = 20
    """Members per ``safety`` seconds of a follower's view safety net: a listing of N members
    costs O(N) bytes, so it is repeated every ``safety * N / view_batch`` s and costs each
    member the same whatever the swarm's size (a silent coordinator re-lists it at once)."""
    jitter: float = 0.25
    """Each safety-net and backoff gap is scaled by a random factor in [1 - j, 1 + j]."""


FIXED = {Mode.COORDINATING: {Fetch.VIEW: "view", Fetch.CHARTER: "charter",
                             Fetch.RIVALS: "rivals"},
         Mode.PASSIVE: {Fetch.VIEW: "view", Fetch.CHARTER: "charter", Fetch.STATE: "view"}}
"""The fixed-period reads of the modes that have them (periods named from SyncTiming)."""


class Sync:
    """Decides the DHT reads of one node. Feed :meth:`heard` (a heartbeat from the
    coordinator we follow, after the controller accepted it), :meth:`have` (what we hold
    now), :meth:`role`; call :meth:`due` on every tick and start what it returns, then
    report each with :meth:`done`."""

    def __init__(self, now: float, timing: SyncTiming = SyncTiming(), *,
                 passive: bool = False, rng: random.Random | None = None) -> None:
        self.timing = timing
        self.passive = passive
        self.coordinating = False
        self.rng = rng or random.Random()
        self.digest: Digest | None = None
        """The last digest heard."""
        self.heard_at: float | None = None
        self.view: bytes = b""
        """Our own view's digest."""
        self.charter = 0
        """Our own charter counter."""
        self.members = 1
        """How many members our own view lists."""
        self._next: dict[Fetch, float] = dict.fromkeys(Fetch, now)
        self._gap: dict[Fetch, float] = dict.fromkeys(Fetch, timing.min_gap)
        self._busy: set[Fetch] = set()
        self._ended: dict[Fetch, float] = dict.fromkeys(Fetch, float("-inf"))
        self._listed: bytes | None = None
        """The view a coordinator's last topic read ended with (a change resets its gap)."""
        self._mode = self.mode(now)
        self.counts: dict[Fetch, int] = dict.fromkeys(Fetch, 0)
        """Fetches started, by kind (benchmarks and tests read them)."""

    # -- events ----------------------------------------------------------------------------

    def heard(self, digest: Digest | None, now: float) -> None:
        """A heartbeat from the coordinator we follow (``digest`` None if it carried none)."""
        self.heard_at = now
        if digest is not None and digest != self.digest:
            self.digest = digest
            for f in (Fetch.VIEW, Fetch.CHARTER):  # a change: the backoff starts over
                self._gap[f] = self.timing.min_gap
        if self.mode(now) is Mode.FOLLOWING:
            for f in (Fetch.VIEW, Fetch.CHARTER):
                if self._differs(f):
                    self._next[f] = min(self._next[f], max(now, self._ended[f] + self._gap[f]))

    def have(self, view: bytes | None = None, charter: int | None = None,
             members: int | None = None) -> None:
        """What we hold now (after a fetch, or any other change of our view or charter;
        ``members``: how many our view lists)."""
        if view is not None:
            self.view = view
        if charter is not None:
            self.charter = charter
        if members is not None:
            self.members = members

    def role(self, coordinating: bool, now: float) -> None:
        """We became, or stopped being, the coordinator."""
        if coordinating != self.coordinating:
            self.coordinating = coordinating
            self.heard_at = None if coordinating else now  # a new follower: grace first
            self._next = dict.fromkeys(Fetch, now)
            self._gap[Fetch.VIEW] = self.timing.view
            self._listed = None

    def nudged(self, now: float) -> None:
        """A member the coordinator does not list said hello: read the topic soon (at most
        once per ``min_gap``, however many hellos arrive: a flood costs the old rate)."""
        if self.coordinating:
            self._gap[Fetch.VIEW] = self.timing.view
            self._next[Fetch.VIEW] = min(self._next[Fetch.VIEW],
                                         max(now, self._ended[Fetch.VIEW] + self.timing.min_gap))

    def done(self, fetch: Fetch, now: float, ok: bool = True) -> None:
        """A fetch that :meth:`due` returned has finished (``ok``: it got an answer)."""
        self._busy.discard(fetch)
        self._ended[fetch] = now
        mode = self.mode(now)
        if mode is Mode.COORDINATING and fetch is Fetch.VIEW:
            changed, self._listed = self.view != self._listed, self.view
            gap = self.timing.view if changed or not ok else \
                min(self._gap[fetch] * 2, self.timing.view_idle)
            self._gap[fetch] = gap
            self._next[fetch] = now + gap
            return
        if mode in FIXED:
            return
        if mode is Mode.SILENT and fetch in (Fetch.VIEW, Fetch.STATE):
            self._next[fetch] = now + self._jittered(self._gap[fetch])
            self._gap[fetch] = min(self._gap[fetch] * 2, self.timing.backoff_max)
            return
        if self._differs(fetch) or not ok:  # still differs: the coordinator may be behind
            self._next[fetch] = now + self._gap[fetch]
            self._gap[fetch] = min(self._gap[fetch] * 2, self.timing.safety)
        else:
            self._gap[fetch] = self.timing.min_gap
            self._next[fetch] = now + self._jittered(self._safety(fetch))

    # -- queries ---------------------------------------------------------------------------

    def mode(self, now: float) -> Mode:
        if self.coordinating:
            return Mode.COORDINATING
        if self.passive:
            return Mode.PASSIVE
        if self.heard_at is None or now - self.heard_at >= self.timing.silence:
            return Mode.SILENT
        return Mode.FOLLOWING

    def due(self, now: float) -> list[Fetch]:
        """The fetches to start now (each marked in flight until :meth:`done`)."""
        mode = self.mode(now)
        if mode is not self._mode:
            self._enter(mode, now)
        out: list[Fetch] = []
        for fetch in self._wanted(mode):
            if fetch in self._busy or now < self._next[fetch]:
                continue
            if mode in FIXED:
                self._next[fetch] = now + getattr(self.timing, FIXED[mode][fetch])
            else:
                self._next[fetch] = now + self.timing.backoff_max + self.timing.safety
                # (the real next time is set by done(); this only guards a lost report)
            self._busy.add(fetch)
            self.counts[fetch] += 1
            out.append(fetch)
        return out

    # -- inside ----------------------------------------------------------------------------

    def _wanted(self, mode: Mode) -> tuple[Fetch, ...]:
        if mode in FIXED:
            return tuple(FIXED[mode])
        return (Fetch.VIEW, Fetch.CHARTER, Fetch.STATE)

    def _differs(self, fetch: Fetch) -> bool:
        d = self.digest
        if d is None:
            return False
        if fetch is Fetch.VIEW:
            return d.view != self.view
        if fetch is Fetch.CHARTER:
            return d.charter > self.charter
        return False

    def _enter(self, mode: Mode, now: float) -> None:
        self._mode = mode
        if mode is Mode.SILENT:  # read the DHT at once, then back off
            for f in (Fetch.VIEW, Fetch.STATE):
                self._next[f] = now
                self._gap[f] = self.timing.view
        elif mode is Mode.FOLLOWING:  # heard again: only what differs, and the safety net
            for f in (Fetch.VIEW, Fetch.CHARTER, Fetch.STATE):
                self._gap[f] = self.timing.min_gap
                self._next[f] = now if self._differs(f) else \
                    now + self._jittered(self._safety(f))
        else:
            self._next = dict.fromkeys(Fetch, now)

    def _safety(self, fetch: Fetch) -> float:
        """The safety-net gap of ``fetch``: a listing of the whole membership costs O(members)
        bytes, so its gap grows with the swarm (per member per second the net stays flat);
        single items keep ``safety``."""
        if fetch is Fetch.VIEW and self.digest is not None:
            # the coordinator's count, but never above twice our own view's: a digest that
            # claims 2^31 members would push the net out by a century (issue 33)
            members = min(self.digest.members, 2 * max(self.members, self.timing.view_batch))
            return self.timing.safety * max(1.0, members / self.timing.view_batch)
        return self.timing.safety

    def _jittered(self, gap: float) -> float:
        j = self.timing.jitter
        return gap * self.rng.uniform(1 - j, 1 + j)
