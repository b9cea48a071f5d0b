"""Freivalds' check: is ``c`` really ``a @ b``? Costs a few skinny products, not a matmul.

For secret random sign vectors ``R`` (N x rounds), a correct ``c`` gives
``a @ (b @ R) == c @ R`` up to float rounding; any element of ``c`` wrong by more than the
tolerance shows up in its row's check, whatever the signs (every ``|r_j| == 1``), and
several wrong elements in one row cancel with probability at most 1/2 per round.

The tolerance is per row: ``KAPPA * unit * ||a_i|| * ||b||_F``, where ``unit`` is the f32
rounding of an accumulation over K (the product) and over N and K (the check itself), plus
the f16 input rounding when the product was computed from f16 inputs.

Cost: ``2 * rounds + 2`` passes over the operands at memory speed (one gemv per operand and
round, then the row norms of ``a`` and the norm of ``b``), against ``2 M N K`` flops for the
product: about 3-4% of a numpy product at n = 2048 on 2 cores, falling as 1/n
(bench/compute.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from compute.backend import check_operands, check_precision
from compute.errors import InvalidInput

# Safety factor over the rounding model. Measured worst |check| / model over normal,
# uniform-positive, lognormal and sparse data at n = 256..2048 (numpy and sequential f32
# accumulation): 0.8. KAPPA leaves 5x on top of that.
KAPPA = 4.0
_U32 = 2.0**-24
_U16 = 2.0**-11


def _secret_rng() -> np.random.Generator:
    # Seeded from the OS's entropy pool: a worker cannot predict the check vectors.
    return np.random.default_rng()


def verify_matmul(
    a: Any,
    b: Any,
    c: Any,
    rounds: int = 2,
    *,
    rng: np.random.Generator | None = None,
    precision: str = "f32",
) -> bool:
    """Return True when ``c`` equals ``a @ b`` within float tolerance (Freivalds' check).

    ``rounds`` random sign vectors are checked at once (one batched skinny product per
    operand). ``rng`` defaults to a fresh OS-seeded generator; pass one only for
    reproducible tests. ``precision`` is what the product was computed in ("f16": inputs
    were rounded to half precision). A ``c`` of the wrong shape, or with NaN or infinity,
    is wrong. Operands that cannot be multiplied, or that are not finite, raise
    :class:`compute.InvalidInput`.
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise InvalidInput(f"rounds must be a positive integer, got {rounds!r}")
    check_precision(precision)
    a, b = check_operands(a, b)
    m, k = a.shape
    n = b.shape[1]
    c = np.asarray(c)
    if c.shape != (m, n) or c.dtype.kind not in "fiu":
        return False
    c = np.ascontiguousarray(c, dtype=np.float32)
    if m == 0 or n == 0:
        return True
    rng = rng or _secret_rng()
    signs = rng.integers(0, 2, size=(rounds, n), dtype=np.int8)
    r = (2 * signs - 1).astype(np.float32)

    with np.errstate(over="ignore", invalid="ignore"):
        # One matrix-vector product per operand and round: BLAS gemv streams each matrix
        # once at memory speed (faster here than a gemm with `rounds` columns).
        z = np.stack([a @ (b @ r[j]) for j in range(rounds)], axis=1)
        cr = np.stack([c @ r[j] for j in range(rounds)], axis=1)
        flat_b = b.reshape(-1)
        norm_b = math.sqrt(float(flat_b @ flat_b))
        # Row norms as a stack of 1 x K @ K x 1 products (BLAS dots; no temporary copy).
        norm_a = np.sqrt(np.matmul(a[:, None, :], a[:, :, None]).reshape(m))
    if not (np.all(np.isfinite(z)) and np.all(np.isfinite(norm_a)) and math.isfinite(norm_b)):
        raise InvalidInput("a and b must be finite (and small enough to multiply in f32)")
    if not np.all(np.isfinite(cr)):
        return False

    unit = _U32 * (math.sqrt(k) + math.sqrt(n) + 2.0)
    if precision == "f16":
        unit += 2.0 * _U16
    tolerance = KAPPA * unit * norm_b * norm_a
    diff = np.abs(z.astype(np.float64) - cr)
    return bool(np.all(diff <= tolerance[:, None]))
