"""compute: matmul backends (WGSL on wgpu, numpy), probe, benchmark, shard plans, Freivalds.

Pure: no networking. Imports no other swarm package.

Exceptions (all in :mod:`compute.errors`)::

    ComputeError               base of everything this package raises on purpose
    +-- BackendUnavailable     a backend cannot run here or failed its self-validation
    +-- KernelError            a WGSL kernel or its buffers were refused before running
"""

from compute.errors import BackendUnavailable, ComputeError, KernelError

__all__ = ["BackendUnavailable", "ComputeError", "KernelError"]
