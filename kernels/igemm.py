"""Integer GEMM for many rows with dot "int8": C (+)= [bias +] round(A) @ W, W Q8_0 or Q4_0.

The product is the one kernels.qdot computes a row at a time (its docstring: each row of A
rounded in blocks of 32 to d_a * q_a, and for row i, column j

    C[i, j] = sum_b (d_a[i, b] * d_w[j, b]) * S_ijb,   S_ijb = sum_{t < 32} q_a[i, 32b + t] * q_w[j, b, t]

with S exact in int32), here for a tile of rows at once.  vpdpbusd multiplies unsigned
bytes of its vector operand by the signed bytes of its broadcast one, so the vector runs
over rows and the broadcast over a column's weights:

    A   rounded once per call and packed as u8 = q_a + 128: a group of RW rows (one int32
        lane each) by a block's 8 quads of inputs, 4 bytes a lane (pack_rows; RW = the
        path's int32 lanes, rows past the tile padded with q_a = 0 and d_a = 0)
    W   read in place: four signed bytes of one column (Q8_0 as stored; Q4_0 nibbles first
        turned into q_w = nibble - 8 by prepare_columns, and rows in groups of 16 back into
        q_w by qgroups.group_columns), broadcast to every lane

so S' = sum (q_a + 128) q_w = S + 128 sum_t q_w, and each lane starts its block at
-128 sum_t q_w[j, b, t] (prepare_columns' corr) to end it at S exactly.  A block's S is
converted to float32 and added as fma(S, d_a * d_w, acc): a micro-tile holds 2 row groups
by NC columns in int32 and float32 registers.  Every path computes the same S: the VNNI
instruction where the CPU has it, its products widened in LLVM IR elsewhere; the floats
are summed block by block, in order, so they equal kernels.qdot's only to float32
rounding (the order of its lanes differs).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from .isa import PATH
from .options import borrowed, keep_alive, kernel
from .qdot import QBLOCK, block_size, round_blocks
from .qgroups import group_columns
from .qlanes import c_array, call_fn, dpbusd, float_zeros, ptr_to
from .simd import Vec, elem_ptr, ir_splat
from .widen import half_load

RW = PATH.vector_bytes // 4     # rows of a group: the int32 lanes of one vector
QUADS = QBLOCK // 4             # vpdpbusd steps a block
NC = 4                          # columns of a micro-tile of 2 row groups (8 int32 and 8 float accumulators)
JB = 64                         # columns prepared at a time: their bytes stay in L2 while every row group passes
_I32 = Vec(types.int32, RW)
_F32 = Vec(types.float32, RW)
_U8 = Vec(types.int8, 4 * RW)      # packed rows' bytes (u8 to vpdpbusd)
_i8, _i32 = ir.IntType(8), ir.IntType(32)
_v = ir.VectorType
_FMA = "fma" if PATH.fma else "fmuladd"
_OFFSET = np.int32(-2139062144)     # 0x80808080: q_a + 128 in each byte of a quad


@intrinsic
def rows_load(typingctx, Ap, i):
    """The packed rows Ap[i : i + RW] (int32 words of four u8 each) as 4 RW bytes."""
    if not c_array(Ap, types.int32):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(ptr_to(context, builder, sig.args[0], args[0], args[1], _v(_i8, 4 * RW)), align=4)
    return _U8(Ap, types.intp), codegen


@intrinsic
def dot_step(typingctx, acc, a, Wb, o):
    """acc + the products of the packed rows a (rows_load) with the four signed bytes
    Wb[o : o + 4] (one column's quad, broadcast)."""
    if not (acc == _I32 and a == _U8 and c_array(Wb, types.int8)):
        return None

    def codegen(context, builder, sig, args):
        accv, av, Wa, o_ = args
        quad = builder.load(ptr_to(context, builder, sig.args[2], Wa, o_, _i32), align=1)
        w = builder.bitcast(ir_splat(builder, quad, _v(_i32, RW)), _v(_i8, 4 * RW))
        return dpbusd(builder, accv, av, w)
    return _I32(acc, a, Wb, types.intp), codegen


@intrinsic
def int_splat(typingctx, C, i):
    """Every lane = C[i] (int32)."""
    if not c_array(C, types.int32):
        return None

    def codegen(context, builder, sig, args):
        return ir_splat(builder, builder.load(elem_ptr(context, builder, sig.args[0], args[0], args[1])),
                        _v(_i32, RW))
    return _I32(C, types.intp), codegen


@intrinsic
def scale_add(typingctx, acc, S, Da, i, dw):
    """acc + float(S) * (Da[i : i + RW] * dw), lane-wise (S converts exactly: |S| < 2^24)."""
    if not (acc == _F32 and S == _I32 and c_array(Da, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        accv, Sv, Da_, i_, dw_ = args
        ty = _v(ir.FloatType(), RW)
        da = builder.load(ptr_to(context, builder, sig.args[2], Da_, i_, ty), align=4)
        s = builder.fmul(da, ir_splat(builder, context.cast(builder, dw_, sig.args[4], types.float32), ty))
        return call_fn(builder, f"llvm.{_FMA}.v{RW}f32", ty, [builder.sitofp(Sv, ty), s, accv])
    return _F32(acc, S, Da, types.intp, types.float32), codegen


zeros = float_zeros(RW)


@intrinsic
def lane(typingctx, v, r):
    """Lane r of v."""
    if v != _F32:
        return None

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], args[1])
    return types.float32(v, types.intp), codegen


# ----------------------------------------------------------------------------- packing


@kernel(readonly=("A",), internal=True)
def pack_rows(A, a_off, lda, m, k, Ap, Da):
    """Rows r < m of A's k columns (A.flat[a_off + r lda + c]) rounded (qdot.round_blocks)
    and packed: word ((g nb + b) QUADS + t) RW + l of Ap holds q_a + 128 of inputs 32b + 4t
    .. + 3 of row g RW + l, and Da[(g nb + b) RW + l] its block's d_a."""
    nb = k // QBLOCK
    words = np.empty(k // 4, dtype=np.int32)
    qs = words.view(np.int8)
    ps, ds = np.empty(nb * 8, dtype=np.int32), np.empty(nb, dtype=np.float32)
    ng = (m + RW - 1) // RW
    Ap[:ng * nb * QUADS * RW] = _OFFSET       # padding rows: q_a = 0, d_a = 0
    Da[:ng * nb * RW] = 0.0
    for r in range(m):
        round_blocks(A, a_off + r * lda, nb, qs, ps, ds, 0)
        g, l = r // RW, r % RW
        for b in range(nb):
            base = (g * nb + b) * QUADS
            for t in range(QUADS):
                Ap[(base + t) * RW + l] = words[b * QUADS + t] ^ _OFFSET
            Da[(g * nb + b) * RW + l] = ds[b]


@intrinsic
def block_weights(typingctx, Wq, p, Wu, u):
    """The sum of the 32 weights q_w of the block at Wq[p] (its scale, then its bytes); for
    Q4_0 (Wq uint8) also writes them, nibble - 8, into Wu[u : u + 32] (in input order: byte
    t holds inputs t and t + 16)."""
    if not (c_array(Wq, types.int8, types.uint8) and c_array(Wu, types.int8)):
        return None
    q8 = Wq.dtype == types.int8

    def codegen(context, builder, sig, args):
        Wa, p_, Ua, u_ = args
        at = builder.add(p_, ir.Constant(p_.type, 2))
        w = builder.load(ptr_to(context, builder, sig.args[0], Wa, at, _v(_i8, 32 if q8 else 16)), align=1)
        if not q8:
            lo = builder.and_(w, ir_splat(builder, ir.Constant(_i8, 15), w.type))
            hi = builder.lshr(w, ir_splat(builder, ir.Constant(_i8, 4), w.type))
            w = builder.sub(builder.shuffle_vector(lo, hi, ir.Constant(_v(_i32, 32), list(range(32)))),
                            ir_splat(builder, ir.Constant(_i8, 8), _v(_i8, 32)))
            builder.store(w, ptr_to(context, builder, sig.args[2], Ua, u_, _v(_i8, 32)), align=1)
        return call_fn(builder, "llvm.vector.reduce.add.v32i32", _i32, [builder.sext(w, _v(_i32, 32))])
    return types.int32(Wq, types.intp, Wu, types.intp), codegen


@kernel(readonly=("Wq",), internal=True)
def prepare_columns(Wq, band, Wu, dw, corr):
    """For columns j0 <= j < j1 of the band (d_in, k0, k, j0, j1) of Wq's stored rows, jj =
    j - j0: dw[jj nb + b] the block's d_w, corr[jj nb + b] = -128 sum_t q_w (what starts its
    lanes), and for Q4_0 (Wq uint8) Wu[jj k + 32 b + t] = q_w (nibble - 8); Q8_0 is read in
    place."""
    d_in, k0, k, j0, j1 = band
    nb = k // QBLOCK
    size = block_size(Wq)
    row = d_in // QBLOCK * size
    o = k0 // QBLOCK * size
    for jj in range(j1 - j0):
        for b in range(nb):
            p = (j0 + jj) * row + o + b * size
            dw[jj * nb + b] = half_load(Wq, p)
            corr[jj * nb + b] = -128 * block_weights(Wq, p, Wu, jj * k + b * QBLOCK)


def in_place(Wq, dot):
    """Whether a micro-tile reads Wq's bytes in place: Q8_0 rows (Wq int8, dot int8), not
    Q4_0's nibbles nor grouped rows (dot qgroups.GROUPED_DOT), which prepare unpacks."""


def _rows_in_place(Wq, dot) -> bool:
    return c_array(Wq, types.int8) and dot.dtype == types.int8


@overload(in_place, inline="always")
def _in_place(Wq, dot):
    yes = _rows_in_place(Wq, dot)
    return lambda Wq, dot: yes


def weight_bytes(Wq, Wu, dot):
    """The signed bytes a micro-tile broadcasts: Wq in place (in_place), else Wu."""


@overload(weight_bytes, inline="always")
def _weight_bytes(Wq, Wu, dot):
    if _rows_in_place(Wq, dot):
        return lambda Wq, Wu, dot: Wq
    return lambda Wq, Wu, dot: Wu


def prepare(Wq, band, Wu, dw, corr, dot):
    """prepare_columns for stored rows, qgroups.group_columns for grouped ones."""


@overload(prepare, inline="always")
def _prepare(Wq, band, Wu, dw, corr, dot):
    if dot.dtype == types.int16:
        return lambda Wq, band, Wu, dw, corr, dot: group_columns(Wq, band, Wu, dw, corr)
    return lambda Wq, band, Wu, dw, corr, dot: prepare_columns(Wq, band, Wu, dw, corr)


# ----------------------------------------------------------------------------- tiles


@kernel(readonly=("Ap", "Da", "Wb", "dw", "corr"), internal=True)
def micro_tile(Ap, Da, groups, nb, Wb, wblk, dw, corr, cols):
    """The float32 sums of row group ga times columns 0-3 of cols and of group gb times
    columns 4-7 (groups = (ga, gb)): column (w, c)'s block b is Wb[w + b * wblk[0] + wblk[1]:]
    (32 signed bytes), its d_w and corr dw[c + b] and corr[c + b].  Two groups by 4
    columns, or one group (ga = gb) by 8."""
    ga, gb = groups
    bs, boff = wblk
    (w0, c0), (w1, c1), (w2, c2), (w3, c3), (w4, c4), (w5, c5), (w6, c6), (w7, c7) = cols
    f0, f1, f2, f3, f4, f5, f6, f7 = zeros(), zeros(), zeros(), zeros(), zeros(), zeros(), zeros(), zeros()
    step = QUADS * RW
    for b in range(nb):
        s0, s1, s2, s3 = int_splat(corr, c0 + b), int_splat(corr, c1 + b), int_splat(corr, c2 + b), int_splat(
            corr, c3 + b)
        s4, s5, s6, s7 = int_splat(corr, c4 + b), int_splat(corr, c5 + b), int_splat(corr, c6 + b), int_splat(
            corr, c7 + b)
        xa, xb, q = (ga * nb + b) * step, (gb * nb + b) * step, b * bs + boff
        for t in range(QUADS):
            a, e, o = rows_load(Ap, xa + t * RW), rows_load(Ap, xb + t * RW), q + 4 * t
            s0 = dot_step(s0, a, Wb, w0 + o)
            s1 = dot_step(s1, a, Wb, w1 + o)
            s2 = dot_step(s2, a, Wb, w2 + o)
            s3 = dot_step(s3, a, Wb, w3 + o)
            s4 = dot_step(s4, e, Wb, w4 + o)
            s5 = dot_step(s5, e, Wb, w5 + o)
            s6 = dot_step(s6, e, Wb, w6 + o)
            s7 = dot_step(s7, e, Wb, w7 + o)
        da, db = (ga * nb + b) * RW, (gb * nb + b) * RW
        f0 = scale_add(f0, s0, Da, da, dw[c0 + b])
        f1 = scale_add(f1, s1, Da, da, dw[c1 + b])
        f2 = scale_add(f2, s2, Da, da, dw[c2 + b])
        f3 = scale_add(f3, s3, Da, da, dw[c3 + b])
        f4 = scale_add(f4, s4, Da, db, dw[c4 + b])
        f5 = scale_add(f5, s5, Da, db, dw[c5 + b])
        f6 = scale_add(f6, s6, Da, db, dw[c6 + b])
        f7 = scale_add(f7, s7, Da, db, dw[c7 + b])
    return f0, f1, f2, f3, f4, f5, f6, f7


@kernel(internal=True)
def store_column(v, C, c, i, nr, j, bias, accumulate):
    """C[i + r, j] (+)= v[r] [+ bias[j]] for r < nr (c: C's Rows)."""
    for r in range(nr):
        x = lane(v, r)
        if bias.size:
            x += bias[j]
        p = c.off + (i + r) * c.ld + j
        C[p] = C[p] + x if accumulate else x


@kernel(readonly=("A", "Wq", "bias"), internal=True)
def igemm(A, a, Wq, band, rows, bias, C, c, accumulate, dot):
    """C[i, c.off-relative j] (+)= [bias[j] +] round(A row i) . inputs k0 : k0 + k of stored
    row j of Wq, for i0 <= i < i1 (rows) and j0 <= j < j1 (band = (d_in, k0, k, j0, j1), k0
    and k multiples of 32); a, c: the Rows of A and C (module docstring); dot: records.Stored's
    (qgemv.DOTS["int8"]: Wq holds rows; qgroups.GROUPED_DOT: groups of rows)."""
    d_in, k0, k, j0, j1 = band
    i0, i1 = rows
    m, n, nb = i1 - i0, j1 - j0, k // QBLOCK
    ng = (m + RW - 1) // RW
    Ap = np.empty(ng * nb * QUADS * RW, dtype=np.int32)
    Da = np.empty(ng * nb * RW, dtype=np.float32)
    pack_rows(A, a.off + i0 * a.ld, a.ld, m, k, Ap, Da)
    size = block_size(Wq)
    inplace = in_place(Wq, dot)
    jn = min(JB, n)
    dw, corr = np.empty(jn * nb, dtype=np.float32), np.empty(jn * nb, dtype=np.int32)
    Wu = np.empty(0 if inplace else jn * k, dtype=np.int8)
    Wb = weight_bytes(Wq, Wu, dot)
    row = d_in // QBLOCK * size
    o = k0 // QBLOCK * size
    wblk = (size, 2) if inplace else (QBLOCK, 0)
    P, D, W, dwb, cb = borrowed(Ap), borrowed(Da), borrowed(Wb), borrowed(dw), borrowed(corr)
    for jb in range(0, n, JB):
        je = min(jb + JB, n)
        # the chunk's scales and sums just before its tiles: its bytes are read from memory once
        prepare(Wq, (d_in, k0, k, j0 + jb, j0 + je), Wu, dw, corr, dot)
        where = (inplace, j0, row, o, k, nb, jb, je)
        for g in range(0, ng, 2):
            two = g + 1 < ng                # else one group by 8 columns
            gb = g + 1 if two else g
            for jc in range(jb, je, NC if two else 2 * NC):
                jd = jc if two else jc + NC     # the second group's columns
                F = micro_tile(P, D, (g, gb), nb, W, wblk, dwb, cb, columns(jc, jd, where))
                for s in range(2 * NC):
                    gs, js = (g, jc + s) if s < NC else (gb, jd + s - NC)
                    if js < je:
                        store_column(F[s], C, c, i0 + gs * RW, min(RW, m - gs * RW), j0 + js, bias, accumulate)
    keep_alive(Ap, Da, Wu, dw, corr)


@kernel(internal=True, inline="always")
def column(j, where):
    """(where column j's bytes start in micro_tile's Wb, its first scale) while columns jb:je
    are prepared: Q8_0 rows in place, else the unpacked rows; columns past je repeat je - 1
    (never stored)."""
    inplace, j0, row, o, k, nb, jb, je = where
    jj = min(j, je - 1)
    return ((j0 + jj) * row + o if inplace else (jj - jb) * k, (jj - jb) * nb)


@kernel(internal=True, inline="always")
def columns(jc, jd, where):
    """micro_tile's cols: columns jc .. jc + 3, then jd .. jd + 3."""
    return (column(jc, where), column(jc + 1, where), column(jc + 2, where), column(jc + 3, where),
            column(jd, where), column(jd + 1, where), column(jd + 2, where), column(jd + 3, where))
