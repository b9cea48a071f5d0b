"""An output assembled from received segments (swarm.links.assembly): mapped in place where
the pages allow it, copied otherwise, copy-on-write, and unmapped with the output."""

from __future__ import annotations

import gc
import mmap
import os

import numpy as np
import pytest

from swarm.links import assembly, shm
from tests.links_helpers import mapping_at, memfds

pytestmark = pytest.mark.skipif(not shm.supported(), reason="shared memory is Linux-only")

COLS = 1024  # 4 KiB rows: every row starts a page


def _received(rows: int, cols: int = COLS, seed: int = 0) -> np.ndarray:
    """A band as a co-located worker's answer arrives: a sealed segment, mapped."""
    data = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)
    fd = shm._sealed(memoryview(data).cast("B"))
    try:
        return shm.map_array(os.getpid(), fd, data.nbytes).view(np.float32).reshape(rows, cols)
    finally:
        os.close(fd)  # the worker's descriptor; the receiver keeps its own


def _address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


def test_a_whole_segment_on_page_boundaries_is_mapped_not_copied():
    top, bottom = _received(512, seed=1), _received(512, seed=2)
    out = assembly.Assembly(1024, COLS)
    out.place(0, top)
    out.place(512, bottom)
    assert out.mapped == 2
    np.testing.assert_array_equal(out.array[:512], top)
    np.testing.assert_array_equal(out.array[512:], bottom)
    assert mapping_at(_address(out.array)).startswith("/memfd:swarm-shm")
    assert mapping_at(_address(out.array[512:])).startswith("/memfd:swarm-shm")
    out.array[0, 0] = 42.0  # copy-on-write: the segment (what was checked) stays as it was
    assert top[0, 0] != 42.0 and out.array[0, 0] == 42.0


def test_bands_that_would_share_a_page_are_copied():
    cols = 1000  # 4000-byte rows: most row starts are not page starts
    out = assembly.Assembly(300, cols)
    first, second = _received(100, cols, seed=3), _received(200, cols, seed=4)
    out.place(0, first)     # starts a page, but its last page is also the next band's first
    out.place(100, second)  # does not start a page
    assert out.mapped == 0
    np.testing.assert_array_equal(out.array[:100], first)
    np.testing.assert_array_equal(out.array[100:], second)
    whole = assembly.Assembly(300, cols)
    whole.place(0, _received(300, cols, seed=5))  # ends where the output ends: mapped
    assert whole.mapped == 1


def test_only_a_whole_received_segment_in_row_order_with_its_descriptor_is_mapped():
    band, square = _received(512), _received(COLS, seed=6)
    out = assembly.Assembly(4 * COLS, COLS)
    out.place(0, band[:256])                         # part of a segment
    out.place(COLS, square.T)                        # the whole segment, in another order
    out.place(2 * COLS, np.ones((512, COLS), np.float32))  # not received at all
    shm.settle(band)                                 # descriptor closed: stays where it is
    assert shm.segment_of(band) is None
    out.place(3 * COLS, band)
    assert out.mapped == 0
    np.testing.assert_array_equal(out.array[:256], band[:256])
    np.testing.assert_array_equal(out.array[COLS:2 * COLS], square.T)
    np.testing.assert_array_equal(out.array[2 * COLS:2 * COLS + 512], 1.0)
    np.testing.assert_array_equal(out.array[3 * COLS:3 * COLS + 512], band)


def test_freeing_the_output_unmaps_it_and_its_segments():
    band = _received(1024)
    out = assembly.Assembly(1024, COLS)
    out.place(0, band)
    where = _address(out.array)
    assert mapping_at(where).startswith("/memfd:swarm-shm")
    del out
    gc.collect()
    assert not mapping_at(where).startswith("/memfd")


def test_without_shared_memory_the_output_is_a_plain_array(monkeypatch):
    monkeypatch.setenv(shm.ENV, "0")
    out = assembly.Assembly(512, COLS)
    out.place(0, _received(512))
    assert out.mapped == 0 and not isinstance(out.array.base, mmap.mmap)


def test_received_segments_keep_a_descriptor_only_until_settled():
    bands = [_received(512, seed=i) for i in range(4)]
    small = _received(8)  # under PLACE_MIN: nothing kept for it
    assert all(shm.segment_of(b) is not None for b in bands) and shm.segment_of(small) is None
    held = memfds()
    for band in bands:
        shm.settle(band)
        shm.settle(band)  # once only: a second settle closes nothing (no stray close)
    assert memfds() == held - 4
    np.testing.assert_array_equal(bands[0], _received(512, seed=0))  # the mapping stays
