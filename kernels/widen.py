"""Loads that widen stored weights into float32 vectors (tblock.formats' bf16, Q8_0, Q4_0).

Each returns a vector of the path's float32 width (simd.lanes of a float32 array: 16 on
avx512, 8 on avx2, 4 on generic) read from a byte (or uint16) array at a flat element
index: the bytes are read once, whole, and widened in registers.

    bf16_load(W16, i)       the float32s whose top halves are W16[i : i + L]
    i8_load(Wq, i)          Wq[i : i + L] as signed bytes (Wq: an int8 array)
    nibble_load(W8, i, hi)  the low (hi = False) or high nibbles of W8[i : i + L], minus 8
    bf16_scalar(h)          the float32 of one bf16 h
    half_load(W, i)         the float16 W[i] | W[i + 1] << 8 as a float32 (a block scale;
                            W: int8 or uint8)

Q8_0 data is passed as an int8 array and Q4_0 data as a uint8 array, so that the format
is the array's type and a caller compiles only the format it is given.

As in simd.py, there are no bounds checks: the caller keeps i inside the array.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from .isa import PATH
from .simd import VECTOR_BYTES, Vec, elem_ptr, ir_splat

F32_LANES = VECTOR_BYTES // 4
_F32 = Vec(types.float32, F32_LANES)


def _bytes_ptr(context, builder, sig, args, width):
    """A pointer to <F32_LANES x iN> at element args[1] of the array args[0]."""
    p = elem_ptr(context, builder, sig.args[0], args[0], args[1])
    return builder.bitcast(p, ir.VectorType(ir.IntType(width), F32_LANES).as_pointer())


def _is_int_array(a, dtype):
    return isinstance(a, types.Array) and a.dtype == dtype


@intrinsic
def bf16_load(typingctx, W16, i):
    if not _is_int_array(W16, types.uint16) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = builder.load(_bytes_ptr(context, builder, sig, args, 16), align=2)
        i32 = ir.VectorType(ir.IntType(32), F32_LANES)
        wide = builder.shl(builder.zext(v, i32), ir_splat(builder, ir.Constant(ir.IntType(32), 16), i32))
        return builder.bitcast(wide, ir.VectorType(ir.FloatType(), F32_LANES))
    return _F32(W16, types.intp), codegen


@intrinsic
def i8_load(typingctx, Wq, i):
    if not _is_int_array(Wq, types.int8) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = builder.load(_bytes_ptr(context, builder, sig, args, 8), align=1)
        return builder.sitofp(v, ir.VectorType(ir.FloatType(), F32_LANES))
    return _F32(Wq, types.intp), codegen


@intrinsic
def nibble_load(typingctx, W8, i, hi):
    if not _is_int_array(W8, types.uint8) or not isinstance(i, types.Integer) or not isinstance(hi, types.Boolean):
        return None

    def codegen(context, builder, sig, args):
        v = builder.load(_bytes_ptr(context, builder, sig, args, 8), align=1)
        i8 = v.type
        shifted = builder.select(args[2], builder.lshr(v, ir_splat(builder, ir.Constant(ir.IntType(8), 4), i8)), v)
        q = builder.and_(shifted, ir_splat(builder, ir.Constant(ir.IntType(8), 15), i8))
        f = builder.uitofp(q, ir.VectorType(ir.FloatType(), F32_LANES))
        return builder.fsub(f, ir_splat(builder, ir.Constant(ir.FloatType(), 8.0), f.type))
    return _F32(W8, types.intp, types.boolean), codegen


@intrinsic
def half_load(typingctx, W, i):
    """The float16 stored little-endian at W[i], W[i + 1] (a byte array), as a float32.

    Exact for every finite half: with the F16C instruction where the target has it,
    else (the generic path) by integer arithmetic: the half's exponent and mantissa bits, moved to a float32's places, are that
    float32 times 2^-112 (a subnormal half lands on a float32 subnormal, scaled alike),
    so one multiply by 2^112 and the sign bit finish it.  NaN/Inf scales never get here
    (tblock.formats refuses them)."""
    if not (_is_int_array(W, types.uint8) or _is_int_array(W, types.int8)) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        p = builder.bitcast(elem_ptr(context, builder, sig.args[0], args[0], args[1]), ir.IntType(16).as_pointer())
        return emit_half(builder, builder.load(p, align=1))
    return types.float32(W, types.intp), codegen


def emit_half(builder, h):
    """The float32 of the float16 bits h (an i16 value), as half_load computes it."""
    i32 = ir.IntType(32)
    if PATH.f16c:                       # one vcvtph2ps: the integer route below is 7 instructions
        return builder.fpext(builder.bitcast(h, ir.HalfType()), ir.FloatType())
    h = builder.zext(h, i32)
    body = builder.shl(builder.and_(h, ir.Constant(i32, 0x7FFF)), ir.Constant(i32, 13))
    mag = builder.fmul(builder.bitcast(body, ir.FloatType()), ir.Constant(ir.FloatType(), 2.0 ** 112))
    sign = builder.shl(builder.and_(h, ir.Constant(i32, 0x8000)), ir.Constant(i32, 16))
    return builder.bitcast(builder.or_(builder.bitcast(mag, i32), sign), ir.FloatType())


@intrinsic
def bf16_scalar(typingctx, h):
    """The float32 whose top half is the bf16 bits h (a uint16)."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = builder.shl(builder.zext(builder.trunc(args[0], ir.IntType(16)), i32), ir.Constant(i32, 16))
        return builder.bitcast(bits, ir.FloatType())
    return types.float32(h), codegen
