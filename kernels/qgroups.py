"""Stored rows in groups of 16: one row times a Q8_0 or Q4_0 matrix at a vector's width.

kernels.qdot multiplies a row by stored rows one block of one row at a time: a block's
sum lands in 8 lanes that then need a conversion, a scale broadcast and an FMA each, so a
core runs out of instructions about when memory runs out of bytes.  Here the rows of a
matrix are regrouped, 16 to a group, so that one vector holds the same 4 bytes of 16 rows:

    group g (rows 16g .. 16g + 15), block b: one chunk of 16 S bytes (S = 34 for Q8_0,
    18 for Q4_0, so the bytes are the rows' own, moved), at (g nb + b) 16 S:
        [0, 32)            the 16 rows' float16 scales d_w, row r at 2r
        [32, 32 + 16 P)    the rows' P payload bytes (32 int8 q, or Q4_0's 16 bytes of
                           two nibbles), as words: word (t, r) at 32 + 4 (16 t + r) holds
                           bytes 4t .. 4t + 3 of row r's block, Q8_0's as q + 128
                           (unsigned: the top bit flipped)

Rows past d_out are padded with zero scales and zero weights.  A block of x, rounded as
dot "int8" rounds it (kernels.qdot.round_blocks), then meets a group in 8 vpdpbusd: x's
quad t broadcast to every lane times word t of each row (Q8_0's q + 128, Q4_0's nibbles
0..15: the low ones meet x's quad t, the high ones quad t + 4), each lane of the int32
result one row's whole block sum S plus offset * sum(q_x) (offset 128 or 8), which the
block's start cancels.  So per block and group, one conversion, one scale vector (16
float16 loaded at once) and one FMA for 16 rows, and no horizontal sums:

    y_j = sum_b float(S_jb) * (d_w[j, b] * d_x[b])      (FMA in block order: even blocks and
                                                           odd ones in two sums, added last)

S_jb is the exact integer qdot's lanes add up to, so y differs from qdot's only in the
float32 order.  The regrouping is a load-time copy (``group_rows``), made where a CPU has
VNNI (tblock.backends.numba.packing); every path runs this kernel (the products widened in
LLVM IR where vpdpbusd is missing), so its tests run everywhere.  The check and the rate
beside the row kernels: bench/bench_qgemv.py (its int8/groups and int4/groups rows).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import types
from numba.extending import intrinsic

from .isa import PATH
from .options import borrowed, keep_alive, kernel
from .qdot import KIND, QBLOCK, block_size, round_blocks, row_scratch
from .qlanes import LANES, c_array, call_fn, dpbusd, float_zeros, ptr_to
from .simd import Vec, ir_splat
from .widen import emit_half, half_load

GROUP = 16                                  # rows a group: int32 lanes of one 512-bit vector
PAYLOAD = {"int8": QBLOCK, "int4": QBLOCK // 2}      # a block's bytes after its scale
Q8_OFFSET, Q4_OFFSET = 128, 8               # what the weight bytes carry as unsigned bytes
GROUPED_DOT = np.empty(0, np.int16)        # records.Stored's dot: "int8" on grouped rows
_F32 = Vec(types.float32, GROUP)
_i8, _i16, _i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_v = ir.VectorType
_FMA = "fma" if PATH.fma else "fmuladd"


# ----------------------------------------------------------------------------- the layout


def grouped_size(fmt: str, d_in: int, d_out: int) -> int:
    """Bytes of a (d_in, d_out) matrix of ``fmt`` (int8 or int4) in groups: its rows padded
    to a multiple of 16."""
    return -(-d_out // GROUP) * GROUP * d_in // QBLOCK * (2 + PAYLOAD[fmt])


def group_rows(rows: np.ndarray, fmt: str, out: np.ndarray | None = None) -> np.ndarray:
    """Stored rows (tblock.formats: (d_out, nb S) uint8, Q8_0 or Q4_0) in groups of 16
    (module docstring), flat, int8 for Q8_0 and uint8 for Q4_0 as the kernels take them;
    written into ``out`` (grouped_size elements, a view into a larger buffer) when given."""
    P = PAYLOAD[fmt]
    S = 2 + P
    d_out, width = rows.shape
    nb = width // S
    ng = -(-d_out // GROUP)
    padded = np.zeros((ng * GROUP, width), dtype=np.uint8)
    padded[:d_out] = rows.view(np.uint8)
    blocks = padded.reshape(ng, GROUP, nb, S)
    if out is None:
        out = np.empty(ng * nb * GROUP * S, dtype=np.int8 if fmt == "int8" else np.uint8)
    elif out.size != ng * nb * GROUP * S or out.itemsize != 1 or not out.flags.c_contiguous:
        raise ValueError(f"out must be {ng * nb * GROUP * S} contiguous bytes, got {out.size} of {out.dtype}")
    dest = out.view(np.uint8).reshape(ng, nb, GROUP * S)
    dest[..., :2 * GROUP] = blocks[..., :2].transpose(0, 2, 1, 3).reshape(ng, nb, 2 * GROUP)
    words = dest[..., 2 * GROUP:]
    words[:] = blocks[..., 2:].reshape(ng, GROUP, nb, P // 4, 4).transpose(0, 2, 3, 1, 4).reshape(ng, nb, GROUP * P)
    if fmt == "int8":
        words ^= np.uint8(0x80)
    return out


def grouped(dot: str) -> bool:
    """Whether a block's matrices with this dot are held in groups: dot "int8" where the
    CPU has VNNI (elsewhere the row kernels of kernels.qdot are as fast)."""
    return dot == "int8" and KIND == "vnni"


# ----------------------------------------------------------------------------- a group's block


def _scales(context, builder, arrty, W, p, dx):
    """The 16 float16 scales at W[p] as float32s, times dx."""
    ty = _v(ir.FloatType(), GROUP)
    h = builder.load(ptr_to(context, builder, arrty, W, p, _v(_i16, GROUP)), align=1)
    if PATH.f16c:
        d = builder.fpext(builder.bitcast(h, _v(ir.HalfType(), GROUP)), ty)
    else:
        d = ir.Constant(ty, None)
        for r in range(GROUP):
            d = builder.insert_element(d, emit_half(builder, builder.extract_element(h, ir.Constant(_i32, r))),
                                       ir.Constant(_i32, r))
    return builder.fmul(d, ir_splat(builder, dx, ty))


@intrinsic
def group_block(typingctx, acc, Wg, p, qs, xo, start, dx):
    """acc + float(S) * (d_w * dx) for the 16 rows of the group's block at Wg[p] (Q8_0:
    int8, Q4_0: uint8) times x's rounded block qs[xo : xo + 32]; start = -offset * sum of
    that block's q_x (module docstring), so that each lane's S is its row's exact sum."""
    if not (acc == _F32 and c_array(Wg, types.int8, types.uint8) and c_array(qs, types.int8)):
        return None
    q8 = Wg.dtype == types.int8

    def codegen(context, builder, sig, args):
        accv, W, p_, qa, xo_, st, dx_ = args
        i8x64, i32x16 = _v(_i8, 64), _v(_i32, GROUP)
        S = ir_splat(builder, builder.trunc(st, _i32) if st.type.width > 32 else st, i32x16)

        def xquad(t):
            at = builder.add(xo_, ir.Constant(xo_.type, 4 * t))
            quad = builder.load(ptr_to(context, builder, sig.args[3], qa, at, _i32), align=1)
            return builder.bitcast(ir_splat(builder, quad, i32x16), i8x64)

        def words(t):
            at = builder.add(p_, ir.Constant(p_.type, 2 * GROUP + 4 * GROUP * t))
            return builder.load(ptr_to(context, builder, sig.args[1], W, at, i8x64), align=1)
        if q8:
            for t in range(QBLOCK // 4):
                S = dpbusd(builder, S, words(t), xquad(t))
        else:
            low = ir_splat(builder, ir.Constant(_i8, 15), i8x64)
            four = ir_splat(builder, ir.Constant(_i8, 4), i8x64)
            for t in range(QBLOCK // 8):
                w = words(t)
                S = dpbusd(builder, S, builder.and_(w, low), xquad(t))
                S = dpbusd(builder, S, builder.lshr(w, four), xquad(t + 4))
        ty = _v(ir.FloatType(), GROUP)
        s = _scales(context, builder, sig.args[1], W, p_, context.cast(builder, dx_, sig.args[6], types.float32))
        return call_fn(builder, f"llvm.{_FMA}.v{GROUP}f32", ty, [builder.sitofp(S, ty), s, accv])
    return _F32(acc, Wg, types.intp, qs, types.intp, types.int32, types.float32), codegen


zeros16 = float_zeros(GROUP)


@intrinsic
def lane_sum(typingctx, a, b, r):
    """Lane r of a + b."""
    if not (a == _F32 and b == _F32):
        return None

    def codegen(context, builder, sig, args):
        return builder.extract_element(builder.fadd(args[0], args[1]), args[2])
    return types.float32(a, b, types.intp), codegen


# ----------------------------------------------------------------------------- rows


@kernel(internal=True)
def block_starts(ps, nb):
    """ps[b] = the sum of round_blocks' 8 lanes of block b (ps[8b : 8b + 8]): -offset * sum
    of its q_x, in place (block b's lanes are read before any later write reaches them)."""
    for b in range(nb):
        s = 0
        for l in range(LANES):
            s += ps[b * LANES + l]
        ps[b] = s


@kernel(readonly=("x", "Wg", "bias"), internal=True)
def gemv_groups(x, x_off, Wg, band, bias, y, y_off, accumulate):
    """y[y_off + j] (+)= [bias[j] +] x[x_off : x_off + k] . inputs k0 : k0 + k of row j of the
    grouped matrix Wg (group_rows), j0 <= j < j1, x rounded once; band = (d_in, k0, k, j0,
    j1), k0 and k multiples of 32; bias empty or one a row."""
    d_in, k0, k, j0, j1 = band
    nb = k // QBLOCK
    qs, ps, ds = row_scratch(k)
    size = block_size(Wg)
    chunk = GROUP * size
    round_blocks(x, x_off, nb, qs, ps, ds, Q8_OFFSET if size == 2 + QBLOCK else Q4_OFFSET)
    block_starts(ps, nb)
    W, q, d, st = borrowed(Wg), borrowed(qs), borrowed(ds), borrowed(ps)
    group = d_in // QBLOCK * chunk
    o = k0 // QBLOCK * chunk
    for g in range(j0 // GROUP, (j1 + GROUP - 1) // GROUP):
        p = g * group + o
        a = zeros16()
        e = zeros16()
        b = 0
        while b + 2 <= nb:
            a = group_block(a, W, p + b * chunk, q, b * QBLOCK, st[b], d[b])
            e = group_block(e, W, p + (b + 1) * chunk, q, (b + 1) * QBLOCK, st[b + 1], d[b + 1])
            b += 2
        if b < nb:
            a = group_block(a, W, p + b * chunk, q, b * QBLOCK, st[b], d[b])
        for j in range(max(j0, g * GROUP), min(j1, g * GROUP + GROUP)):
            r = j - g * GROUP
            s = lane_sum(a, e, r)
            if bias.size:
                s += bias[j]
            y[y_off + j] = y[y_off + j] + s if accumulate else s
    keep_alive(qs, ps, ds)


@kernel(readonly=("x", "Wg", "bias"), parallel=True)
def gemv_groups_parallel(x, Wg, d_out, bias, y, accumulate, nthr):
    """y[0:d_out] (+)= x @ W (+ bias): x (d_in,) float32, Wg a matrix's group_rows, bias
    (d_out,) or empty; the groups split into nthr near-equal runs, one a task."""
    ng = (d_out + GROUP - 1) // GROUP
    for t in prange(nthr):
        g0, g1 = t * ng // nthr, (t + 1) * ng // nthr
        if g1 > g0:
            gemv_groups(x, 0, Wg, (x.size, 0, x.size, g0 * GROUP, min(g1 * GROUP, d_out)), bias, y, 0, accumulate)


@kernel(readonly=("Wg",), internal=True)
def group_row(Wg, v, d, out, o):
    """out[o : o + d] = row v of the grouped matrix Wg of d inputs, as float32 values
    d_w * q_w (a stored embedding's row: kernels.wgemm.embed_row)."""
    size = block_size(Wg)
    chunk = GROUP * size
    g, r = v // GROUP, v % GROUP
    for b in range(d // QBLOCK):
        p = (g * (d // QBLOCK) + b) * chunk
        dw = half_load(Wg, p + 2 * r)
        for i in range(QBLOCK):
            if size == 2 + QBLOCK:
                q = np.int32(Wg[p + 2 * GROUP + 4 * (GROUP * (i // 4) + r) + i % 4]) ^ -128
            else:
                t = i % 16
                byte = np.int32(Wg[p + 2 * GROUP + 4 * (GROUP * (t // 4) + r) + t % 4])
                q = ((byte >> 4) if i >= 16 else (byte & 15)) - 8
            out[o + b * QBLOCK + i] = dw * np.float32(q)


# ----------------------------------------------------------------------------- columns for igemm


@intrinsic
def group_weights(typingctx, Wg, p, r, Wu, u):
    """Row r's block in the group's block at Wg[p] as 32 signed q_w, in input order, into
    Wu[u : u + 32] (kernels.igemm's unpacked columns); returns their sum."""
    if not (c_array(Wg, types.int8, types.uint8) and c_array(Wu, types.int8)):
        return None
    q8 = Wg.dtype == types.int8

    def codegen(context, builder, sig, args):
        W, p_, r_, Ua, u_ = args
        nw = (QBLOCK if q8 else QBLOCK // 2) // 4
        v = ir.Constant(_v(_i32, nw), None)
        for t in range(nw):
            at = builder.add(p_, builder.add(ir.Constant(p_.type, 2 * GROUP + 4 * GROUP * t),
                                              builder.mul(r_, ir.Constant(r_.type, 4))))
            word = builder.load(ptr_to(context, builder, sig.args[0], W, at, _i32), align=1)
            v = builder.insert_element(v, word, ir.Constant(_i32, t))
        w = builder.bitcast(v, _v(_i8, 4 * nw))
        if q8:
            w = builder.xor(w, ir_splat(builder, ir.Constant(_i8, 0x80), w.type))
        else:
            lo = builder.and_(w, ir_splat(builder, ir.Constant(_i8, 15), w.type))
            hi = builder.lshr(w, ir_splat(builder, ir.Constant(_i8, 4), w.type))
            w = builder.sub(builder.shuffle_vector(lo, hi, ir.Constant(_v(_i32, QBLOCK), list(range(QBLOCK)))),
                            ir_splat(builder, ir.Constant(_i8, 8), _v(_i8, QBLOCK)))
        builder.store(w, ptr_to(context, builder, sig.args[3], Ua, u_, _v(_i8, QBLOCK)), align=1)
        return call_fn(builder, "llvm.vector.reduce.add.v32i32", _i32, [builder.sext(w, _v(_i32, QBLOCK))])
    return types.int32(Wg, types.intp, types.intp, Wu, types.intp), codegen


@kernel(readonly=("Wg",), internal=True)
def group_columns(Wg, band, Wu, dw, corr):
    """kernels.igemm.prepare_columns for a grouped matrix: for columns j0 <= j < j1 of the
    band (d_in, k0, k, j0, j1), jj = j - j0, dw[jj nb + b] the block's d_w, corr[jj nb + b]
    = -128 sum_t q_w and Wu[jj k + 32 b + t] = q_w."""
    d_in, k0, k, j0, j1 = band
    nb = k // QBLOCK
    chunk = GROUP * block_size(Wg)
    group = d_in // QBLOCK * chunk
    o = k0 // QBLOCK * chunk
    for jj in range(j1 - j0):
        g, r = (j0 + jj) // GROUP, (j0 + jj) % GROUP
        for b in range(nb):
            p = g * group + o + b * chunk
            dw[jj * nb + b] = half_load(Wg, p + 2 * r)
            corr[jj * nb + b] = -128 * group_weights(Wg, p, r, Wu, jj * k + b * QBLOCK)
