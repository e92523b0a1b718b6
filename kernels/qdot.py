"""Integer dot products for a stored matrix's dot "int8" (tblock.formats): x rounded to int8.

With dot "int8", a product x @ W over Q8_0 (int8) or Q4_0 (int4) rows first rounds x, in
blocks of 32 inputs, to d_x * q_x (tblock.formats' rule: amax = max |x|, d = amax / 127,
q = rint(x * (127 / amax)) in float32, half to even; 0 where amax is 0).  Then row j is

    y_j = sum_b (d_w[j, b] * d_x[b]) * S_jb,   S_jb = sum_{i < 32} q_x[32 b + i] * q_w[j, b, i]

with S_jb an exact integer.  A product rounds x once (``round_blocks``, into scratch on the
stack) and then streams the rows, four at a time, sharing the rounded blocks.

S_jb is summed as 8 int32 lanes, lane l holding the products of inputs 4l .. 4l+3 exactly,
by the widest instruction the target has:

    vnni     vpdpbusd (AVX512_VNNI or AVX-VNNI): unsigned weight bytes times signed q_x, so
             Q8_0 bytes are offset by 128 (w ^ 0x80) and Q4_0 nibbles taken as 0..15; the
             offset times the lane's sum of q_x (precomputed per block) starts the lane
    avx2     vpmaddubsw + vpmaddwd: Q8_0 as |w| times q_x with w's sign (no int16
             saturation: 2 * 128 * 127 < 2^15); Q4_0 nibbles as above
    generic  the products widened to int32

Every path gives the same lanes, so every path with an FMA gives the same floats.  The
lanes are then scaled and summed in float32: per row two 8-lane accumulators (even and odd
blocks), acc = fma(float(lanes), d_w * d_x, acc), added and summed in a fixed tree.  Q4_0
rows go two to a vector (kernels.qlanes.pair_lanes): a row's lanes l and l + 4 are added
as integers first, so each row has two 4-lane accumulators, and half the conversions and
scalings a block.  A row gets the same sums alone as beside others.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray
from numba.core import types
from numba.extending import intrinsic, overload

from .isa import PATH
from .options import borrowed, keep_alive, kernel
from .qlanes import KIND, LANES, Q4_BYTES, Q8_BYTES, QBLOCK, float_zeros, pair_lanes, pair_scale, pair_sums
from .qlanes import weight_offset
from .qlanes import c_array as _c_array, call_fn as _call, ptr_to as _ptr, quads as _quads, vconst as _const
from .simd import Vec, elem_ptr, ir_splat
from .widen import emit_half

QCH = 4096              # inputs a product rounds into scratch on its stack (longer: heap)
_FMA = "fma" if PATH.fma else "fmuladd"
_I8x32 = Vec(types.int8, 32)
_I32x8 = Vec(types.int32, LANES)
_F32x8 = Vec(types.float32, LANES)
_i8, _i16, _i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_v = ir.VectorType


# ----------------------------------------------------------------------------- rounding


@intrinsic
def round_block(typingctx, x, xi, qs, ps, ds, b, offset):
    """Block b of a row: x[xi : xi + 32] (float32) rounded (module docstring) into
    qs[32b : 32b + 32] (q, int8), ds[b] (d, float32) and ps[8b : 8b + 8] (int32: lane l is
    -offset times the sum of q over inputs 4l .. 4l+3: what starts the block's lanes,
    start_offset).  Exact only without fast-math flags: the caller is
    compiled without them (round_blocks).  The rounding is 1.5 * 2^23 added to x * (127 /
    amax): the sum's low mantissa bits are rint(x * 127 / amax), ties to even, whose low byte
    is q (|q| <= 127 < 2^22); a NaN in x makes d NaN."""
    if not (_c_array(x, types.float32) and _c_array(qs, types.int8) and _c_array(ps, types.int32)
            and _c_array(ds, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        xa, xi_, qa, pa, da, b_, off = args
        f32, f32x32, i32x32 = ir.FloatType(), _v(ir.FloatType(), 32), _v(_i32, 32)
        v = builder.load(_ptr(context, builder, sig.args[0], xa, xi_, f32x32), align=4)
        mag = builder.and_(builder.bitcast(v, i32x32), ir_splat(builder, ir.Constant(_i32, 0x7FFFFFFF), i32x32))
        # |x| of floats orders as their bits do (a NaN's bits above every number's)
        top = _call(builder, "llvm.vector.reduce.umax.v32i32", _i32, [mag])
        amax = builder.bitcast(top, f32)
        nonzero = builder.icmp_unsigned("!=", top, ir.Constant(_i32, 0))
        d = builder.fdiv(amax, ir.Constant(f32, 127.0))
        inv = builder.select(nonzero, builder.fdiv(ir.Constant(f32, 127.0), amax), ir.Constant(f32, 0.0))
        t = builder.fmul(v, ir_splat(builder, inv, f32x32))
        r = builder.fadd(t, ir_splat(builder, ir.Constant(f32, 1.5 * 2.0 ** 23), f32x32))
        q = builder.trunc(builder.bitcast(r, i32x32), _v(_i8, 32))
        builder.store(q, _ptr(context, builder, sig.args[2], qa, builder.mul(b_, ir.Constant(b_.type, 32)),
                              _v(_i8, 32)), align=1)
        neg = builder.neg(builder.trunc(off, _i32))
        lanes = builder.mul(_quads(builder, builder.sext(q, i32x32)), ir_splat(builder, neg, _v(_i32, LANES)))
        builder.store(lanes, _ptr(context, builder, sig.args[3], pa, builder.mul(b_, ir.Constant(b_.type, LANES)),
                                  _v(_i32, LANES)), align=4)
        builder.store(d, elem_ptr(context, builder, sig.args[4], da, b_))
        return context.get_dummy_value()
    return types.void(x, types.intp, qs, ps, ds, types.intp, types.intp), codegen


@kernel(readonly=("x",), internal=True, fastmath=False)
def round_blocks(x, x_off, nb, qs, ps, ds, offset):
    """The nb blocks of x[x_off : x_off + 32 nb] rounded into qs, ps, ds (round_block);
    compiled without fast-math flags, so each division and rounding is IEEE's."""
    for b in range(nb):
        round_block(x, x_off + b * QBLOCK, qs, ps, ds, b, offset)


# ----------------------------------------------------------------------------- scratch


def _stack_pointer(dtype, n):
    """An intrinsic returning a pointer to n ``dtype`` on the caller's stack, 64-byte
    aligned and uninitialised (numba.carray makes it an array): valid while the calling
    function runs, and taken at its entry, so a loop does not grow the stack."""
    def impl(typingctx):
        def codegen(context, builder, sig, args):
            elem = context.get_data_type(dtype)
            with builder.goto_entry_block():
                slot = builder.alloca(ir.ArrayType(elem, n))
                slot.align = 64
            return builder.bitcast(slot, elem.as_pointer())
        return types.CPointer(dtype)(), codegen
    impl.__name__ = impl.__qualname__ = f"stack_{dtype}"
    return intrinsic(impl)


_stack_q = _stack_pointer(types.int8, QCH)
_stack_p = _stack_pointer(types.int32, QCH // QBLOCK * LANES)
_stack_d = _stack_pointer(types.float32, QCH // QBLOCK)


@kernel(internal=True, inline="always")
def stack_scratch():
    """Room on the caller's stack for QCH rounded inputs (round_blocks' qs, ps, ds)."""
    return carray(_stack_q(), QCH), carray(_stack_p(), QCH // QBLOCK * LANES), carray(_stack_d(), QCH // QBLOCK)


@kernel(internal=True, inline="always")
def row_scratch(k):
    """round_blocks' qs, ps, ds for a row of k inputs: stack_scratch, or for a row longer
    than QCH arrays on the heap."""
    if k <= QCH:
        return stack_scratch()
    nb = k // QBLOCK
    return np.empty(k, np.int8), np.empty(nb * LANES, np.int32), np.empty(nb, np.float32)


# ----------------------------------------------------------------------------- lanes


@intrinsic
def q_load(typingctx, qs, i):
    """The 32 int8 qs[i : i + 32]."""
    if not _c_array(qs, types.int8):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _v(_i8, 32)), align=1)
    return _I8x32(qs, types.intp), codegen


def start_offset(Wq):
    """The offset the weight bytes of Wq's format carry on this path (module docstring):
    128 for Q8_0 and 8 for Q4_0 taken unsigned by vpdpbusd or vpmaddubsw, else 0."""


@overload(start_offset, inline="always")
def _start_offset(Wq):
    if not (isinstance(Wq, types.Array) and Wq.dtype in (types.int8, types.uint8)):
        return None
    q8 = Wq.dtype == types.int8
    offset = weight_offset(q8)
    return lambda Wq: offset


@intrinsic
def start_load(typingctx, ps, i):
    """The 8 int32 ps[i : i + 8]."""
    if not _c_array(ps, types.int32):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _v(_i32, LANES)), align=4)
    return _I32x8(ps, types.intp), codegen


def _weight_bytes(builder, w8, q8):
    """The block's 32 weights as bytes the path multiplies: Q8_0's int8 (w8: <32 x i8>) or
    Q4_0's nibbles in input order (w8: <16 x i8>, byte j = inputs j and j + 16)."""
    if q8:
        return w8
    lo = builder.and_(w8, ir_splat(builder, ir.Constant(_i8, 15), w8.type))
    hi = builder.lshr(w8, ir_splat(builder, ir.Constant(_i8, 4), w8.type))
    return builder.shuffle_vector(lo, hi, _const(_v(_i32, 32), range(32)))


@intrinsic
def block_lanes(typingctx, Wq, o, qx, start):
    """start + the 8 int32 lanes of the block at Wq[o] (its scale at o, then its weights)
    times the rounded inputs qx: lane l = sum_{m < 4} q_w[4l + m] * qx[4l + m] exactly, for
    Q8_0 (Wq int8) or Q4_0 (Wq uint8) weights; start: start_load of the block (zeros where start_offset is 0)."""
    if not (_c_array(Wq, types.int8, types.uint8) and qx == _I8x32 and start == _I32x8):
        return None
    q8 = Wq.dtype == types.int8
    unsigned = weight_offset(q8)

    def codegen(context, builder, sig, args):
        Wa, o_, x, acc = args
        if not unsigned:                # start holds zeros: spare its load
            acc = ir.Constant(acc.type, None)
        p = builder.add(o_, ir.Constant(o_.type, 2))
        w = _weight_bytes(builder, builder.load(_ptr(context, builder, sig.args[0], Wa, p, _v(_i8, 32 if q8 else 16)),
                                                align=1), q8)
        i32x8, i8x32 = _v(_i32, LANES), _v(_i8, 32)
        if KIND == "vnni":
            u = builder.xor(w, ir_splat(builder, ir.Constant(_i8, 0x80), i8x32)) if q8 else w
            return _call(builder, "llvm.x86.avx512.vpdpbusd.256", i32x8, [acc, u, x])
        if KIND == "avx2":
            if q8:
                u = _call(builder, "llvm.abs.v32i8", i8x32, [w, ir.Constant(ir.IntType(1), 0)])
                x = _call(builder, "llvm.x86.avx2.psign.b", i8x32, [x, w])
            else:
                u = w
            pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _v(_i16, 16), [u, x])
            ones = ir_splat(builder, ir.Constant(_i16, 1), _v(_i16, 16))
            return builder.add(acc, _call(builder, "llvm.x86.avx2.pmadd.wd", i32x8, [pairs, ones]))
        wide = builder.sext(w, _v(_i32, 32)) if q8 else builder.sub(
            builder.zext(w, _v(_i32, 32)), ir_splat(builder, ir.Constant(_i32, 8), _v(_i32, 32)))
        return builder.add(acc, _quads(builder, builder.mul(wide, builder.sext(x, _v(_i32, 32)))))
    return _I32x8(Wq, types.intp, qx, start), codegen


@intrinsic
def block_scale(typingctx, Wq, o, dx):
    """All 8 lanes = d_w * dx, d_w the float16 scale of the block at Wq[o].  With F16C
    the scale is broadcast as it is loaded and converted as a vector: a scalar conversion
    inserts it into a register LLVM picks, whose old value (often an accumulator) the
    insert then waits for, chaining every block's loads to the sums."""
    if not _c_array(Wq, types.int8, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        ty = _v(ir.FloatType(), LANES)
        h = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _i16), align=1)
        dx = context.cast(builder, args[2], sig.args[2], types.float32)
        if PATH.f16c:
            hv = builder.bitcast(ir_splat(builder, h, _v(_i16, LANES)), _v(ir.HalfType(), LANES))
            return builder.fmul(builder.fpext(hv, ty), ir_splat(builder, dx, ty))
        return ir_splat(builder, builder.fmul(emit_half(builder, h), dx), ty)
    return _F32x8(Wq, types.intp, types.float32), codegen


@intrinsic
def lanes_fma(typingctx, acc, lanes, s):
    """acc + float(lanes) * s, lane-wise with one rounding (the lanes convert exactly)."""
    if not (acc == _F32x8 and lanes == _I32x8 and s == _F32x8):
        return None

    def codegen(context, builder, sig, args):
        ty = _v(ir.FloatType(), LANES)
        f = builder.sitofp(args[1], ty)
        return _call(builder, f"llvm.{_FMA}.v8f32", ty, [f, args[2], args[0]])
    return _F32x8(acc, lanes, s), codegen


@intrinsic
def prefetch(typingctx, W, i):
    """Hint the cache line holding W[i] (a byte array) into L1 (prefetcht0)."""
    if not _c_array(W, types.int8, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        p = elem_ptr(context, builder, sig.args[0], args[0], args[1])
        _call(builder, "llvm.prefetch.p0", ir.VoidType(), [p, ir.Constant(_i32, 0), ir.Constant(_i32, 3),
                                                          ir.Constant(_i32, 1)])
        return context.get_dummy_value()
    return types.void(W, types.intp), codegen


zeros8 = float_zeros(LANES)


@intrinsic
def sum_pair(typingctx, a, b):
    """The lanes of a + b summed in a fixed tree: halves, quarters, then the last two."""
    if not (a == _F32x8 and b == _F32x8):
        return None

    def codegen(context, builder, sig, args):
        v = builder.fadd(args[0], args[1])
        n = LANES
        while n > 1:
            half = n // 2
            lo = builder.shuffle_vector(v, v, _const(_v(_i32, half), range(half)))
            hi = builder.shuffle_vector(v, v, _const(_v(_i32, half), range(half, n)))
            v = builder.fadd(lo, hi)
            n = half
        return builder.extract_element(v, ir.Constant(_i32, 0))
    return types.float32(a, b), codegen


# ----------------------------------------------------------------------------- rows


def block_size(Wq):
    """Bytes of one block of Wq's format (Q8_0: int8 rows; Q4_0: uint8 rows)."""


@overload(block_size, inline="always")
def _block_size(Wq):
    if isinstance(Wq, types.Array) and Wq.dtype in (types.int8, types.uint8):
        n = Q8_BYTES if Wq.dtype == types.int8 else Q4_BYTES
        return lambda Wq: n
    return None


@kernel(internal=True, inline="always")
def block_term(acc, Wq, p, qs, ps, ds, k):
    """acc + the lanes of block k of x times the block at Wq[p], scaled (module docstring)."""
    return lanes_fma(acc, block_lanes(Wq, p, q_load(qs, k * QBLOCK), start_load(ps, k * LANES)),
                     block_scale(Wq, p, ds[k]))


@kernel(internal=True, inline="always")
def row_int8(Wq, o, qs, ps, ds, nb):
    """The row of nb blocks at Wq[o] times the rounded blocks (qs, ps, ds: round_blocks),
    even blocks into one accumulator and odd ones into another."""
    size = block_size(Wq)
    a = zeros8()
    b = zeros8()
    k = 0
    while k + 2 <= nb:
        p = o + k * size
        a = block_term(a, Wq, p, qs, ps, ds, k)
        b = block_term(b, Wq, p + size, qs, ps, ds, k + 1)
        k += 2
    if k < nb:
        a = block_term(a, Wq, o + k * size, qs, ps, ds, k)
    return sum_pair(a, b)


@kernel(internal=True, inline="always")
def rows4_int8(Wq, o, row, qs, ps, ds, nb, f, fstep):
    """row_int8 of the four rows at Wq[o + r * row], r < 4, sharing each rounded block's
    loads, while prefetching 256 bytes from Wq[f] on, f advancing by fstep, every two
    blocks (rows_int8 aims it at the next group of rows)."""
    size = block_size(Wq)
    a0, a1, a2, a3 = zeros8(), zeros8(), zeros8(), zeros8()
    b0, b1, b2, b3 = zeros8(), zeros8(), zeros8(), zeros8()
    k = 0
    while k + 2 <= nb:
        prefetch(Wq, f)
        prefetch(Wq, f + 64)
        prefetch(Wq, f + 128)
        prefetch(Wq, f + 192)
        f += fstep
        p = o + k * size
        qx, st, dx = q_load(qs, k * QBLOCK), start_load(ps, k * LANES), ds[k]
        a0 = lanes_fma(a0, block_lanes(Wq, p, qx, st), block_scale(Wq, p, dx))
        a1 = lanes_fma(a1, block_lanes(Wq, p + row, qx, st), block_scale(Wq, p + row, dx))
        a2 = lanes_fma(a2, block_lanes(Wq, p + 2 * row, qx, st), block_scale(Wq, p + 2 * row, dx))
        a3 = lanes_fma(a3, block_lanes(Wq, p + 3 * row, qx, st), block_scale(Wq, p + 3 * row, dx))
        p += size
        qx, st, dx = q_load(qs, k * QBLOCK + QBLOCK), start_load(ps, k * LANES + LANES), ds[k + 1]
        b0 = lanes_fma(b0, block_lanes(Wq, p, qx, st), block_scale(Wq, p, dx))
        b1 = lanes_fma(b1, block_lanes(Wq, p + row, qx, st), block_scale(Wq, p + row, dx))
        b2 = lanes_fma(b2, block_lanes(Wq, p + 2 * row, qx, st), block_scale(Wq, p + 2 * row, dx))
        b3 = lanes_fma(b3, block_lanes(Wq, p + 3 * row, qx, st), block_scale(Wq, p + 3 * row, dx))
        k += 2
    if k < nb:
        p = o + k * size
        qx, st, dx = q_load(qs, k * QBLOCK), start_load(ps, k * LANES), ds[k]
        a0 = lanes_fma(a0, block_lanes(Wq, p, qx, st), block_scale(Wq, p, dx))
        a1 = lanes_fma(a1, block_lanes(Wq, p + row, qx, st), block_scale(Wq, p + row, dx))
        a2 = lanes_fma(a2, block_lanes(Wq, p + 2 * row, qx, st), block_scale(Wq, p + 2 * row, dx))
        a3 = lanes_fma(a3, block_lanes(Wq, p + 3 * row, qx, st), block_scale(Wq, p + 3 * row, dx))
    return sum_pair(a0, b0), sum_pair(a1, b1), sum_pair(a2, b2), sum_pair(a3, b3)


@kernel(internal=True, inline="always")
def pair_term(acc, Wq, p, p2, qs, ps, ds, k):
    """acc + the lanes of block k of x times the blocks at Wq[p] and Wq[p2], scaled."""
    return lanes_fma(acc, pair_lanes(Wq, p, p2, qs, ps, k), pair_scale(Wq, p, p2, ds[k]))


@kernel(internal=True, inline="always")
def pair_int4(Wq, o, o2, qs, ps, ds, nb):
    """The Q4_0 rows at Wq[o] and Wq[o2] times the rounded blocks, as row_int8 (even and odd
    blocks apart) on pair_lanes' four lanes a row; o2 = o: one row, the same sums."""
    size = block_size(Wq)
    a = zeros8()
    b = zeros8()
    k = 0
    while k + 2 <= nb:
        a = pair_term(a, Wq, o + k * size, o2 + k * size, qs, ps, ds, k)
        b = pair_term(b, Wq, o + (k + 1) * size, o2 + (k + 1) * size, qs, ps, ds, k + 1)
        k += 2
    if k < nb:
        a = pair_term(a, Wq, o + k * size, o2 + k * size, qs, ps, ds, k)
    return pair_sums(a, b)


@kernel(internal=True, inline="always")
def rows4_int4(Wq, o, row, qs, ps, ds, nb, f, fstep):
    """rows4_int8 for Q4_0 rows, as two pairs (pair_int4)."""
    size = block_size(Wq)
    a0, a1, b0, b1 = zeros8(), zeros8(), zeros8(), zeros8()
    k = 0
    while k + 2 <= nb:
        prefetch(Wq, f)
        prefetch(Wq, f + 64)
        prefetch(Wq, f + 128)
        f += fstep
        p = o + k * size
        a0 = pair_term(a0, Wq, p, p + row, qs, ps, ds, k)
        a1 = pair_term(a1, Wq, p + 2 * row, p + 3 * row, qs, ps, ds, k)
        p += size
        b0 = pair_term(b0, Wq, p, p + row, qs, ps, ds, k + 1)
        b1 = pair_term(b1, Wq, p + 2 * row, p + 3 * row, qs, ps, ds, k + 1)
        k += 2
    if k < nb:
        p = o + k * size
        a0 = pair_term(a0, Wq, p, p + row, qs, ps, ds, k)
        a1 = pair_term(a1, Wq, p + 2 * row, p + 3 * row, qs, ps, ds, k)
    s0, s1 = pair_sums(a0, b0)
    s2, s3 = pair_sums(a1, b1)
    return s0, s1, s2, s3


def rows4(Wq, o, row, qs, ps, ds, nb, f, fstep):
    """Four rows' products: rows4_int8 (Q8_0) or rows4_int4 (Q4_0)."""


@overload(rows4, inline="always")
def _rows4(Wq, o, row, qs, ps, ds, nb, f, fstep):
    if Wq.dtype == types.uint8:
        return lambda Wq, o, row, qs, ps, ds, nb, f, fstep: rows4_int4(Wq, o, row, qs, ps, ds, nb, f, fstep)
    return lambda Wq, o, row, qs, ps, ds, nb, f, fstep: rows4_int8(Wq, o, row, qs, ps, ds, nb, f, fstep)


def row_one(Wq, o, qs, ps, ds, nb):
    """One row's product, with the sums rows4 gives it: row_int8, or pair_int4 of the row twice."""


@overload(row_one, inline="always")
def _row_one(Wq, o, qs, ps, ds, nb):
    if Wq.dtype == types.uint8:
        return lambda Wq, o, qs, ps, ds, nb: pair_int4(Wq, o, o, qs, ps, ds, nb)[0]
    return lambda Wq, o, qs, ps, ds, nb: row_int8(Wq, o, qs, ps, ds, nb)


@kernel(internal=True)
def settle(y, i, s, bias, j, accumulate):
    """y[i] (+)= s [+ bias[j]] (bias empty: none)."""
    if bias.size:
        s += bias[j]
    y[i] = y[i] + s if accumulate else s


@kernel(readonly=("x", "Wq", "bias"), internal=True)
def gemv_int8(x, x_off, Wq, band, bias, y, y_off, accumulate):
    """y[y_off + j] (+)= [bias[j] +] x[x_off : x_off + k] . inputs k0 : k0 + k of row j of Wq,
    j0 <= j < j1, x rounded once (module docstring).  Wq: Q8_0 (int8) or Q4_0 (uint8) rows
    of d_in inputs; band = (d_in, k0, k, j0, j1), k0 and k multiples of 32; bias empty or
    one a row."""
    d_in, k0, k, j0, j1 = band
    nb = k // QBLOCK
    qs, ps, ds = row_scratch(k)
    round_blocks(x, x_off, nb, qs, ps, ds, start_offset(Wq))
    size = block_size(Wq)
    row = d_in // QBLOCK * size
    o = k0 // QBLOCK * size
    W, q, p, d = borrowed(Wq), borrowed(qs), borrowed(ps), borrowed(ds)    # no reference counts a row
    # Rows read four side by side are short streams, which the hardware prefetcher would
    # start cold at every group, so each group prefetches the next one: a group of whole
    # rows is one run of bytes, prefetched in order (a stream the hardware follows too);
    # bands of rows (k < d_in) are left to the hardware.
    whole = k == d_in
    fstep = 8 * size if whole else 0
    j = j0
    while j + 4 <= j1:
        f = (min(j + 4, j1 - 4) * row if whole else j * row) + o    # the last group: itself
        s0, s1, s2, s3 = rows4(W, j * row + o, row, q, p, d, nb, f, fstep)
        settle(y, y_off + j, s0, bias, j, accumulate)
        settle(y, y_off + j + 1, s1, bias, j + 1, accumulate)
        settle(y, y_off + j + 2, s2, bias, j + 2, accumulate)
        settle(y, y_off + j + 3, s3, bias, j + 3, accumulate)
        j += 4
    for i in range(j, j1):
        settle(y, y_off + i, row_one(W, i * row + o, q, p, d, nb), bias, i, accumulate)
    keep_alive(qs, ps, ds)


@kernel(readonly=("A",), internal=True)
def rounded_rows(A, a_off, lda, m, k, out):
    """out[r * k + i] = A.flat[a_off + r * lda + i] as dot "int8" takes it (d * q, float32),
    r < m, i < k (k a multiple of 32): the input of a many-row product."""
    qs, ps, ds = stack_scratch()
    for r in range(m):
        for c0 in range(0, k, QCH):
            n = min(QCH, k - c0)
            round_blocks(A, a_off + r * lda + c0, n // QBLOCK, qs, ps, ds, 0)
            for i in range(n):
                out[r * k + c0 + i] = ds[i // QBLOCK] * np.float32(qs[i])
