"""The WGSL binding reader: arbitrary (remote) source never crashes it, and the bindings it
reports are the ones declared."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute import KernelError
from compute.wgsl import parse_bindings

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
elements = st.sampled_from(["f32", "i32", "u32", "vec4<f32>", "vec2<u32>"])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_gives_bindings_or_kernel_error(text):
    try:
        found = parse_bindings(text)
    except KernelError:
        return
    assert all(b.group == 0 for b in found.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(names, elements, st.sampled_from(["read", "read_write", None]),
                          st.booleans()), min_size=1, max_size=8,
                unique_by=lambda t: t[0]))
def test_declared_bindings_are_found(decls):
    lines = []
    for i, (name, element, access, group_first) in enumerate(decls):
        attrs = f"@group(0) @binding({i})" if group_first else f"@binding({i})  @group( 0 )"
        mode = f"storage, {access}" if access else "storage"
        lines.append(f"{attrs}\nvar<{mode}> {name} : array<{element}>;")
    found = parse_bindings("// kernel\n" + "\n".join(lines) + "\n@compute fn main() {}")
    assert list(found) == [d[0] for d in decls]
    for i, (name, element, access, _) in enumerate(decls):
        b = found[name]
        assert b.binding == i and b.access == (access or "read")
        assert b.dtype == np.dtype({"f": np.float32, "i": np.int32, "u": np.uint32}[
            element.replace("vec4<", "").replace("vec2<", "")[0]])


def test_commented_out_declarations_are_ignored():
    src = """
    // @group(0) @binding(0) var<storage, read> old: array<f32>;
    /* @group(0) @binding(1) var<storage, read> older: array<f32>; */
    @group(0) @binding(2) var<storage, read_write> out: array<f32>;
    """
    assert list(parse_bindings(src)) == ["out"]


@pytest.mark.parametrize("src", [
    "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
    "@group(0) @binding(0) var<storage, read> y: array<f32>;",
    "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
    "@group(0) @binding(1) var<storage, read> x: array<f32>;",
    "@group(0) @binding(0) var<uniform, read_write> x: P;",
    "@group(0) @binding(0) var<workgroup> x: array<f32, 4>;",
    "@group(0) @binding(0) var s: sampler;",
])
def test_unsupported_declarations_are_refused(src):
    with pytest.raises(KernelError):
        parse_bindings(src)
