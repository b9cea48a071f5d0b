"""Sixteen-lane vectors for numba kernels: a value type and the few operations the GGUF block
decoders and dot products need (models.quant_kernels), each a numba ``intrinsic`` that emits
LLVM vector IR.

Why not plain loops: numba's LLVM pipeline runs only the loop vectorizer (SLP is off), which
vectorizes a loop over a long runtime dimension; a block of 32 weights is a loop with a
constant trip count, unrolled into scalar code before the vectorizer sees it, and a runtime
trip count per block paid ~20 instructions of checks per block. These vectors are values
(``<16 x float>``, ``<16 x i32>``) that LLVM keeps in registers: zmm with AVX-512, two ymm with
AVX2, NEON quads elsewhere; the lanes and the order of every sum are the same on all of them.

No fast-math anywhere: a multiply and an add stay two roundings unless :func:`fma` (IEEE fused
multiply-add, ``llvm.fma``: one rounding on every machine) is written; so results are the same
bits wherever IEEE float32 is (summation order: models.quant_kernels' docstring).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

LANES = 16


class Vec(types.Type):
    """A vector of :data:`LANES` float32 (``kind="f32"``) or int32 (``"i32"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(name=f"{kind}x{LANES}")


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        elem = ir.FloatType() if fe_type.kind == "f32" else ir.IntType(32)
        super().__init__(dmm, fe_type, ir.VectorType(elem, LANES))


F32 = Vec("f32")
I32 = Vec("i32")
_VF = ir.VectorType(ir.FloatType(), LANES)
_VI = ir.VectorType(ir.IntType(32), LANES)
_I32 = ir.IntType(32)


def _ptr(context, builder, aryty, ary, off):
    """Pointer to element ``off`` of a C-contiguous 1-D array (no bounds check: the
    kernels' callers check every size first)."""
    a = context.make_array(aryty)(context, builder, ary)
    return builder.gep(a.data, [off])


def _load(builder, ptr, vt, align):
    return builder.load(builder.bitcast(ptr, vt.as_pointer()), align=align)


def _i32(builder, value):
    """An integer argument as i32 (numba passes literals and indices as i64)."""
    if value.type.width > 32:
        return builder.trunc(value, _I32)
    if value.type.width < 32:
        return builder.zext(value, _I32)
    return value


def _splat(builder, scalar, vt):
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, LANES), None))


# -- loads and stores ------------------------------------------------------------------------

@intrinsic
def load_u8(typingctx, arr, off):
    """16 bytes of a uint8 array from ``off``, zero-extended to int32 lanes."""
    def codegen(context, builder, sig, args):
        v = _load(builder, _ptr(context, builder, sig.args[0], *args),
                  ir.VectorType(ir.IntType(8), LANES), 1)
        return builder.zext(v, _VI)
    return I32(arr, off), codegen


@intrinsic
def load_i8(typingctx, arr, off):
    """16 bytes of a uint8 array from ``off`` read as int8, sign-extended to int32 lanes."""
    def codegen(context, builder, sig, args):
        v = _load(builder, _ptr(context, builder, sig.args[0], *args),
                  ir.VectorType(ir.IntType(8), LANES), 1)
        return builder.sext(v, _VI)
    return I32(arr, off), codegen


@intrinsic
def load_f16(typingctx, arr, off):
    """16 IEEE half floats (32 bytes of a uint8 array from ``off``), widened exactly."""
    def codegen(context, builder, sig, args):
        v = _load(builder, _ptr(context, builder, sig.args[0], *args),
                  ir.VectorType(ir.HalfType(), LANES), 1)
        return builder.fpext(v, _VF)
    return F32(arr, off), codegen


@intrinsic
def load_bf16(typingctx, arr, off):
    """16 bfloat16 (32 bytes of a uint8 array from ``off``): each the top half of a float32."""
    def codegen(context, builder, sig, args):
        v = _load(builder, _ptr(context, builder, sig.args[0], *args),
                  ir.VectorType(ir.IntType(16), LANES), 1)
        v = builder.shl(builder.zext(v, _VI), _splat(builder, ir.Constant(_I32, 16), _VI))
        return builder.bitcast(v, _VF)
    return F32(arr, off), codegen


@intrinsic
def load_f32(typingctx, arr, off):
    """16 float32 of a float32 array from ``off``."""
    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], *args)
        if sig.args[0].dtype != types.float32:  # uint8 bytes holding float32 (an F32 tensor)
            ptr = builder.bitcast(ptr, ir.FloatType().as_pointer())
        return _load(builder, ptr, _VF, 1)
    return F32(arr, off), codegen


@intrinsic
def store_f32(typingctx, arr, off, v):
    """Write ``v`` to 16 float32 of a float32 array from ``off``."""
    def codegen(context, builder, sig, args):
        ptr = builder.bitcast(_ptr(context, builder, sig.args[0], args[0], args[1]),
                              _VF.as_pointer())
        builder.store(args[2], ptr, align=4)
        return context.get_dummy_value()
    return types.none(arr, off, v), codegen


@intrinsic
def load_half(typingctx, arr, off):
    """The IEEE half at byte ``off`` of a uint8 array, as float32 (one 16-bit load)."""
    def codegen(context, builder, sig, args):
        ptr = builder.bitcast(_ptr(context, builder, sig.args[0], *args),
                              ir.HalfType().as_pointer())
        return builder.fpext(builder.load(ptr, align=1), ir.FloatType())
    return types.float32(arr, off), codegen


@intrinsic
def load_u32(typingctx, arr, off):
    """The little-endian uint32 at byte ``off`` of a uint8 array (one 32-bit load)."""
    def codegen(context, builder, sig, args):
        ptr = builder.bitcast(_ptr(context, builder, sig.args[0], *args), _I32.as_pointer())
        return builder.zext(builder.load(ptr, align=1), ir.IntType(64))
    return types.uint64(arr, off), codegen


# -- integer lanes -----------------------------------------------------------------------------

def _int_op(op):
    @intrinsic
    def fn(typingctx, v, s):
        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], _splat(builder, _i32(builder, args[1]), _VI))
        return I32(v, s), codegen
    return fn


iand = _int_op("and_")
"""``v & s`` per lane (``s`` a scalar)."""
ishr = _int_op("lshr")
"""``v >> s`` per lane, logical (``s`` a scalar)."""
ishl = _int_op("shl")
"""``v << s`` per lane (``s`` a scalar)."""
isub = _int_op("sub")
"""``v - s`` per lane (``s`` a scalar)."""


@intrinsic
def ior(typingctx, a, b):
    """``a | b`` per lane."""
    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])
    return I32(a, b), codegen


@intrinsic
def bits_of(typingctx, word, first):
    """Lane ``l``: bit ``first + l`` of the 32-bit ``word`` (0 or 1)."""
    def codegen(context, builder, sig, args):
        w = _splat(builder, _i32(builder, args[0]), _VI)
        shifts = builder.add(_splat(builder, _i32(builder, args[1]), _VI),
                             ir.Constant(_VI, list(range(LANES))))
        return builder.and_(builder.lshr(w, shifts), _splat(builder, ir.Constant(_I32, 1), _VI))
    return I32(word, first), codegen


@intrinsic
def to_f32(typingctx, v):
    """Integer lanes as float32 (exact for |v| < 2**24)."""
    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _VF)
    return F32(v), codegen


# -- float lanes ---------------------------------------------------------------------------------

@intrinsic
def zeros(typingctx):
    """A float32 vector of +0.0."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_VF, None)
    return F32(), codegen


@intrinsic
def splat(typingctx, s):
    """A float32 scalar in every lane."""
    def codegen(context, builder, sig, args):
        return _splat(builder, args[0], _VF)
    return F32(types.float32), codegen


@intrinsic
def scale(typingctx, v, s):
    """``v * s`` per lane (one rounding; ``s`` a float32 scalar)."""
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], _splat(builder, args[1], _VF))
    return F32(v, types.float32), codegen


@intrinsic
def shift(typingctx, v, s):
    """``v + s`` per lane (one rounding; ``s`` a float32 scalar)."""
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], _splat(builder, args[1], _VF))
    return F32(v, types.float32), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` per lane with one rounding (IEEE fusedMultiplyAdd, on every machine)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), f"llvm.fma.v{LANES}f32")
        return builder.call(fn, args)
    return F32(a, b, c), codegen


@intrinsic
def add(typingctx, a, b):
    """``a + b`` per lane."""
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return F32(a, b), codegen


@intrinsic
def mul(typingctx, a, b):
    """``a * b`` per lane."""
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])
    return F32(a, b), codegen


@intrinsic
def total(typingctx, v):
    """The lanes' sum in a fixed tree: lane l + lane l+8, then l + l+4, l + l+2, l + l+1."""
    def codegen(context, builder, sig, args):
        v, n = args[0], LANES
        while n > 1:
            h = n // 2
            mask = ir.VectorType(_I32, h)
            lo = builder.shuffle_vector(v, v, ir.Constant(mask, list(range(h))))
            hi = builder.shuffle_vector(v, v, ir.Constant(mask, list(range(h, n))))
            v, n = builder.fadd(lo, hi), h
        return builder.extract_element(v, ir.Constant(_I32, 0))
    return types.float32(v), codegen
