"""A tiny SIMD vocabulary for Numba kernels: a vector type of the path's width and a few
intrinsics.

Why this exists: the hot loops (GEMM micro-kernels, the flash-attention tiles, the
softmax exponentials, GELU) need register-blocked code with full-width vectors.
Numba's auto-vectoriser cannot give that: it never keeps a block of accumulators in
registers across the k loop (it cannot prove the output does not alias the inputs), and
on AVX-512 machines LLVM prefers 256-bit vectors for auto-vectorised loops.  Explicit
``<16 x float>`` / ``<8 x double>`` values are kept in registers by LLVM like any
scalar and compile to one instruction each on a target of that width.

Conventions
  * A vector holds ``isa.PATH.vector_bytes`` bytes (64 on avx512, 32 on avx2, 16 on
    generic): ``lanes(arr)`` elements of arr's dtype.  A *panel vector* holds the NV
    vectors of one micro-tile row as one LLVM vector (``panel_lanes``, ``pload``, ...):
    LLVM splits it into NV registers, so the GEMM is written once for every NV.
  * Memory is addressed as (C-contiguous array, flat element index).  No bounds
    checks and no negative-index wraparound: the caller guarantees the range is
    inside the array (that is what the ``_n`` variants with a lane count are for).
  * Floating-point ops carry no fast-math flags, except ``contract`` implied by
    the explicit fma; reductions use a fixed tree order, so results are
    deterministic and NaN/Inf propagate as IEEE says.
"""

from __future__ import annotations

import math

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

from .isa import PATH
from .tiles import NV

VECTOR_BYTES = PATH.vector_bytes
PANEL_VECTORS = NV               # vectors per micro-tile row
# a target without an FMA instruction (the x86-64 baseline of the generic path) gets a
# multiply and an add (llvm.fmuladd) instead of a libm call per lane
_FMA = "fma" if PATH.fma else "fmuladd"


class Vec(types.Type):
    """A SIMD register of ``lanes`` elements of ``dtype`` (a numba float type)."""

    def __init__(self, dtype, lanes):
        self.dtype = dtype
        self.lanes = lanes
        super().__init__(name=f"Vec({dtype}x{lanes})")


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        be_type = ir.VectorType(dmm.lookup(fe_type.dtype).get_value_type(), fe_type.lanes)
        super().__init__(dmm, fe_type, be_type)


def _vec_of(dtype):
    return Vec(dtype, VECTOR_BYTES // (dtype.bitwidth // 8))


def _panel_of(dtype):
    return Vec(dtype, PANEL_VECTORS * VECTOR_BYTES // (dtype.bitwidth // 8))


def _is_float_array(a):
    return isinstance(a, types.Array) and a.dtype in (types.float32, types.float64)


def _i32(v):
    return ir.Constant(ir.IntType(32), v)


def _vt(context, vty):
    return context.get_value_type(vty)


def elem_ptr(context, builder, arrty, arrval, idx):
    ary = context.make_array(arrty)(context, builder, arrval)
    return builder.gep(ary.data, [idx])


def _vec_ptr(context, builder, arrty, arrval, idx, vty):
    return builder.bitcast(elem_ptr(context, builder, arrty, arrval, idx), _vt(context, vty).as_pointer())


def ir_splat(builder, scalar, vtype):
    undef = ir.Constant(vtype, ir.Undefined)
    v = builder.insert_element(undef, scalar, _i32(0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(ir.IntType(32), vtype.count), [0] * vtype.count))


def _lane_mask(builder, n, count):
    """<count x i1>: lane j is on iff j < n (n is an intp)."""
    ity = ir.VectorType(ir.IntType(64), count)
    iota = ir.Constant(ity, list(range(count)))
    return builder.icmp_signed("<", iota, ir_splat(builder, n, ity))


def _masked(builder, name, fnty, args):
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    return builder.call(fn, args)


def _suffix(vtype):
    return f"v{vtype.count}f{32 if isinstance(vtype.element, ir.FloatType) else 64}"


# ----------------------------------------------------------------------------- memory


def _memory_ops(vec_of, prefix):
    """lanes, load, masked load, store, masked store, broadcast and splat for the vector
    type vec_of(dtype) gives: written once, made for the vector and the panel vector."""

    def lanes(typingctx, arr):
        """Number of lanes of the vector type that goes with ``arr``'s dtype (a constant)."""
        if not _is_float_array(arr):
            return None
        n = vec_of(arr.dtype).lanes

        def codegen(context, builder, sig, args):
            return context.get_constant(types.intp, n)
        return types.intp(arr), codegen

    def load(typingctx, arr, i):
        """The vector arr.flat[i : i + lanes]."""
        if not _is_float_array(arr) or not isinstance(i, types.Integer):
            return None
        vty = vec_of(arr.dtype)

        def codegen(context, builder, sig, args):
            p = _vec_ptr(context, builder, sig.args[0], args[0], args[1], vty)
            return builder.load(p, align=arr.dtype.bitwidth // 8)
        return vty(arr, types.intp), codegen

    def load_n(typingctx, arr, i, n):
        """arr.flat[i : i + n] in the first n lanes (n may exceed lanes or be <= 0), zeros
        after; memory beyond the first n elements is never touched."""
        if not _is_float_array(arr):
            return None
        vty = vec_of(arr.dtype)

        def codegen(context, builder, sig, args):
            vtype = _vt(context, vty)
            p = _vec_ptr(context, builder, sig.args[0], args[0], args[1], vty)
            mask = _lane_mask(builder, args[2], vty.lanes)
            fnty = ir.FunctionType(vtype, [p.type, ir.IntType(32), mask.type, vtype])
            return _masked(builder, f"llvm.masked.load.{_suffix(vtype)}.p0", fnty,
                           [p, _i32(arr.dtype.bitwidth // 8), mask, ir.Constant(vtype, [0.0] * vty.lanes)])
        return vty(arr, types.intp, types.intp), codegen

    def store(typingctx, arr, i, v):
        """arr.flat[i : i + lanes] = v."""
        if not _is_float_array(arr) or v != vec_of(arr.dtype):
            return None

        def codegen(context, builder, sig, args):
            p = _vec_ptr(context, builder, sig.args[0], args[0], args[1], v)
            builder.store(args[2], p, align=arr.dtype.bitwidth // 8)
            return context.get_dummy_value()
        return types.void(arr, types.intp, v), codegen

    def store_n(typingctx, arr, i, v, n):
        """arr.flat[i : i + n] = v[:n] for the first min(n, lanes) lanes; nothing else is
        written."""
        if not _is_float_array(arr) or v != vec_of(arr.dtype):
            return None

        def codegen(context, builder, sig, args):
            vtype = _vt(context, v)
            p = _vec_ptr(context, builder, sig.args[0], args[0], args[1], v)
            mask = _lane_mask(builder, args[3], v.lanes)
            fnty = ir.FunctionType(ir.VoidType(), [vtype, p.type, ir.IntType(32), mask.type])
            _masked(builder, f"llvm.masked.store.{_suffix(vtype)}.p0", fnty,
                    [args[2], p, _i32(arr.dtype.bitwidth // 8), mask])
            return context.get_dummy_value()
        return types.void(arr, types.intp, v, types.intp), codegen

    def bcast(typingctx, arr, i):
        """All lanes = arr.flat[i] (compiles to a broadcast load, often folded into the fma)."""
        if not _is_float_array(arr):
            return None
        vty = vec_of(arr.dtype)

        def codegen(context, builder, sig, args):
            x = builder.load(elem_ptr(context, builder, sig.args[0], args[0], args[1]))
            return ir_splat(builder, x, _vt(context, vty))
        return vty(arr, types.intp), codegen

    def splat(typingctx, like, x):
        """All lanes = x, converted to the dtype of ``like`` (an array or a vector)."""
        if _is_float_array(like):
            vty = vec_of(like.dtype)
        elif isinstance(like, Vec):
            vty = like
        else:
            return None
        if not isinstance(x, (types.Float, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            s = context.cast(builder, args[1], sig.args[1], vty.dtype)
            return ir_splat(builder, s, _vt(context, vty))
        return vty(like, x), codegen

    made = []
    for f in (lanes, load, load_n, store, store_n, bcast, splat):
        f.__name__ = f.__qualname__ = prefix + f.__name__
        made.append(intrinsic(f))
    return tuple(made)


# vectors of the path's width, for everything but the GEMM's accumulators
lanes, vload, vload_n, vstore, vstore_n, vbcast, vsplat = _memory_ops(_vec_of, "v")
# panel vectors: one micro-tile row of NV vectors (gemm.micro_kernel)
panel_lanes, pload, pload_n, pstore, pstore_n, pbcast, psplat = _memory_ops(_panel_of, "p")


# ----------------------------------------------------------------------------- arithmetic


def _binary(op):
    def impl(typingctx, a, b):
        if not isinstance(a, Vec) or a != b:
            return None

        def codegen(context, builder, sig, args):
            return op(builder, *args)
        return a(a, b), codegen
    return impl


vadd = intrinsic(_binary(lambda b, x, y: b.fadd(x, y)))
vsub = intrinsic(_binary(lambda b, x, y: b.fsub(x, y)))
vmul = intrinsic(_binary(lambda b, x, y: b.fmul(x, y)))
vdiv = intrinsic(_binary(lambda b, x, y: b.fdiv(x, y)))
# select-based max/min: "x > y ? x : y" (a NaN in y wins, as in a comparison loop)
vmax = intrinsic(_binary(lambda b, x, y: b.select(b.fcmp_ordered(">", x, y), x, y)))


def _fma(builder, a, b, c):
    fnty = ir.FunctionType(a.type, [a.type] * 3)
    return _masked(builder, f"llvm.{_FMA}.{_suffix(a.type)}", fnty, [a, b, c])


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c with one rounding."""
    if not isinstance(a, Vec) or not (a == b == c):
        return None

    def codegen(context, builder, sig, args):
        return _fma(builder, *args)
    return a(a, b, c), codegen


def _tree(builder, v, combine):
    """Reduce the lanes pairwise in a fixed order (halves, then quarters, ...)."""
    n = v.type.count
    while n > 1:
        half = n // 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), half), list(range(half))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), half), list(range(half, n))))
        v = combine(builder, lo, hi)
        n = half
    return builder.extract_element(v, _i32(0))


@intrinsic
def vhsum(typingctx, v):
    """Sum of the lanes (fixed pairwise order)."""
    if not isinstance(v, Vec):
        return None

    def codegen(context, builder, sig, args):
        return _tree(builder, args[0], lambda b, x, y: b.fadd(x, y))
    return v.dtype(v), codegen


@intrinsic
def vhmax(typingctx, v):
    """Largest lane."""
    if not isinstance(v, Vec):
        return None

    def codegen(context, builder, sig, args):
        return _tree(builder, args[0], lambda b, x, y: b.select(b.fcmp_ordered(">", x, y), x, y))
    return v.dtype(v), codegen


@intrinsic
def vkeep(typingctx, v, n, fill):
    """Lanes j < n keep v[j], the others become ``fill`` (masking a tile's tail)."""
    if not isinstance(v, Vec):
        return None

    def codegen(context, builder, sig, args):
        vtype = args[0].type
        f = context.cast(builder, args[2], sig.args[2], v.dtype)
        return builder.select(_lane_mask(builder, args[1], v.lanes), args[0], ir_splat(builder, f, vtype))
    return v(v, types.intp, fill), codegen


# ----------------------------------------------------------------------------- exp

# Cody-Waite split of ln 2: k * LN2_HI is exact for |k| < 2^11 (float64) / 2^8 (float32)
_LN2_HI = {64: 6.93147180369123816490e-01, 32: 0.693145751953125}
_LN2_LO = {64: 1.90821492927058770002e-10, 32: 1.428606765330187045e-06}
# Taylor degree whose truncation error at |r| <= ln2/2 is below half an ulp
_EXP_DEGREE = {64: 13, 32: 7}
# arguments below this underflow to 0 (we clamp there; exp(-inf) = 0 is what softmax needs)
_EXP_LO = {64: -708.0, 32: -87.0}
_EXP_HI = {64: 709.0, 32: 88.0}


def _emit_exp(builder, x):
    """exp(x) lane-wise: x = k ln2 + r, exp(r) by Horner, scale by 2^k through the exponent
    bits.  Accurate to about 1-2 ulp on [_EXP_LO, _EXP_HI]; below that it returns 0 (so
    exp(-inf) = 0), above it +inf; NaN lanes stay NaN."""
    vtype = x.type
    bits = 32 if isinstance(vtype.element, ir.FloatType) else 64
    n = vtype.count
    const = lambda c: ir.Constant(vtype, [c] * n)
    ity = ir.VectorType(ir.IntType(bits), n)
    lo, hi = const(_EXP_LO[bits]), const(_EXP_HI[bits])
    xc = builder.select(builder.fcmp_ordered("<", x, lo), lo, x)
    xc = builder.select(builder.fcmp_ordered(">", xc, hi), hi, xc)
    # k = round(x / ln2)
    t = builder.fmul(xc, const(1.0 / math.log(2.0)))
    rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vtype, [vtype]), f"llvm.rint.{_suffix(vtype)}")
    k = builder.call(rint, [t])
    r = _fma(builder, k, const(-_LN2_HI[bits]), xc)
    r = _fma(builder, k, const(-_LN2_LO[bits]), r)
    deg = _EXP_DEGREE[bits]
    p = const(1.0 / math.factorial(deg))
    for i in range(deg - 1, -1, -1):
        p = _fma(builder, p, r, const(1.0 / math.factorial(i)))
    # 2^k: add k to the exponent field.  k is in [-1022, 1023] (float64) / [-126, 127]
    # (float32) here, so p * 2^k cannot overflow the field except at the top, which the
    # hi clamp keeps finite; +inf input is handled below.
    mant = 52 if bits == 64 else 23
    ki = builder.fptosi(k, ity)
    shifted = builder.shl(ki, ir.Constant(ity, [mant] * n))
    y = builder.bitcast(builder.add(builder.bitcast(p, ity), shifted), vtype)
    # exact edge values: below lo -> 0, above hi -> +inf, NaN -> NaN
    y = builder.select(builder.fcmp_ordered("<", x, lo), const(0.0), y)
    y = builder.select(builder.fcmp_ordered(">", x, hi), const(math.inf), y)
    y = builder.select(builder.fcmp_unordered("uno", x, x), x, y)
    return y


@intrinsic
def vexp(typingctx, v):
    """Lane-wise exp (see _emit_exp for the accuracy)."""
    if not isinstance(v, Vec):
        return None

    def codegen(context, builder, sig, args):
        return _emit_exp(builder, args[0])
    return v(v), codegen


# ----------------------------------------------------------------------------- exp2 for softmax

# polynomial degree for 2^f, f in [-1/2, 1/2]: Taylor of exp(f ln2); truncation error
# (ln2/2)^(n+1)/(n+1)! < 1/2 ulp for n = 7 (float32) and n = 13 (float64)
_EXP2_DEGREE = {64: 13, 32: 7}
_EXP2_LO = {64: -1022.0, 32: -126.0}


def _emit_exp2(builder, t):
    """2^t lane-wise for t <= ~0 (softmax arguments): t = k + f, 2^f by Horner, scaled by
    2^k through the exponent bits.  Below the smallest normal exponent it returns
    2^lo (~1e-38 float32 / ~2e-308 float64) instead of the subnormal or 0: callers add
    such terms to a sum that is >= 1, or mask them out.  NaN lanes stay NaN; no
    argument above ~1 is expected (the exponent field would overflow past 2^127).

    k comes from adding 1.5 * 2^mant: the sum rounds t to the nearest integer (ties to
    even, like rint) and holds k in its low mantissa bits, so shifting the sum's bits
    left by mant gives k's exponent-field increment directly; the polynomial is in f
    with ln 2 folded into its coefficients: no rint, float-to-int conversion or multiply
    by ln 2 on the softmax's hot loop, and no less accurate (docs/perf-log.md)."""
    vtype = t.type
    bits = 32 if isinstance(vtype.element, ir.FloatType) else 64
    n = vtype.count
    const = lambda c: ir.Constant(vtype, [c] * n)
    ity = ir.VectorType(ir.IntType(bits), n)
    mant = 52 if bits == 64 else 23
    lo = const(_EXP2_LO[bits])
    tc = builder.select(builder.fcmp_ordered("<", t, lo), lo, t)    # -inf -> lo as well
    magic = const(1.5 * 2.0 ** mant)
    # Numba puts the kernels' fast-math flags (reassoc among them) on every float
    # operation, these too: without the fences LLVM rewrites tc - ((tc + magic) - magic)
    # as 0
    fence = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vtype, [vtype]),
                                           f"llvm.arithmetic.fence.{_suffix(vtype)}")
    y = builder.call(fence, [builder.fadd(tc, magic)])     # exact: |tc| < 2^(mant-1)
    k = builder.call(fence, [builder.fsub(y, magic)])      # round(tc)
    f = builder.fsub(tc, k)                     # exact, in [-1/2, 1/2]
    deg = _EXP2_DEGREE[bits]
    ln2 = math.log(2.0)
    p = const(ln2 ** deg / math.factorial(deg))
    for i in range(deg - 1, -1, -1):
        p = _fma(builder, p, f, const(ln2 ** i / math.factorial(i)))
    # (bits of y) << mant == k << mant: y's mantissa is 2^(mant-1) + k, its top bit and
    # the exponent field are shifted out
    shifted = builder.shl(builder.bitcast(y, ity), ir.Constant(ity, [mant] * n))
    r = builder.bitcast(builder.add(builder.bitcast(p, ity), shifted), vtype)
    return builder.select(builder.fcmp_unordered("uno", t, t), t, r)


@intrinsic
def vexp2(typingctx, v):
    """Lane-wise 2^v for v <= ~0, as the softmax needs it (see _emit_exp2)."""
    if not isinstance(v, Vec):
        return None

    def codegen(context, builder, sig, args):
        return _emit_exp2(builder, args[0])
    return v(v), codegen


@intrinsic
def prefetch_l2(typingctx, arr, i):
    """Hint the cache line holding arr.flat[i] into L2 (prefetcht1): for data needed a
    few thousand cycles from now, which should not displace what L1 holds."""
    if not _is_float_array(arr):
        return None

    def codegen(context, builder, sig, args):
        p = builder.bitcast(elem_ptr(context, builder, sig.args[0], args[0], args[1]), ir.IntType(8).as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [p.type, ir.IntType(32), ir.IntType(32), ir.IntType(32)])
        _masked(builder, "llvm.prefetch.p0", fnty, [p, _i32(0), _i32(2), _i32(1)])
        return context.get_dummy_value()
    return types.void(arr, types.intp), codegen
