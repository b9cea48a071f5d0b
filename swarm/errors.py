"""The swarm package's exception tree; documented in :mod:`swarm`'s docstring."""

import concurrent.futures

# Exit codes: the same for every subcommand (``swarm --help`` lists them). Here, below the
# commands and the CLI, so that a command returns one without importing the CLI.
EXIT_OK = 0
EXIT_FAILURE = 1  # the work failed: a remote error, a job that could not complete
EXIT_USAGE = 2  # bad arguments, bad URI, bad file: fix the command line
EXIT_REFUSED = 3  # consent declined, or not authorised to do this
EXIT_UNAVAILABLE = 4  # something this machine lacks: no security key, no backend
EXIT_INTERRUPTED = 130


class SwarmError(Exception):
    """Base of every error swarm raises on purpose."""


class ConfigError(SwarmError, ValueError):
    """A bad option, URI or data dir: the caller's input, found before any I/O."""


class URIError(ConfigError):
    """A join URI that does not parse; the message names the part that is wrong."""


class ConsentRefused(SwarmError):
    """The user declined to join, or no terminal was there to ask (use --yes)."""


class Blocked(ConsentRefused):
    """This peer is blocked from the swarm (its own data dir says so); it may not rejoin."""


class LocalError(SwarmError):
    """Something failed on this machine (no backend, no key plugged in, disk)."""


class RemoteError(SwarmError):
    """A peer answered with an error or broke the protocol."""


class ProtocolError(RemoteError):
    """A malformed, oversized or out-of-order frame; the link that sent it is closed."""


class CharterError(RemoteError):
    """A swarm's charter is missing, forged, or does not chain to the pinned owner."""


class StaleTerm(RemoteError):
    """A coordinator command from a term lower than the highest seen (fencing)."""


class NotCoordinator(RemoteError):
    """A command that only the coordinator may act on reached a peer that is not it."""


class AuthenticationError(RemoteError):
    """A peer is not who it claims or was expected to be (wrong key, bad or replayed
    signature, a DTLS fingerprint that does not match the signed one); the link is refused."""


class LinkClosed(RemoteError, ConnectionError):
    """The peer link is closed (by either side, a keepalive timeout or a protocol error).

    ``reason`` says why in words; ``error`` is the exception that closed it, if any (a
    ProtocolError or AuthenticationError counts against the peer)."""

    def __init__(self, reason: str, error: BaseException | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error

    def again(self) -> "LinkClosed":
        """A fresh copy to raise. Raising one stored instance again and again grew its
        traceback by every caller's frames, which then lived (arrays and all) as long as
        the link did."""
        return LinkClosed(self.reason, self.error)


class TaskCancelledError(SwarmError, concurrent.futures.CancelledError):
    """``get()`` of a ref whose task was cancelled (``swarm.cancel``, or the client closed)."""


class GetTimeoutError(SwarmError, TimeoutError):
    """``get()`` ran out of time before every ref was ready (the work may still finish)."""


class TaskError(RemoteError):
    """A task failed for good: every allowed attempt raised on its worker."""


class ActorDiedError(RemoteError):
    """An actor's host was lost and ``max_restarts`` is used up (or a call was in flight and
    ``max_task_retries`` did not allow retrying it)."""


class SpanLost(SwarmError):
    """A span's worker was lost mid-generation and no live worker can take its blocks (or
    the sequence's rebuilds are spent): the request fails, the message says why."""

    def __init__(self, message: str, shortfall: int = 0) -> None:
        super().__init__(message)
        self.shortfall = shortfall
        """Bytes a live worker would have to offer beyond what it has left (0: not memory)."""
