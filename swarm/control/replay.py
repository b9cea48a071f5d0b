"""Replay guards for operator commands (sans-IO, fed the wall clock).

An owner or admin command (``swarm kick|block|unblock``) is a signed statement anyone who
saw it could send again. :class:`CommandGuard` admits each one once: its counter is its
issue time in ms and must lie within ``max_age`` of ``wall`` (NaN never does); each
(issuer, counter) is remembered until it ages out of that window (so memory is bounded by
the rate of fresh commands, and by ``max_seen``); and an owner authenticator's FIDO2 sign
counter must move forward from command to command (a cloned key reuses or rewinds it).
"""

from __future__ import annotations

import math
from collections import OrderedDict

from swarm.errors import StaleTerm

COMMAND_AGE = 120.0
"""Seconds by which a command's issue time may differ from ours."""
MAX_SEEN = 4096


class CommandGuard:
    """Admits each operator command once, fresh, with a forward-moving sign counter."""

    def __init__(self, max_age: float = COMMAND_AGE, max_seen: int = MAX_SEEN,
                 sign_counts: dict[bytes, int] | None = None) -> None:
        self.max_age = max_age
        self.max_seen = max_seen
        self._seen: OrderedDict[tuple[bytes, int], float] = OrderedDict()
        self.sign_counts: dict[bytes, int] = dict(sign_counts or {})
        """Highest FIDO2 sign counter seen per owner credential id."""

    def admit(self, issuer: bytes, counter: int, wall: float,
              sign_count: int | None = None) -> None:
        """Raise :class:`StaleTerm` for a replayed, stale or future command, or an owner
        proof whose sign counter did not move forward; else remember it."""
        issued = counter / 1000
        if not (math.isfinite(wall) and abs(wall - issued) <= self.max_age):
            raise StaleTerm("stale or future command (its counter is the issue time in ms)")
        while self._seen and (len(self._seen) >= self.max_seen
                              or next(iter(self._seen.values())) < wall - 2 * self.max_age):
            self._seen.popitem(last=False)
        key = (issuer, counter)
        if key in self._seen:
            raise StaleTerm("replayed command")
        if sign_count is not None:
            last = self.sign_counts.get(issuer, 0)
            if sign_count <= last and not (sign_count == 0 and last == 0):
                raise StaleTerm(f"authenticator sign counter {sign_count} is not above {last}: "
                                "a cloned owner key?")
            self.sign_counts[issuer] = sign_count
        self._seen[key] = wall
