"""Backends: shape classes, self-validation, fault injection, `auto` fallback, numpy threads."""

from __future__ import annotations

import time

import numpy as np
import pytest

import compute
from compute import BackendUnavailable, ComputeError, InvalidInput, registry
from compute.backend import check_result
from compute.numpy_backend import NumpyBackend

SHAPES = [(1, 1, 1), (7, 5, 3), (64, 64, 64), (65, 63, 67), (300, 4, 2), (2, 4, 300),
          (3, 700, 5), (128, 1, 128)]


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.clear_cache()
    yield
    registry.clear_cache()


def reference(a, b):
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_numpy_shapes(shape):
    m, k, n = shape
    rng = np.random.default_rng(m * 1000 + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = compute.get_backend("numpy").matmul(a, b)
    assert c.dtype == np.float32 and c.shape == (m, n)
    np.testing.assert_allclose(c, reference(a, b), rtol=1e-4, atol=1e-4)


def test_numpy_converts_and_refuses():
    backend = compute.get_backend("numpy")
    c = backend.matmul(np.arange(6).reshape(2, 3), np.ones((3, 2), dtype=np.float64))
    assert c.dtype == np.float32 and c.tolist() == [[3, 3], [12, 12]]
    with pytest.raises(InvalidInput, match="inner"):
        backend.matmul(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(InvalidInput, match="2-D"):
        backend.matmul(np.ones(3), np.ones((3, 1)))
    with pytest.raises(InvalidInput, match="dtype"):
        backend.matmul(np.array([["x"]]), np.ones((1, 1)))
    with pytest.raises(ComputeError, match="f16"):
        backend.matmul(np.ones((2, 2)), np.ones((2, 2)), precision="f16")
    with pytest.raises(InvalidInput, match="precision"):
        backend.matmul(np.ones((2, 2)), np.ones((2, 2)), precision="f64")


def test_numpy_thread_setting():
    one = compute.get_backend("numpy", threads=1)
    assert one.threads == 1 and one.blas_threads() == 1
    assert one.adapter_info()["threads"] == 1
    default = compute.get_backend("numpy")
    assert default is not one
    assert compute.get_backend("numpy", threads=1) is one  # cached per thread count
    # The cap applies to the backend's own calls only: the process setting is untouched.
    before = default.blas_threads()
    one.matmul(np.ones((64, 64)), np.ones((64, 64)))
    assert default.blas_threads() == before
    with pytest.raises(InvalidInput):
        compute.get_backend("numpy", threads=0)


def test_matmul_many_matches_matmul():
    backend = compute.get_backend("numpy")
    rng = np.random.default_rng(1)
    pairs = [(rng.standard_normal((m, k), dtype=np.float32),
              rng.standard_normal((k, n), dtype=np.float32)) for m, k, n in SHAPES[:4]]
    for (a, b), c in zip(pairs, backend.matmul_many(pairs), strict=True):
        np.testing.assert_allclose(c, reference(a, b), rtol=1e-4, atol=1e-4)


class ZerosBackend(NumpyBackend):
    """A driver that 'succeeds' and hands back zeros."""

    name = "zeros"

    def matmul(self, a, b, precision="f32"):
        return np.zeros((np.shape(a)[0], np.shape(b)[1]), np.float32)


class SlightlyWrongBackend(NumpyBackend):
    name = "slightly-wrong"

    def matmul(self, a, b, precision="f32"):
        c = super().matmul(a, b)
        c[c.shape[0] // 2, c.shape[1] // 2] += 0.01
        return c


class NanBackend(NumpyBackend):
    name = "nan"

    def matmul(self, a, b, precision="f32"):
        c = super().matmul(a, b)
        c.flat[-1] = np.nan
        return c


class BrokenBatchBackend(NumpyBackend):
    name = "broken-batch"

    def matmul_many(self, pairs, precision="f32"):
        return [np.zeros((a.shape[0], b.shape[1]), np.float32) for a, b in pairs]


class CrashingBackend(NumpyBackend):
    name = "crashing"

    def matmul(self, a, b, precision="f32"):
        raise RuntimeError("device lost")


@pytest.mark.parametrize(
    ("cls", "reason"),
    [(ZerosBackend, "all zeros"), (SlightlyWrongBackend, "wrong result"),
     (NanBackend, "non-finite"), (BrokenBatchBackend, "all zeros"),
     (CrashingBackend, "device lost")],
)
def test_validation_refuses_faulty_backends(cls, reason):
    with pytest.raises(BackendUnavailable, match=reason) as info:
        cls().validate()
    assert info.value.reason.startswith(cls.name)


def test_auto_refuses_a_zeros_backend_and_falls_back(monkeypatch):
    """The fastest backend returns zeros: auto must not pick it, and must say why."""
    monkeypatch.setattr(registry, "FACTORIES", {"fastzeros": lambda t: ZerosBackend(t),
                                                "numpy": registry.FACTORIES["numpy"]})
    chosen = compute.get_backend("auto")
    assert chosen.name == "numpy"
    status = {s.name: s for s in compute.available_backends()}
    assert not status["fastzeros"].validated and "all zeros" in status["fastzeros"].reason
    assert status["numpy"].validated and status["numpy"].reason is None
    with pytest.raises(BackendUnavailable, match="all zeros"):
        compute.get_backend("fastzeros")


def test_auto_raises_when_nothing_validates(monkeypatch):
    monkeypatch.setattr(registry, "FACTORIES", {"zeros": lambda t: ZerosBackend(t),
                                                "crashing": lambda t: CrashingBackend(t)})
    with pytest.raises(BackendUnavailable, match="no usable backend.*zeros.*crashing"):
        compute.get_backend("auto")


def test_auto_picks_the_faster_validated_backend(monkeypatch):
    class Slow(NumpyBackend):
        name = "slow"

        def matmul(self, a, b, precision="f32"):
            # Slower by a margin load cannot erase (numpy's 384-product takes ~1 ms; a
            # two-thread BLAS that loses a core to another process can take 20x that).
            time.sleep(0.1)
            return super().matmul(a, b)

    monkeypatch.setattr(registry, "FACTORIES", {"slow": lambda t: Slow(t),
                                                "numpy": registry.FACTORIES["numpy"]})
    assert compute.get_backend("auto").name == "numpy"
    assert compute.get_backend("auto") is compute.get_backend("auto")


def test_unknown_backend_name():
    with pytest.raises(InvalidInput, match="unknown backend"):
        compute.get_backend("cuda")


def test_check_result_catches_each_fault():
    a = np.ones((4, 4), np.float32)
    check_result(a, a, np.full((4, 4), 4.0))
    with pytest.raises(BackendUnavailable, match="shape"):
        check_result(a, a, np.ones((4, 3)))
    with pytest.raises(BackendUnavailable, match="all zeros"):
        check_result(a, a, np.zeros((4, 4)))
    with pytest.raises(BackendUnavailable, match=r"element \(1, 2\)"):
        bad = np.full((4, 4), 4.0)
        bad[1, 2] = 4.01
        check_result(a, a, bad)
