"""The WebGPU backend: tiled WGSL matmul and caller-supplied WGSL kernels on wgpu.

One device per process (:meth:`WgpuBackend.shared`). Pipelines are compiled once and cached;
matmul buffers are pooled and reused; several products (shards) go to the device in one
submission. A caller's kernel is bound by buffer name and validated by wgpu/naga before it
runs, which is how work runs on a remote peer without any Python code travelling.

Use one device per process (``shared()``): with two, wgpu-native's GL backend (llvmpipe)
was seen to abort when one device's poll thread ran while the other submitted work.

Known limit: WGSL has no way to bound a kernel's run time. A kernel that loops forever
blocks its caller (real GPUs reset it after the driver's watchdog; llvmpipe does not), so a
runtime that accepts kernels from other peers should run them in a process it can kill.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compute.backend import (
    Backend,
    BackendUnavailable,
    check_operands,
    check_precision,
    check_result,
    validation_inputs,
)
from compute.errors import ComputeError, InvalidInput, KernelError
from compute.kernels import DEFAULT_TILES, LARGE_TILES, TileConfig, source, tiled_source
from compute.wgsl import parse_bindings

log = logging.getLogger("compute.wgpu")

KERNELS = ("tiled", "naive")
MAX_WGSL_CHARS = 256 * 1024  # a custom kernel's source
MAX_KERNEL_BUFFER_BYTES = 256 * 1024 * 1024  # one custom-kernel buffer (device limit may be lower)
MAX_KERNEL_TOTAL_BYTES = 1024 * 1024 * 1024  # all buffers of one custom-kernel run
MAX_CACHED_KERNELS = 32  # compiled custom kernels kept (least recently used dropped)
BATCH_BYTES = 1024 * 1024 * 1024  # device memory one matmul submission may use


def _wgpu():
    try:
        import wgpu
    except Exception as exc:  # not installed, or its native library fails to load
        raise BackendUnavailable(f"wgpu: cannot load the wgpu package: {exc!r}") from exc
    return wgpu


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


@dataclass
class _Job:
    """One dispatch of a matmul submission: a block of one product."""

    out: int  # index of the product in the batch
    rows: tuple[int, int]
    cols: tuple[int, int]
    a: np.ndarray  # padded, device dtype
    b: np.ndarray
    b_key: tuple[int, int, int]  # (id of the caller's b, col range): uploads shared per call
    n_pad: int


class WgpuBackend(Backend):
    """Matmul and custom WGSL kernels on the first wgpu adapter (prefers a discrete GPU)."""

    name = "wgpu"
    _shared: WgpuBackend | None = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls) -> WgpuBackend:
        """The process's one wgpu backend (creating a device costs ~0.5 s)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def __init__(self, *, power_preference: str = "high-performance",
                 tiles: TileConfig | None = None) -> None:
        wgpu = _wgpu()
        self._wgpu = wgpu
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)
        except Exception as exc:
            raise BackendUnavailable(f"wgpu: no adapter: {exc}") from exc
        if adapter is None:
            raise BackendUnavailable("wgpu: no adapter found")
        self.adapter = adapter
        self.info = dict(adapter.info)
        alimits = adapter.limits
        wanted = ("max-buffer-size", "max-storage-buffer-binding-size",
                  "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                  "max-compute-workgroup-size-x", "max-compute-workgroup-size-y",
                  "max-storage-buffers-per-shader-stage")
        self.f16_available = "shader-f16" in adapter.features
        features = ["shader-f16"] if self.f16_available else []
        try:
            self.device = adapter.request_device_sync(
                required_features=features,
                required_limits={k: alimits[k] for k in wanted if k in alimits},
            )
        except Exception as exc:
            raise BackendUnavailable(f"wgpu: cannot open a device: {exc}") from exc
        self.limits = dict(self.device.limits)
        self.f16_reason = None if self.f16_available else "adapter lacks shader-f16"
        if tiles is None:  # the larger register tiles won on llvmpipe too (bench/compute.py)
            tiles = LARGE_TILES if self._fits(LARGE_TILES) else DEFAULT_TILES
        if not self._fits(tiles):
            raise BackendUnavailable(f"wgpu: tile config {tiles} exceeds the device limits")
        self.tiles = tiles
        self._lock = threading.RLock()
        self._pipelines: dict[Any, Any] = {}
        self._kernels: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._pool: dict[tuple[str, int], Any] = {}
        self.max_binding = int(self.limits["max-storage-buffer-binding-size"])
        self.max_groups = int(self.limits["max-compute-workgroups-per-dimension"])

    def _fits(self, t: TileConfig) -> bool:
        lim = self.adapter.limits
        return (t.workgroup_bytes <= lim["max-compute-workgroup-storage-size"]
                and t.invocations <= lim["max-compute-invocations-per-workgroup"]
                and t.wg_x <= lim["max-compute-workgroup-size-x"]
                and t.wg_y <= lim["max-compute-workgroup-size-y"])

    # ----------------------------------------------------------------- description

    def adapter_info(self) -> dict[str, Any]:
        return {
            "name": self.info.get("device", ""),
            "type": self.info.get("adapter_type", ""),
            "api": self.info.get("backend_type", ""),
            "vendor": self.info.get("vendor", ""),
            "description": self.info.get("description", ""),
            "shader_f16": self.f16_available,
            "tiles": f"{self.tiles.block_m}x{4 * self.tiles.block_n4}"
                     f" ({self.tiles.rm}x{4 * self.tiles.vn} per thread, k step {self.tiles.tk})",
        }

    # ----------------------------------------------------------------- pipelines, buffers

    def _matmul_pipeline(self, kernel: str, f16: bool, tiles: TileConfig | None = None):
        tiles = tiles or self.tiles
        key = (kernel, f16, tiles)
        pipeline = self._pipelines.get(key)
        if pipeline is None:
            code = tiled_source(tiles, f16=f16) if kernel == "tiled" else source("matmul_naive")
            module = self.device.create_shader_module(label=f"matmul_{kernel}", code=code)
            pipeline = self.device.create_compute_pipeline(
                label=f"matmul_{kernel}", layout="auto",
                compute={"module": module, "entry_point": "main"},
            )
            self._pipelines[key] = pipeline
        return pipeline

    def _buffer(self, slot: tuple[str, int], nbytes: int, usage: int):
        """A pooled buffer of at least ``nbytes`` for ``slot`` (grown, never shrunk)."""
        buf = self._pool.get(slot)
        if buf is None or buf.size < nbytes or buf.usage != usage:
            if buf is not None:
                buf.destroy()
            size = max(256, _round_up(nbytes * 5 // 4, 256))  # headroom: fewer regrowths
            size = min(size, max(_round_up(nbytes, 4), int(self.limits["max-buffer-size"])))
            buf = self.device.create_buffer(size=size, usage=usage, label=f"{slot[0]}{slot[1]}")
            self._pool[slot] = buf
        return buf

    def release_buffers(self) -> None:
        """Free every pooled buffer (they are recreated on demand)."""
        with self._lock:
            for buf in self._pool.values():
                buf.destroy()
            self._pool.clear()

    # ----------------------------------------------------------------- matmul

    def matmul(self, a: np.ndarray, b: np.ndarray, precision: str = "f32", *,
               kernel: str = "tiled") -> np.ndarray:
        return self.matmul_many([(a, b)], precision, kernel=kernel)[0]

    def matmul_many(self, pairs: Sequence[tuple[np.ndarray, np.ndarray]],
                    precision: str = "f32", *, kernel: str = "tiled") -> list[np.ndarray]:
        """Multiply every pair; all of them go to the device in one submission (or a few,
        when they would use more than BATCH_BYTES of device memory)."""
        check_precision(precision)
        if kernel not in KERNELS:
            raise InvalidInput(f"kernel must be one of {KERNELS}, got {kernel!r}")
        f16 = precision == "f16"
        if f16 and not self.f16_available:
            raise ComputeError(f"wgpu cannot compute in f16 here: {self.f16_reason}")
        if f16 and kernel != "tiled":
            raise InvalidInput("f16 is computed by the tiled kernel only")
        checked = [check_operands(a, b) for a, b in pairs]
        results = [np.zeros((a.shape[0], b.shape[1]), np.float32) for a, b in checked]
        jobs = [job for i, (a, b) in enumerate(checked) if a.size and b.size
                for job in self._jobs(i, a, b, kernel, f16)]
        with self._lock:
            batch: list[_Job] = []
            used = 0
            for job in jobs:
                need = job.a.nbytes + job.b.nbytes + 2 * (job.rows[1] - job.rows[0]) * job.n_pad * 4
                if batch and used + need > BATCH_BYTES:
                    self._run_jobs(batch, results, kernel, f16)
                    batch, used = [], 0
                batch.append(job)
                used += need
            if batch:
                self._run_jobs(batch, results, kernel, f16)
        return results

    def _jobs(self, out: int, a: np.ndarray, b: np.ndarray, kernel: str, f16: bool) -> list[_Job]:
        """Split one product into dispatches whose buffers and grids fit the device."""
        m, k = a.shape
        n = b.shape[1]
        quad = 1 if kernel == "naive" else 4
        k_pad, n_pad = _round_up(k, quad), _round_up(n, quad)
        elt = 2 if f16 else 4
        block_m = self.tiles.block_m if kernel == "tiled" else 16
        block_n = 4 * self.tiles.block_n4 if kernel == "tiled" else 16
        col_step = n_pad
        while k_pad * col_step * elt > self.max_binding or -(-col_step // block_n) > self.max_groups:
            col_step = max(quad, _round_up(col_step // 2, quad))
            if col_step <= quad and k_pad * col_step * elt > self.max_binding:
                raise InvalidInput(f"K = {k} is too long for this device's buffers")
        row_bytes = max(k_pad * elt, col_step * 4)
        row_step = max(1, min(m, self.max_binding // row_bytes, self.max_groups * block_m))
        dtype = np.float16 if f16 else np.float32
        jobs = []
        for c0 in range(0, n, col_step):
            c1 = min(n, c0 + col_step)
            width = _round_up(c1 - c0, quad)
            bp = np.zeros((k_pad, width), dtype)
            bp[:k, : c1 - c0] = b[:, c0:c1]
            for r0 in range(0, m, row_step):
                r1 = min(m, r0 + row_step)
                if k_pad == k and a.dtype == dtype:
                    ap = a[r0:r1]
                else:
                    ap = np.zeros((r1 - r0, k_pad), dtype)
                    ap[:, :k] = a[r0:r1]
                jobs.append(_Job(out, (r0, r1), (c0, c1), ap, bp, (id(b), c0, c1), width))
        return jobs

    def _run_jobs(self, jobs: list[_Job], results: list[np.ndarray], kernel: str,
                  f16: bool) -> None:
        wgpu = self._wgpu
        usage_in = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
        usage_out = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        usage_uniform = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
        usage_read = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        try:
            pipeline = self._matmul_pipeline(kernel, f16)
            layout = pipeline.get_bind_group_layout(0)
            queue = self.device.queue
            encoder = self.device.create_command_encoder(label="matmul")
            uploaded_b: dict[tuple[int, int, int], Any] = {}
            staging = []
            for i, job in enumerate(jobs):
                rows = job.rows[1] - job.rows[0]
                a_buf = self._buffer(("a", i), job.a.nbytes, usage_in)
                queue.write_buffer(a_buf, 0, job.a)
                b_buf = uploaded_b.get(job.b_key)
                if b_buf is None:
                    b_buf = self._buffer(("b", i), job.b.nbytes, usage_in)
                    queue.write_buffer(b_buf, 0, job.b)
                    uploaded_b[job.b_key] = b_buf
                c_bytes = rows * job.n_pad * 4
                c_buf = self._buffer(("c", i), c_bytes, usage_out)
                read_buf = self._buffer(("read", i), c_bytes, usage_read)
                k_pad = job.a.shape[1]
                if kernel == "tiled":
                    dims = np.array([rows, k_pad // 4, job.n_pad // 4, 0], np.uint32)
                    groups = (-(-(job.n_pad // 4) // self.tiles.block_n4),
                              -(-rows // self.tiles.block_m), 1)
                else:
                    dims = np.array([rows, k_pad, job.n_pad, 0], np.uint32)
                    groups = (-(-job.n_pad // 16), -(-rows // 16), 1)
                u_buf = self._buffer(("dims", i), dims.nbytes, usage_uniform)
                queue.write_buffer(u_buf, 0, dims)
                bind = self.device.create_bind_group(layout=layout, entries=[
                    {"binding": 0, "resource": {"buffer": a_buf, "offset": 0, "size": job.a.nbytes}},
                    {"binding": 1, "resource": {"buffer": b_buf, "offset": 0, "size": job.b.nbytes}},
                    {"binding": 2, "resource": {"buffer": c_buf, "offset": 0, "size": c_bytes}},
                    {"binding": 3, "resource": {"buffer": u_buf, "offset": 0, "size": dims.nbytes}},
                ])
                cpass = encoder.begin_compute_pass()
                cpass.set_pipeline(pipeline)
                cpass.set_bind_group(0, bind)
                cpass.dispatch_workgroups(*groups)
                cpass.end()
                encoder.copy_buffer_to_buffer(c_buf, 0, read_buf, 0, c_bytes)
                staging.append((job, read_buf, c_bytes, rows))
            queue.submit([encoder.finish()])
            for job, read_buf, c_bytes, rows in staging:
                read_buf.map_sync(wgpu.MapMode.READ, 0, c_bytes)
                try:
                    data = np.frombuffer(read_buf.read_mapped(0, c_bytes, copy=False), np.float32)
                    block = data.reshape(rows, job.n_pad)[:, : job.cols[1] - job.cols[0]]
                    results[job.out][job.rows[0]:job.rows[1], job.cols[0]:job.cols[1]] = block
                finally:
                    read_buf.unmap()
        except wgpu.GPUError as exc:
            raise ComputeError(f"wgpu matmul failed: {exc}") from exc

    def kernel_seconds(self, m: int, k: int, n: int, *, kernel: str = "tiled",
                       repeats: int = 5, tiles: TileConfig | None = None) -> float:
        """Device time per product for ``kernel``: inputs uploaded once, ``repeats``
        dispatches in one submission, no read-back. What the naive-vs-tiled figure uses;
        ``tiles`` tries another tile shape on the same device (bench/gpu_matmul.py)."""
        import time

        wgpu = self._wgpu
        tiles = tiles or self.tiles
        if not self._fits(tiles):
            raise ComputeError(f"tile config {tiles} exceeds this device's limits")
        rng = np.random.default_rng(0)
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        job = self._jobs(0, a, b, kernel, False)[0]
        if job.a.nbytes > self.max_binding or job.b.nbytes > self.max_binding:
            raise ComputeError(f"a {m}x{k}x{n} product needs bindings above this device's "
                               f"{self.max_binding} bytes")
        with self._lock:
            pipeline = self._matmul_pipeline(kernel, False, tiles)
            usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
            a_buf = self.device.create_buffer_with_data(data=job.a, usage=usage)
            b_buf = self.device.create_buffer_with_data(data=job.b, usage=usage)
            c_buf = self.device.create_buffer(size=m * job.n_pad * 4,
                                              usage=usage | wgpu.BufferUsage.COPY_SRC)
            # Mapping a word copied after the dispatches waits for them (wgpu-py 0.32's
            # on_submitted_work_done fails with a cffi signature mismatch).
            fence = self.device.create_buffer(
                size=4, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            if kernel == "tiled":
                dims = np.array([m, job.a.shape[1] // 4, job.n_pad // 4, 0], np.uint32)
                groups = (-(-(job.n_pad // 4) // tiles.block_n4), -(-m // tiles.block_m), 1)
            else:
                dims = np.array([m, k, n, 0], np.uint32)
                groups = (-(-n // 16), -(-m // 16), 1)
            u_buf = self.device.create_buffer_with_data(data=dims, usage=wgpu.BufferUsage.UNIFORM)
            bind = self.device.create_bind_group(
                layout=pipeline.get_bind_group_layout(0),
                entries=[{"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                         for i, buf in enumerate((a_buf, b_buf, c_buf, u_buf))])

            def submit(count: int) -> None:
                encoder = self.device.create_command_encoder()
                for _ in range(count):
                    cpass = encoder.begin_compute_pass()
                    cpass.set_pipeline(pipeline)
                    cpass.set_bind_group(0, bind)
                    cpass.dispatch_workgroups(*groups)
                    cpass.end()
                encoder.copy_buffer_to_buffer(c_buf, 0, fence, 0, 4)
                self.device.queue.submit([encoder.finish()])
                fence.map_sync(wgpu.MapMode.READ)
                fence.unmap()

            try:
                submit(1)  # warm-up: pipeline and buffers resident
                t0 = time.perf_counter()
                submit(repeats)
                return (time.perf_counter() - t0) / repeats
            finally:
                for buf in (a_buf, b_buf, c_buf, u_buf, fence):
                    buf.destroy()

    # ----------------------------------------------------------------- validation

    def validate(self) -> None:
        super().validate()
        if self.f16_available:
            try:
                for a, b in validation_inputs()[:3]:
                    check_result(a, b, self.matmul(a, b, "f16"), "f16")
            except Exception as exc:  # f16 is optional: refuse it, keep f32
                self.f16_available = False
                self.f16_reason = f"f16 failed validation: {exc}"
                log.warning("wgpu f16 disabled: %s", exc)

    # ----------------------------------------------------------------- custom kernels

    def run_kernel(
        self,
        wgsl: str,
        *,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, tuple[tuple[int, ...], Any]],
        dispatch: tuple[int, int, int],
        entry_point: str = "main",
    ) -> dict[str, np.ndarray]:
        """Run a WGSL compute kernel with buffers bound by their WGSL names.

        ``inputs`` fill buffers before the run; ``outputs`` name writable buffers to read
        back, with their shape and dtype (a name in both is read, then written). Output
        buffers not in ``inputs`` start zeroed; buffers are never shared between runs.
        Everything is checked, and the WGSL validated by wgpu/naga, before anything runs:
        :class:`KernelError` says what was refused.
        """
        wgpu = self._wgpu
        if not isinstance(wgsl, str) or not wgsl.strip():
            raise KernelError("the kernel source must be non-empty WGSL text")
        if len(wgsl) > MAX_WGSL_CHARS:
            raise KernelError(f"kernel source is {len(wgsl)} chars; the limit is {MAX_WGSL_CHARS}")
        groups = self._check_dispatch(dispatch)
        bindings = parse_bindings(wgsl)
        unknown = sorted((set(inputs) | set(outputs)) - set(bindings))
        if unknown:
            raise KernelError(f"unknown buffer(s) {unknown}; the kernel declares "
                              f"{sorted(bindings) or 'none'}")
        missing = sorted(set(bindings) - set(inputs) - set(outputs))
        if missing:
            raise KernelError(f"kernel buffer(s) {missing} need data: pass them in inputs or "
                              "outputs")
        arrays = {name: self._kernel_input(bindings[name], value) for name, value in inputs.items()}
        out_specs = {}
        for name, spec in outputs.items():
            out_specs[name] = self._kernel_output(bindings[name], spec)
            if name in arrays and arrays[name].nbytes != out_specs[name][2]:
                raise KernelError(f"{name!r} is read and written but its input has "
                                  f"{arrays[name].nbytes} bytes and its output {out_specs[name][2]}")
        sizes = {name: arrays[name].nbytes if name in arrays else out_specs[name][2]
                 for name in bindings}
        if sum(sizes.values()) > MAX_KERNEL_TOTAL_BYTES:
            raise KernelError(f"kernel buffers total {sum(sizes.values())} bytes; the limit is "
                              f"{MAX_KERNEL_TOTAL_BYTES}")

        with self._lock:
            try:
                pipeline = self._kernel_pipeline(wgsl, entry_point, bindings)
            except wgpu.GPUError as exc:
                raise KernelError(f"wgpu refused the kernel: {exc}") from exc
            created = []
            try:
                entries, staging = [], {}
                encoder = self.device.create_command_encoder(label="kernel")
                for name, bnd in bindings.items():
                    size = _round_up(max(sizes[name], 4), 4)
                    usage = (wgpu.BufferUsage.UNIFORM if bnd.space == "uniform"
                             else wgpu.BufferUsage.STORAGE) | wgpu.BufferUsage.COPY_DST
                    if name in out_specs:
                        usage |= wgpu.BufferUsage.COPY_SRC
                    buf = self.device.create_buffer(size=size, usage=usage, label=name)
                    created.append(buf)
                    if name in arrays and arrays[name].nbytes:
                        self.device.queue.write_buffer(buf, 0, _pad4(arrays[name]))
                    entries.append({"binding": bnd.binding,
                                    "resource": {"buffer": buf, "offset": 0, "size": size}})
                    if name in out_specs:
                        read = self.device.create_buffer(
                            size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
                        created.append(read)
                        staging[name] = (buf, read, size)
                bind = self.device.create_bind_group(
                    layout=pipeline.get_bind_group_layout(0), entries=entries)
                cpass = encoder.begin_compute_pass()
                cpass.set_pipeline(pipeline)
                cpass.set_bind_group(0, bind)
                cpass.dispatch_workgroups(*groups)
                cpass.end()
                for buf, read, size in staging.values():
                    encoder.copy_buffer_to_buffer(buf, 0, read, 0, size)
                self.device.queue.submit([encoder.finish()])
                result = {}
                for name, (_, read, size) in staging.items():
                    shape, dtype, nbytes = out_specs[name]
                    read.map_sync(wgpu.MapMode.READ, 0, size)
                    try:
                        raw = np.frombuffer(read.read_mapped(0, size), np.uint8)[:nbytes]
                        result[name] = raw.view(dtype).reshape(shape).copy()
                    finally:
                        read.unmap()
                return result
            except wgpu.GPUError as exc:
                raise KernelError(f"wgpu refused to run the kernel: {exc}") from exc
            finally:
                for buf in created:
                    buf.destroy()

    def _check_dispatch(self, dispatch: Any) -> tuple[int, int, int]:
        try:
            groups = tuple(int(x) for x in dispatch)
            ok = len(groups) == 3 and all(int(x) == x for x in dispatch)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise KernelError(f"dispatch must be three workgroup counts, got {dispatch!r}")
        if not all(1 <= g <= self.max_groups for g in groups):
            raise KernelError(f"dispatch {groups} is outside 1..{self.max_groups} per dimension")
        return groups  # type: ignore[return-value]

    def _buffer_limit(self, space: str) -> int:
        if space == "uniform":
            return int(self.limits["max-uniform-buffer-binding-size"])
        return min(self.max_binding, MAX_KERNEL_BUFFER_BYTES)

    def _kernel_input(self, bnd, value: Any) -> np.ndarray:
        arr = np.asarray(value)
        if arr.dtype.kind not in "fiu" or arr.dtype.itemsize not in (2, 4):
            raise KernelError(f"{bnd.name!r}: dtype {arr.dtype} is not a 16/32-bit number type")
        if bnd.dtype is not None and arr.dtype != bnd.dtype:
            raise KernelError(f"{bnd.name!r} holds {bnd.type} but the input is {arr.dtype}")
        if arr.dtype == np.float16 and not self.f16_available:
            raise KernelError(f"{bnd.name!r}: f16 buffers need shader-f16 ({self.f16_reason})")
        if arr.nbytes > self._buffer_limit(bnd.space):
            raise KernelError(f"{bnd.name!r} has {arr.nbytes} bytes; the limit is "
                              f"{self._buffer_limit(bnd.space)}")
        return np.ascontiguousarray(arr)

    def _kernel_output(self, bnd, spec: Any) -> tuple[tuple[int, ...], np.dtype, int]:
        if not bnd.writable or bnd.space != "storage":
            raise KernelError(f"{bnd.name!r} is not a read_write storage buffer, so it cannot "
                              "be an output")
        try:
            shape_in, dtype_in = spec
            shape = tuple(int(d) for d in (shape_in if np.ndim(shape_in) else (shape_in,)))
            dtype = np.dtype(dtype_in)
        except (TypeError, ValueError) as exc:
            raise KernelError(f"output {bnd.name!r} needs (shape, dtype), got {spec!r}") from exc
        if any(d < 0 for d in shape) or dtype.kind not in "fiu" or dtype.itemsize not in (2, 4):
            raise KernelError(f"output {bnd.name!r}: bad shape {shape} or dtype {dtype}")
        if bnd.dtype is not None and dtype != bnd.dtype:
            raise KernelError(f"{bnd.name!r} holds {bnd.type} but the output asks for {dtype}")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self._buffer_limit(bnd.space):
            raise KernelError(f"output {bnd.name!r} has {nbytes} bytes; the limit is "
                              f"{self._buffer_limit(bnd.space)}")
        return shape, dtype, nbytes

    def _kernel_pipeline(self, wgsl: str, entry_point: str, bindings: dict) -> Any:
        key = (hashlib.sha256(wgsl.encode()).hexdigest(), entry_point)
        pipeline = self._kernels.get(key)
        if pipeline is not None:
            self._kernels.move_to_end(key)
            return pipeline
        wgpu = self._wgpu
        kinds = {"uniform": wgpu.BufferBindingType.uniform}
        layout = self.device.create_bind_group_layout(entries=[
            {"binding": b.binding, "visibility": wgpu.ShaderStage.COMPUTE,
             "buffer": {"type": kinds.get(b.space) or (
                 wgpu.BufferBindingType.storage if b.writable
                 else wgpu.BufferBindingType.read_only_storage)}}
            for b in bindings.values()])
        module = self.device.create_shader_module(label="kernel", code=wgsl)
        pipeline = self.device.create_compute_pipeline(
            label="kernel",
            layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": entry_point},
        )
        self._kernels[key] = pipeline
        if len(self._kernels) > MAX_CACHED_KERNELS:
            self._kernels.popitem(last=False)
        return pipeline


def _pad4(arr: np.ndarray) -> np.ndarray:
    """Bytes of ``arr``, zero-padded to a multiple of 4 (wgpu writes whole words)."""
    raw = arr.reshape(-1).view(np.uint8)
    if raw.size % 4:
        raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])
    return raw
