"""The CPU backend: numpy's BLAS (OpenBLAS, MKL or Accelerate), thread count settable."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from compute.backend import Backend, check_operands, check_precision
from compute.errors import ComputeError, InvalidInput

SMALL_PRODUCT = 1 << 16
"""Products of at most this many multiply-adds skip the thread cap: BLAS runs them on the
calling thread anyway, and setting the cap (threadpoolctl) cost ~20 us, as much as a small
task's product and its receipt together."""


class NumpyBackend(Backend):
    """``a @ b`` through numpy's BLAS in float32.

    ``threads`` caps the BLAS thread pool for this backend's calls only (None: leave the
    library's own setting alone), so a worker can keep cores free for its other duties.
    """

    name = "numpy"

    def __init__(self, threads: int | None = None) -> None:
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InvalidInput(f"threads must be a positive integer or None, got {threads!r}")
        self.threads = threads
        self._controller = None
        if threads is not None:
            from threadpoolctl import ThreadpoolController

            self._controller = ThreadpoolController()

    def matmul(self, a: np.ndarray, b: np.ndarray, precision: str = "f32") -> np.ndarray:
        if check_precision(precision) != "f32":
            raise ComputeError("the numpy backend computes in f32 only; f16 needs wgpu")
        a, b = check_operands(a, b)
        if self._controller is None or a.shape[0] * a.shape[1] * b.shape[1] <= SMALL_PRODUCT:
            return a @ b
        with self._controller.limit(limits=self.threads, user_api="blas"):
            return a @ b

    def cpu_limit(self) -> AbstractContextManager[Any]:
        """BLAS capped at ``threads`` for a whole block of work (one threadpoolctl switch, not
        one per product). Two span workers on two cores at the library's default of two BLAS
        threads each decoded SmolLM2 at 159-176 ms a token, at one thread each 80-97 ms."""
        if self._controller is None:
            return nullcontext()
        return self._controller.limit(limits=self.threads, user_api="blas")

    def blas_threads(self) -> int | None:
        """The BLAS thread count in effect for this backend's calls (None if unknown)."""
        from threadpoolctl import ThreadpoolController

        controller = self._controller or ThreadpoolController()
        blas = controller.select(user_api="blas")
        if not blas.lib_controllers:
            return None
        if self.threads is None:
            return blas.lib_controllers[0].num_threads
        with controller.limit(limits=self.threads, user_api="blas"):
            return ThreadpoolController().select(user_api="blas").lib_controllers[0].num_threads

    def adapter_info(self) -> dict[str, Any]:
        from threadpoolctl import threadpool_info

        blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        info: dict[str, Any] = {"name": "numpy " + np.__version__, "type": "CPU"}
        if blas:
            info["blas"] = f"{blas[0].get('internal_api')} {blas[0].get('version')}"
            info["threads"] = self.threads or blas[0].get("num_threads")
        return info
