"""compute: matmul backends (WGSL on wgpu, numpy), probe, benchmark, shard plans, Freivalds.

Pure: no networking. Imports no other swarm package.

    >>> import numpy as np, compute
    >>> backend = compute.get_backend()           # fastest validated backend here
    >>> a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    >>> c = backend.matmul(a, b)
    >>> compute.verify_matmul(a, b, c)
    True
    >>> [s.rows for s in compute.plan_shards(10, 4, [3.0, 1.0])]
    [(0, 8), (8, 10)]

Exceptions (all in :mod:`compute.errors`)::

    ComputeError               base of everything this package raises on purpose
    +-- BackendUnavailable     a backend cannot run here or failed its self-validation
    +-- KernelError            a WGSL kernel or its buffers were refused before running
    +-- InvalidInput           bad shapes, dtypes, sizes, weights or plans (also ValueError)
"""

from compute.backend import Backend, BackendStatus
from compute.bench import benchmark, measured_tflops
from compute.errors import BackendUnavailable, ComputeError, InvalidInput, KernelError
from compute.probe import probe
from compute.registry import available_backends, get_backend
from compute.shards import Shard, merge_shards, plan_shards
from compute.verify import verify_matmul

__all__ = [
    "Backend",
    "BackendStatus",
    "BackendUnavailable",
    "ComputeError",
    "InvalidInput",
    "KernelError",
    "Shard",
    "available_backends",
    "benchmark",
    "get_backend",
    "measured_tflops",
    "merge_shards",
    "plan_shards",
    "probe",
    "verify_matmul",
]
