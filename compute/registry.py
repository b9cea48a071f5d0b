"""Backend discovery: create, self-validate and rank the backends this machine has.

Everything is cached per process: a backend is validated once, and ``auto`` measures the
validated backends once and keeps the fastest.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from compute.backend import Backend, BackendStatus
from compute.errors import BackendUnavailable, InvalidInput
from compute.timing import best_seconds, matmul_flops, square_operands

log = logging.getLogger("compute")

# Size of the product ``auto`` times each backend on: large enough that a GPU's transfer
# overhead does not hide its throughput, small enough for start-up (llvmpipe: ~0.1 s).
AUTO_SIZE = 384


def _numpy(threads: int | None) -> Backend:
    from compute.numpy_backend import NumpyBackend

    return NumpyBackend(threads=threads)


def _wgpu(threads: int | None) -> Backend:
    from compute.wgpu_backend import WgpuBackend

    return WgpuBackend.shared()


# name -> factory(threads) -> unvalidated Backend (may raise BackendUnavailable).
# Tests replace entries to inject faulty backends.
FACTORIES: dict[str, Callable[[int | None], Backend]] = {"numpy": _numpy, "wgpu": _wgpu}

_lock = threading.RLock()
_validated: dict[tuple[str, int | None], Backend | BackendUnavailable] = {}
_auto: dict[int | None, Backend] = {}


def clear_cache() -> None:
    """Forget every validation and ``auto`` choice (tests; after a driver change)."""
    with _lock:
        _validated.clear()
        _auto.clear()


def _load(name: str, threads: int | None) -> Backend:
    key = (name, threads if name == "numpy" else None)
    with _lock:
        cached = _validated.get(key)
        if cached is None:
            try:
                backend = FACTORIES[name](threads)
                backend.validate()
                cached = backend
                log.debug("backend %s validated", name)
            except BackendUnavailable as exc:
                cached = exc
                log.info("backend %s unusable: %s", name, exc.reason)
            except Exception as exc:  # an untrusted driver's failure means "unusable here"
                cached = BackendUnavailable(f"{name}: {exc!r}")
                log.info("backend %s unusable: %r", name, exc)
            _validated[key] = cached
    if isinstance(cached, BackendUnavailable):
        raise BackendUnavailable(cached.reason)
    return cached


def available_backends(names: Sequence[str] | None = None, *, threads: int | None = None
                       ) -> list[BackendStatus]:
    """Every known backend (or those in ``names``) with whether it validated here, why not,
    and its adapter. A backend left out is never loaded: wgpu on llvmpipe can abort the
    whole process, so a numpy-only caller must not touch it."""
    out = []
    for name in FACTORIES:
        if names is not None and name not in names:
            continue
        try:
            backend = _load(name, threads)
        except BackendUnavailable as exc:
            out.append(BackendStatus(name, False, exc.reason))
        else:
            out.append(BackendStatus(name, True, None, backend.adapter_info()))
    return out


def compare_gflops(backends: list[Backend], n: int = AUTO_SIZE) -> dict[str, float]:
    """GFLOPS of each backend at ``n``: best of repeated products over at least 0.3 s each,
    which outlasts a transient slowdown (or a burst of load from other processes)."""
    a, b = square_operands(n)
    return {
        bk.name: matmul_flops(n, n, n)
        / best_seconds(lambda bk=bk: bk.matmul(a, b), 3, min_time_s=0.3, max_repeats=200)
        / 1e9
        for bk in backends
    }


def get_backend(name: str = "auto", *, threads: int | None = None) -> Backend:
    """A validated backend: ``"numpy"``, ``"wgpu"``, or ``"auto"`` (the fastest validated one).

    ``threads`` caps numpy's BLAS threads. Raises :class:`BackendUnavailable` (with the
    reason) when the named backend cannot run here or fails its self-validation; ``auto``
    skips such backends and raises only when none is left.
    """
    if name != "auto" and name not in FACTORIES:
        raise InvalidInput(f"unknown backend {name!r}; choose auto or {', '.join(FACTORIES)}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InvalidInput(f"threads must be a positive integer or None, got {threads!r}")
    if name != "auto":
        return _load(name, threads)
    with _lock:
        if threads in _auto:
            return _auto[threads]
        candidates, reasons = [], []
        for candidate in FACTORIES:
            try:
                candidates.append(_load(candidate, threads))
            except BackendUnavailable as exc:
                reasons.append(f"{candidate}: {exc.reason}")
        if not candidates:
            raise BackendUnavailable("no usable backend: " + "; ".join(reasons))
        if len(candidates) == 1:
            best = candidates[0]
        else:
            speeds = compare_gflops(candidates)
            log.info("auto backend speeds (GFLOPS at n=%d): %s", AUTO_SIZE, speeds)
            best = max(candidates, key=lambda b: speeds[b.name])
        _auto[threads] = best
        return best
