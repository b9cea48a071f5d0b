"""TEMPORARY stand-in for ``models.quant.QTensor`` (written on the gguf-quant branch): the same
methods over a float32 copy, so the model registry can be built and tested before the quantized
kernels land. The lead swaps it when merging: ``models.gguf_weights`` imports it in one place,
and this file is then deleted. It keeps none of the memory savings the real one exists for.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, quants


class QTensor:
    """A 2-D weight ``[out, in]`` (here: dequantized to float32 once, at load)."""

    def __init__(self, qtype: str, shape: tuple[int, int], data: np.ndarray) -> None:
        self.qtype, self.shape, self.data = qtype, shape, data
        # kept [in, out] C-contiguous, as a span's bundle holds it, so that the local forward
        # and a worker run the same BLAS kernel and agree to the bit
        self._t = np.ascontiguousarray(np.asarray(
            quants.dequantize(data, GGMLQuantizationType[qtype]), np.float32).reshape(shape).T)
        self._t.setflags(write=False)
        self._f32 = self._t.T
        self.nbytes = int(data.nbytes)

    @classmethod
    def from_reader(cls, tensor) -> QTensor:
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        return cls(tensor.tensor_type.name, shape, np.asarray(tensor.data))

    @classmethod
    def from_bytes(cls, qtype: str, shape: tuple[int, int], buf) -> QTensor:
        rows = shape[0]
        data = np.frombuffer(buf, np.uint8).reshape(rows, -1)
        return cls(qtype, shape, data)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x @ self._t)

    def dequantize(self, rows=None) -> np.ndarray:
        return self._f32 if rows is None else self._f32[rows]

    def rows(self, index) -> np.ndarray:
        return np.ascontiguousarray(self._f32[index])

    def slice_rows(self, a: int, b: int) -> QTensor:
        out = object.__new__(QTensor)
        out.qtype, out.shape, out.data = self.qtype, (b - a, self.shape[1]), self.data[a:b]
        out._f32, out.nbytes = self._f32[a:b], int(self.data[a:b].nbytes)
        out._t = out._f32.T
        return out

    def fingerprint(self, r: np.ndarray) -> np.ndarray:
        return self._f32 @ r
