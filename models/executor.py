"""Where a model's matrix products run: the one seam between a forward pass and the swarm.

A forward pass never multiplies matrices itself. It hands an :class:`Executor` a list of
:class:`Product` s, ``x @ w`` each, and gets the results back in order. All products in one call
are independent of each other, so an executor may run them at once (a layer's Q/K/V, the gate
and up projections of an FFN, or one matrix-vector product per sequence in a decode step).

    from models.executor import LocalExecutor, Product, Weight

    w = Weight.of(np.ones((384, 1152), np.float32))   # content-addressed, [in, out]
    (y,) = LocalExecutor().matmuls([Product(x, w)])   # y == x @ w.array

Two kinds of right-hand operand:

* :class:`Weight`: a model parameter, the same for every call. It carries a content address
  (``digest``), so a remote executor sends it to a worker once and names it afterwards.
* a plain ``np.ndarray``: an activation (an attention score or value matrix); it travels with
  the call every time.

Contract, for every executor:

* ``x`` is float32 ``[m, k]`` (``m`` >= 1: a batch of tokens, or one row for a decode step);
  the right-hand operand is float32 ``[k, n]``; the result is float32 ``[m, n]``, C-contiguous.
* Results are checked before they are returned: an executor that runs products elsewhere
  verifies each one (or raises); callers never see an unchecked value (DESIGN.md invariant 10).
* An executor raises :class:`ExecutorError` (or a subclass) when it cannot produce a checked
  result; it never returns a partial or unverified list.
* ``prepare(weights)`` is an optional hint to place weights ahead of the first call (upload,
  pin); ``matmuls`` must work without it.

:class:`LocalExecutor` (numpy, this process) is the reference every other executor is tested
against. The swarm's executor lives in the ``swarm`` package (this package never imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import blake3
import numpy as np


class ExecutorError(RuntimeError):
    """An executor could not produce a checked result for a product."""


def digest_of(array: np.ndarray) -> str:
    """The content address of an array: BLAKE3 over dtype, shape and bytes (hex)."""
    h = blake3.blake3(f"{array.dtype.str}{array.shape}".encode())
    h.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return h.hexdigest()


class Weight:
    """A model parameter used as a right-hand operand ``[in, out]``, read-only: a float32
    array, or a matrix kept in its file's block format (``tensor``: ``[out, in]`` with its own
    ``matmul``, e.g. models.quant's QTensor), dequantized only for whoever asks ``array``."""

    __slots__ = ("_array", "name", "_digest", "tensor")

    def __init__(self, array: np.ndarray | None = None, name: str = "", digest: str = "", *,
                 tensor: Any = None) -> None:
        if (array is None) == (tensor is None):
            raise ValueError("a Weight is an array or a tensor, exactly one")
        self._array, self._digest, self.tensor = array, digest, tensor
        self.name = name  # a readable label for logs and reports (``blk.0.attn_q.weight``)

    @classmethod
    def of(cls, array: np.ndarray, name: str = "") -> Weight:
        """Wrap ``array`` (copied to float32 C order, made read-only) with its digest."""
        a = np.array(array, dtype=np.float32, order="C", copy=True)
        if a.ndim != 2:
            raise ValueError(f"a weight is a 2-D matrix, got shape {a.shape}")
        a.setflags(write=False)
        return cls(a, name, digest_of(a))

    @classmethod
    def of_tensor(cls, tensor: Any, name: str = "") -> Weight:
        """A matrix in its file's format (``tensor.shape`` is ``[out, in]``)."""
        return cls(None, name, tensor=tensor)

    @property
    def array(self) -> np.ndarray:
        """The matrix, float32 ``[k, n]`` (a Linear layer's stored ``[out, in]``, transposed;
        for a tensor, dequantized on every call: remote executors put it once)."""
        if self._array is not None:
            return self._array
        return self.tensor.dequantize().T

    @property
    def digest(self) -> str:
        """Content address: :func:`digest_of` for an array; for a tensor, BLAKE3 over its
        type, shape and the bytes the file stores (computed on first use)."""
        if not self._digest:
            qtype = getattr(self.tensor.qtype, "name", self.tensor.qtype)  # GGML's type name
            h = blake3.blake3(f"{qtype}{tuple(self.tensor.shape)}".encode())
            h.update(memoryview(np.ascontiguousarray(self.tensor.data)).cast("B"))
            self._digest = h.hexdigest()
        return self._digest

    @property
    def shape(self) -> tuple[int, int]:
        if self._array is not None:
            return self._array.shape  # type: ignore[return-value]
        out, inp = self.tensor.shape
        return inp, out

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """``x @ W`` here (a tensor's own kernel, or numpy)."""
        if self.tensor is not None:
            return self.tensor.matmul(x)
        return x @ self._array


@dataclass(frozen=True, eq=False)
class Product:
    """One matrix product ``x @ w`` to compute."""

    x: np.ndarray
    """Left operand, float32 ``[m, k]`` (activations)."""
    w: Weight | np.ndarray
    """Right operand, float32 ``[k, n]``: a :class:`Weight` (cached by content address) or an
    activation array (sent with every call)."""

    def right(self) -> np.ndarray:
        return self.w.array if isinstance(self.w, Weight) else self.w

    def check(self) -> None:
        """Raise ValueError unless the operands meet the contract above."""
        shape = self.w.shape
        dtype = np.float32 if isinstance(self.w, Weight) else self.w.dtype
        if self.x.dtype != np.float32 or dtype != np.float32:
            raise ValueError(f"products are float32, got {self.x.dtype} @ {dtype}")
        if self.x.ndim != 2 or len(shape) != 2 or self.x.shape[1] != shape[0]:
            raise ValueError(f"shapes do not chain: {self.x.shape} @ {shape}")


@runtime_checkable
class Executor(Protocol):
    """Runs independent matrix products and returns checked results, in order."""

    def prepare(self, weights: Sequence[Weight]) -> None:
        """Optional hint: these weights will be used; place them now."""
        ...

    def matmuls(self, products: Sequence[Product]) -> list[np.ndarray]:
        """``[p.x @ p.w for p in products]``, each float32 ``[m, n]`` and checked."""
        ...


class LocalExecutor:
    """The reference: numpy in this process (its BLAS threads)."""

    def prepare(self, weights: Sequence[Weight]) -> None:
        return None

    def matmuls(self, products: Sequence[Product]) -> list[np.ndarray]:
        for p in products:
            p.check()
        kept = [i for i, p in enumerate(products)
                if isinstance(p.w, Weight) and p.w.tensor is not None]
        out: list[Any] = [None] * len(products)
        if len(kept) > 1:  # one hand-off to the kernels' threads for all (models.quant)
            from models.quant import matmuls

            for i, y in zip(kept, matmuls([(products[i].w.tensor, products[i].x)
                                           for i in kept]), strict=True):
                out[i] = y
        for i, p in enumerate(products):
            if out[i] is None:
                out[i] = p.w.matmul(p.x) if isinstance(p.w, Weight) else p.x @ p.w
        return [np.ascontiguousarray(y) for y in out]
