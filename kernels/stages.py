"""The tasks of the block's stages: each computes one piece of one stage (a row block and
a group of column panels of a projection, a query tile of one head, a slice of rows of a
LayerNorm) with the serial kernels of this package, into buffers it shares with the other
tasks of its stage.  ``block`` runs them in order, in parallel within a stage; ``layout``
holds their tile and stride arithmetic; the FFN's tasks are ``ffn``'s.

Grouped-query attention: K and V have kv_heads heads of d_k (d_kv columns); query head h
of sequence b reads K/V head (b, h // group), group = n_heads // kv_heads, and packed or
cached keys and values are kept per (sequence, K/V head), numbered b * kv_heads + g.
"""

from __future__ import annotations

import numpy as np

from .attention import attention_rows_direct, flash_rows, pack_kt, pack_rows
from .bgemm import pair_stride
from .layernorm import layernorm_rows
from .layout import (block_layout, ceil_div, kt_len, norm_offsets, panels, qkv_parts, row_piece, take, take_f64,
                     up16, v_stride)
from .options import borrowed, keep_alive, kernel
from .records import KV, Att, FlashWork, Pairs, Panels, Rows, Tile
from .simd import lanes, panel_lanes, vadd, vload_n, vsplat, vstore_n
from .tiles import BK, BQ, QSUB
from .wgemm import floats, wgemm_block


@kernel(readonly=("X", "P"), internal=True)
def copy_add(X, x_off, Y, y_off, n, P, p_off, add):
    """Y.flat[y_off : y_off+n] = X.flat[x_off : x_off+n] (+ P.flat[p_off : p_off+n] if add);
    Y may be X."""
    W = lanes(X)
    for j in range(0, n, W):
        v = vload_n(X, x_off + j, n - j)
        if add:
            v = vadd(v, vload_n(P, p_off + j, n - j))
        vstore_n(Y, y_off + j, v, n - j)


@kernel(readonly=("X", "P"), standalone=True, internal=True)
def layernorm_piece(X, Y, t, pieces, rows, d, P, g_off, b_off, eps):
    """Piece t of ``pieces`` equal row ranges of a LayerNorm over (rows, d): Y = LN(X)."""
    r0, r1 = row_piece(t, pieces, rows)
    layernorm_rows(X, Rows(r0 * d, d), Y, Rows(r0 * d, d), r1 - r0, d, P, g_off, b_off, eps)


@kernel(readonly=("H", "Wf"), standalone=True, internal=True)
def out_proj_task(H, Wf, dims, tile, bufs):
    """Task of stage 3: the tile of out = H + q @ W_O + b_o, q the heads' outputs (bufs:
    Output; the residual is the GEMM's initial C)."""
    NR = panel_lanes(floats(Wf))
    d = dims.d
    layout = block_layout(dims, NR)
    o_o, o_bo = layout[1], layout[11]
    c0 = tile.p0 * NR
    c1 = min(d, tile.p1 * NR)
    for r in range(tile.i0, tile.i1):
        copy_add(H, r * d + c0, bufs.out, r * d + c0, c1 - c0, floats(Wf), 0, False)
    wgemm_block(bufs.q, Rows(0, bufs.ldq), Wf, Panels(o_o, d * NR, d, d), bufs.out, Rows(0, d), tile, True, o_bo)


@kernel(internal=True)
def attention_buffers(like, nseq, T, dk, heads):
    """Room for the packed K^T (pack_kt's panels) and V (rows of ldv, zero past d_k) of
    every (sequence, K/V head), ``heads`` K/V heads of dk a sequence, in the dtype of
    ``like``; see attention_task."""
    NR = panel_lanes(like)
    ktn = kt_len(T, dk, NR)
    ldv = v_stride(dk, NR)
    nbh = nseq * heads
    return np.empty(nbh * ktn, dtype=like.dtype), np.empty(nbh * T * ldv, dtype=like.dtype)


@kernel
def store_kt(S, lds, r0, r1, c0, c1, T, n_heads, dk, Kt):
    """Columns c0..c1 (of n_heads heads of dk: the K/V heads) of the K rows r0..r1
    (tokens of all sequences; K[r, c] is
    S.flat[(r - r0) * lds + c - c0]) into the K^T panels of their heads
    (pack_kt's layout); the row that ends a sequence also zeroes the keys past T of its
    last panel.  Stores run along the keys, contiguous within a panel."""
    NR = panel_lanes(Kt)
    ktn = kt_len(T, dk, NR)
    r = r0
    while r < r1:
        b = r // T
        e = min(r1, (b + 1) * T)                     # rows r..e-1 are one sequence's
        t0 = r - b * T
        t1 = e - b * T
        tz = panels(T, NR) * NR if e == (b + 1) * T else t1      # keys t1..tz zeroed
        src = (r - r0 - t0) * lds - c0               # K[token t, c] at S[src + t * lds + c]
        for h in range(c0 // dk, (c1 - 1) // dk + 1):
            ca = max(c0, h * dk)
            cb = min(c1, (h + 1) * dk)
            head = (b * n_heads + h) * ktn - h * dk * NR
            for p in range(t0 // NR, panels(tz, NR)):
                ta = max(t0, p * NR)
                tb = min(t1, (p + 1) * NR)
                dst = head + p * dk * NR - p * NR    # K^T[c, t] at Kt[dst + c * NR + t]
                if tb - ta == NR:
                    # a whole panel: NR loads (a fixed count, unrolled) to one stored run
                    for c in range(ca, cb):
                        for j in range(NR):
                            Kt[dst + c * NR + ta + j] = S[src + (ta + j) * lds + c]
                    continue
                for c in range(ca, cb):
                    for t in range(ta, tb):
                        Kt[dst + c * NR + t] = S[src + t * lds + c]
                    for t in range(max(ta, tb), min(tz, (p + 1) * NR)):
                        Kt[dst + c * NR + t] = 0.0
        r = e


@kernel
def store_v(S, lds, r0, r1, c0, c1, T, n_heads, dk, Vp):
    """Columns c0..c1 of the V rows r0..r1 (as in store_kt) into the contiguous per-head
    rows of Vp (ldv = d_k rounded up to NR); where c1 ends a head, its padding columns
    d_k..ldv are zeroed."""
    W = lanes(Vp)
    NR = panel_lanes(Vp)
    ldv = v_stride(dk, NR)
    zero = vsplat(Vp, 0.0)
    for r in range(r0, r1):
        b = r // T
        t = r - b * T
        for h in range(c0 // dk, (c1 - 1) // dk + 1):
            ca = max(c0, h * dk)
            cb = min(c1, (h + 1) * dk)
            src = (r - r0) * lds + ca - c0
            dst = ((b * n_heads + h) * T + t) * ldv + ca - h * dk
            n = cb - ca
            for c in range(0, n, W):
                vstore_n(Vp, dst + c, vload_n(S, src + c, n - c), n - c)
            if cb == (h + 1) * dk:
                row = ((b * n_heads + h) * T + t) * ldv
                for c in range(dk, ldv, W):
                    vstore_n(Vp, row + c, zero, ldv - c)


@kernel(readonly=("Wf",), standalone=True, internal=True)
def qkv_task(Wf, dims, tile, bufs):
    """Task of stage 1: [LN1 of] the tile's rows of X times its panels of [W_q W_k W_v],
    plus [b_q b_k b_v] (the stage's panels: W_q's npq = ceil(d / NR), then W_k's and
    W_v's npk = ceil(d_kv / NR) each); bufs: Attend (X, and LN1 here when bufs.ln).

    With ``packed``, Q goes to q (row stride ldq = d) and K and V straight into the
    layouts attention reads (K^T panels in kt, per-head rows in vp), through a scratch
    of the task's rows and panels, still in L2: the (rows, 3d) projection buffer and a
    separate pass that packed K and V out of it are never needed (at long T they were
    most of the peak memory).  Without it (tiny sequences, attention_direct_task, cached
    calls), Q, K and V are columns 0, d and 2d of q, row stride ldq = 3d (K and V d_kv
    wide)."""
    NR = panel_lanes(floats(Wf))
    T, d, n_heads = dims.T, dims.d, dims.n_heads
    r0, r1, p0, p1 = tile
    H, q, ldq, packed = bufs.X, bufs.q, bufs.ldq, bufs.packed
    layout = block_layout(dims, NR)
    o_g1, o_be1 = norm_offsets(layout, 1, dims.rms)
    dk = d // n_heads
    dkv = dims.kv_heads * dk
    mats, biases = qkv_parts(d, dkv, NR, layout[0], layout[10])
    npq = panels(d, NR)
    npk = panels(dkv, NR)
    m = r1 - r0
    # scratch (LN1's rows; S, for the K or the V panels, the wider) through views that
    # count no references (options.borrowed); none unused (a decode step allocates nothing)
    own_a = np.empty(m * d, dtype=H.dtype) if bufs.ln else q[:0]
    ns = max(min(p1, npq + npk) - max(p0, npq), min(p1, npq + 2 * npk) - max(p0, npq + npk), 0) if packed else 0
    own_s = np.empty(m * ns * NR, dtype=H.dtype) if ns > 0 else q[:0]
    S = borrowed(own_s)
    if bufs.ln:
        A, xp = borrowed(own_a), bufs.xp[:0]
        layernorm_rows(H, Rows(r0 * d, d), A, Rows(0, d), m, d, floats(Wf), o_g1, o_be1, dims.eps)
        a_off = 0
    else:
        A, xp = H, bufs.xp              # xp: X's rows as the LN1 stage rounded them, or empty
        a_off = r0 * d
    Ax = Pairs(A, xp, pair_stride(d), 0)
    for j in range(3):
        first = 0 if j == 0 else npq + (j - 1) * npk      # matrix j's first panel in the stage
        n = d if j == 0 else dkv
        a = max(p0, first) - first
        b = min(p1, first + panels(n, NR)) - first
        if a >= b:
            continue
        W = Panels(mats[j], d * NR, d, n)
        if j == 0 or not packed:
            wgemm_block(Ax, Rows(a_off, d), Wf, W, q, Rows(r0 * ldq + (0 if packed else j * d), ldq), Tile(0, m, a, b),
                        False, biases[j])
            continue
        lds = (b - a) * NR                    # S: panels a..b of the task's rows
        wgemm_block(Ax, Rows(a_off, d), Wf, W, S, Rows(-a * NR, lds), Tile(0, m, a, b), False, biases[j])
        if j == 1:
            store_kt(S, lds, r0, r1, a * NR, min(dkv, b * NR), T, dims.kv_heads, dk, bufs.kt)
        else:
            store_v(S, lds, r0, r1, a * NR, min(dkv, b * NR), T, dims.kv_heads, dk, bufs.vp)
    keep_alive(own_a, own_s)


@kernel(standalone=True, internal=True)
def pack_head(qkv, T, d, dk, heads, t, kt, vp):
    """Task t = b*heads + h of attention_core's packing stage: K^T panels and contiguous V
    of K/V head h (of ``heads``, dk wide) of sequence b, from (B*T, 3d) projection rows
    [Q | K | V]."""
    NR = panel_lanes(kt)
    ld = 3 * d
    ktn = kt_len(T, dk, NR)
    ldv = v_stride(dk, NR)
    b = t // heads
    h = t % heads
    pack_kt(qkv, b * T * ld + d + h * dk, ld, T, dk, kt, t * ktn)
    pack_rows(qkv, b * T * ld + 2 * d + h * dk, ld, T, dk, vp, t * T * ldv, ldv)


@kernel(internal=True)
def attention_work(m, keys, dk, NR, itemsize):
    """Elements of scratch (of an itemsize-byte dtype) attention_task takes from a work
    buffer for a tile of m queries over ``keys`` keys."""
    bk = min(BK, panels(keys, NR) * NR)
    return (up16(m * dk) + up16(min(m, QSUB) * bk) + up16(m * v_stride(dk, NR))
            + 2 * up16(m * 8 // itemsize))


@kernel(internal=True, inline="always")
def seq_at(cache, b):
    """(sequence, past) of call sequence b in a Cache: the cache's sequence it writes and
    reads, and the tokens there before it.  b and cache.past, or a ragged decode step's
    pair (cache.seqs: each sequence its own slot and length)."""
    if cache.seqs.size > 0:
        return cache.seqs[2 * b], cache.seqs[2 * b + 1]
    return b, cache.past


@kernel(internal=True)
def query_tile(t, T, n_heads):
    """(b, h, q0, q1): attention task t's sequence, head and query rows q0:q1, the tasks
    numbered as attention_task says."""
    nqt = ceil_div(T, BQ)
    bh = t // nqt
    q0 = (nqt - 1 - t % nqt) * BQ
    return bh // n_heads, bh % n_heads, q0, min(T, q0 + BQ)


@kernel(internal=True)
def grouped_decode(dims, kv):
    """Whether ATTEND_CACHED's tasks over the Cache kv are one a (sequence, K/V head), its
    group of query heads as the rows of one tile (cached_attention_task): one new token a
    sequence over a float cache.  A stored cache's one-query rows would gain nothing but
    fewer, coarser tasks (docs/perf-log.md)."""
    return dims.T == 1 and kv.K.itemsize >= 4


@kernel(internal=True)
def cached_attention_tasks(dims, nseq, kv):
    """Tasks of the ATTEND_CACHED stage for nseq sequences over the Cache kv: grouped
    (grouped_decode), one a (sequence, K/V head); else attention_task's, one a (sequence,
    head, query tile)."""
    if grouped_decode(dims, kv):
        return nseq * dims.kv_heads
    return nseq * dims.n_heads * ceil_div(dims.T, BQ)


@kernel(standalone=True, internal=True)
def cached_attention_task(q, ldq, dims, t, kv, work, w_pos):
    """Task t of ATTEND_CACHED over a float cache (cached_attention_tasks).  Grouped
    (grouped_decode) with query heads sharing a K/V head, the group's queries are the rows
    of one tile: their Q columns lie dk apart in the token's row, none is masked (the
    token sees every cached key), so each key panel read serves the whole group in the
    micro-kernel, where one query a task is a chain of dependent FMAs re-reading the
    panel.  Scratch: that of the group's heads as attention_task takes it, one block."""
    group = dims.n_heads // dims.kv_heads
    if not grouped_decode(dims, kv) or group == 1:
        attention_task(q, ldq, dims, t, kv, work, w_pos)
        return
    kt, vp, max_T = kv.K, kv.V, kv.max_T
    NR = panel_lanes(kt)
    dk = dims.d // dims.n_heads
    ldv = v_stride(dk, NR)
    b = t // dims.kv_heads
    seq, past = seq_at(kv, b)
    bh = seq * dims.kv_heads + t % dims.kv_heads
    keys = past + 1
    bk = min(BK, panels(keys, NR) * NR)
    pos = w_pos + t * group * attention_work(1, kv.past + 1, dk, NR, q.itemsize) if work.size > 0 else 0
    Qt, pos = take(work, pos, group * dk)
    S, pos = take(work, pos, min(group, QSUB) * bk)
    O, pos = take(work, pos, group * ldv)
    mrow, pos = take_f64(work, pos, group)
    lrow, pos = take_f64(work, pos, group)
    heads = Rows(b * ldq + t % dims.kv_heads * group * dk, dk)      # query i: head h0 + i
    flash_rows(q, heads, kt, vp, KV(bh * kt_len(max_T, dk, NR), bh * max_T * ldv, ldv),
               Att(0, group, keys, dk, False, 1.0 / np.sqrt(dk), bk), FlashWork(Qt, S, O, mrow, lrow), q, heads)


@kernel(standalone=True, internal=True)
def attention_task(q, ldq, dims, t, kv, work, w_pos):
    """Task t of stage 2: one query tile of one head of one sequence; Q[b, i] of head h
    is q.flat[(b*T + i)*ldq + h*d_k ...], and the head's output goes over those Q
    columns.  K and V are packed in kv.K and kv.V (a Cache: attention_buffers, or a
    KVCache's, which holds them the same way for max_T tokens a head): the T rows are
    tokens past..past+T-1, and attend over keys 0..past+T-1 (past = 0, max_T = T without
    a cache).  Tasks are numbered head by head, and within a (sequence, head)
    costly-first: its last query tile (most keys under a causal mask) first.  So the
    threads work on the same head at once and share its K and V in L3, where threads on
    different heads would compete for it (docs/perf-log.md).  Scratch: task t's
    attention_work at w_pos + t times that of a tile of min(T, BQ) queries in ``work``, or
    new arrays (work empty)."""
    kt, vp, max_T = kv.K, kv.V, kv.max_T
    T, d, n_heads = dims.T, dims.d, dims.n_heads
    NR = panel_lanes(kt)
    dk = d // n_heads
    ktn = kt_len(max_T, dk, NR)
    ldv = v_stride(dk, NR)
    b, h, q0, q1 = query_tile(t, T, n_heads)
    seq, past = seq_at(kv, b)
    bh = seq * dims.kv_heads + h // (n_heads // dims.kv_heads)     # the K/V head it reads
    # scratch sized to this tile (a short sequence needs far less than BQ x BK), each
    # task's at the stride of the call's most keys (kv.past: every task's in a ragged step)
    m = q1 - q0
    keys = past + T
    bk = min(BK, panels(keys, NR) * NR)
    pos = w_pos + t * attention_work(min(T, BQ), kv.past + T, dk, NR, q.itemsize) if work.size > 0 else 0
    Qt, pos = take(work, pos, m * dk)
    S, pos = take(work, pos, min(m, QSUB) * bk)
    O, pos = take(work, pos, m * ldv)
    mrow, pos = take_f64(work, pos, m)
    lrow, pos = take_f64(work, pos, m)
    # flash_rows numbers queries by token: row i of this sequence is token past + i
    flash_rows(q, Rows((b * T - past) * ldq + h * dk, ldq), kt, vp, KV(bh * ktn, bh * max_T * ldv, ldv),
               Att(past + q0, past + q1, keys, dk, dims.causal, 1.0 / np.sqrt(dk), bk),
               FlashWork(Qt, S, O, mrow, lrow), q, Rows((b * T + q0) * ldq + h * dk, ldq))


@kernel(standalone=True, internal=True)
def attention_direct_task(qkv, dims, t, srow):
    """Stage 2 for a tiny sequence (T*T*d_k <= DIRECT_MAX): head h = t % n_heads of
    sequence b = t // n_heads, output over its Q columns (attention_rows_direct
    computes each query's row completely before writing it, from its own Q).
    qkv: (B*T, 3d) rows [Q | K | V] (K and V d_kv wide).  srow: float64 scratch, T
    elements per task."""
    T, d, n_heads = dims.T, dims.d, dims.n_heads
    dk = d // n_heads
    ld = 3 * d
    b = t // n_heads
    h = t % n_heads
    base = b * T * ld + h * dk
    kv = b * T * ld + h // (n_heads // dims.kv_heads) * dk         # the K/V head it reads
    attention_rows_direct(qkv, ld, (base, kv + d, kv + 2 * d), Att(0, T, T, dk, dims.causal, 1.0 / np.sqrt(dk), 0),
                          srow[t * T:(t + 1) * T], qkv, Rows(base, ld))


@kernel(standalone=True, internal=True)
def cache_rows_task(qkv, dims, t, cache):
    """Keys and values of the T new rows of K/V head h = t % kv_heads of sequence
    b = t // kv_heads, from (B*T, 3d) projection rows [Q | K | V], into a KVCache at tokens
    past..past+T-1: K^T panels (head after head, kt_len(max_T) apart) and V rows of
    v_stride (max_T rows a head), the layouts attention_task reads (a ragged step's
    sequence b: the cache's sequence and past of seq_at)."""
    Kc, Vc, max_T = cache.K, cache.V, cache.max_T
    T, d = dims.T, dims.d
    NR = panel_lanes(Kc)
    W = lanes(Kc)
    dk = d // dims.n_heads
    ld = 3 * d
    ldv = v_stride(dk, NR)
    b = t // dims.kv_heads
    h = t % dims.kv_heads
    seq, past = seq_at(cache, b)
    head = seq * dims.kv_heads + h              # the cache's (sequence, K/V head)
    kt = head * kt_len(max_T, dk, NR)
    for i in range(T):
        src = (b * T + i) * ld + h * dk
        p = past + i
        key = kt + (p // NR) * dk * NR + p % NR     # column p % NR of its panel
        for c in range(dk):
            Kc[key + c * NR] = qkv[src + d + c]
        row = (head * max_T + p) * ldv
        for c in range(0, dk, W):
            vstore_n(Vc, row + c, vload_n(qkv, src + 2 * d + c, dk - c), dk - c)


@kernel(standalone=True, internal=True)
def cache_packed_task(kt, vp, dims, t, cache):
    """Task t's (a (sequence, K/V head)'s) keys and values of a first chunk, packed by stage 1 (attention_buffers:
    the same panels and rows for T tokens), into a KVCache at tokens 0..T-1: two
    contiguous copies."""
    Kc, Vc, max_T = cache.K, cache.V, cache.max_T
    T = dims.T
    NR = panel_lanes(kt)
    W = lanes(Kc)
    dk = dims.d // dims.n_heads
    ktn = kt_len(T, dk, NR)
    ldv = v_stride(dk, NR)
    src, dst = t * ktn, t * kt_len(max_T, dk, NR)
    for i in range(0, ktn, W):
        vstore_n(Kc, dst + i, vload_n(kt, src + i, ktn - i), ktn - i)
    n = T * ldv
    src, dst = t * T * ldv, t * max_T * ldv
    for i in range(0, n, W):
        vstore_n(Vc, dst + i, vload_n(vp, src + i, n - i), n - i)
