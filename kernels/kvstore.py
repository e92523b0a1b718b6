"""KV caches in a stored format (tblock.kvcache: bf16, int8): the rounding of the new keys
and values as a cached call writes them, and attention over the stored bytes.

The cache's arrays say its format, as kernels.widen's do for weights: K and V of float32
(or float64) for fp32, uint16 for bf16, int8 for int8.  Numba compiles per argument type,
so the block builds the format it is given, and the dispatchers here (cache_new_rows,
cache_first, attend_cache) send a float cache to kernels.stages' tasks unchanged: an fp32
cache runs the code it ran before, bit for bit.

A stored cache keeps the fp32 cache's K^T panels of NR keys (NR of float32) and V rows of
d_k rounded up to 16, per (sequence, head); int8 keeps each float32 scale in the same
array, beside its values (``extra`` = 4 bytes): a panel's d_k rows of NR bytes are followed
by its NR keys' scales, a V row by its scale (tblock.kvcache's layout).  A cached call with
one writes the new rows first, rounded, then attends over the cache (stored_rows): every
key and value it reads is the stored one, the new tokens' own included.  stored_rows
takes its queries one at a time; a decode step has one a head, and a prefill through a
stored cache pays for the simpler loop.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from .attention import LOG2E, softmax_update
from .layout import panels, take, take_f64, up16
from .options import kernel
from .records import KV, Att, FlashWork, Rows
from .simd import (PANEL_VECTORS, VECTOR_BYTES, Vec, elem_ptr, lanes, panel_lanes, pbcast, psplat, pstore, vadd,
                   vfma, vload, vload_n, vmul, vsplat, vstore, vstore_n)
from .stages import attention_work, cache_packed_task, cache_rows_task, cached_attention_task, query_tile, seq_at
from .tiles import BK, BQ
from .widen import bf16_load, i8_load

_PANEL_F32 = Vec(types.float32, PANEL_VECTORS * VECTOR_BYTES // 4)


def is_stored(A) -> bool:
    """Whether a cache array's numba type is a stored format's (uint16: bf16, int8: int8)."""
    return isinstance(A, types.Array) and A.dtype in (types.uint16, types.int8)


# ----------------------------------------------------------------------------- loads


@intrinsic
def pwiden(typingctx, A, i):
    """The float32 panel vector (panel_lanes of float32) of A[i : i + NR]: bf16 bits
    (uint16) shifted into a float32's top half, or int8 sign-extended and converted."""
    if not is_stored(A) or not isinstance(i, types.Integer):
        return None
    n = _PANEL_F32.lanes
    bits = 16 if A.dtype == types.uint16 else 8

    def codegen(context, builder, sig, args):
        p = builder.bitcast(elem_ptr(context, builder, sig.args[0], args[0], args[1]),
                            ir.VectorType(ir.IntType(bits), n).as_pointer())
        v = builder.load(p, align=bits // 8)
        if bits == 8:
            return builder.sitofp(v, ir.VectorType(ir.FloatType(), n))
        i32 = ir.VectorType(ir.IntType(32), n)
        wide = builder.shl(builder.zext(v, i32), ir.Constant(i32, [16] * n))
        return builder.bitcast(wide, ir.VectorType(ir.FloatType(), n))
    return _PANEL_F32(A, types.intp), codegen


def vwiden(A, i):
    """The float32 vector (lanes of float32) of the stored A[i : i + W] (kernels.widen)."""


@overload(vwiden, inline="always")
def _vwiden(A, i):
    if isinstance(A, types.Array) and A.dtype == types.uint16:
        return lambda A, i: bf16_load(A, i)
    if isinstance(A, types.Array) and A.dtype == types.int8:
        return lambda A, i: i8_load(A, i)
    return None


def _byte_ptr(context, builder, arrty, arr, i, vty):
    """A pointer to a value of LLVM type vty at byte offset i of an integer array's data."""
    p = builder.bitcast(elem_ptr(context, builder, arrty, arr, ir.Constant(ir.IntType(64), 0)), ir.IntType(8).as_pointer())
    return builder.bitcast(builder.gep(p, [i]), vty.as_pointer())


@intrinsic
def f32_at(typingctx, A, i):
    """The float32 at byte offset i of the stored array A (an int8 cache's scale)."""
    if not is_stored(A) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], ir.FloatType()), align=1)
    return types.float32(A, types.intp), codegen


@intrinsic
def f32_put(typingctx, A, i, x):
    """Store the float32 x at byte offset i of the stored array A."""
    if not is_stored(A) or not isinstance(i, types.Integer) or x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _byte_ptr(context, builder, sig.args[0], args[0], args[1], ir.FloatType()), align=1)
        return context.get_dummy_value()
    return types.none(A, types.intp, types.float32), codegen


@intrinsic
def pscales(typingctx, A, i):
    """The float32 panel vector (NR scales) at byte offset i of the stored array A."""
    if not is_stored(A) or not isinstance(i, types.Integer):
        return None
    vty = ir.VectorType(ir.FloatType(), _PANEL_F32.lanes)

    def codegen(context, builder, sig, args):
        return builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], vty), align=1)
    return _PANEL_F32(A, types.intp), codegen


@kernel(internal=True, inline="always")
def scale_bytes(A):
    """The bytes of a scale beside each key and value row of a cache of A's type: 4 for
    int8, 0 for bf16."""
    return 4 if A.itemsize == 1 else 0


@intrinsic
def f32_bits(typingctx, x):
    """The bits of the float32 x as a uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(x), codegen


# ----------------------------------------------------------------------------- rounding
# compiled without fast-math: the division, the product and rint must be IEEE's own, the
# bits tblock.kvcache's numpy rounding gives


@kernel(fastmath=False, internal=True)
def round_bf16(src, off, n, dst, d_off, step):
    """dst[d_off + c*step] = src[off + c] (float32) rounded to the nearest bf16, ties to
    even, for c < n; returns 0 (no scale)."""
    for c in range(n):
        u = np.int64(f32_bits(src[off + c]))
        dst[d_off + c * step] = np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)
    return np.float32(0.0)


@kernel(fastmath=False, internal=True)
def round_int8(src, off, n, dst, d_off, step):
    """The row src[off : off + n] (float32) as int8 q at dst[d_off + c*step] and its scale
    d, returned: amax = max|x|; d = amax / 127, q = rint(x * (127 / amax)); d = q = 0 when
    127 / amax is not finite (amax == 0, or below 127 / FLT_MAX)."""
    amax = np.float32(0.0)
    for c in range(n):
        amax = max(amax, abs(src[off + c]))
    inv = np.float32(127.0) / amax
    if not math.isfinite(inv):
        for c in range(n):
            dst[d_off + c * step] = 0
        return np.float32(0.0)
    for c in range(n):
        dst[d_off + c * step] = np.int8(np.rint(src[off + c] * inv))
    return amax / np.float32(127.0)


def round_into(src, off, n, dst, d_off, step):
    """round_bf16 or round_int8, as dst's type says."""


@overload(round_into, inline="always")
def _round_into(src, off, n, dst, d_off, step):
    if isinstance(dst, types.Array) and dst.dtype == types.uint16:
        return lambda src, off, n, dst, d_off, step: round_bf16(src, off, n, dst, d_off, step)
    if isinstance(dst, types.Array) and dst.dtype == types.int8:
        return lambda src, off, n, dst, d_off, step: round_int8(src, off, n, dst, d_off, step)
    return None


# ----------------------------------------------------------------------------- the tasks


@kernel(standalone=True, internal=True)
def stored_rows_task(qkv, dims, t, cache):
    """cache_rows_task for a stored cache: the keys and values of the T new rows of K/V
    head h = t % kv_heads of sequence b = t // kv_heads, from (B*T, 3d) rows [Q | K | V],
    rounded into the cache at tokens past..past+T-1 (int8: each row's scale beside it;
    a ragged step's sequence b: the cache's sequence and past of seq_at)."""
    Kc, Vc, max_T = cache.K, cache.V, cache.max_T
    T, d = dims.T, dims.d
    NR = panel_lanes(qkv)
    extra = scale_bytes(Kc)
    dk = d // dims.n_heads
    kst = (dk + extra) * NR                 # a K^T panel, its scales included
    ldv = up16(dk) + extra
    b = t // dims.kv_heads
    h = t % dims.kv_heads
    seq, past = seq_at(cache, b)
    head = seq * dims.kv_heads + h              # the cache's (sequence, K/V head)
    for i in range(T):
        src = (b * T + i) * (3 * d) + h * dk
        p = past + i
        pan = head * panels(max_T, NR) * kst + (p // NR) * kst
        s = round_into(qkv, src + d, dk, Kc, pan + p % NR, NR)
        if extra:
            f32_put(Kc, pan + dk * NR + 4 * (p % NR), s)
        row = (head * max_T + p) * ldv
        s = round_into(qkv, src + 2 * d, dk, Vc, row, 1)
        if extra:
            f32_put(Vc, row + up16(dk), s)


@kernel(standalone=True, internal=True)
def stored_attention_task(q, ldq, dims, t, cache, work, w_pos):
    """attention_task for a stored cache (the same tasks, scratch and numbering): one
    query tile of one head of one sequence, over the cache's keys 0..past+T-1 (seq_at's
    sequence and past: a ragged step's own)."""
    max_T = cache.max_T
    T, d, n_heads = dims.T, dims.d, dims.n_heads
    NR = panel_lanes(q)
    dk = d // n_heads
    extra = scale_bytes(cache.K)
    ldv = up16(dk) + extra
    b, h, q0, q1 = query_tile(t, T, n_heads)
    seq, past = seq_at(cache, b)
    bh = seq * dims.kv_heads + h // (n_heads // dims.kv_heads)     # the K/V head it reads
    m = q1 - q0
    keys = past + T
    bk = min(BK, panels(keys, NR) * NR)
    pos = w_pos + t * attention_work(min(T, BQ), cache.past + T, dk, NR, q.itemsize) if work.size > 0 else 0
    Qt, pos = take(work, pos, m * dk)
    S, pos = take(work, pos, bk)
    O, pos = take(work, pos, m * panels(dk, NR) * NR)
    mrow, pos = take_f64(work, pos, m)
    lrow, pos = take_f64(work, pos, m)
    kv = KV(bh * panels(max_T, NR) * (dk + extra) * NR, bh * max_T * ldv, ldv)
    att = Att(past + q0, past + q1, keys, dk, True, 1.0 / np.sqrt(dk), bk)
    stored_rows(q, Rows((b * T - past) * ldq + h * dk, ldq), cache, kv, att, FlashWork(Qt, S, O, mrow, lrow),
                Rows((b * T + q0) * ldq + h * dk, ldq))


@kernel(standalone=True, internal=True)
def stored_rows(X, q, cache, kv, att, work, o):
    """The causal attention output of queries att.q0:att.q1 (tokens) of one head over a
    stored cache, written to X.flat[o.off + i*o.ld + c] (over the queries' own columns:
    Q is copied out first).  Q[t, c] = X.flat[q.off + t*q.ld + c]; kv: where the head's
    K^T panels and V rows (kv.ldv apart) start in cache.K, cache.V (int8: the scales
    beside them, module docstring).  Query t sees keys
    0..t, in tiles of att.bk: scores, softmax_update, O += P V, as flash_rows's one-query
    tiles.  work: FlashWork, O's rows panels(dk, NR) * NR apart."""
    Qt, S, O, mrow, lrow = work
    K, V = cache.K, cache.V
    W = lanes(S)
    NR = panel_lanes(S)
    dk, m = att.dk, att.q1 - att.q0
    ldo = panels(dk, NR) * NR
    extra = scale_bytes(K)
    step = (dk + extra) * NR                # elements of one K^T panel, its scales included
    vc2 = vsplat(S, att.scale * LOG2E)
    zero = vsplat(O, 0.0)
    for i in range(m):
        for c in range(0, dk, W):
            vstore_n(Qt, i * dk + c, vload_n(X, q.off + (att.q0 + i) * q.ld + c, dk - c), dk - c)
        mrow[i] = -math.inf
        lrow[i] = 0.0
        for c in range(0, ldo, W):
            vstore(O, i * ldo + c, zero)
    for i in range(m):
        kv_end = att.q0 + i + 1
        for k0 in range(0, kv_end, att.bk):
            kn = min(att.bk, kv_end - k0)
            npn = panels(kn, NR)
            pb = kv.kt + k0 // NR * step
            for p in range(0, npn, 2):
                p2 = min(p + 1, npn - 1)        # an odd count: the last panel twice
                a0 = a1 = psplat(S, 0.0)
                for c in range(dk):
                    qc = pbcast(Qt, i * dk + c)
                    a0 = vfma(qc, pwiden(K, pb + p * step + c * NR), a0)
                    a1 = vfma(qc, pwiden(K, pb + p2 * step + c * NR), a1)
                if extra:                       # int8: each key's score times its scale
                    a0 = vmul(a0, pscales(K, pb + p * step + dk * NR))
                    a1 = vmul(a1, pscales(K, pb + p2 * step + dk * NR))
                pstore(S, p * NR, a0)
                pstore(S, p2 * NR, a1)
            softmax_update(work, 0, kn, kn, i, ldo, vc2, att.scale)
            if extra:                           # int8: P times each value row's scale
                vs = kv.v + k0 * kv.ldv + up16(dk)
                for j in range(kn):
                    S[j] *= f32_at(V, vs + j * kv.ldv)
            _pv(S, V, kv, k0, kn, dk, O, i * ldo)
    for i in range(m):
        vinv = vsplat(O, 1.0 / lrow[i])
        for c in range(0, dk, W):
            vstore_n(X, o.off + i * o.ld + c, vmul(vload(O, i * ldo + c), vinv), dk - c)


# not inline="always": inlined after softmax_update (inlined too), Numba lost that
# function's early-return update of lrow (queries past the first key tile were wrong)
@kernel(internal=True)
def _pv(S, V, kv, k0, kn, dk, O, ob):
    """O[ob : ob + dk] += sum_j S[j] V[k0 + j] over the kn stored rows of keys k0.. (kv:
    the head's rows, kv.ldv apart), W columns at a time: four chains of FMAs (keys j mod
    4), each waiting on its own latency only.  A row's W-wide loads stay inside its values
    (d_k rounded up to 16)."""
    W = lanes(O)
    ldv = kv.ldv
    vb = kv.v + k0 * ldv
    n4 = kn // 4 * 4
    for c in range(0, dk, W):
        o0 = o1 = o2 = o3 = vsplat(O, 0.0)
        for j in range(0, n4, 4):
            r = vb + j * ldv + c
            o0 = vfma(vsplat(O, S[j]), vwiden(V, r), o0)
            o1 = vfma(vsplat(O, S[j + 1]), vwiden(V, r + ldv), o1)
            o2 = vfma(vsplat(O, S[j + 2]), vwiden(V, r + 2 * ldv), o2)
            o3 = vfma(vsplat(O, S[j + 3]), vwiden(V, r + 3 * ldv), o3)
        for j in range(n4, kn):
            o0 = vfma(vsplat(O, S[j]), vwiden(V, vb + j * ldv + c), o0)
        vstore(O, ob + c, vadd(vload(O, ob + c), vadd(vadd(o0, o1), vadd(o2, o3))))


# ----------------------------------------------------------------------------- dispatch
# The block's stages call these with its Cache record; a float cache reaches stages' own
# tasks, a stored one the tasks above.


def cache_new_rows(qkv, dims, t, cache):
    """The new rows' keys and values into the cache (stages.cache_rows_task's arguments)."""


@overload(cache_new_rows, inline="always")
def _cache_new_rows(qkv, dims, t, cache):
    if is_stored(cache.types[0]):
        return lambda qkv, dims, t, cache: stored_rows_task(qkv, dims, t, cache)
    return lambda qkv, dims, t, cache: cache_rows_task(qkv, dims, t, cache)


def cache_first(kt, vp, dims, t, cache):
    """A first chunk's packed keys and values copied into a float cache
    (stages.cache_packed_task); nothing for a stored one, which never takes that path."""


@overload(cache_first, inline="always")
def _cache_first(kt, vp, dims, t, cache):
    if is_stored(cache.types[0]):
        return lambda kt, vp, dims, t, cache: None
    return lambda kt, vp, dims, t, cache: cache_packed_task(kt, vp, dims, t, cache)


def attend_cache(q, ldq, dims, t, cache, work, w_pos):
    """Task t of the ATTEND_CACHED stage (stages.cached_attention_tasks) over the cache's
    keys and values, whatever their format."""


@overload(attend_cache, inline="always")
def _attend_cache(q, ldq, dims, t, cache, work, w_pos):
    if is_stored(cache.types[0]):
        return lambda q, ldq, dims, t, cache, work, w_pos: stored_attention_task(q, ldq, dims, t, cache, work, w_pos)
    return lambda q, ldq, dims, t, cache, work, w_pos: cached_attention_task(q, ldq, dims, t, cache, work, w_pos)
