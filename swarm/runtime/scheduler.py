"""Sans-IO shard scheduler: weighted by measured throughput, work stealing, stragglers, retries.

One :class:`JobScheduler` drives one job's shards. It does no I/O and reads no clock: the
requester's adapter feeds it events (a worker joined or was lost, a shard's result verified
or was rejected) with ``now`` and executes the :class:`Assign` / :class:`Cancel` actions that
:meth:`JobScheduler.step` returns. Tests drive it with a fake clock.

Policy, in order of preference for an idle slot on worker ``w``:

1. ``w``'s own queue (shards were dealt to workers in proportion to their measured rates);
2. when idle, steal the queued shard, from the most loaded other worker, whose large inputs ``w``
   already holds (locality), else the one at the tail of that worker's queue; only a shard
   ``w`` would likely finish before its worker got to it and finished it (rates known);
3. duplicate a straggler: an in-flight shard running longer than ``straggler_factor`` times
   its expected time (as it was when the shard was sent) elsewhere; the first verified
   result wins, the other is cancelled and its peer, unless heard from meanwhile, held for
   a while to no faster than it had run (:meth:`RateBook.slower_than`).

A shard whose result failed verification, whose worker was lost, or that ran past
``task_timeout`` goes back to the pool; a worker that returned a wrong result gets nothing
more from this job, one that failed a shard does not get that shard again (unless it is the
only worker), and one whose link broke under it may (a lost link blames no one). With no usable worker left, or for a shard that failed
``max_attempts`` times, the requester runs shards itself (:data:`LOCAL`, "solo mode"), so a
job completes while the requester lives (invariant 3).

``owners`` gives each shard's first worker (a plan already weighted by measured rates);
without it shards are dealt in proportion to the rates. ``twins`` pairs shards that must
run on different peers (``verify="replicate"``); a twin no worker may take runs locally.

Rates (:class:`RateBook`) are *observed* flops per second of verified shards, an EWMA kept
across jobs; a peer's own claim (its announced TFLOPS) is never used for weighting.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

LOCAL = "local"
"""The requester itself, as a worker of last resort."""

Peer = Hashable


@dataclass(frozen=True, slots=True)
class ShardTask:
    """What the scheduler needs to know about one shard."""

    index: int
    """Position of the shard in the job (0-based, dense)."""
    cost: float
    """Work in flops (2*m*k*n for a matmul shard); turns elapsed time into a rate."""
    inputs: tuple[Hashable, ...] = ()
    """Ids of large inputs (weights) that stay cached on workers: the locality hint."""


@dataclass(frozen=True, slots=True)
class Assign:
    """Action: run ``shard`` on ``peer`` (``LOCAL`` = on the requester itself)."""

    shard: int
    """Shard index."""
    peer: Peer
    """Worker to run it on."""
    attempt: int
    """1 for the first run of this shard, higher for retries and straggler copies."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """Action: ``peer`` may stop ``shard``; another copy's result already won."""

    shard: int
    """Shard index."""
    peer: Peer
    """Worker running the losing copy."""


RATE_HOLD = 10.0
"""Seconds a straggler beaten by its copy stays rated at what it had run so far (about twice
a link probe's timeout: a silent peer's link is closed before the hold ends)."""

MIN_RATED_FLOPS = 1e9
"""Shards smaller than this measure a round trip's overhead more than a peer's throughput (a
1x1 job "measured" 60 flop/s beside 7e8 from a large band, and the next job's bands all went
to the other worker); their rates stand in only where no larger shard was measured."""


class SlotBook:
    """The slots a requester's jobs share (sans-IO): tasks at each peer over all jobs (calls
    pending plus slots booked for calls about to start; :class:`JobScheduler`'s window counts
    them through its ``inflight``), and the jobs waiting for a freed slot, oldest first.

    One book per requester: jobs planned in one loop turn otherwise saw none of each other's
    tasks, and a freed slot is offered to the waiting jobs in turn instead of waking them all.
    """

    def __init__(self) -> None:
        self._at: dict[Hashable, int] = {}
        self._waiting: dict[Hashable, None] = {}

    def at(self, peer: Hashable) -> int:
        """Tasks at ``peer`` now, all jobs."""
        return self._at.get(peer, 0)

    def enter(self, peer: Hashable) -> None:
        """One more task at ``peer`` (booked or sent)."""
        self._at[peer] = self._at.get(peer, 0) + 1

    def leave(self, peer: Hashable) -> None:
        """A task at ``peer`` ended, or its booked call never started."""
        self._at[peer] = self._at.get(peer, 0) - 1
        if self._at[peer] <= 0:
            del self._at[peer]

    def want(self, job: Hashable, wants: bool) -> None:
        """Whether ``job`` could start a task at a freed slot now (a job already waiting
        keeps its turn)."""
        if wants:
            self._waiting.setdefault(job, None)
        else:
            self._waiting.pop(job, None)

    def waiting(self) -> list[Hashable]:
        """The jobs to offer a freed slot to, oldest first."""
        return list(self._waiting)


class RateBook:
    """Observed throughput per peer (flops/s, EWMA) and a reputation tally, kept across jobs.

    A straggler beaten by its copy, and not heard from while it ran, is *held* to a bound
    for :data:`RATE_HOLD` seconds of ``clock`` (the requester's loop time; tests pass a fake
    one). The bound never enters the average, and the hold ends early when the peer is heard
    from, so a stall does not cost a peer its share for good."""

    def __init__(self, alpha: float = 0.5, clock: Callable[[], float] = time.monotonic,
                 max_peers: int = 4096) -> None:
        self.alpha = alpha
        self.clock = clock
        self.max_peers = max_peers
        self._peers: dict[Peer, None] = {}  # every peer with an entry, least recent first
        self._rates: dict[Peer, float] = {}
        self._sized: set[Peer] = set()  # rates measured on shards of MIN_RATED_FLOPS or more
        self._held: dict[Peer, tuple[float, float]] = {}  # peer -> (bound, until)
        self._heard: dict[Peer, float] = {}  # peer -> when it last answered a probe or linked
        self.verified: dict[Peer, int] = {}
        self.rejected: dict[Peer, int] = {}

    def observe(self, peer: Peer, flops: float, seconds: float) -> None:
        """A verified shard of ``flops`` took ``seconds`` on ``peer`` (it answers: any hold
        on it ends)."""
        self._touch(peer)
        self.verified[peer] = self.verified.get(peer, 0) + 1
        self._held.pop(peer, None)
        sized = flops >= MIN_RATED_FLOPS
        if not sized and peer in self._sized:
            return  # a small shard's rate would only blur a measured one
        rate = flops / max(seconds, 1e-6)
        # a first large shard starts afresh: small shards' rates are not averaged into it
        old = None if sized and peer not in self._sized else self._rates.get(peer)
        self._rates[peer] = rate if old is None else old + self.alpha * (rate - old)
        if sized:
            self._sized.add(peer)

    def slower_than(self, peer: Peer, flops: float, seconds: float,
                    ran: float | None = None) -> None:
        """``peer`` had not finished a shard of ``flops`` after ``seconds`` of its own time
        (``ran`` since it was sent) when a copy elsewhere won: its rate is at most
        ``flops / seconds``.

        Heard from meanwhile (:meth:`heard`), it is slow, not silent (a far peer, a browser
        tab, a stalled host): its rate moves toward the bound as a measurement would, by
        ``alpha`` (a peer never measured takes it), so a far peer stops being dealt bands it
        only makes the job wait for, and one stall does not starve a peer. Not heard from,
        it is *held* to the bound for :data:`RATE_HOLD` seconds: a peer gone silent (a NAT
        mapping lost, its link not yet called dead) is dealt nothing at once, instead of
        costing every job a straggler's wait until its link is probed and closed."""
        if flops < MIN_RATED_FLOPS and peer in self._sized:
            return
        self._touch(peer)
        now = self.clock()
        bound = flops / max(seconds, 1e-6)
        if self._heard.get(peer, -math.inf) >= now - (seconds if ran is None else ran):
            self._slower(peer, bound)
            return
        held = self._held.get(peer)
        if held is not None and held[1] > now:
            bound = min(bound, held[0])
        self._held[peer] = (bound, now + RATE_HOLD)

    def heard(self, peer: Peer) -> None:
        """``peer`` answered a probe or linked again: it is there, so a hold on it ends (a
        peer dealt nothing is never measured again) and counts as a slow answer instead."""
        self._touch(peer)
        self._heard[peer] = self.clock()
        held = self._held.pop(peer, None)
        if held is not None:
            self._slower(peer, held[0])

    def _touch(self, peer: Peer) -> None:
        """``peer`` is about to get an entry: at most ``max_peers`` peers are kept (workers
        linked over time, fresh keys among them), the least recently heard of forgotten
        first (it is measured again if it returns)."""
        self._peers.pop(peer, None)
        self._peers[peer] = None
        while len(self._peers) > self.max_peers:
            old = next(iter(self._peers))
            del self._peers[old]
            for book in (self._rates, self._held, self._heard, self.verified, self.rejected):
                book.pop(old, None)
            self._sized.discard(old)

    def _slower(self, peer: Peer, bound: float) -> None:
        old = self._rates.get(peer)
        if old is None or bound < old:
            self._rates[peer] = bound if old is None else old + self.alpha * (bound - old)

    def _bound(self, peer: Peer) -> float | None:
        held = self._held.get(peer)
        if held is None:
            return None
        if held[1] <= self.clock():
            del self._held[peer]
            return None
        return held[0]

    def reject(self, peer: Peer) -> None:
        """``peer`` returned a result that failed verification."""
        self._touch(peer)
        self.rejected[peer] = self.rejected.get(peer, 0) + 1

    def rate(self, peer: Peer) -> float | None:
        """Measured flops/s (held lower while it is held), or None before the first
        verified shard or hold."""
        rate, bound = self._rates.get(peer), self._bound(peer)
        if bound is None or rate is None:
            return rate if bound is None else bound
        return min(rate, bound)

    def weight(self, peer: Peer, among: Iterable[Peer] = ()) -> float:
        """Relative weight: the measured rate; for a peer measured only on small shards (or
        not at all), the median rate of ``among`` measured on large ones, if any, else its
        own, else the median of ``among``'s known rates. A held peer weighs no more than its
        bound."""
        bound = self._bound(peer)
        weight = self._weight(peer, list(among))
        return weight if bound is None else min(weight, bound)

    def _weight(self, peer: Peer, among: list[Peer]) -> float:
        if peer in self._sized:
            return self._rates[peer]
        sized = [self._rates[p] for p in among if p in self._sized]
        if sized:
            return statistics.median(sized)
        known = self._rates.get(peer)
        if known is not None:
            return known
        others = [r for p in among if (r := self._rates.get(p)) is not None]
        return statistics.median(others) if others else 1.0


class ServiceClock:
    """How long each answer took *at the peer*, as the requester sees it, for :class:`RateBook`.

    A peer runs its tasks one after another, and a requester keeps a window of them in
    flight: the second task of a window waits in the peer's queue while the first runs, so its
    round trip counts its neighbour's work too and halves the peer's measured rate (bands
    are then dealt by noise). Its service time starts when the peer's previous answer came.
    A far peer answers a window of small tasks about one round trip after they left, almost
    at once, so "since the previous answer" would be ~0 for the second one and its rate
    sample huge: a task is never credited with less than its round trip shared among the
    ``turn`` tasks at the peer when it left (itself included). For a peer that runs its tasks
    one after another that floor never binds. Only times the requester observed are used,
    never a peer's claim."""

    def __init__(self, max_peers: int = 4096) -> None:
        self.max_peers = max_peers
        self._last: dict[Peer, float] = {}  # oldest first; forgetting one costs one estimate

    def seconds(self, peer: Peer, sent: float, answered: float, turn: int = 1) -> float:
        """Service time of a task sent to ``peer`` at ``sent`` and answered at ``answered``,
        ``turn`` tasks being at the peer when it left (itself included)."""
        last = self._last.pop(peer, None)
        self._last[peer] = answered if last is None else max(last, answered)
        if len(self._last) > self.max_peers:
            del self._last[next(iter(self._last))]
        since = answered - (sent if last is None else min(answered, max(sent, last)))
        return max(since, (answered - sent) / max(1, turn))


def deal(counts_by_weight: dict[Peer, float], n: int) -> dict[Peer, int]:
    """Split ``n`` items among peers in proportion to weights (largest remainder)."""
    peers = sorted(counts_by_weight, key=repr)
    total = sum(counts_by_weight.values()) or 1.0
    exact = {p: n * counts_by_weight[p] / total for p in peers}
    out = {p: int(exact[p]) for p in peers}
    rest = n - sum(out.values())
    for p in sorted(peers, key=lambda p: exact[p] - out[p], reverse=True)[:rest]:
        out[p] += 1
    return out


@dataclass
class _Worker:
    peer: Peer
    queue: deque[int] = field(default_factory=deque)
    running: dict[int, float] = field(default_factory=dict)  # shard -> started at
    turn: dict[int, int] = field(default_factory=dict)  # shard -> tasks at the peer before it + 1
    expected: dict[int, float] = field(default_factory=dict)  # shard -> seconds, when sent
    banned: bool = False


class JobScheduler:
    """Schedules one job's shards over a changing set of workers (see module docstring)."""

    def __init__(
        self,
        shards: Sequence[ShardTask],
        workers: Iterable[Peer],
        rates: RateBook,
        *,
        holds: dict[Peer, set[Hashable]] | None = None,
        owners: Sequence[Peer] | None = None,
        twins: Sequence[int] | None = None,
        window: int = 2,
        straggler_factor: float = 3.0,
        straggler_min: float = 0.05,
        task_timeout: float = 60.0,
        max_attempts: int = 6,
        inflight: Callable[[Peer], int] | None = None,
    ) -> None:
        if [s.index for s in shards] != list(range(len(shards))):
            raise ValueError("shard indices must be 0..n-1 in order")
        self.shards = list(shards)
        self.rates = rates
        self.holds = holds if holds is not None else {}
        self.window = window
        self.straggler_factor = straggler_factor
        self.straggler_min = straggler_min
        self.task_timeout = task_timeout
        self.max_attempts = max_attempts
        self.inflight = inflight or (lambda peer: 0)
        """Tasks the requester has at a peer, all its jobs (this one's included). The window
        is per peer, not per job: a peer full with other jobs' tasks gets nothing more, so
        many small jobs in flight queue here, where an idle peer can still take them,
        instead of piling up in one peer's queue (and looking like stragglers there)."""
        self.done: dict[int, Peer] = {}
        self.attempts = [0] * len(shards)
        self._failed_on: dict[int, set[Peer]] = {}
        self._twins = list(twins) if twins is not None else None
        if self._twins is not None and sorted(self._twins) != list(range(len(shards))):
            raise ValueError("twins must pair up shard indices")
        self._workers: dict[Peer, _Worker] = {}
        self._pool: deque[int] = deque()  # shards not queued on any worker
        self._local_only: deque[int] = deque()  # shards out of remote attempts
        self._checking: dict[int, set[Peer]] = {}  # results being verified, by shard
        self._no_copies: set[int] = set()  # shards never duplicated again
        self._overdue: set[tuple[int, Peer, float]] = set()  # attempts told by overdue()
        for peer in workers:
            self._workers[peer] = _Worker(peer)
        if owners is None:
            self._deal(range(len(shards)))
        else:
            if len(owners) != len(shards):
                raise ValueError("owners needs one peer per shard")
            for i, peer in enumerate(owners):
                w = self._workers.get(peer)
                (w.queue if w is not None else self._pool).append(i)

    # -- state -----------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.shards)

    def workers(self) -> list[Peer]:
        return [w.peer for w in self._workers.values() if not w.banned]

    def running_on(self, peer: Peer) -> list[int]:
        w = self._workers.get(peer)
        return list(w.running) if w else []

    def _usable(self) -> list[_Worker]:
        return [w for w in self._workers.values() if not w.banned and w.peer != LOCAL]

    def _deal(self, indices: Iterable[int]) -> None:
        """Queue shards on usable workers in proportion to their measured rates."""
        todo = [i for i in indices if i not in self.done]
        usable = self._usable()
        if not usable:
            self._pool.extend(todo)
            return
        peers = [w.peer for w in usable]
        weights = {p: self.rates.weight(p, peers) for p in peers}
        counts = deal(weights, len(todo))
        it = iter(todo)
        for w in usable:
            for _ in range(counts[w.peer]):
                w.queue.append(next(it))

    # -- events ------------------------------------------------------------------------------

    def add_worker(self, peer: Peer) -> None:
        """A worker became available; it takes work by stealing at the next :meth:`step`."""
        if peer not in self._workers:
            self._workers[peer] = _Worker(peer)

    def lost(self, peer: Peer) -> None:
        """``peer``'s link broke or it crashed: everything it held goes back to the pool."""
        w = self._workers.pop(peer, None)
        if w is None:
            return
        back = list(w.running) + list(w.queue)
        self._pool.extend(i for i in back if i not in self.done and not self._running_elsewhere(i))

    def returned(self, shard: int, peer: Peer) -> None:
        """``peer`` answered ``shard``; its slot is free while the requester verifies."""
        w = self._workers.get(peer)
        if w is not None and shard in w.running:
            del w.running[shard]
            self._checking.setdefault(shard, set()).add(peer)

    def _checked(self, shard: int, peer: Peer) -> None:
        peers = self._checking.get(shard)
        if peers is not None:
            peers.discard(peer)
            if not peers:
                del self._checking[shard]

    def verified(self, shard: int, peer: Peer, seconds: float,
                 now: float | None = None) -> list[Cancel]:
        """``peer``'s result for ``shard`` passed verification. Returns copies to cancel;
        given ``now``, each one's peer is rated no faster than it had run so far."""
        self._checked(shard, peer)
        w = self._workers.get(peer)
        if w is not None:
            w.running.pop(shard, None)
        if shard in self.done:
            return []
        self.done[shard] = peer
        if peer != LOCAL:
            self.rates.observe(peer, self.shards[shard].cost, seconds)
        cancels = []
        for other in self._workers.values():
            if shard in other.running:
                started = other.running.pop(shard)
                cancels.append(Cancel(shard, other.peer))
                if now is not None and other.peer != LOCAL and now > started:
                    self.rates.slower_than(other.peer, self.shards[shard].cost,
                                           (now - started) / other.turn.get(shard, 1),
                                           ran=now - started)
            if shard in other.queue:
                other.queue.remove(shard)
        if shard in self._pool:
            self._pool.remove(shard)
        return cancels

    def rejected(self, shard: int, peer: Peer) -> None:
        """``peer``'s result for ``shard`` was wrong: ban it for this job, redo the shard."""
        self._checked(shard, peer)
        self.rates.reject(peer)
        w = self._workers.get(peer)
        if w is not None:
            w.banned = True
            w.running.pop(shard, None)
            back = list(w.queue) + list(w.running)
            w.queue.clear()
            w.running.clear()
            self._requeue(back)
        self._fail_attempt(shard, peer)

    def errored(self, shard: int, peer: Peer, *, lost: bool = False) -> None:
        """``peer`` reported an error (or timed out) for ``shard``: retry it elsewhere if
        possible. ``lost``: the link broke under the task, which says nothing about the
        shard, so ``peer`` may take it again (re-dialed after a NAT mapping was lost, it may
        be the only worker left to copy a straggler to); attempts still run out."""
        w = self._workers.get(peer)
        if w is not None:
            w.running.pop(shard, None)
        self._fail_attempt(shard, peer, blame=not lost)

    def no_copies(self, shard: int) -> None:
        """Never start straggler copies of ``shard`` again (it already ran past a limit)."""
        self._no_copies.add(shard)

    def _fail_attempt(self, shard: int, peer: Peer, *, blame: bool = True) -> None:
        if shard in self.done:
            return
        if blame:
            self._failed_on.setdefault(shard, set()).add(peer)
        if self._running_elsewhere(shard):
            return
        if self.attempts[shard] >= self.max_attempts:
            self._local_only.append(shard)  # the swarm keeps failing it: do it ourselves
        else:
            self._pool.appendleft(shard)

    def _requeue(self, shards: Iterable[int]) -> None:
        for i in shards:
            if i not in self.done and not self._running_elsewhere(i) and i not in self._pool:
                self._pool.append(i)

    def _avoid(self, shard: int, peer: Peer) -> bool:
        """Whether ``peer`` must not run ``shard``: it ran or runs the shard's twin."""
        if self._twins is None or peer == LOCAL:
            return False
        twin = self._twins[shard]
        return self.done.get(twin) == peer or twin in getattr(self._workers.get(peer),
                                                              "running", ())

    def _running_elsewhere(self, shard: int) -> bool:
        return shard in self._checking or any(shard in w.running for w in self._workers.values())

    # -- decisions ---------------------------------------------------------------------------

    def step(self, now: float) -> list[Assign]:
        """Fill every free slot; call after each event and at :meth:`next_deadline`."""
        out: list[Assign] = []
        for w in list(self._workers.values()):
            for shard, started in list(w.running.items()):
                if now - started > self.task_timeout:
                    self.errored(shard, w.peer)
        usable = self._usable()
        if not usable:
            return self._solo(now)
        for shard in list(self._pool):
            if all(self._avoid(shard, w.peer) for w in usable) and not any(
                    shard in w.running for w in usable):
                self._pool.remove(shard)
                self._local_only.append(shard)
        if self._local_only:
            local = self._workers.setdefault(LOCAL, _Worker(LOCAL))
            if not local.running:
                out.append(self._start(local, self._local_only.popleft(), now))
        progress = True
        while progress:
            progress = False
            for w in sorted(usable, key=lambda w: len(w.running)):
                if max(len(w.running), self.inflight(w.peer)) >= self.window:
                    continue
                shard = self._pick(w, now)
                if shard is not None:
                    out.append(self._start(w, shard, now))
                    progress = True
        return out

    def _pick(self, w: _Worker, now: float) -> int | None:
        while w.queue:
            shard = w.queue.popleft()
            if shard in self.done or self._running_elsewhere(shard):
                continue
            if self._avoid(shard, w.peer):
                self._pool.append(shard)
                continue
            return shard
        shard = self._from_pool(w)
        if shard is not None:
            return shard
        if w.running:  # only an idle worker steals: the deal already matched measured rates
            return None
        shard = self._steal(w)
        if shard is not None:
            return shard
        return self._straggler(w, now)

    def _from_pool(self, w: _Worker) -> int | None:
        for shard in list(self._pool):
            if self._avoid(shard, w.peer):
                continue
            if w.peer not in self._failed_on.get(shard, ()) or self._only_worker(w):
                self._pool.remove(shard)
                if shard in self.done or self._running_elsewhere(shard):
                    continue
                return shard
        return None

    def _only_worker(self, w: _Worker) -> bool:
        return all(o is w for o in self._usable())

    def _steal(self, w: _Worker) -> int | None:
        found = self._steal_from(w)
        if found is None:
            return None
        victim, shard = found
        victim.queue.remove(shard)
        return shard

    def _steal_from(self, w: _Worker) -> tuple[_Worker, int] | None:
        """The queued shard idle ``w`` would steal, and from whom (nothing taken yet)."""
        victims = [o for o in self._usable() if o is not w and o.queue]
        if not victims:
            return None
        victim = max(victims, key=lambda o: (len(o.queue), repr(o.peer)))
        held = self.holds.get(w.peer, set())
        allowed = [s for pos, s in enumerate(victim.queue) if not self._avoid(s, w.peer)
                   and self._sooner(w, victim, s, pos)]
        for shard in reversed(allowed):
            if held.intersection(self.shards[shard].inputs):
                return victim, shard
        return (victim, allowed[-1]) if allowed else None

    def _sooner(self, thief: _Worker, victim: _Worker, shard: int, pos: int) -> bool:
        """Whether ``thief`` would likely finish ``shard`` (at ``pos`` in ``victim``'s queue)
        before ``victim`` got to it and finished it: each runs what it already holds first
        (this job's and others'), one after another at its measured rate. An idle peer whose
        one task takes longer (a far or relayed peer, a browser tab) than the victim's whole
        queue only makes the job wait for it (measured: four jobs of two 192-row bands
        beside a peer 200 ms away took 425 ms a batch, each job waiting for the band it
        stole). Unknown rates steal, so a new peer gets measured."""
        mine, theirs = self._expected(thief.peer, shard), self._expected(victim.peer, shard)
        if mine is None or theirs is None:
            return True
        ahead_mine = max(self.inflight(thief.peer), len(thief.running))
        ahead_theirs = max(self.inflight(victim.peer), len(victim.running)) + pos
        return (ahead_mine + 1) * mine < (ahead_theirs + 1) * theirs

    def _expected(self, peer: Peer, shard: int) -> float | None:
        rate = self.rates.rate(peer)
        if rate is None:
            known = [r for p in self._workers if (r := self.rates.rate(p)) is not None]
            if not known:
                return None
            rate = statistics.median(known)
        return self.shards[shard].cost / rate

    def _straggler_due(self, peer: Peer, shard: int, started: float) -> float | None:
        """When ``shard``, started on ``peer`` at ``started``, becomes a straggler (None: no
        rate known yet). The one place both :meth:`_straggler` and :meth:`next_deadline` ask,
        so a deadline that wakes the adapter always finds its straggler due."""
        # Both fixed when it was sent, so a deadline never moves: the expected time (a copy
        # that beats another of the peer's shards lowers its rate, and must not push this
        # one's deadline back) and its turn (rates are service times: a task first waits
        # for those sent to the peer before it).
        w = self._workers.get(peer)
        expected = w.expected.get(shard) if w is not None else None
        if expected is None:
            expected = self._expected(peer, shard)
        if expected is None:
            return None
        turn = w.turn.get(shard, 1) if w is not None else 1
        return started + max(self.straggler_factor * expected * turn, self.straggler_min)

    def _straggler(self, w: _Worker, now: float) -> int | None:
        best, best_due = None, now
        for o in self._usable():
            if o is w:
                continue
            for shard, started in o.running.items():
                if (shard in w.running or w.peer in self._failed_on.get(shard, ())
                        or self._avoid(shard, w.peer)):
                    continue
                if shard in self._checking or shard in self._no_copies or sum(
                        shard in x.running for x in self._workers.values()) > 1:
                    continue   # already copied, or a copy's result is being verified
                if self.attempts[shard] >= self.max_attempts:
                    continue  # out of attempts: the running one may still answer
                due = self._straggler_due(o.peer, shard, started)
                if due is not None and due <= best_due:
                    best, best_due = shard, due
        return best

    def _start(self, w: _Worker, shard: int, now: float) -> Assign:
        self.attempts[shard] += 1
        others = max(0, self.inflight(w.peer) - len(w.running))  # other jobs' tasks there
        w.running[shard] = now
        w.turn[shard] = min(self.window, len(w.running) + others)
        if (expected := self._expected(w.peer, shard)) is not None:
            w.expected[shard] = expected
        else:
            w.expected.pop(shard, None)
        return Assign(shard, w.peer, self.attempts[shard])

    def _solo(self, now: float) -> list[Assign]:
        local = self._workers.setdefault(LOCAL, _Worker(LOCAL))
        if local.running:
            return []
        for w in self._workers.values():
            if w is not local:
                self._requeue(w.queue)
                w.queue.clear()
        self._pool.extendleft(reversed(self._local_only))
        self._local_only.clear()
        while self._pool:
            shard = self._pool.popleft()
            if shard not in self.done and not self._running_elsewhere(shard):
                return [self._start(local, shard, now)]
        return []

    def overdue(self, now: float) -> list[Peer]:
        """Peers holding a shard past its straggler deadline, each attempt told once, whether
        or not a copy can start now (the other workers may all be busy): the adapter asks
        them whether they are still there."""
        out: list[Peer] = []
        for w in self._usable():
            for shard, started in w.running.items():
                if (shard, w.peer, started) in self._overdue:
                    continue
                due = self._straggler_due(w.peer, shard, started)
                if due is not None and due <= now:
                    self._overdue.add((shard, w.peer, started))
                    if w.peer not in out:
                        out.append(w.peer)
        return out

    def wants_slot(self, now: float, peer: Peer | None = None) -> bool:
        """Whether a slot freed at a full peer (``peer``, when known) could start something
        now: a shard not started anywhere that it would take, or a straggler due for a copy.
        May say yes when :meth:`step` then finds nothing (a shard only one banned peer may
        run): never no when it would."""
        if self.finished:
            return False
        w = self._workers.get(peer) if peer is not None else None
        if w is None or w.banned:
            waiting = bool(self._pool) or any(i not in self.done for o in self._workers.values()
                                              for i in o.queue)
        else:
            waiting = bool(self._pool) or any(i not in self.done for i in w.queue) or (
                not w.running and self._steal_from(w) is not None)
        if waiting:
            return True
        return any(shard not in self._checking and shard not in self._no_copies
                   and (due := self._straggler_due(o.peer, shard, started)) is not None
                   and due <= now
                   for o in self._usable() for shard, started in o.running.items())

    def next_deadline(self, now: float) -> float | None:
        """When :meth:`step` should next run without an event (timeouts, stragglers)."""
        times = []
        for w in self._workers.values():
            for shard, started in w.running.items():
                times.append(started + self.task_timeout)
                due = self._straggler_due(w.peer, shard, started) if w.peer != LOCAL else None
                if due is not None:
                    times.append(due)
        future = [t for t in times if t > now]
        return min(future) if future else None
