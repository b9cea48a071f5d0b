"""compute's exception tree; documented in :mod:`compute`'s docstring."""


class ComputeError(Exception):
    """Base of every error compute raises on purpose."""


class BackendUnavailable(ComputeError):
    """A backend cannot run here, or failed its self-validation (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class KernelError(ComputeError):
    """A WGSL kernel, its buffers or its dispatch size were refused before running."""


class InvalidInput(ComputeError, ValueError):
    """Arguments refused before any work: bad shapes, dtypes, sizes, weights or plans.

    Also a ``ValueError``, so callers that treat bad arguments generically still catch it.
    """
