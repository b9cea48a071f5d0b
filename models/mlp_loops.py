"""Compiled loops of the MLP trainer (numba): a step's weight fingerprints and its SGD update,
each one pass over the parameters.

Both ran as several numpy passes, each reading the parameters from memory again (and the
fingerprints' ``rᵀ W`` went to BLAS, whose pool of threads then spun on a core for a while
after every call: CPU that showed up nowhere near the check that caused it). Here each is one
loop on the calling thread, so its thread time is all it costs.

Compiled on first use and kept in numba's on-disk cache (where it finds a writable one).
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)
_reassoc = numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


@_reassoc
def _fingerprints(w: np.ndarray, rft: np.ndarray, rb: np.ndarray, wr: np.ndarray,
                  rows2: np.ndarray, wtrt: np.ndarray, cols2: np.ndarray
                  ) -> None:  # pragma: no cover - compiled
    """One pass over ``w`` [in, out]: ``wr = w @ rftᵀ`` and the row norms squared ``rows2``
    (the forward's ``A @ W`` check), ``wtrt = rbᵀ @ w`` and the column norms squared
    ``cols2`` (the backward's ``dZ @ Wᵀ``). Products in float32 (row sums in the compiler's
    lane order, as compute.verify's pass; column sums in row order), squares in float64."""
    n_in, n_out = w.shape
    rounds = rft.shape[0]
    for i in range(n_in):
        s = 0.0
        for j in range(n_out):
            v = np.float64(w[i, j])
            s += v * v
            cols2[j] += v * v
        rows2[i] = s
        for t in range(rounds):
            a = np.float32(0.0)
            for j in range(n_out):
                a += w[i, j] * rft[t, j]
            wr[i, t] = a
            c = rb[i, t]
            for j in range(n_out):
                wtrt[t, j] += w[i, j] * c


def fingerprints(w: np.ndarray, rf: np.ndarray, rb: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(w @ rf, w's row norms², wᵀ @ rb, w's column norms²)`` from one read of ``w``
    (``rb`` None: the last two are None). Norms in float64: squares of any finite float32
    stay finite."""
    w = np.ascontiguousarray(w, np.float32)
    n_in, n_out = w.shape
    rounds = rf.shape[1]
    back = rb is not None
    rb_ = np.ascontiguousarray(rb if back else np.zeros((n_in, rounds), np.float32),
                               np.float32)
    wr = np.empty((n_in, rounds), np.float32)
    rows2 = np.empty(n_in)
    wtrt = np.zeros((rounds, n_out), np.float32)
    cols2 = np.zeros(n_out)
    _fingerprints(w, np.ascontiguousarray(rf.T, np.float32), rb_, wr, rows2, wtrt, cols2)
    if not back:
        return wr, rows2, None, None
    return wr, rows2, np.ascontiguousarray(wtrt.T), cols2


@_jit
def _sgd(grads: tuple, samples: float, momentum: np.float32, lr: np.float32,
         velocity: np.ndarray, params: np.ndarray) -> None:  # pragma: no cover - compiled
    """Per element: the blocks' gradients added in order in float64, over ``samples``,
    rounded to float32, then ``v = v * momentum + g`` and ``p -= lr * v``, each
    operation rounded to float32 as numpy's in-place steps round them (no fused
    multiply-add: the same bits as the numpy passes this replaced)."""
    for e in range(params.shape[0]):
        s = 0.0
        for g in grads:
            s += np.float64(g[e])
        v = velocity[e] * momentum
        v = v + np.float32(s / samples)
        velocity[e] = v
        params[e] = params[e] - lr * v


def sgd_step(grads: list[np.ndarray], samples: int, momentum: float, lr: float,
             velocity: np.ndarray, params: np.ndarray) -> None:
    """One SGD-with-momentum step on ``params`` (in place, float32, 1-D) from the blocks'
    summed gradients ``grads`` (each laid out as ``params``), in one pass."""
    flat = tuple(np.ascontiguousarray(g, np.float32).reshape(-1) for g in grads)
    if not flat or any(g.shape != params.shape for g in flat) \
            or velocity.shape != params.shape or params.dtype != np.float32 \
            or velocity.dtype != np.float32 or params.ndim != 1:
        raise ValueError("sgd_step: each gradient, the velocity and the parameters must be "
                         f"float32 [{params.size}]")
    _sgd(flat, float(samples), np.float32(momentum), np.float32(lr), velocity, params)
