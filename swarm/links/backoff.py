"""Reconnecting with exponential backoff: a sans-IO schedule and a small dial loop.

Why jitter: after a coordinator or network blip many peers redial the same peer at once;
randomised delays spread them out instead of synchronising retries.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from swarm.errors import AuthenticationError, LinkClosed, ProtocolError
from swarm.links.base import PeerLink

log = logging.getLogger(__name__)

RETRYABLE: tuple[type[BaseException], ...] = (OSError, TimeoutError, LinkClosed)
"""Failures worth another try: nobody there yet, no answer, a dropped connection. A peer
that fails authentication or speaks garbage is not retried: it is the wrong peer."""


@dataclass
class Backoff:
    """Delays ``initial * factor**n`` capped at ``cap``, each scaled by a random factor in
    ``[1 - jitter, 1]``."""

    initial: float = 0.5
    """First delay in seconds."""
    factor: float = 2.0
    """Growth per failed attempt."""
    cap: float = 30.0
    """Largest delay in seconds."""
    jitter: float = 0.5
    """Fraction of each delay that is randomised away."""
    failures: int = 0
    """Failed attempts since the last success."""

    def next_delay(self, rand: float) -> float:
        """The delay before the next attempt, given ``rand`` uniform in [0, 1)."""
        base = min(self.cap, self.initial * self.factor ** self.failures)
        self.failures += 1
        return base * (1.0 - self.jitter * rand)

    def reset(self) -> None:
        self.failures = 0


async def dial(connect: Callable[[], Awaitable[PeerLink]], *, attempts: int = 8,
               backoff: Backoff | None = None,
               sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
               rand: Callable[[], float] = random.random) -> PeerLink:
    """``await connect()`` until it returns a link, waiting between failures.

    Raises the last failure after ``attempts`` tries, and AuthenticationError or
    ProtocolError at once.
    """
    backoff = backoff or Backoff()
    for attempt in range(1, attempts + 1):
        try:
            link = await connect()
        except (AuthenticationError, ProtocolError):
            raise
        except RETRYABLE as exc:
            if attempt == attempts:
                raise
            delay = backoff.next_delay(rand())
            log.info("dial attempt %d failed (%s); retrying in %.2f s", attempt, exc, delay)
            await sleep(delay)
        else:
            backoff.reset()
            return link
    raise AssertionError("unreachable")  # the loop returns or raises
