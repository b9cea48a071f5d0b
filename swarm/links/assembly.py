"""An output array assembled from received shared-memory segments, mapped where they belong.

A matmul's bands come back from co-located workers as sealed segments (:mod:`swarm.links.shm`)
and were copied into the output once checked: 64 MiB per n=4096 job, about 4% of its time
on two cores. Instead, the output is a private anonymous mapping, and a checked band whose
place starts on a page boundary (and ends on one, or at the output's end) has its segment
mapped over that place, copy-on-write (``MAP_FIXED | MAP_PRIVATE``): the pages are the ones
the worker wrote, nothing is copied, and writing to the output copies only the page written.
The segment is sealed, so what was checked is what the output holds. Anything else is copied
as before. Freeing the output unmaps it all.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from collections.abc import Callable

import numpy as np

from swarm.links import shm

_MAP_FIXED = 0x10
"""Linux's value on every architecture (Python's mmap module does not export it)."""


@functools.cache
def _mmap() -> Callable[..., int | None]:
    fn = ctypes.CDLL(None, use_errno=True).mmap
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_long]
    return fn


class Assembly:
    """A float32 ``rows x cols`` output whose row bands are placed with :meth:`place`."""

    def __init__(self, rows: int, cols: int) -> None:
        self._row_bytes = 4 * cols
        self._nbytes = rows * self._row_bytes
        if shm.supported() and self._nbytes >= shm.PLACE_MIN:
            self._region: mmap.mmap | None = mmap.mmap(-1, self._nbytes, flags=mmap.MAP_PRIVATE)
            self.array = np.frombuffer(self._region, np.float32).reshape(rows, cols)
        else:
            self._region = None
            self.array = np.empty((rows, cols), np.float32)
        self._address = self.array.__array_interface__["data"][0]
        self.mapped = 0
        """Bands placed by mapping (tests assert the path is used)."""

    def place(self, row: int, band: np.ndarray) -> None:
        """Put ``band`` (full rows) at ``row``: mapped when it is a whole received segment on
        page boundaries, copied otherwise."""
        if not self._map(row, band):
            self.array[row:row + band.shape[0]] = band

    def _map(self, row: int, band: np.ndarray) -> bool:
        seg = shm.segment_of(band) if self._region is not None else None
        if seg is None or band.dtype != np.float32 or band.ndim != 2 \
                or not band.flags.c_contiguous or band.shape[1] * 4 != self._row_bytes:
            return False
        start, size = row * self._row_bytes, band.nbytes
        end = start + size
        if start % mmap.PAGESIZE or end > self._nbytes \
                or (end % mmap.PAGESIZE and end != self._nbytes):
            return False  # a page shared with another band would be lost to one of them
        at = self._address + start
        got = _mmap()(at, size, mmap.PROT_READ | mmap.PROT_WRITE,
                      mmap.MAP_PRIVATE | _MAP_FIXED, seg.descriptor.fd, 0)
        if got == at:
            self.mapped += 1
            return True
        # a failed MAP_FIXED may have unmapped the place: put fresh memory back, then copy
        back = _mmap()(at, size, mmap.PROT_READ | mmap.PROT_WRITE,
                       mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
        if back != at:
            raise MemoryError(f"cannot map {size} bytes back into an output (errno "
                              f"{ctypes.get_errno()})")
        return False
