"""The integer lanes of dot "int8" (kernels.qdot) below its row kernels: which integer dot a
path runs, the IR helpers, and a pair of Q4_0 rows in one vector.

kernels.qdot sums a block's 32 products in 8 int32 lanes, lane l the inputs 4l .. 4l+3.  A
Q4_0 block is 16 bytes, half a vector, so two rows share one: ``pair_lanes`` multiplies the
low nibbles of both rows (inputs 0..15) by inputs 0..15 of x, then the high ones (16..31)
by x's 16..31, into the same lanes, so lane l < 4 holds a row's lanes l and l + 4 added
(exactly: integers) and lanes 4..7 the other row's; ``pair_scale`` and ``pair_sums`` are
the float scale and the final sums of such a pair.  Every path computes the same lanes.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .isa import PATH
from .simd import Vec, elem_ptr, ir_splat
from .widen import emit_half

QBLOCK = 32
Q8_BYTES = 34
Q4_BYTES = 18
LANES = 8               # int32 lanes of one block's sum (256 bits on every path)


def dot_kind(path_name: str, vnni: bool) -> str:
    """Which integer dot a path runs: "vnni", "avx2" or "generic" (module docstring)."""
    if vnni:
        return "vnni"
    return "avx2" if path_name in ("avx512", "avx2") else "generic"


KIND = dot_kind(PATH.name, PATH.vnni)


def weight_offset(q8: bool) -> int:
    """The offset this path's weight bytes carry (module docstring): 128 for Q8_0 bytes and
    8 for Q4_0 nibbles taken unsigned (vpdpbusd; vpmaddubsw for nibbles), else 0."""
    if KIND == "vnni":
        return 128 if q8 else 8
    return 8 if KIND == "avx2" and not q8 else 0


_I32x8 = Vec(types.int32, LANES)
_F32x8 = Vec(types.float32, LANES)
_i8, _i16, _i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_v = ir.VectorType


def c_array(a, *dtypes) -> bool:
    """Whether a is a C-contiguous array of one of dtypes (the intrinsics address memory
    by flat index)."""
    return isinstance(a, types.Array) and a.layout == "C" and a.dtype in dtypes


def vconst(ty, values):
    return ir.Constant(ty, list(values))


def ptr_to(context, builder, arrty, arr, i, ty):
    return builder.bitcast(elem_ptr(context, builder, arrty, arr, i), ty.as_pointer())


def call_fn(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def quads(builder, v32):
    """<8 x i32>: lane l = v32[4l] + v32[4l+1] + v32[4l+2] + v32[4l+3] (v32: <32 x i32>)."""
    parts = [builder.shuffle_vector(v32, v32, vconst(_v(_i32, LANES), range(m, 32, 4))) for m in range(4)]
    return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))


def float_zeros(n: int):
    """An intrinsic of no arguments returning n float32 zeros (an accumulator's start)."""
    def impl(typingctx):
        def codegen(context, builder, sig, args):
            return ir.Constant(_v(ir.FloatType(), n), None)
        return Vec(types.float32, n)(), codegen
    impl.__name__ = impl.__qualname__ = f"zeros{n}"
    return intrinsic(impl)


def dpbusd(builder, acc, u, s):
    """acc + lane l: sum_{m < 4} u8(u[4l + m]) * s8(s[4l + m]), for any number n of int32
    lanes (acc: <n x i32>; u, s: <4n x i8>): vpdpbusd where the CPU has VNNI, on the
    widest vectors it has (pieces of 16 or 8 lanes), else the products widened in IR."""
    n = acc.type.count
    if KIND != "vnni":
        wide = _v(_i32, 4 * n)
        prod = builder.mul(builder.zext(u, wide), builder.sext(s, wide))
        parts = [builder.shuffle_vector(prod, prod, vconst(_v(_i32, n), range(m, 4 * n, 4))) for m in range(4)]
        return builder.add(acc, builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3])))
    piece = min(n, PATH.vector_bytes // 4)
    if piece == n:
        return call_fn(builder, f"llvm.x86.avx512.vpdpbusd.{32 * n}", acc.type, [acc, u, s])
    out = []
    for h in range(0, n, piece):
        def part(v, k):
            return builder.shuffle_vector(v, v, vconst(_v(_i32, k * piece), range(k * h, k * (h + piece))))
        out.append(call_fn(builder, f"llvm.x86.avx512.vpdpbusd.{32 * piece}", _v(_i32, piece),
                           [part(acc, 1), part(u, 4), part(s, 4)]))
    while len(out) > 1:
        out = [builder.shuffle_vector(out[i], out[i + 1], vconst(_v(_i32, 2 * out[i].type.count),
                                                                 range(2 * out[i].type.count)))
               for i in range(0, len(out), 2)]
    return out[0]


# ----------------------------------------------------------------------------- pairs of Q4_0 rows


def twice(context, builder, arrty, arr, i, ty):
    """The n / 2 elements arr[i : i + n / 2] (n: 32 int8 or 8 int32, one 256-bit vector) in
    both halves of an n-lane vector."""
    n = 256 // ty.width
    half = builder.load(ptr_to(context, builder, arrty, arr, i, _v(ty, n // 2)), align=1)
    return builder.shuffle_vector(half, half, vconst(_v(_i32, n), [m % (n // 2) for m in range(n)]))


@intrinsic
def pair_lanes(typingctx, Wq, o, o2, qs, ps, k):
    """Q4_0: the blocks at Wq[o] and Wq[o2] (two rows) times the rounded block k (qs, ps:
    round_blocks), as 8 int32 lanes: lane l < 4 holds the sum of lanes l and
    l + 4 of block_lanes for the first row, lane 4 + l the same for the second.  One vector
    holds both rows: the low nibbles meet inputs 0..15 of both, the high ones 16..31."""
    if not (c_array(Wq, types.uint8) and c_array(qs, types.int8) and c_array(ps, types.int32)):
        return None
    unsigned = weight_offset(False)

    def codegen(context, builder, sig, args):
        Wa, o_, o2_, qa, pa, k_ = args
        i8x16, i8x32, i32x8 = _v(_i8, 16), _v(_i8, 32), _v(_i32, LANES)
        two = ir.Constant(o_.type, 2)
        r0, r1 = (builder.load(ptr_to(context, builder, sig.args[0], Wa, builder.add(p, two), i8x16), align=1)
                  for p in (o_, o2_))
        w = builder.shuffle_vector(r0, r1, vconst(_v(_i32, 32), range(32)))
        lo = builder.and_(w, ir_splat(builder, ir.Constant(_i8, 15), i8x32))
        hi = builder.lshr(w, ir_splat(builder, ir.Constant(_i8, 4), i8x32))
        # x's halves and the starts' halves each in both halves of a vector: loads that
        # broadcast, where one load and a shuffle each cost a shuffle a block
        def at(n, h):
            return builder.add(builder.mul(k_, ir.Constant(k_.type, n)), ir.Constant(k_.type, h))
        xl, xh = (twice(context, builder, sig.args[3], qa, at(QBLOCK, h), _i8) for h in (0, 16))
        acc = ir.Constant(i32x8, None)
        if unsigned:                    # the starts of lanes l and l + 4
            acc = builder.add(*(twice(context, builder, sig.args[4], pa, at(LANES, h), _i32) for h in (0, 4)))
        if KIND == "vnni":
            acc = call_fn(builder, "llvm.x86.avx512.vpdpbusd.256", i32x8, [acc, lo, xl])
            return call_fn(builder, "llvm.x86.avx512.vpdpbusd.256", i32x8, [acc, hi, xh])
        if KIND == "avx2":
            ones = ir_splat(builder, ir.Constant(_i16, 1), _v(_i16, 16))
            for u, xv in ((lo, xl), (hi, xh)):
                pairs = call_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _v(_i16, 16), [u, xv])
                acc = builder.add(acc, call_fn(builder, "llvm.x86.avx2.pmadd.wd", i32x8, [pairs, ones]))
            return acc
        for u, xv in ((lo, xl), (hi, xh)):
            wide = builder.sub(builder.zext(u, _v(_i32, 32)), ir_splat(builder, ir.Constant(_i32, 8), _v(_i32, 32)))
            acc = builder.add(acc, quads(builder, builder.mul(wide, builder.sext(xv, _v(_i32, 32)))))
        return acc
    return _I32x8(Wq, types.intp, types.intp, qs, ps, types.intp), codegen


@intrinsic
def pair_scale(typingctx, Wq, o, o2, dx):
    """Lanes 0..3 = d_w * dx for the block at Wq[o], lanes 4..7 for the block at Wq[o2]."""
    if not c_array(Wq, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        ty = _v(ir.FloatType(), LANES)
        h0, h1 = (builder.load(ptr_to(context, builder, sig.args[0], args[0], p, _i16), align=1) for p in args[1:3])
        dx = ir_splat(builder, context.cast(builder, args[3], sig.args[3], types.float32), ty)
        if PATH.f16c:                   # splats, as block_scale's: no insert into a live register
            hv = builder.shuffle_vector(ir_splat(builder, h0, _v(_i16, LANES)), ir_splat(builder, h1, _v(_i16, LANES)),
                                        vconst(_v(_i32, LANES), [0, 0, 0, 0, 8, 8, 8, 8]))
            return builder.fmul(builder.fpext(builder.bitcast(hv, _v(ir.HalfType(), LANES)), ty), dx)
        f0, f1 = (ir_splat(builder, emit_half(builder, h), ty) for h in (h0, h1))
        return builder.fmul(builder.shuffle_vector(f0, f1, vconst(_v(_i32, LANES), [0, 1, 2, 3, 12, 13, 14, 15])), dx)
    return _F32x8(Wq, types.intp, types.intp, types.float32), codegen


@intrinsic
def pair_sums(typingctx, a, b):
    """The two rows' sums of a + b (pair_lanes' halves), each half summed as sum_pair's last
    two steps: lanes 0 + 2 and 1 + 3, then those two."""
    if not (a == _F32x8 and b == _F32x8):
        return None

    def codegen(context, builder, sig, args):
        v = builder.fadd(args[0], args[1])
        out = []
        for h in (0, 4):
            w = builder.fadd(*(builder.shuffle_vector(v, v, vconst(_v(_i32, 2), [h + m, h + m + 1])) for m in (0, 2)))
            out.append(builder.fadd(*(builder.extract_element(w, ir.Constant(_i32, m)) for m in (0, 1))))
        return context.make_tuple(builder, sig.return_type, out)
    return types.UniTuple(types.float32, 2)(a, b), codegen
