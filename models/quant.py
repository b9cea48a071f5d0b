"""Weight matrices kept in the block format the GGUF file stores, multiplied without ever
making a float32 copy of the whole matrix.

    from models.quant import QTensor
    w = QTensor.from_reader(reader.tensors[i])   # zero-copy over the file's mmap
    y = w.matmul(x)                              # x float32 [n, in] -> [n, out] = x @ W.T

**Paths** (kernels: models.quant_kernels, in numba):

* ``n <= FEW`` rows of ``x`` (decode): every weight byte is read once and decoded in registers
  (one row of ``x``), or a tile of rows is decoded into cache and dotted with each row of
  ``x`` (a few). Fixed summation order (models.quant_kernels' docstring), explicit IEEE fused
  multiply-adds: the same bits on every machine, whichever of the two kernels ran. Output rows
  are split between :data:`THREADS` threads (above :data:`SPLIT_BYTES` of weights; capped by
  :func:`limit_threads`, as a worker's ``--threads``).
* ``n > FEW`` (prefill): tiles of :data:`TILE_BYTES` decoded to float32 and multiplied by BLAS
  (``sgemm``): one thread, n = 64, 1536 x 576 Q4_1: 61 GFLOPS, against 21 for the decoding
  kernel's four-rows-at-a-time dot products. The tiles are shared between the same threads.
  Same bits for the same BLAS, thread count and machine; elsewhere within float32 rounding.

:func:`matmuls` runs several independent products (a layer's Q, K and V) in one hand-off to
the threads, with the same bits as one at a time.

**Dequantized values** equal ``gguf.quants.dequantize``'s exactly (tests check each type), so
a requester that draws Freivalds vectors ``R`` computes the fingerprints from the same
weights it would have dequantized (:meth:`QTensor.check_vectors`, streamed by row tiles).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor

from models import quant_kernels as qk

Q = GGMLQuantizationType
SUPPORTED: tuple[GGMLQuantizationType, ...] = (
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)
"""The block formats this module multiplies (GGML's names)."""

FEW = 8
"""Up to this many rows of ``x`` take the decoding kernels; more take tiles and BLAS."""
THREADS = max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else os.cpu_count() or 1))
"""Threads a decoding product is split over (the caller and ``THREADS - 1`` helpers), unless
the calling thread is under :func:`limit_threads`."""
_limit = threading.local()


@contextlib.contextmanager
def limit_threads(threads: int | None) -> Iterator[None]:
    """Within this block, this thread's products use at most ``threads`` threads (None: no
    cap): a worker started with ``--threads 1`` keeps to one core, as its BLAS does."""
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    before = getattr(_limit, "threads", None)
    _limit.threads = threads
    try:
        yield
    finally:
        _limit.threads = before


def _threads() -> int:
    cap = getattr(_limit, "threads", None)
    return THREADS if cap is None else min(THREADS, cap)
SHARES = 4
"""Shares of a split product per thread (each a numba call of a few microseconds)."""
SPLIT_BYTES = 256 << 10
"""Weights below this many bytes run on the calling thread alone: handing half to a helper
costs ~20-50 us of wake-up, about what 256 KiB takes to stream."""
TILE_BYTES = 512 << 10
"""float32 bytes of one decoded tile: stays in L2 while BLAS uses it (at least
:data:`TILE_ROWS` rows: sgemm on 26 rows of 4864 ran at half the speed of 227 rows of 576)."""
TILE_ROWS = 64


def _supported_names() -> str:
    return ", ".join(t.name for t in SUPPORTED)


def _qtype(qtype) -> GGMLQuantizationType:
    try:
        t = GGMLQuantizationType(qtype) if not isinstance(qtype, str) else Q[qtype]
    except (ValueError, KeyError):
        raise ValueError(f"unknown GGML type {qtype!r}; supported: {_supported_names()}"
                         ) from None
    if t not in SUPPORTED:
        raise ValueError(f"GGML type {t.name} is not supported; supported: "
                         f"{_supported_names()}")
    return t


def row_bytes(qtype, n_in: int) -> int:
    """Bytes of one row of ``n_in`` weights in block format ``qtype`` (a GGML type or its
    name); ValueError names the supported types, or the row length the format needs."""
    t = _qtype(qtype)
    per_block, block_bytes = qk.LAYOUT[qk.CODES[t.name]]
    if n_in <= 0 or n_in % per_block:
        raise ValueError(f"a {t.name} row holds a multiple of {per_block} weights, got {n_in}")
    return n_in // per_block * block_bytes


class QTensor:
    """A 2-D weight ``[out, in]`` kept in the GGUF block format the file stores."""

    __slots__ = ("qtype", "shape", "data", "_code")

    def __init__(self, qtype, shape: tuple[int, int], data: np.ndarray) -> None:
        """``data``: uint8 ``[out, bytes_per_row]`` (a read-only view is taken, never a
        copy unless its rows are not contiguous)."""
        self.qtype = _qtype(qtype)
        out, n_in = (int(s) for s in shape)
        self.shape = (out, n_in)
        self._code = qk.CODES[self.qtype.name]
        per_block, block_bytes = qk.LAYOUT[self._code]
        if out < 0 or n_in <= 0 or n_in % per_block:
            raise ValueError(f"a {self.qtype.name} row holds a multiple of {per_block} "
                             f"weights, got shape {self.shape}")
        row_bytes = n_in // per_block * block_bytes
        data = np.asarray(data)
        if data.dtype != np.uint8 or data.shape != (out, row_bytes):
            raise ValueError(f"{self.qtype.name} {self.shape} is uint8 [{out}, {row_bytes}] "
                             f"bytes, got {data.dtype} {list(data.shape)}")
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        data = data.view()
        data.setflags(write=False)  # one compiled signature, and the file's bytes stay put
        self.data = data

    @classmethod
    def from_reader(cls, tensor: ReaderTensor) -> QTensor:
        """A tensor of a ``gguf.GGUFReader``, over its memory map (no copy)."""
        if len(tensor.shape) != 2:
            raise ValueError(f"tensor {tensor.name!r} has shape {list(tensor.shape)}: "
                             "a QTensor is a 2-D matrix")
        n_in, out = (int(s) for s in tensor.shape)  # GGUF's ne: innermost first
        data = np.asarray(tensor.data)
        return cls(tensor.tensor_type, (out, n_in), data.view(np.uint8).reshape(out, -1))

    @classmethod
    def from_bytes(cls, qtype, shape: tuple[int, int], buf) -> QTensor:
        """A matrix from its raw bytes (e.g. a received bundle; no copy of ``buf``)."""
        t = _qtype(qtype)
        out, n_in = (int(s) for s in shape)
        if out < 0:
            raise ValueError(f"a {t.name} matrix has no {out} rows")
        per_row = row_bytes(t, n_in)
        raw = np.frombuffer(buf, dtype=np.uint8)
        if raw.size != out * per_row:
            raise ValueError(f"{t.name} {(out, n_in)} is {out * per_row} bytes, got {raw.size}")
        return cls(t, (out, n_in), raw.reshape(out, per_row))

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def __repr__(self) -> str:
        return f"QTensor({self.qtype.name}, {self.shape})"

    # -- reading weights -------------------------------------------------------------------

    def dequantize(self, rows: slice | None = None) -> np.ndarray:
        """float32 ``[rows, in]`` (all rows by default), equal to gguf.quants.dequantize."""
        start, stop, step = (rows or slice(None)).indices(self.shape[0])
        if step != 1:
            raise ValueError("dequantize takes a contiguous slice of rows (step 1)")
        stop = max(start, stop)
        out = np.empty((stop - start, self.shape[1]), np.float32)
        self._kernels().dequantize_range(self.data, start, stop, out)
        return out

    def rows(self, index: np.ndarray) -> np.ndarray:
        """float32 ``[len(index), in]``: the rows named by ``index`` (token embeddings)."""
        index = np.asarray(index)
        if index.ndim != 1 or index.dtype.kind not in "iu":
            raise ValueError(f"rows takes a 1-D integer index, got {index.dtype} "
                             f"{list(index.shape)}")
        if index.size and (index.min() < 0 or index.max() >= self.shape[0]):
            raise ValueError(f"row index out of range [0, {self.shape[0]})")
        out = np.empty((index.size, self.shape[1]), np.float32)
        decode = self._kernels().dequantize_range
        for i, r in enumerate(index.tolist()):
            decode(self.data, r, r + 1, out[i:i + 1])
        return out

    def slice_rows(self, start: int, stop: int) -> QTensor:
        """Rows ``[start, stop)`` as a QTensor over the same bytes (a view)."""
        if not 0 <= start <= stop <= self.shape[0]:
            raise ValueError(f"rows [{start}, {stop}) are not within [0, {self.shape[0]}]")
        return QTensor(self.qtype, (stop - start, self.shape[1]), self.data[start:stop])

    # -- products ----------------------------------------------------------------------------

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """``x @ W.T``: x float32 ``[n, in]`` (or ``[in]``) -> float32 ``[n, out]`` (``[out]``)."""
        return matmuls([(self, x)])[0]

    def _operand(self, x: np.ndarray) -> tuple[np.ndarray, bool]:
        """``x`` as the kernels take it (float32 ``[n, in]``, C order, writable) and whether
        it was one vector."""
        x = np.asarray(x)
        vector = x.ndim == 1
        x2 = x[None, :] if vector else x
        if x2.ndim != 2 or x2.shape[1] != self.shape[1] or x.dtype != np.float32:
            raise ValueError(f"x is float32 [n, {self.shape[1]}], got {x.dtype} "
                             f"{list(x.shape)}")
        x2 = np.ascontiguousarray(x2)
        if not x2.flags.writeable:  # one compiled signature per kernel: writable x
            x2 = x2.copy()
        return x2, vector

    def _decode_product(self, x: np.ndarray, y: np.ndarray, r0: int, r1: int) -> None:
        k = self._kernels()
        if x.shape[0] == 1:
            k.matvec(self.data, x, y, r0, r1)
        else:
            k.matmul_few(self.data, x, y, r0, r1, np.empty(self.shape[1], np.float32))

    def _tile_rows(self) -> int:
        """Rows of one prefill tile (module docstring: :data:`TILE_BYTES`, :data:`TILE_ROWS`)."""
        out, n_in = self.shape
        return max(1, min(out, max(TILE_ROWS, TILE_BYTES // (4 * n_in))))

    def _tile(self, x: np.ndarray, yt: np.ndarray, t0: int, t1: int) -> None:
        """Prefill: ``yt[t0:t1] = W[t0:t1] @ x.T``, the weight rows decoded to float32 in this
        thread's scratch tile and multiplied by BLAS."""
        n_in = self.shape[1]
        scratch = getattr(_scratch, "tile", None)
        if scratch is None or scratch.size < (t1 - t0) * n_in:
            scratch = _scratch.tile = np.empty(max((t1 - t0) * n_in, TILE_BYTES // 4),
                                               np.float32)
        tile = scratch[:(t1 - t0) * n_in].reshape(t1 - t0, n_in)
        self._kernels().dequantize_range(self.data, t0, t1, tile)
        np.matmul(tile, x.T, out=yt[t0:t1])

    # -- verification ----------------------------------------------------------------------

    def fingerprint(self, r: np.ndarray) -> np.ndarray:
        """``W @ r`` (float32 ``[out, k]``) for ``r`` float32 ``[in, k]``, streamed by the
        decoding kernels (no float32 copy of ``W``)."""
        r = np.asarray(r)
        if r.ndim != 2 or r.shape[0] != self.shape[1]:
            raise ValueError(f"r is [{self.shape[1]}, k], got {list(r.shape)}")
        return np.ascontiguousarray(self.matmul(np.ascontiguousarray(r.T, np.float32)).T)

    def check_vectors(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What a Freivalds check of ``y = x @ W.T`` takes from the weight, for check vectors
        ``r`` float32 ``[out, k]``: ``W.T @ r`` (float32 ``[in, k]``) and ``W``'s squared
        column norms (float64 ``[in]``): compute.verify.check_product's ``br`` and
        ``b_norms2`` for ``b = W.T``. One pass over the rows, each decoded once and added
        into both sums (models.quant_kernels ``check_sums``: a tile through BLAS plus float64
        squares in numpy took 4-5x as long, and a requester redraws every weight's vectors
        each :attr:`models.span.Fingerprints.REUSE` checks)."""
        r = np.ascontiguousarray(r, dtype=np.float32)
        out, n_in = self.shape
        if r.ndim != 2 or r.shape[0] != out:
            raise ValueError(f"r is [{out}, k], got {list(r.shape)}")
        brt = np.zeros((r.shape[1], n_in), np.float32)
        norms2 = np.zeros(n_in)
        self._kernels().check_sums(self.data, r, brt, norms2, np.empty(n_in, np.float32))
        return np.ascontiguousarray(brt.T), norms2

    def _kernels(self):
        return qk.kernels(self._code)


def matmuls(pairs: list[tuple[QTensor, np.ndarray]]) -> list[np.ndarray]:
    """``[w.matmul(x) for w, x in pairs]`` (the same bits), the work handed to the helper
    threads together: one wake-up for a layer's Q, K and V, not three (on two cores each
    hand-off cost 20-50 us, a fifth of a SmolLM2 decode step's products), and a prefill's
    tiles shared out too (each BLAS call on the caller's BLAS threads: one, as models.generate
    runs it, so two cores without OpenBLAS's threads spinning against each other)."""
    outs, decode, tiled, nbytes = [], [], [], 0
    operands = [w._operand(x) for w, x in pairs]  # every one checked before any runs
    for (w, _), (x2, _) in zip(pairs, operands, strict=True):
        n, out = x2.shape[0], w.shape[0]
        if n == 0 or out == 0:
            y = np.zeros((n, out), np.float32)
        elif n > FEW:
            y = np.empty((out, n), np.float32)  # y.T, filled a tile of rows at a time
            tiled.append((w, x2, y))
        else:
            y = np.empty((n, out), np.float32)
            decode.append((w, x2, y))
            nbytes += w.nbytes
        outs.append(y)
    threads = _threads()
    shares: list[tuple[Any, tuple]] = []
    if threads < 2 or nbytes < SPLIT_BYTES:
        shares += [(w._decode_product, (x2, y, 0, w.shape[0])) for w, x2, y in decode]
    else:
        size = nbytes / (SHARES * threads)
        for w, x2, y in decode:
            out = w.shape[0]
            parts = max(1, min(out, round(w.nbytes / size)))
            shares += [(w._decode_product, (x2, y, out * p // parts, out * (p + 1) // parts))
                       for p in range(parts)]
    for w, x2, yt in tiled:
        rows = w._tile_rows()
        shares += [(w._tile, (x2, yt, t0, min(w.shape[0], t0 + rows)))
                   for t0 in range(0, w.shape[0], rows)]
    if threads < 2 or len(shares) < 2:
        for fn, args in shares:
            fn(*args)
    else:
        _split(shares, threads)
    transposed = {id(yt) for _, _, yt in tiled}
    outs = [np.ascontiguousarray(y.T) if id(y) in transposed else y for y in outs]
    return [y[0] if vector else y for y, (_, vector) in zip(outs, operands, strict=True)]


def _split(shares: list[tuple[Any, tuple]], threads: int) -> None:
    """Run every share (a function and its arguments), the caller and the helpers taking
    them as they come free. The caller waits only for shares a helper has started: on a
    loaded machine a helper that is not scheduled in time finds nothing left, instead of
    the products waiting for it."""
    count = len(shares)
    taken, done = itertools.count(), itertools.count(1)  # next() is atomic under the GIL
    errors: list[BaseException] = []
    # held until the last share is done, released by whoever did it: a bare lock (waiting on
    # an Event's condition had cost ~0.2 ms a product on loaded cores, profiled)
    finished = threading.Lock()
    finished.acquire()

    def take() -> None:
        while (p := next(taken)) < count:
            fn, args = shares[p]
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                errors.append(e)
            if next(done) == count:
                finished.release()

    for helper in _helpers(threads - 1):
        helper.put(take)
    take()
    finished.acquire()
    if errors:
        raise errors[0]


def gguf_tensors(reader: GGUFReader) -> dict[str, QTensor | np.ndarray]:
    """Every tensor of a ``gguf.GGUFReader`` by name, nothing copied or dequantized in bulk:
    2-D ones as :class:`QTensor` over the file's map, 1-D ones (norms, biases: F32 in every
    file seen) as float32 arrays (decoded if they are stored otherwise). ValueError names
    a tensor of an unsupported type or rank."""
    out: dict[str, QTensor | np.ndarray] = {}
    for t in reader.tensors:
        if len(t.shape) == 2:
            out[t.name] = QTensor.from_reader(t)
        elif len(t.shape) == 1:
            _qtype(t.tensor_type)
            if t.tensor_type == Q.F32:
                out[t.name] = np.asarray(t.data, np.float32)
            else:
                n = int(t.shape[0])
                out[t.name] = QTensor(t.tensor_type, (1, n), np.asarray(t.data).view(
                    np.uint8).reshape(1, -1)).dequantize()[0]
        else:
            raise ValueError(f"tensor {t.name!r} has {len(t.shape)} dimensions; "
                             "a model's weights are matrices and vectors")
    return out


_pool: list[queue.SimpleQueue] = []
_pool_lock = threading.Lock()
_scratch = threading.local()
"""Each thread's float32 tile for prefill products (``tile``), kept between calls."""


def _helpers(count: int) -> list[queue.SimpleQueue]:
    """The queues of ``count`` helper threads, started once per process (and again in a
    fork), each running what it is handed, in order."""
    with _pool_lock:
        while len(_pool) < count:
            q: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(q,), name="swarm-quant", daemon=True).start()
            _pool.append(q)
        return _pool[:count]


def _serve(q: queue.SimpleQueue) -> None:
    while True:
        q.get()()  # a split's take(): it catches what its shares raise


def _forget_pool() -> None:
    global _pool_lock
    _pool.clear()  # a forked child has none of the parent's threads
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
