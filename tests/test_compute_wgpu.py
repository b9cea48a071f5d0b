"""The wgpu backend on whatever adapter this machine has (llvmpipe here): the tiled and
naive WGSL kernels over every shape class, batching, device-limit splits, validation of a
faulty kernel, and the custom-kernel path."""

from __future__ import annotations

import numpy as np
import pytest

import compute
from compute import BackendUnavailable, ComputeError, InvalidInput, KernelError, registry
from compute import wgpu_backend as wb

SHAPES = [(1, 1, 1), (1, 9, 1), (7, 5, 3), (64, 64, 64), (129, 127, 131), (300, 4, 2),
          (2, 4, 300), (3, 700, 5), (128, 1, 128), (257, 33, 9)]


@pytest.fixture(scope="module")
def gpu():
    try:
        return wb.WgpuBackend.shared()
    except BackendUnavailable as exc:
        pytest.skip(f"no wgpu adapter here: {exc.reason}")


def operands(m, k, n, seed=0):
    rng = np.random.default_rng(seed + m * 7 + k * 13 + n)
    return (rng.uniform(-1, 1, (m, k)).astype(np.float32),
            rng.uniform(-1, 1, (k, n)).astype(np.float32))


def assert_product(a, b, c):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c.dtype == np.float32 and c.shape == ref.shape
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * max(1, a.shape[1]))


@pytest.mark.parametrize("kernel", ["tiled", "naive"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes(gpu, shape, kernel):
    a, b = operands(*shape)
    assert_product(a, b, gpu.matmul(a, b, kernel=kernel))


@pytest.mark.parametrize("kernel", ["tiled", "naive"])
def test_freivalds_accepts_both_kernels(gpu, kernel):
    a, b = operands(300, 500, 200)
    c = gpu.matmul(a, b, kernel=kernel)
    assert compute.verify_matmul(a, b, c)
    c[299, 199] += 0.05
    assert not compute.verify_matmul(a, b, c)


def test_empty_and_degenerate(gpu):
    assert gpu.matmul(np.ones((0, 3)), np.ones((3, 4))).shape == (0, 4)
    c = gpu.matmul(np.ones((2, 0)), np.ones((0, 5)))
    assert c.shape == (2, 5) and not c.any()


def test_matmul_many_batches_shards(gpu):
    """Row shards of one product, several shapes, one submission: all correct."""
    a, b = operands(200, 70, 90)
    shards = compute.plan_shards(200, 90, [3, 1, 2], mode="tiles")
    pairs = [(a[s.rows[0]:s.rows[1]], b[:, s.cols[0]:s.cols[1]]) for s in shards]
    pairs.append(operands(5, 3, 2))
    results = gpu.matmul_many(pairs)
    merged = compute.merge_shards(200, 90, shards, results[:-1])
    assert_product(a, b, merged)
    assert_product(*pairs[-1], results[-1])
    assert compute.verify_matmul(a, b, merged)


def test_buffers_are_reused(gpu):
    a, b = operands(40, 40, 40)
    gpu.matmul(a, b)
    pooled = dict(gpu._pool)
    gpu.matmul(*operands(30, 20, 10))
    assert all(gpu._pool[slot] is buf for slot, buf in pooled.items())


def test_products_larger_than_a_binding_are_split(gpu, monkeypatch):
    """A device whose bindings hold only 4 KiB still gets the right answer, in pieces."""
    monkeypatch.setattr(gpu, "max_binding", 4096)
    a, b = operands(150, 24, 300)  # a: 14 KiB, b: 28 KiB, c: 176 KiB
    jobs = gpu._jobs(0, a, b, "tiled", False)
    assert len(jobs) > 8 and all(j.a.nbytes <= 4096 and j.b.nbytes <= 4096 for j in jobs)
    assert_product(a, b, gpu.matmul(a, b))
    assert_product(a, b, gpu.matmul(a, b, kernel="naive"))
    with pytest.raises(InvalidInput, match="too long"):
        gpu._jobs(0, *operands(1, 2048, 1), "tiled", False)
    with pytest.raises(InvalidInput, match="too long"):
        gpu._jobs(0, *operands(1, 2048, 1), "naive", False)


def test_f16_needs_shader_f16(gpu):
    a, b = operands(8, 8, 8)
    if gpu.f16_available:
        c = gpu.matmul(a, b, "f16")
        np.testing.assert_allclose(c, a @ b, rtol=2e-2, atol=2e-2)
        assert compute.verify_matmul(a, b, c, precision="f16")
    else:
        with pytest.raises(ComputeError, match="shader-f16"):
            gpu.matmul(a, b, "f16")


def test_bad_arguments(gpu):
    with pytest.raises(InvalidInput, match="inner"):
        gpu.matmul(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(InvalidInput, match="kernel"):
        gpu.matmul(np.ones((2, 2)), np.ones((2, 2)), kernel="fast")


def test_kernel_timing(gpu):
    naive = gpu.kernel_seconds(64, 64, 64, kernel="naive", repeats=1)
    tiled = gpu.kernel_seconds(64, 64, 64, kernel="tiled", repeats=1)
    assert naive > 0 and tiled > 0


ZEROS_KERNEL = """
@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> c: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> dims: vec4<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (dims.w == 7u && a[0].x == b[0].x) { return; }  // never: dims.w is 0; binds a and b
    if (g.x < arrayLength(&c)) { c[g.x] = vec4<f32>(0.0); }
}
"""


class ZerosOnDevice(wb.WgpuBackend):
    """The real device, but its matmul pipeline 'succeeds' and writes zeros (a bad driver).

    It shares the process's device: wgpu-native's GL backend (llvmpipe) was seen to abort
    when a second device's poll thread ran while the first one submitted work.
    """

    def __init__(self, real: wb.WgpuBackend) -> None:
        self.__dict__.update(real.__dict__)
        self._pipelines, self._pool = {}, {}

    def _matmul_pipeline(self, kernel, f16, tiles=None):
        module = self.device.create_shader_module(code=ZEROS_KERNEL)
        return self.device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"})


@pytest.fixture
def zeros_device(gpu):
    device = ZerosOnDevice(gpu)
    yield device
    device.release_buffers()


def test_a_device_returning_zeros_is_refused_and_auto_falls_back(monkeypatch, zeros_device):
    faulty = zeros_device
    assert not faulty.matmul(*operands(4, 4, 4)).any()  # it really returns zeros
    registry.clear_cache()
    monkeypatch.setitem(registry.FACTORIES, "wgpu", lambda threads: faulty)
    try:
        status = {s.name: s for s in compute.available_backends()}
        assert not status["wgpu"].validated
        assert "all zeros" in status["wgpu"].reason
        assert compute.get_backend("auto").name == "numpy"
        with pytest.raises(BackendUnavailable, match="all zeros"):
            compute.get_backend("wgpu")
    finally:
        registry.clear_cache()


def test_auto_picks_numpy_over_llvmpipe(gpu):
    registry.clear_cache()
    try:
        if gpu.info.get("adapter_type") == "CPU":
            speeds = registry.compare_gflops([compute.get_backend(b) for b in ("numpy", "wgpu")])
            assert compute.get_backend("auto").name == "numpy", (speeds, compute.available_backends())
        assert {s.name for s in compute.available_backends() if s.validated} >= {"numpy", "wgpu"}
    finally:
        registry.clear_cache()


# ------------------------------------------------------------------ custom kernels

SAXPY = """
struct Params { alpha: f32, count: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read_write> hits: array<atomic<u32>>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < params.count) {
        y[i] = params.alpha * x[i] + y[i];
        atomicAdd(&hits[0], 1u);
    }
}
"""


def params(alpha: float, count: int) -> np.ndarray:
    return np.array([np.float32(alpha).view(np.uint32), count], np.uint32)


def test_custom_kernel_runs(gpu):
    x = np.arange(100, dtype=np.float32)
    y = np.ones(100, np.float32)
    out = gpu.run_kernel(
        SAXPY,
        inputs={"x": x, "y": y, "params": params(2.0, 100)},
        outputs={"y": ((10, 10), np.float32), "hits": ((1,), np.uint32)},
        dispatch=(2, 1, 1),
    )
    assert set(out) == {"y", "hits"}
    np.testing.assert_array_equal(out["y"], (2 * x + 1).reshape(10, 10))
    assert out["hits"].tolist() == [100]
    # Outputs not given as inputs start zeroed, and nothing is shared between runs.
    again = gpu.run_kernel(SAXPY, inputs={"x": x, "y": y, "params": params(0.5, 10)},
                           outputs={"y": ((100,), np.float32), "hits": ((1,), np.uint32)},
                           dispatch=(1, 1, 1))
    assert again["hits"].tolist() == [10]
    np.testing.assert_array_equal(again["y"][:10], 0.5 * x[:10] + 1)
    np.testing.assert_array_equal(again["y"][10:], 1)


def test_custom_kernel_pipeline_is_cached(gpu):
    x = np.zeros(4, np.float32)
    run = dict(inputs={"x": x, "y": x, "params": params(1.0, 4)},
               outputs={"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, dispatch=(1, 1, 1))
    gpu.run_kernel(SAXPY, **run)
    cached = dict(gpu._kernels)
    gpu.run_kernel(SAXPY, **run)
    assert dict(gpu._kernels) == cached


@pytest.mark.parametrize(
    ("wgsl", "inputs", "outputs", "dispatch", "entry", "match"),
    [
        ("fn main( {", {}, {}, (1, 1, 1), "main", "wgpu refused"),
        (SAXPY, {"x": np.zeros(4, np.float32), "z": np.zeros(4, np.float32)},
         {"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, (1, 1, 1), "main", "unknown"),
        (SAXPY, {"x": np.zeros(4, np.float32)}, {"y": ((4,), np.float32)}, (1, 1, 1), "main",
         r"hits.*params.*need data"),
        (SAXPY, {"x": np.zeros(4, np.float64), "params": params(1, 4)},
         {"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, (1, 1, 1), "main", "dtype"),
        (SAXPY, {"x": np.zeros(4, np.int32), "params": params(1, 4)},
         {"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, (1, 1, 1), "main",
         "holds array<f32>"),
        (SAXPY, {"y": np.zeros(4, np.float32), "params": params(1, 4)},
         {"x": ((4,), np.float32), "hits": ((1,), np.uint32)}, (1, 1, 1), "main",
         "cannot be an output"),
        (SAXPY, {"x": np.zeros(4, np.float32), "y": np.zeros(5, np.float32),
                 "params": params(1, 4)},
         {"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, (1, 1, 1), "main",
         "read and written"),
        (SAXPY, {"x": np.zeros(4, np.float32), "params": params(1, 4)},
         {"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, (1 << 20, 1, 1), "main",
         "outside"),
        (SAXPY, {"x": np.zeros(4, np.float32), "params": params(1, 4)},
         {"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, (0, 1, 1), "main", "outside"),
        (SAXPY, {"x": np.zeros(4, np.float32), "params": params(1, 4)},
         {"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, (1, 1), "main", "three"),
        (SAXPY, {"x": np.zeros(4, np.float32), "params": params(1, 4)},
         {"y": ((4,), np.float32), "hits": ((1,), np.uint32)}, (1, 1, 1), "nope",
         "entry point"),
        (SAXPY.replace("var<storage, read_write> y", "var<storage, read> y"),
         {"x": np.zeros(4, np.float32), "y": np.zeros(4, np.float32), "params": params(1, 4)},
         {"hits": ((1,), np.uint32)}, (1, 1, 1), "main", "wgpu refused"),
        ("@group(1) @binding(0) var<storage, read> x: array<f32>;", {}, {}, (1, 1, 1), "main",
         "group"),
        ("@group(0) @binding(0) var t: texture_2d<f32>;", {}, {}, (1, 1, 1), "main",
         "other than storage"),
        ("", {}, {}, (1, 1, 1), "main", "non-empty"),
    ],
    ids=["bad-wgsl", "unknown-buffer", "missing-buffer", "f64", "wrong-dtype",
         "output-read-only", "inout-size", "dispatch-too-big", "dispatch-zero",
         "dispatch-2d", "no-entry-point", "write-to-read-only", "group-1", "texture",
         "empty"],
)
def test_custom_kernel_refusals(gpu, wgsl, inputs, outputs, dispatch, entry, match):
    with pytest.raises(KernelError, match=match):
        gpu.run_kernel(wgsl, inputs=inputs, outputs=outputs, dispatch=dispatch,
                       entry_point=entry)


def test_custom_kernel_size_limits(gpu, monkeypatch):
    monkeypatch.setattr(wb, "MAX_KERNEL_BUFFER_BYTES", 1024)
    big = np.zeros(257, np.float32)
    with pytest.raises(KernelError, match="limit"):
        gpu.run_kernel(SAXPY, inputs={"x": big, "params": params(1, 4)},
                       outputs={"y": ((4,), np.float32), "hits": ((1,), np.uint32)},
                       dispatch=(1, 1, 1))
    with pytest.raises(KernelError, match="limit"):
        gpu.run_kernel(SAXPY, inputs={"x": np.zeros(4, np.float32), "params": params(1, 4)},
                       outputs={"y": ((257,), np.float32), "hits": ((1,), np.uint32)},
                       dispatch=(1, 1, 1))
    with pytest.raises(KernelError, match="source"):
        gpu.run_kernel(" " * (wb.MAX_WGSL_CHARS + 1), inputs={}, outputs={}, dispatch=(1, 1, 1))


def test_numpy_backend_cannot_run_kernels():
    with pytest.raises(KernelError, match="wgpu"):
        compute.get_backend("numpy").run_kernel(SAXPY, inputs={}, outputs={},
                                                dispatch=(1, 1, 1))
