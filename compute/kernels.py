"""The matmul kernels' WGSL (shipped in compute/kernels/*.wgsl) and their tile shapes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class TileConfig:
    """Tile shape of the tiled kernel; one compiled pipeline per distinct config."""

    wg_x: int = 16
    """Threads per workgroup along N."""
    wg_y: int = 16
    """Threads per workgroup along M."""
    rm: int = 4
    """Rows of C per thread (a multiple of 4)."""
    vn: int = 1
    """vec4 columns of C per thread (so 4 * vn columns)."""
    tk: int = 16
    """K per step through workgroup memory (a multiple of 4)."""

    @property
    def block_m(self) -> int:
        return self.wg_y * self.rm

    @property
    def block_n4(self) -> int:
        return self.wg_x * self.vn

    @property
    def workgroup_bytes(self) -> int:
        return 16 * self.tk * (self.block_m // 4 + self.block_n4)

    @property
    def invocations(self) -> int:
        return self.wg_x * self.wg_y

    def check(self) -> None:
        if self.rm % 4 or self.tk % 4 or min(self.wg_x, self.wg_y, self.rm, self.vn, self.tk) < 1:
            raise ValueError(f"bad tile config {self}: rm and tk must be positive multiples of 4")


# Small enough for every WebGPU device's default limits (16 KiB workgroup memory,
# 256 invocations): 64 x 64 blocks, 16 outputs per thread.
DEFAULT_TILES = TileConfig()
# Larger register tiles, used wherever the device allows: 128 x 128 blocks, 64 outputs per
# thread, 8 KiB of workgroup memory.
LARGE_TILES = TileConfig(wg_x=16, wg_y=16, rm=8, vn=2, tk=8)


@cache
def source(name: str) -> str:
    """The text of ``compute/kernels/<name>.wgsl``."""
    return resources.files("compute").joinpath("kernels", f"{name}.wgsl").read_text("utf-8")


def _set_const(text: str, name: str, value: int) -> str:
    new, count = re.subn(rf"(?m)^const {name}: u32 = \d+u;", f"const {name}: u32 = {value}u;", text)
    if count != 1:
        raise ValueError(f"kernel has no single `const {name}` line")
    return new


def tiled_source(config: TileConfig = DEFAULT_TILES, *, f16: bool = False) -> str:
    """The tiled kernel for ``config``; ``f16`` reads half-precision inputs (accumulates f32)."""
    config.check()
    text = source("matmul_tiled")
    for name, value in (("WG_X", config.wg_x), ("WG_Y", config.wg_y), ("RM", config.rm),
                        ("VN", config.vn), ("TK", config.tk)):
        text = _set_const(text, name, value)
    if f16:
        text = "enable f16;\n" + text.replace("alias IN = vec4<f32>;", "alias IN = vec4<f16>;")
    return text
