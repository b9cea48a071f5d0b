"""Reading a caller's WGSL just enough to bind its buffers by name.

wgpu/naga does the real validation (syntax, types, entry point, access modes); this module
only finds the module-scope ``var`` declarations with ``@group``/``@binding`` so buffers can
be matched to names, and refuses what the custom-kernel path does not support.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from compute.errors import KernelError

# `@group(0) @binding(1) var<storage, read_write> name: type;` (attributes in either order).
_ATTR = r"@\s*(group|binding)\s*\(\s*(\d+)\s*\)"
_DECL = re.compile(
    rf"{_ATTR}\s*{_ATTR}\s*var\s*<\s*(\w+)\s*(?:,\s*(\w+)\s*)?>\s*(\w+)\s*:\s*([^;]+);"
)
_ELEMENT = re.compile(r"^array\s*<\s*(?:vec([234])\s*<\s*)?(f32|i32|u32|f16)")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)

SCALARS = {"f32": np.dtype(np.float32), "i32": np.dtype(np.int32),
           "u32": np.dtype(np.uint32), "f16": np.dtype(np.float16)}


@dataclass(frozen=True)
class Binding:
    """One buffer a kernel declares."""

    group: int
    """``@group`` index (only 0 is supported)."""
    binding: int
    """``@binding`` index within the group."""
    space: str
    """Address space: ``storage`` or ``uniform``."""
    access: str
    """``read`` or ``read_write`` (uniforms are ``read``)."""
    name: str
    """The variable's name: the key callers use in ``inputs``/``outputs``."""
    type: str
    """The declared WGSL type, as written."""

    @property
    def dtype(self) -> np.dtype | None:
        """numpy dtype of the elements for ``array<scalar>``/``array<vecN<scalar>>``."""
        match = _ELEMENT.match(self.type.strip())
        return SCALARS[match.group(2)] if match else None

    @property
    def writable(self) -> bool:
        return self.access == "read_write"


def parse_bindings(wgsl: str) -> dict[str, Binding]:
    """The buffers ``wgsl`` declares, by name; KernelError for unsupported declarations."""
    text = _COMMENT.sub(" ", wgsl)
    found: dict[str, Binding] = {}
    slots: set[tuple[int, int]] = set()
    for match in _DECL.finditer(text):
        attrs = {match.group(1): int(match.group(2)), match.group(3): int(match.group(4))}
        if set(attrs) != {"group", "binding"}:
            raise KernelError(f"declaration of {match.group(7)!r} needs @group and @binding")
        space, access, name, type_ = match.group(5), match.group(6), match.group(7), match.group(8)
        if space not in ("storage", "uniform"):
            raise KernelError(f"{name!r}: only storage and uniform buffers can be bound")
        access = access or "read"
        if space == "uniform" and access != "read":
            raise KernelError(f"{name!r}: a uniform buffer is read-only")
        if attrs["group"] != 0:
            raise KernelError(f"{name!r} is in @group({attrs['group']}); only group 0 is bound")
        if name in found or (0, attrs["binding"]) in slots:
            raise KernelError(f"{name!r}: duplicate buffer name or binding")
        slots.add((0, attrs["binding"]))
        found[name] = Binding(0, attrs["binding"], space, access, name, type_.strip())
    # Any other bound resource (textures, samplers, a declaration this parser could not
    # read) would be left without a buffer: refuse instead of guessing.
    if len(re.findall(r"@\s*binding\s*\(", text)) != len(found):
        raise KernelError("the kernel binds resources other than storage/uniform buffers, "
                          "or declares them in a form this loader does not read")
    return found
