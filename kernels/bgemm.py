"""bf16 GEMM: C (+)= [bias +] bf16(A) @ W, W stored bf16, products summed in float32.

The many-row product with bf16 weights (a prefill's projections) as AVX512_BF16 computes
it: vdpbf16ps multiplies pairs of bf16 and adds both products to a float32 lane, 32
multiply-adds per zmm instruction where an fp32 FMA does 16.  Its inputs are rounded:

    A    each float32 rounded to bf16, to nearest even; a float32 subnormal becomes +-0
         and a NaN stays a NaN (as vcvtne2ps2bf16 rounds, which does it where it exists)
    W    the stored bf16 (tblock.formats), a bf16 subnormal taken as +-0 (vdpbf16ps
         reads its inputs so: DAZ); pack_bf16_panels flushes them, so every path sees it

What vdpbf16ps computes per lane j (Intel SDM): acc += b[2j+1] * a[1], then acc +=
b[2j] * a[0], each a float32 FMA rounded to nearest even, subnormal results flushed to
zero (FTZ).  A product of two bf16 is exact in float32, so each step rounds once.  Paths
without AVX512_BF16 (avx2, generic, an avx512 CPU without it) widen both bf16 of a pair to
float32 and do the same two FMAs in the same order: the same sums bit for bit, except
where an intermediate sum is subnormal (flushed there, kept here).

Layout (records: Rows, Panels, Tile, in uint32 units for the packed operands)
  * W: packed once (pack_bf16_panels) into panels of NR columns, NR the float32 GEMM's
    (gemm.panel_width(float32): a Tile's panels are the same columns in both); panel p
    holds pair rows r = 0 .. ceil(K/2) - 1, each NR uint32 of (W[2r, j] | W[2r+1, j] << 16),
    zero past K and past N; a band of k rows starts at an even k.
  * A: rounded into a scratch of bf16 pairs (pack_pairs), one uint32 per (row, k pair),
    rows of whole vectors (pair_stride): the micro-kernel broadcasts one pair per row.
    bgemm_rows rounds all rows once; bgemm_panels, a task's rows for itself; the block's
    stages round a stage's rows once for all of its tasks (wgemm.pair_rows).
  * C, bias: float32; only the valid m x n corner of a micro-tile is written; the bias is
    read as whole panels (padded as layout.bias_len pads it).

The micro-kernel keeps MR x NV vectors of C in registers, as gemm.py's (6 x 4 zmm on
avx512): per k pair it loads one pair row of the panel (NV vectors) and broadcasts MR
pairs of A into MR x NV vdpbf16ps.

    pack_bf16_panels, bf16_packed_size   W's packed form (a prepare step, numpy)
    pair_stride, pack_pairs              A's rows as pairs
    bf16_rows                            A's rows rounded so, as float32 (a head's rows)
    bgemm_packed(Ap, ap, Bp, b, C, c, tile, accumulate, bias, bias_off)   a task, A in pairs
    bgemm_panels(A, a, Bp, b, C, c, tile, accumulate, bias, bias_off)     a task, A float32
    bgemm_rows                           a whole product on nthr threads
    bgemm                                the same from Python, with its arguments checked
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import get_num_threads, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from .isa import PATH
from .layout import ceil_div, panels, row_piece, stage_grid, task_tile
from .options import kernel
from .records import Panels, Rows
from .simd import (VECTOR_BYTES, Vec, elem_ptr, ir_splat, pload, pload_n, psplat, pstore, pstore_n, vadd, vload,
                   vload_n)
from .tiles import MC, MR, NV

L = VECTOR_BYTES // 4            # float32 lanes of one vector
NR = NV * L                      # columns of a panel: the float32 GEMM's
KCP = 512                        # k pairs per block (all of K = 768 and 1024): the panel's
                                 # slice streams from L2 at the micro-kernel's pace (NR pairs
                                 # per MR x NV dots), so an L1-sized block saved nothing and
                                 # cost a store and a reload of C per block (docs/perf-log.md)
_F = Vec(types.float32, NR)      # a panel vector of float32 (simd's pload type)
_I = Vec(types.int32, NR)        # a panel vector of bf16 pairs


BF16_DOT = PATH.bf16_dot
# rows per micro-tile: MR with vdpbf16ps; 4 where a pair row is widened into two float32
# rows, which take twice the registers (six rows spilled)
ROWS = MR if BF16_DOT else 4


# ----------------------------------------------------------------------------- intrinsics


class _BFloat(ir.Type):
    """LLVM's bfloat (llvmlite has no such type): the dpbf16ps intrinsic's operands."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


def _is_u32(a):
    return isinstance(a, types.Array) and a.dtype == types.uint32


def _chunk(builder, v, i, n):
    """Lanes i*n .. i*n + n - 1 of v."""
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(i * n, i * n + n))))


def _concat(builder, parts):
    """One vector of the parts (equal lengths, a power of two of them), in order."""
    while len(parts) > 1:
        n = parts[0].type.count
        idx = ir.Constant(ir.VectorType(ir.IntType(32), 2 * n), list(range(2 * n)))
        parts = [builder.shuffle_vector(parts[i], parts[i + 1], idx) for i in range(0, len(parts), 2)]
    return parts[0]


def _dpbf16(builder, acc, b, a):
    """vdpbf16ps on one zmm: acc <16 x float>, b and a <16 x i32> of bf16 pairs."""
    f32x16 = acc.type
    bf = ir.VectorType(_BFloat(), 32)
    fnty = ir.FunctionType(f32x16, [f32x16, bf, bf])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512bf16.dpbf16ps.512")
    return builder.call(fn, [acc, builder.bitcast(b, bf), builder.bitcast(a, bf)])


def _widen_dot(builder, acc, b, a):
    """acc + b's high bf16 * a's high, then + the low ones, in float32 FMAs: vdpbf16ps's
    order and roundings (a product of two bf16 is exact) without its flushes."""
    i32 = b.type
    f32 = acc.type
    sixteen = ir_splat(builder, ir.Constant(ir.IntType(32), 16), i32)
    top = ir_splat(builder, ir.Constant(ir.IntType(32), 0xFFFF0000 - (1 << 32)), i32)
    a = ir_splat(builder, a, i32)
    hi = lambda v: builder.bitcast(builder.and_(v, top), f32)
    lo = lambda v: builder.bitcast(builder.shl(v, sixteen), f32)
    fma = "fma" if PATH.fma else "fmuladd"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), f"llvm.{fma}.v{f32.count}f32")
    acc = builder.call(fn, [hi(b), hi(a), acc])
    return builder.call(fn, [lo(b), lo(a), acc])


@intrinsic
def pair_load(typingctx, Bp, i):
    """The panel vector of bf16 pairs Bp[i : i + NR] (Bp: uint32)."""
    if not _is_u32(Bp) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        p = elem_ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.load(builder.bitcast(p, context.get_value_type(_I).as_pointer()), align=4)
    return _I(Bp, types.intp), codegen


@intrinsic
def pair_dot(typingctx, acc, b, Ap, i):
    """acc + the pair products of the pair row b and the pair Ap[i] broadcast: lane j
    gains b_hi[j] * a_hi + b_lo[j] * a_lo (module docstring: vdpbf16ps or two FMAs)."""
    if acc != _F or b != _I or not _is_u32(Ap) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        accv, bv = args[0], args[1]
        a = builder.load(elem_ptr(context, builder, sig.args[2], args[2], args[3]))
        if not BF16_DOT:
            return _widen_dot(builder, accv, bv, a)
        a16 = ir_splat(builder, a, ir.VectorType(ir.IntType(32), 16))
        parts = [_dpbf16(builder, _chunk(builder, accv, q, 16), _chunk(builder, bv, q, 16), a16)
                 for q in range(NR // 16)]
        return _concat(builder, parts)
    return _F(_F, _I, Ap, types.intp), codegen


def _round_bf16(builder, v):
    """<n x i32> whose low halves are the bf16 of the float32 lanes v: nearest even, a
    subnormal to +-0, a NaN quiet (module docstring)."""
    i32 = ir.VectorType(ir.IntType(32), v.type.count)
    c = lambda x: ir_splat(builder, ir.Constant(ir.IntType(32), x), i32)
    u = builder.bitcast(v, i32)
    up = builder.lshr(u, c(16))
    rounded = builder.lshr(builder.add(u, builder.add(c(0x7FFF), builder.and_(up, c(1)))), c(16))
    mag = builder.and_(u, c(0x7FFFFFFF))
    out = builder.select(builder.icmp_unsigned(">", mag, c(0x7F800000)), builder.or_(up, c(0x40)), rounded)
    sub = builder.icmp_unsigned("==", builder.and_(u, c(0x7F800000)), c(0))
    return builder.select(sub, builder.and_(up, c(0x8000)), out)


def _pairs_of(builder, lo, hi):
    """<L x i32>: the bf16 pairs of the 2L float32 lanes lo then hi (lane 2q of lo|hi in
    the low half of pair q), rounded as _round_bf16 says: one vcvtne2ps2bf16 (which rounds
    so) where the target has it."""
    n = lo.type.count
    i32 = ir.VectorType(ir.IntType(32), n)
    if BF16_DOT:
        fnty = ir.FunctionType(ir.VectorType(_BFloat(), 2 * n), [lo.type, lo.type])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512bf16.cvtne2ps2bf16.512")
        return builder.bitcast(builder.call(fn, [hi, lo]), i32)       # its first operand fills the top half
    i16 = ir.VectorType(ir.IntType(16), n)
    halves = [builder.trunc(_round_bf16(builder, v), i16) for v in (lo, hi)]
    both = _concat(builder, halves)
    return builder.bitcast(both, i32)


@intrinsic
def store_pairs(typingctx, lo, hi, Ap, j):
    """Ap[j : j + L] = the float32 vectors lo then hi (2L values) rounded to bf16 pairs."""
    if not isinstance(lo, Vec) or lo.dtype != types.float32 or hi != lo or not _is_u32(Ap):
        return None

    def codegen(context, builder, sig, args):
        pairs = _pairs_of(builder, args[0], args[1])
        p = elem_ptr(context, builder, sig.args[2], args[2], args[3])
        builder.store(pairs, builder.bitcast(p, pairs.type.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(lo, hi, Ap, types.intp), codegen


# ----------------------------------------------------------------------------- packing


def bf16_packed_size(K: int, N: int) -> int:
    """uint32 elements of the packed form of a (K, N) bf16 matrix: whole panels of
    ceil(K / 2) pair rows."""
    return -(-N // NR) * -(-K // 2) * NR


def pack_bf16_panels(W16: np.ndarray, out: np.ndarray) -> None:
    """Write the bf16 matrix W (K, N), given as tblock.formats stores it (uint16 rows of
    W^T: W16 (N, K)), into the flat uint32 ``out`` (bf16_packed_size(K, N) elements or
    more) as pair panels (module docstring); subnormals become +-0."""
    if not isinstance(W16, np.ndarray) or W16.dtype != np.uint16 or W16.ndim != 2 or 0 in W16.shape:
        got = f"{W16.dtype} {W16.shape}" if isinstance(W16, np.ndarray) else type(W16).__name__
        raise ValueError(f"W16 must be a non-empty 2-D uint16 array (bf16 rows, (N, K)), got {got}")
    N, K = W16.shape
    if not isinstance(out, np.ndarray) or out.dtype != np.uint32 or out.ndim != 1 or out.size < bf16_packed_size(K, N):
        got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"out must be 1-D uint32 of at least {bf16_packed_size(K, N)} elements, got {got}")
    Kp, NP = -(-K // 2), -(-N // NR)
    W = np.zeros((NP * NR, 2 * Kp), np.uint32)
    W[:N, :K] = W16
    W[(W & 0x7F80) == 0] &= 0x8000                                      # DAZ: subnormals are +-0
    pairs = W[:, 0::2] | (W[:, 1::2] << 16)                             # (NP*NR, Kp)
    out[:NP * Kp * NR] = pairs.reshape(NP, NR, Kp).transpose(0, 2, 1).reshape(-1)


@kernel
def pair_stride(K):
    """Row stride (uint32) of A rounded to pairs: whole vectors of pairs (2L inputs each)."""
    return -(-K // (2 * L)) * L


@kernel(readonly=("A",))
def pack_pairs(A, a, rows, K, Ap, ap):
    """Rows ap.off + r * ap.ld of Ap = row r of A (a: its Rows) rounded to bf16 pairs, for
    r < rows, over pair_stride(K) pairs: zero past K."""
    for r in range(rows):
        src = a.off + r * a.ld
        dst = ap.off + r * ap.ld
        k = 0
        while k + 2 * L <= K:
            store_pairs(vload(A, src + k), vload(A, src + k + L), Ap, dst + k // 2)
            k += 2 * L
        if k < K:
            store_pairs(vload_n(A, src + k, K - k), vload_n(A, src + k + L, K - k - L), Ap, dst + k // 2)


@kernel(internal=True)
def bf16_bits(u):
    """The float32 bits u (int64, 0 .. 2^32 - 1) rounded to bf16 as A is (module docstring),
    as float32 bits: nearest even, a subnormal to +-0, a NaN quiet."""
    if (u & 0x7F800000) == 0:
        return u & 0x80000000
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u | 0x400000) & 0xFFFF0000
    return (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000


@kernel(readonly=("A",))
def bf16_rows(A, a_off, lda, m, k, out):
    """out[r * k + i] = A[a_off + r * lda + i] rounded to bf16 as A is here (bf16_bits), a
    float32, for r < m, i < k: the inputs of a product with dot "bf16" where the weights
    stay float32 or stored rows (a head, one row)."""
    Au = A.view(np.uint32)
    ou = out.view(np.uint32)
    for r in range(m):
        for i in range(k):
            ou[r * k + i] = bf16_bits(np.int64(Au[a_off + r * lda + i]))


# ----------------------------------------------------------------------------- kernels


@kernel(internal=True)
def _put_row(C, off, n, accumulate, v):
    """C.flat[off : off + n] (+)= v[:n]."""
    if n >= NR:
        if accumulate:
            v = vadd(pload(C, off), v)
        pstore(C, off, v)
    elif n > 0:
        if accumulate:
            v = vadd(pload_n(C, off, n), v)
        pstore_n(C, off, v, n)


@kernel(readonly=("Ap", "Bp", "bias"), internal=True)
def micro_kernel(Ap, a, Bp, b, C, c, mnk, accumulate, bias, bias_off):
    """C[0:m, 0:n] (+)= [bias +] the rows of pairs Ap (a: Rows) @ the pair rows of a panel
    (b: Rows, ld = NR) over kp pairs, mnk = (m, n, kp), m <= MR, n <= NR; with bias_off >= 0
    the sums start from bias[bias_off : bias_off + NR].  Rows past m repeat row 0 and are
    never stored; one row has a loop of its own (a decode step's GEMV), and two to four
    rows another (the last row tile of 64 or 128 rows), so that no dots go to rows that
    are never stored; every loop's sums are the six-row loop's, in the same order."""
    m, n, KP = mnk
    a_off, a_rs = a
    b_off, ldb = b
    c_off, ldc = c
    c0 = pload(bias, bias_off) if bias_off >= 0 else psplat(bias, 0.0)
    if m == 1:
        for k in range(KP):
            c0 = pair_dot(c0, pair_load(Bp, b_off + k * ldb), Ap, a_off + k)
        _put_row(C, c_off, n, accumulate, c0)
        return
    a1 = a_off + a_rs
    a2 = a_off + (2 * a_rs if m > 2 else 0)
    a3 = a_off + (3 * a_rs if m > 3 else 0)
    if m <= 4:
        c1 = c2 = c3 = c0
        for k in range(KP):
            bk = pair_load(Bp, b_off + k * ldb)
            c0 = pair_dot(c0, bk, Ap, a_off + k)
            c1 = pair_dot(c1, bk, Ap, a1 + k)
            c2 = pair_dot(c2, bk, Ap, a2 + k)
            c3 = pair_dot(c3, bk, Ap, a3 + k)
        _put_row(C, c_off, n, accumulate, c0)
        _put_row(C, c_off + ldc, n, accumulate, c1)
        if m > 2:
            _put_row(C, c_off + 2 * ldc, n, accumulate, c2)
        if m > 3:
            _put_row(C, c_off + 3 * ldc, n, accumulate, c3)
        return
    a4 = a_off + (4 * a_rs if m > 4 else 0)
    a5 = a_off + (5 * a_rs if m > 5 else 0)
    c1 = c2 = c3 = c4 = c5 = c0
    for k in range(KP):
        bk = pair_load(Bp, b_off + k * ldb)
        c0 = pair_dot(c0, bk, Ap, a_off + k)
        c1 = pair_dot(c1, bk, Ap, a1 + k)
        c2 = pair_dot(c2, bk, Ap, a2 + k)
        c3 = pair_dot(c3, bk, Ap, a3 + k)
        c4 = pair_dot(c4, bk, Ap, a4 + k)
        c5 = pair_dot(c5, bk, Ap, a5 + k)
    _put_row(C, c_off, n, accumulate, c0)
    _put_row(C, c_off + ldc, n, accumulate, c1)
    if m > 2:
        _put_row(C, c_off + 2 * ldc, n, accumulate, c2)
    if m > 3:
        _put_row(C, c_off + 3 * ldc, n, accumulate, c3)
    if m > 4:
        _put_row(C, c_off + 4 * ldc, n, accumulate, c4)
    if m > 5:
        _put_row(C, c_off + 5 * ldc, n, accumulate, c5)


@kernel(internal=True)
def tile_rows(left):
    """Rows of the next micro-tile with ``left`` rows to go: ROWS, but the last eight as two
    of four (a six, then a two in the four-row loop, did ten rows' dots for eight: T =
    128); the sums are the same in any loop."""
    if ROWS == MR and left == MR + 2:
        return 4
    return min(ROWS, left)


@kernel(readonly=("Ap", "Bp", "bias"), standalone=True)
def bgemm_packed(Ap, ap, Bp, b, C, c, tile, accumulate, bias, bias_off):
    """C[tile] (+)= [bias +] A[rows of tile] @ B, serially, with A already in pairs: row i
    at Ap[ap.off + i * ap.ld] (pack_pairs); b the Panels of B in the packed uint32 Bp
    (off, ld in uint32; b.k inputs: a band of pair rows of a taller matrix, with its
    panel stride); c the Rows of C (float32); tile its rows and column panels.
    bias_off >= 0: column j's bias is bias[bias_off + j], read as whole panels.

    As gemm_panels: panels, then k blocks of KCP pairs, then micro row-tiles (the row
    tiles share the panel's slice, from L2)."""
    i0, i1, p0, p1 = tile
    KP = ceil_div(b.k, 2)
    for p in range(p0, p1):
        n = min(NR, b.n - p * NR)
        for kc0 in range(0, KP, KCP):
            acc = accumulate or kc0 > 0
            bo = bias_off + p * NR if bias_off >= 0 and kc0 == 0 else -1
            pb = Rows(b.off + p * b.ld + kc0 * NR, NR)
            i = i0
            while i < i1:
                m = tile_rows(i1 - i)
                micro_kernel(Ap, Rows(ap.off + i * ap.ld + kc0, ap.ld), Bp, pb, C,
                             Rows(c.off + i * c.ld + p * NR, c.ld), (m, n, min(KCP, KP - kc0)), acc, bias, bo)
                i += m


@kernel(readonly=("A", "Bp", "bias"), standalone=True)
def bgemm_panels(A, a, Bp, b, C, c, tile, accumulate, bias, bias_off):
    """bgemm_packed with A float32 (a: its Rows): the tile's rows rounded to pairs first,
    into a scratch of the task's own.  For a task that is alone in reading its rows; tasks
    that share rows (a stage split by columns) pack them once instead (bgemm_rows)."""
    rows = tile.i1 - tile.i0
    ldp = pair_stride(b.k)
    Ap = np.empty(rows * ldp, dtype=np.uint32)
    pack_pairs(A, Rows(a.off + tile.i0 * a.ld, a.ld), rows, b.k, Ap, Rows(0, ldp))
    bgemm_packed(Ap, Rows(-tile.i0 * ldp, ldp), Bp, b, C, c, tile, accumulate, bias, bias_off)


@kernel(readonly=("A", "Bp", "bias"), parallel=True)
def bgemm_rows(A, a, Bp, b, C, c, rows, accumulate, bias, nthr):
    """C[0:rows] (+)= [bias +] bf16(A[0:rows]) @ B on nthr threads: A's rows rounded to
    pairs once, a share a thread, then the tasks of the block's QKV and W_O stages
    (layout.stage_grid; with few rows, one column panel each, all reading every row).
    bias: float32 of whole panels (N rounded up to NR), empty for none.  a, b, c: plain
    tuples of Rows' and Panels' fields (records.py: what Python passes)."""
    a, b, c = Rows(a[0], a[1]), Panels(b[0], b[1], b[2], b[3]), Rows(c[0], c[1])
    ldp = pair_stride(b.k)
    Ap = np.empty(rows * ldp, dtype=np.uint32)
    for t in prange(nthr):
        r0, r1 = row_piece(t, nthr, rows)
        pack_pairs(A, Rows(a.off + r0 * a.ld, a.ld), r1 - r0, b.k, Ap, Rows(r0 * ldp, ldp))
    npn = panels(b.n, NR)
    mc, groups, ntasks = stage_grid(rows, npn, MC, nthr, 1)
    for t in prange(ntasks):
        bgemm_packed(Ap, Rows(0, ldp), Bp, b, C, c, task_tile(t, groups, mc, rows, npn), accumulate, bias,
                     0 if bias.size > 0 else -1)


# ----------------------------------------------------------------------------- from Python


def _check_f32(name, x, ndim):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype != np.float32 or x.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D float32 array, got {x.ndim}-D {x.dtype}")
    if ndim == 2 and x.shape[0] > 0 and (x.strides[1] != 4 or x.strides[0] % 4 or x.strides[0] < 4 * x.shape[1]):
        raise ValueError(f"{name} must have contiguous rows (a row stride of at least its width), "
                         f"got strides {x.strides}")


def _flat(x):
    """A 1-D view of the 2-D x from x[0, 0] to its last element (rows lda apart), and lda."""
    lda = x.strides[0] // 4
    n = (x.shape[0] - 1) * lda + x.shape[1]
    return np.lib.stride_tricks.as_strided(x, shape=(n,), strides=(4,)), lda


def bgemm(A, Bp, K, N, C, bias=None, accumulate=False, nthr=None):
    """C (+)= [bias +] bf16(A) @ W for A (M, K) and C (M, N) float32 with contiguous rows
    (any row strides), Bp W's pack_bf16_panels form, bias (N,) float32 or None; on nthr
    threads (numba's count when None)."""
    _check_f32("A", A, 2)
    _check_f32("C", C, 2)
    for name, v in (("K", K), ("N", N)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not C.flags.writeable:
        raise ValueError("C must be writeable, got a read-only array")
    if A.shape[1] != K or C.shape != (A.shape[0], N):
        raise ValueError(f"A must be (M, {K}) and C (M, {N}); got A {A.shape}, C {C.shape}")
    if not isinstance(Bp, np.ndarray) or Bp.dtype != np.uint32 or Bp.ndim != 1 or Bp.size < bf16_packed_size(K, N):
        got = f"{Bp.dtype} {Bp.shape}" if isinstance(Bp, np.ndarray) else type(Bp).__name__
        raise ValueError(f"Bp must be 1-D uint32 of at least {bf16_packed_size(K, N)} elements "
                         f"(pack_bf16_panels of a ({K}, {N}) matrix), got {got}")
    padded = np.zeros(0, np.float32)
    if bias is not None:
        _check_f32("bias", bias, 1)
        if bias.shape != (N,):
            raise ValueError(f"bias must be ({N},), got {bias.shape}")
        padded = np.zeros(-(-N // NR) * NR, np.float32)
        padded[:N] = bias
    if A.shape[0] == 0:
        return C
    a, lda = _flat(A)
    cf, ldc = _flat(C)
    bgemm_rows(a, (0, lda), Bp, (0, -(-K // 2) * NR, K, N), cf, (0, ldc), A.shape[0], bool(accumulate), padded,
               nthr or get_num_threads())
    return C
