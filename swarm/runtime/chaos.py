"""Fault injection for tests and demos: ``SWARM_CHAOS`` in a worker process's environment.

Format: comma-separated ``key=value`` pairs, all optional::

    SWARM_CHAOS="corrupt=0.5,drop=0.1,delay=200,crash_after=3,seed=7"

``corrupt=P``
    with probability P a shard's result is returned wrong (one element changed), so the
    requester's verification must catch it.
``drop=P``
    with probability P a task is silently never answered (a lost message); the requester's
    timeout / straggler logic must redo it.
``delay=MS``
    every task answers MS milliseconds late (a slow or far-away peer: a straggler).
``invalid=P``
    with probability P a task is refused as "invalid" although it is well-formed (a worker
    trying to abort other people's jobs); the requester must run it elsewhere.
``hang=P``
    with probability P a task's compute never finishes (an endless kernel loop); the worker's
    per-dispatch time limit must stop it and report a timeout.
``layer=P``
    with probability P a matmul is computed, correctly, with the wrong right-hand operand: a
    model's layer that is plausible but not the one asked for. Another array of the same
    shape the worker holds (another layer's weight) if there is one, else the layer skipped
    (its input returned) where the shapes allow, else the weight with its columns rotated.
``hold=DIR``
    every task, once computed, is held unanswered until the file ``DIR/release`` exists (a
    task in flight for as long as a test needs, with no delay to wait out). On holding task
    T the worker creates ``DIR/held-T``, so a test knows the task reached it and is running.
    A worker asked to stop (draining) lets its held answers go.
    DIR is an existing directory (it cannot contain a comma).
``stale=P``
    with probability P a task is refused as "invalid" with the words of a span cache that lost
    its positions (what an honest worker answered before the refusal had its own kind); the
    requester must not keep choosing it.
``nan=P``
    with probability P a result's first element is NaN (in a span's trace: the first recorded
    input), a value the requester's checks must refuse without crashing.
``claim=BYTES``
    the worker announces BYTES as the memory it offers, whatever its ``--max-memory`` holds
    (a worker that over-claims: the span it is given does not fit, it refuses, and the
    requester must place the span elsewhere).
``crash_after=N``
    the worker process dies abruptly (``os._exit``) when it receives task N+1, as a crash
    or a pulled plug would.
``seed=S``
    seed of the fault dice, for reproducible runs (default: random).

A bad value is a :class:`~swarm.errors.ConfigError` at worker start, never a silent no-op.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarm.errors import ConfigError

ENV = "SWARM_CHAOS"


@dataclass(frozen=True, slots=True)
class ChaosSpec:
    """Parsed ``SWARM_CHAOS``."""

    corrupt: float = 0.0
    """Probability that a result is corrupted."""
    drop: float = 0.0
    """Probability that a task is never answered."""
    invalid: float = 0.0
    """Probability that a well-formed task is refused as invalid."""
    hang: float = 0.0
    """Probability that a task's compute never finishes."""
    layer: float = 0.0
    """Probability that a matmul uses a plausible wrong weight (another layer's)."""
    nan: float = 0.0
    """Probability that a result's first element is NaN."""
    stale: float = 0.0
    """Probability that a task is refused as a span cache that lost its positions."""
    delay_ms: float = 0.0
    """Added latency per task, in milliseconds."""
    crash_after: int | None = None
    """Tasks to serve before the process dies; None = never."""
    claim: int | None = None
    """Memory announced as offered instead of ``--max-memory``; None = the truth."""
    hold: str = ""
    """Directory whose ``release`` file lets held answers go; "" = no hold."""
    seed: int | None = None
    """Dice seed; None = random."""

    @property
    def active(self) -> bool:
        return bool(self.corrupt or self.drop or self.invalid or self.hang or self.layer or self.nan
                    or self.stale or self.delay_ms or self.hold
                    or self.crash_after is not None)


def parse(text: str | None) -> ChaosSpec:
    """Parse a ``SWARM_CHAOS`` value; empty or None means no faults."""
    if not text or not text.strip():
        return ChaosSpec()
    values: dict[str, float | int | str] = {}
    for part in text.split(","):
        key, sep, raw = part.strip().partition("=")
        if not sep:
            raise ConfigError(f"{ENV}: expected key=value, got {part.strip()!r}")
        key = key.strip()
        try:
            if key in ("corrupt", "drop", "invalid", "hang", "layer", "nan", "stale"):
                p = float(raw)
                if not 0.0 <= p <= 1.0:
                    raise ValueError
                values[key] = p
            elif key == "delay":
                ms = float(raw)
                if not 0.0 <= ms <= 600_000:
                    raise ValueError
                values["delay_ms"] = ms
            elif key == "hold":
                values["hold"] = raw
            elif key in ("crash_after", "seed", "claim"):
                n = int(raw)
                if n < 0:
                    raise ValueError
                values[key] = n
            else:
                raise ConfigError(
                    f"{ENV}: unknown fault {key!r} (known: corrupt, drop, invalid, hang, layer, nan, stale, delay, "
                    "hold, crash_after, claim, seed)"
                )
        except ValueError:
            raise ConfigError(
                f"{ENV}: bad value {raw!r} for {key} (corrupt/drop/invalid/hang/layer/nan/stale: 0..1, delay: milliseconds, "
                "crash_after/claim/seed: integers >= 0)"
            ) from None
    if "hold" in values and not Path(str(values["hold"])).is_dir():
        raise ConfigError(f"{ENV}: hold={values['hold']!r} is not a directory")
    return ChaosSpec(**values)


@dataclass(frozen=True, slots=True)
class Fault:
    """What to do to one task."""

    delay_s: float = 0.0
    """Sleep this long before answering."""
    drop: bool = False
    """Never answer."""
    crash: bool = False
    """Exit the process now."""
    corrupt: bool = False
    """Return a wrong result."""
    invalid: bool = False
    """Refuse the task as invalid."""
    hang: bool = False
    """Run a compute that never finishes (stopped only by the time limit)."""
    layer: bool = False
    """Compute a matmul with a plausible wrong weight."""
    hold: str = ""
    """Hold the answer until ``hold/release`` exists ("" = no hold)."""
    nan: bool = False
    """Return a result whose first element is NaN."""
    stale: bool = False
    """Refuse the task as a span cache that lost its positions."""


class Chaos:
    """Rolls the dice for each task a worker serves (sans-IO: the node acts on the Fault)."""

    def __init__(self, spec: ChaosSpec) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self.served = 0

    def next_task(self) -> Fault:
        s = self.spec
        if not s.active:
            return Fault()
        if s.crash_after is not None and self.served >= s.crash_after:
            return Fault(crash=True)
        self.served += 1
        return Fault(
            delay_s=s.delay_ms / 1000.0,
            drop=self._rng.random() < s.drop,
            corrupt=self._rng.random() < s.corrupt,
            invalid=self._rng.random() < s.invalid,
            hang=self._rng.random() < s.hang,
            layer=s.layer > 0 and self._rng.random() < s.layer,  # old seeds' dice kept
            hold=s.hold,
            nan=s.nan > 0 and self._rng.random() < s.nan,
            stale=s.stale > 0 and self._rng.random() < s.stale,
        )

    def wrong_layer(self, a: np.ndarray, b: np.ndarray, held: Iterable[np.ndarray]
                    ) -> np.ndarray:
        """A right operand a lying worker would use instead of ``b`` (see ``layer=P``); the
        identity matrix stands for a skipped layer (``a @ I`` is ``a``)."""
        others = [h for h in held if h.shape == b.shape and h.dtype == b.dtype
                  and not np.array_equal(h, b)]
        if others:
            return others[self._rng.randrange(len(others))]
        if b.shape[0] == b.shape[1]:
            return np.eye(b.shape[0], dtype=b.dtype)
        return np.roll(b, 1, axis=1)

    def corrupt(self, result: np.ndarray) -> np.ndarray:
        """A copy of ``result`` with one element changed (what a lying peer would send)."""
        bad = np.array(result, copy=True)
        if bad.size:
            flat = bad.reshape(-1)
            i = self._rng.randrange(flat.size)
            flat[i] = flat[i] + (1 + abs(flat[i])) * 3
        return bad

    @staticmethod
    def nan(result: np.ndarray) -> np.ndarray:
        """A copy of ``result`` whose first element is NaN."""
        bad = np.array(result, copy=True)
        if bad.size and bad.dtype.kind == "f":
            bad.reshape(-1)[0] = np.nan
        return bad


HOLD_POLL = 0.02
"""Seconds between looks for the release file of a held task."""


async def hold(directory: str, task: int, stopping: Callable[[], bool] = lambda: False
               ) -> None:
    """Tell the test that ``task`` is held (``held-TASK``), then wait for ``release`` (or
    for ``stopping()``: a worker asked to stop answers what it holds and goes)."""
    import asyncio

    where = Path(directory)
    (where / f"held-{task}").touch()
    while not (where / "release").exists() and not stopping():
        await asyncio.sleep(HOLD_POLL)
