"""The backend interface, input checks and the self-validation every backend must pass.

A backend is trusted only after it has multiplied known inputs and matched a float64
reference: a driver that "succeeds" and hands back zeros, NaNs or garbage is refused with a
reason instead of silently poisoning a swarm job.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compute.errors import BackendUnavailable, InvalidInput, KernelError

PRECISIONS = ("f32", "f16")

# Largest operand or result this package accepts, in elements (2**31 f32 values = 8 GiB).
MAX_ELEMENTS = 1 << 31

# Shapes each backend must get right before it is trusted: square, not multiples of any
# tile, 1 x 1, tall-skinny, wide, a long inner dimension.
VALIDATION_SHAPES: tuple[tuple[int, int, int], ...] = (
    (64, 64, 64),
    (67, 45, 33),
    (1, 1, 1),
    (129, 3, 2),
    (5, 300, 7),
    (16, 1000, 24),
)


@dataclass(frozen=True)
class BackendStatus:
    """What :func:`compute.available_backends` learned about one backend."""

    name: str
    """Backend name: ``"numpy"`` or ``"wgpu"``."""
    validated: bool
    """True when the backend passed its self-validation on this machine."""
    reason: str | None = None
    """Why it is unusable (None when validated)."""
    adapter: dict[str, Any] = field(default_factory=dict)
    """What runs the work: adapter name, type and API for wgpu; BLAS library for numpy."""


def check_operands(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ``a`` and ``b`` as C-contiguous float32 matrices, or raise :class:`InvalidInput`."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.ndim != 2 or b.ndim != 2:
        raise InvalidInput(f"matmul needs 2-D operands, got shapes {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise InvalidInput(f"inner dimensions differ: {a.shape} @ {b.shape}")
    for name, x in (("a", a), ("b", b)):
        if x.dtype.kind not in "fiub":
            raise InvalidInput(f"{name} has dtype {x.dtype}; expected a real number type")
        if x.size > MAX_ELEMENTS:
            raise InvalidInput(f"{name} has {x.size} elements; the limit is {MAX_ELEMENTS}")
    m, n = a.shape[0], b.shape[1]
    if m * n > MAX_ELEMENTS:
        raise InvalidInput(f"result would have {m * n} elements; the limit is {MAX_ELEMENTS}")
    return (np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32))


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise InvalidInput(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def validation_tolerance(k: int, precision: str) -> float:
    """Relative tolerance (to ``|a| @ |b|``) for a correct product with inner dimension ``k``.

    Worst-case f32 accumulation over ``k`` terms; f16 adds the rounding of both inputs
    (accumulation stays f32 on every backend).
    """
    tol = 4.0 * 2.0**-24 * (k + 2)
    return tol + (4.0 * 2.0**-11 if precision == "f16" else 0.0)


def check_result(a: np.ndarray, b: np.ndarray, c: Any, precision: str = "f32") -> None:
    """Raise :class:`BackendUnavailable` unless ``c`` is a plausible ``a @ b``.

    Checks shape, finiteness, that a non-zero product is not all zeros, and each element
    against a float64 reference within the worst-case rounding bound for ``k``.
    """
    c = np.asarray(c)
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if c.shape != (m, n):
        raise BackendUnavailable(f"returned shape {c.shape} for a {m}x{k} @ {k}x{n} product")
    if not np.all(np.isfinite(c)):
        raise BackendUnavailable(f"returned non-finite values for a {m}x{k}x{n} product")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    if np.any(ref != 0) and not np.any(c != 0):
        raise BackendUnavailable(f"returned all zeros for a non-zero {m}x{k}x{n} product")
    bound = validation_tolerance(k, precision) * (np.abs(a64) @ np.abs(b64)) + 1e-30
    err = np.abs(c.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    if err[worst] > bound[worst]:
        raise BackendUnavailable(
            f"wrong result for a {m}x{k}x{n} product: element {tuple(int(i) for i in worst)} "
            f"is {float(c[worst]):.6g}, expected {float(ref[worst]):.6g}"
        )


def validation_inputs(seed: int = 20261129) -> list[tuple[np.ndarray, np.ndarray]]:
    """Known operand pairs for self-validation (fixed seed, values of mixed sign)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for m, k, n in VALIDATION_SHAPES:
        a = rng.uniform(-1.0, 1.0, size=(m, k)).astype(np.float32)
        b = rng.uniform(-1.0, 1.0, size=(k, n)).astype(np.float32)
        pairs.append((a, b))
    return pairs


class Backend(abc.ABC):
    """Multiplies matrices on one device. Get instances from :func:`compute.get_backend`."""

    name: str = "?"

    @abc.abstractmethod
    def matmul(self, a: np.ndarray, b: np.ndarray, precision: str = "f32") -> np.ndarray:
        """Return ``a @ b`` as a float32 (M, N) array."""

    def matmul_many(
        self, pairs: Sequence[tuple[np.ndarray, np.ndarray]], precision: str = "f32"
    ) -> list[np.ndarray]:
        """Multiply several pairs (shards); backends that can batch them override this."""
        return [self.matmul(a, b, precision) for a, b in pairs]

    def adapter_info(self) -> dict[str, Any]:
        """What executes the work (device, library); shown by probe and bench."""
        return {}

    def cpu_limit(self) -> AbstractContextManager[Any]:
        """A context in which numpy work done beside this backend's products (an actor's own
        layer pass) keeps to the worker's CPU share; no cap by default."""
        return nullcontext()

    def validate(self) -> None:
        """Multiply known inputs and check the results; raise BackendUnavailable if wrong.

        Goes through :meth:`matmul_many` as well as :meth:`matmul`, so a fault in either path
        (a driver returning zeros, a broken batch submission) is caught.
        """
        pairs = validation_inputs()
        try:
            singles = [self.matmul(a, b) for a, b in pairs]
            batched = self.matmul_many(pairs)
        except BackendUnavailable:
            raise
        except Exception as exc:  # any failure of an untrusted driver means "unusable"
            raise BackendUnavailable(f"{self.name}: matmul raised {exc!r}") from exc
        if len(batched) != len(pairs):
            raise BackendUnavailable(
                f"{self.name}: matmul_many returned {len(batched)} results for {len(pairs)}"
            )
        for (a, b), c1, c2 in zip(pairs, singles, batched, strict=True):
            try:
                check_result(a, b, c1)
                check_result(a, b, c2)
            except BackendUnavailable as exc:
                raise BackendUnavailable(f"{self.name}: {exc.reason}") from None

    def run_kernel(
        self,
        wgsl: str,
        *,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, tuple[tuple[int, ...], Any]],
        dispatch: tuple[int, int, int],
        entry_point: str = "main",
    ) -> dict[str, np.ndarray]:
        """Run a caller's WGSL compute kernel; only the wgpu backend can."""
        raise KernelError(f"the {self.name} backend cannot run WGSL kernels; use wgpu")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
