"""The per-job logic of a requester, sans-IO: events in (with ``now``), actions out.

One :class:`JobCore` runs one job over a :class:`~swarm.runtime.scheduler.JobScheduler`.
The requester's asyncio adapter (``requester._JobRun``) feeds it what happened — the worker
set changed, an attempt answered or failed, a check or a tiebreak finished — and carries out
the actions it returns: start an attempt (:class:`Run`), verify an answer (:class:`Check`),
stop a losing copy (:class:`Stop`), count a wrong result against a peer (:class:`Reject`),
settle two disagreeing replicas with the requester's own run (:class:`Tiebreak`). It reads
no clock and awaits nothing, so tests drive whole jobs with a fake clock and no processes.

Policy lives here, not in the adapter: a worker's "invalid" refusal of a call that passed
our own checks is misbehaviour (banned for the job, shard redone elsewhere), never a reason
to fail the job; a call stopped at a worker's time limit is sent again at most once; a
copy that another beat is never used, but its answer is still judged when it comes (a
:class:`Stop` says so), and a wrong result counts even when another copy already won.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swarm.errors import TaskError
from swarm.runtime.scheduler import LOCAL, JobScheduler

log = logging.getLogger("swarm.runtime.jobcore")
MISSING_TRIES = 3
"""Times one call goes to a worker in all while it answers "missing" (it lost the call's
inputs: they are sent again with the call, :meth:`~swarm.runtime.requester.Requester.call`);
after that the call fails as "missing" and the job's policy takes over."""


@dataclass
class PeerReport:
    """One peer's share of a job."""

    shards: int = 0
    """Shard results received."""
    bytes_out: int = 0
    """Array bytes sent to it."""
    bytes_in: int = 0
    """Array bytes received from it."""
    seconds: float = 0.0
    """Sum of its shards' round-trip times."""
    verified: int = 0
    """Results that passed verification."""
    rejected: int = 0
    """Results that failed verification."""
    failed: int = 0
    """Attempts that ended in an error, a timeout or a lost link."""

    def add(self, other: PeerReport) -> None:
        """Count ``other``'s figures into these."""
        for f in dataclasses.fields(PeerReport):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class JobReport:
    """What a job cost and who did it."""

    shards: int
    """Shards in the job."""
    seconds: float = 0.0
    """Wall time of the job."""
    peers: dict[str, PeerReport] = field(default_factory=dict)
    """Per peer (printable PeerId, or "local" for the requester)."""

    def peer(self, key: Any) -> PeerReport:
        return self.peers.setdefault(_printable(key), PeerReport())


@functools.lru_cache(maxsize=4096)
def _printable(key: Any) -> str:
    """A peer's report key (base32 of its id: cached, a job asks several times per shard)."""
    return str(key)


@dataclass(frozen=True, slots=True)
class Run:
    """Action: start an attempt of ``shard`` on ``peer`` (LOCAL: on the requester)."""

    shard: int
    """Scheduler shard index (call index modulo the number of calls)."""
    peer: Hashable
    """Where."""


@dataclass(frozen=True, slots=True)
class Check:
    """Action: verify ``answer``; feed the outcome back with :meth:`JobCore.checked`."""

    shard: int
    """Scheduler shard index."""
    peer: Hashable
    """Who answered."""
    answer: Any
    """The answer as the adapter handed it in (outputs, receipt, ...)."""


@dataclass(frozen=True, slots=True)
class Stop:
    """Action: the attempt of ``shard`` on ``peer`` is no longer needed."""

    shard: int
    """Scheduler shard index."""
    peer: Hashable
    """Where it runs."""
    judge: bool = False
    """Judge its answer all the same when it comes (the adapter waits for it a while, apart
    from the job): a wrong one is reported like any other. Dropped unchecked, a copy that
    another beat let a liar that was merely slow, as any worker is on a loaded machine,
    escape every check and give no evidence (issue 48, finding 3)."""


@dataclass(frozen=True, slots=True)
class Reject:
    """Action: ``peer``'s answer was wrong: report it (with evidence when there is some)."""

    peer: Hashable
    """The peer."""
    shard: int
    """Scheduler shard index."""
    reason: str
    """In words."""
    answer: Any = None
    """The wrong answer, for evidence (None: a replica or a refusal, nothing to prove)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """Action: a shard is overdue at ``peer`` (past its straggler deadline): ask whether it is
    still there (:meth:`swarm.links.base.PeerLink.probe`), so that a silent link is called lost in
    seconds and its peer dialed again, not after the keepalive's tens of seconds."""

    peer: Hashable
    """The peer the shard is overdue at."""


@dataclass(frozen=True, slots=True)
class Tiebreak:
    """Action: run call ``call`` on the requester; feed it back with :meth:`JobCore.tiebroken`."""

    call: int
    """Call index."""


Action = Run | Check | Stop | Reject | Probe | Tiebreak


class JobCore:
    """One job's state machine (see the module docstring)."""

    def __init__(self, n: int, sched: JobScheduler, *, verify: bool, replicate: bool,
                 agree: Any) -> None:
        self.n = n
        """Calls in the job (shards are calls, twice over with ``replicate``)."""
        self.sched = sched
        self.verify = verify
        self.replicate = replicate
        self._agree = agree
        self.report = JobReport(shards=n)
        self.results: dict[int, list[np.ndarray]] = {}
        self._replicas: dict[int, tuple[Any, list[np.ndarray]]] = {}
        self._known: set = set(sched.workers()) - {LOCAL}
        self._timeouts: dict[int, int] = {}
        self._out: list[Action] = []

    @property
    def finished(self) -> bool:
        """Every call has its result (replicas compared, tiebreaks settled)."""
        return self.sched.finished and len(self.results) == self.n

    def outputs(self) -> list[list[np.ndarray]]:
        return [self.results[i] for i in range(self.n)]

    # -- events ------------------------------------------------------------------------------

    def workers(self, current: set) -> None:
        """The usable worker set is now ``current``."""
        for p in sorted(current - self._known, key=repr):
            self.sched.add_worker(p)
        for p in sorted(self._known - current, key=repr):
            self.sched.lost(p)
        self._known = set(current)

    def answered(self, shard: int, peer: Any, outputs: list[np.ndarray], seconds: float,
                 answer: Any = None, now: float | None = None) -> None:
        """An attempt returned ``outputs`` (``answer``: what a later Check/Reject carries;
        ``now``: when, on :meth:`poll`'s clock, so that a copy this one beats rates its peer)."""
        if shard in self.sched.done:
            return  # a copy another beat that answered before its Stop: never used
        pr = self.report.peer(peer)
        pr.shards += 1
        pr.seconds += seconds
        if self._judges(peer):
            self.sched.returned(shard, peer)  # its slot takes the next shard meanwhile
            self._out.append(Check(shard, peer, (outputs, seconds, answer)))
            return
        self._accept(shard, peer, outputs, seconds, now)

    def checked(self, check: Check, ok: bool, now: float | None = None) -> None:
        """A :class:`Check` finished (``now``: as for :meth:`answered`)."""
        shard, peer = check.shard, check.peer
        outputs, seconds, answer = check.answer
        pr = self.report.peer(peer)
        if not ok:  # wrong, even if another copy already won: it counts
            pr.rejected += 1
            self._out.append(Reject(peer, shard, f"shard {shard % self.n} failed verification",
                                    answer))
            self.sched.rejected(shard, peer)
            return
        pr.verified += 1
        if shard in self.sched.done:
            self.sched.verified(shard, peer, seconds)  # bookkeeping only
            return
        self._accept(shard, peer, outputs, seconds, now)

    def failed(self, shard: int, peer: Any, kind: str, message: str) -> None:
        """An attempt ended without outputs ("lost": the link broke)."""
        self.report.peer(peer).failed += 1
        if kind == "invalid" and peer != LOCAL:
            # The call passed our own MethodSpec check before it was sent, so a worker
            # calling it invalid is misbehaving (or broken): never let it fail the job.
            log.warning("worker %s refused shard %d as invalid (%s); running it elsewhere",
                        peer, shard, message)
            self._out.append(Reject(peer, shard, f"refused a valid call as invalid: "
                                                 f"{message[:100]}"))
            self.sched.rejected(shard, peer)
            return
        if kind == "timeout":
            # A kernel past a worker's time limit: sent again once (that worker may be slow),
            # never copied further; a second timeout means the kernel itself never ends.
            self._timeouts[shard % self.n] = self._timeouts.get(shard % self.n, 0) + 1
            if self._timeouts[shard % self.n] >= 2:
                raise TaskError(f"call {shard % self.n} ran past the time limit on two "
                                f"workers and was stopped ({message}); it is not sent again")
            self.sched.no_copies(shard)
        log.info("shard %d on %s failed (%s): %s", shard, peer, kind, message)
        self.sched.errored(shard, peer, lost=kind == "lost")

    def tiebroken(self, call: int, truth: list[np.ndarray]) -> None:
        """The requester's own run of ``call`` (after replicas disagreed)."""
        twins = (call, call + self.n)
        replicas = [self._replicas[shard] for shard in twins]
        for i in wrong_replicas(replicas, truth, self._agree):
            peer, shard = replicas[i][0], twins[i]
            self.report.peer(peer).rejected += 1
            self.sched.rates.reject(peer)
            self._out.append(Reject(peer, shard, f"replica of call {call} disagreed with "
                                                 "the requester's run"))
        self.results[call] = truth

    # -- decisions -----------------------------------------------------------------------------

    def outliving(self) -> list[Reject | Stop]:
        """Actions :meth:`poll` has not handed out yet that outlive the job, taken now:
        rejections (the events that finish a job can also reject a copy that lost, and the
        job's end must not drop the report) and the stops of copies whose answers are still
        judged (the pass that finishes a job is the one that beats them)."""
        left: list[Reject | Stop] = []
        kept: list[Action] = []
        for a in self._out:
            (left if isinstance(a, Reject) or isinstance(a, Stop) and a.judge else kept).append(a)
        self._out = kept
        return left

    def poll(self, now: float) -> list[Action]:
        """Actions to carry out now (call after every event and at :meth:`next_wake`)."""
        out, self._out = self._out, []
        if not self.sched.finished:
            out.extend(Run(a.shard, a.peer) for a in self.sched.step(now))
            out.extend(Probe(peer) for peer in self.sched.overdue(now))
        return out

    def wants_slot(self, now: float, peer: Any = None) -> bool:
        """Whether a slot freed at a full peer (``peer``, when known) may start one of this
        job's tasks (the adapter offers freed slots to the jobs that want one, instead of
        waking them all)."""
        return self.sched.wants_slot(now, peer)

    def next_wake(self, now: float) -> float | None:
        """When :meth:`poll` must run again without an event (timeouts, stragglers)."""
        return None if self.sched.finished else self.sched.next_deadline(now)

    def _judges(self, peer: Any) -> bool:
        """Whether ``peer``'s answers are checked one by one (replicas are compared instead;
        our own runs are trusted)."""
        return peer != LOCAL and self.verify and not self.replicate

    def _accept(self, shard: int, peer: Any, outputs: list[np.ndarray], seconds: float,
                now: float | None) -> None:
        for c in self.sched.verified(shard, peer, seconds, now):
            self._out.append(Stop(c.shard, c.peer, self._judges(c.peer)))
        if not self.replicate:
            self.results[shard] = outputs
            return
        i, twin = shard % self.n, (shard + self.n) % (2 * self.n)
        self._replicas[shard] = (peer, outputs)
        if twin not in self._replicas:
            return
        (p1, o1), (p2, o2) = self._replicas[shard], self._replicas[twin]
        if self._agree(o1, o2):
            for p in (p1, p2):
                if p != LOCAL:
                    self.report.peer(p).verified += 1
            self.results[i] = o1
        else:
            self._out.append(Tiebreak(i))


def wrong_replicas(replicas: Sequence[tuple[Hashable, list[np.ndarray]]],
                   truth: list[np.ndarray], agree: Any) -> list[int]:
    """After two replicas of a call disagreed and the requester ran it itself (``truth``):
    which replicas, by index, were wrong and count against their peer (``(peer, outputs)``
    each; LOCAL or None, the requester's own run, never counts). Jobs (:meth:`JobCore.tiebroken`)
    and actor calls (:mod:`swarm.api`) judge alike."""
    return [i for i, (peer, outputs) in enumerate(replicas)
            if peer is not None and peer != LOCAL and not agree(outputs, truth)]


def twins_of(n: int) -> Sequence[int]:
    """Shard ``i``'s twin under ``replicate`` (calls run twice: shards i and i + n)."""
    return [(i + n) % (2 * n) for i in range(2 * n)]
