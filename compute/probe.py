"""Capability probe: what this machine offers, before anything is measured."""

from __future__ import annotations

import os
import platform
from typing import Any

import numpy as np

# Device limits worth reporting (the ones the matmul and custom-kernel paths depend on).
LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroups-per-dimension",
    "max-storage-buffers-per-shader-stage",
)


def host_info() -> dict[str, Any]:
    import psutil

    return {
        "cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def adapters() -> tuple[list[dict[str, Any]], str | None]:
    """Every adapter wgpu can see, with limits and f16 support; or the reason it cannot."""
    try:
        import wgpu

        found = wgpu.gpu.enumerate_adapters_sync()
    except Exception as exc:  # no package, no native library, no driver
        return [], f"wgpu unavailable: {exc}"
    out = []
    for adapter in found:
        info = adapter.info
        out.append({
            "name": info.get("device", ""),
            "type": info.get("adapter_type", ""),
            "api": info.get("backend_type", ""),
            "vendor": info.get("vendor", ""),
            "description": info.get("description", ""),
            "shader_f16": "shader-f16" in adapter.features,
            "limits": {k: int(adapter.limits[k]) for k in LIMITS if k in adapter.limits},
        })
    return out, None if out else "wgpu found no adapter"


def probe(gpu: bool = True) -> dict[str, Any]:
    """Host cores and memory, and each wgpu adapter (name, type, API, limits, shader-f16);
    ``gpu=False`` leaves wgpu unloaded (a numpy-only run)."""
    found, reason = adapters() if gpu else ([], "not probed (numpy only)")
    result: dict[str, Any] = {"host": host_info(), "adapters": found}
    if reason:
        result["adapters_reason"] = reason
    return result
