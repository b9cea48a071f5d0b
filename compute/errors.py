"""compute's exception tree; documented in :mod:`compute`'s docstring."""


class ComputeError(Exception):
    """Base of every error compute raises on purpose."""


class BackendUnavailable(ComputeError):
    """A backend cannot run here, or failed its self-validation (``reason`` says why)."""


class KernelError(ComputeError):
    """A WGSL kernel, its buffers or its dispatch size were refused before running."""
