"""Flash-style attention for one head: tiles of queries against tiles of keys with an
online softmax, so the extra memory is O(tile) and the T x T scores never exist.

The operands come from the fused projection buffer X (one row per token: [Q | K | V]
for all heads, row stride ldx).  Per head, K is packed transposed into NR-wide panels
(``pack_kt``: the micro-kernel wants the key index along the vector lanes for
S = Q K^T) and V into contiguous rows (``pack_v``); each task copies its query tile.
In X a head's row is d_k elements in a stride of 3 d_model, often a new page per token:
read in place, a key tile would touch a page per key and miss the TLB.
"""

from __future__ import annotations

import math


from .gemm import micro_kernel
from .layout import panels
from .options import kernel
from .records import Rows
from .simd import (lanes, panel_lanes, pbcast, pload, psplat, pstore, vadd, vexp2, vfma, vhmax, vhsum,
                   vkeep, vload, vload_n, vmax, vmul, vsub, vsplat, vstore, vstore_n)
from .tiles import KV_CHUNK, MR, QSUB

LOG2E = 1.4426950408889634


@kernel
def pack_kt(X, x_off, ldx, T, dk, Kt, kt_off):
    """K^T panels of one head: for panel p (keys p*NR .. p*NR+NR-1),
    Kt[kt_off + p*dk*NR + c*NR + j] = K[p*NR + j, c], zero for keys >= T.
    K[t, c] = X.flat[x_off + t*ldx + c]."""
    NR = panel_lanes(Kt)
    for p in range(panels(T, NR)):
        base = kt_off + p * dk * NR
        for j in range(NR):
            t = p * NR + j
            if t < T:
                src = x_off + t * ldx
                for c in range(dk):
                    Kt[base + c * NR + j] = X[src + c]
            else:
                for c in range(dk):
                    Kt[base + c * NR + j] = 0.0


@kernel
def pack_rows(X, x_off, ldx, rows, n, Y, y_off, ldy):
    """Y[r, 0:n] = X[r, 0:n] and Y[r, n:ldy] = 0 for r < rows (a contiguous copy of a
    strided block, zero-padded to the row length ldy)."""
    W = lanes(X)
    zero = vsplat(Y, 0.0)
    for r in range(rows):
        src = x_off + r * ldx
        dst = y_off + r * ldy
        for c in range(0, n, W):
            vstore_n(Y, dst + c, vload_n(X, src + c, n - c), n - c)
        for c in range(n, ldy, W):
            vstore_n(Y, dst + c, zero, ldy - c)


@kernel(standalone=True)
def flash_rows(X, q, Kt, V, kv, att, work, out, o):
    """Attention output of the queries att.q0:att.q1 of one head of one sequence.

    Q[t, c] = X.flat[q.off + t*q.ld + c]; K^T packed at Kt[kv.kt] (pack_kt); V[t, c] =
    V.flat[kv.v + t*kv.ldv + c] with kv.ldv >= dk a multiple of NR, zero past dk
    (pack_rows).  work (FlashWork): Qt >= (q1-q0)*dk, S >= min(q1-q0, QSUB)*bk, O >=
    (q1-q0)*ldv, mrow/lrow >= q1-q0 (float64).  att.bk must be a multiple of NR.  Writes
    out.flat[o.off + i*o.ld + c] for i < q1-q0, c < dk.

    Loop order: key tiles outside, sub-tiles of QSUB queries inside, so each key tile
    (K^T and V) is used by all the task's queries while it is in L2; at long T a head's K
    and V no longer fit L2, and re-reading them from L3 for every few dozen queries would
    cost more than the tile loop saves.  With ``causal`` the key tiles at or beyond q1
    (entirely above the diagonal) are never visited, nor the parts of a tile above a
    sub-tile's or micro-tile's last query."""
    W = lanes(Kt)
    Qt, S, O, mrow, lrow = work
    q0, q1, dk, ldv = att.q0, att.q1, att.dk, kv.ldv
    m = q1 - q0
    zero = vsplat(O, 0.0)
    vc2 = vsplat(S, att.scale * LOG2E)
    pack_rows(X, q.off + q0 * q.ld, q.ld, m, dk, Qt, 0, dk)
    for i in range(m):
        mrow[i] = -math.inf
        lrow[i] = 0.0
        for c in range(0, ldv, W):
            vstore(O, i * ldv + c, zero)
    kv_end = q1 if att.causal else att.keys
    for k0 in range(0, kv_end, att.bk):
        kn = min(att.bk, kv_end - k0)
        if m == 1:
            # one query (a decode step): it sees every key of every tile
            _one_query_tile(Kt, V, kv, att, work, vc2, k0, kn)
            continue
        for s0 in range(0, m, QSUB):
            s1 = min(m, s0 + QSUB)
            if att.causal and k0 > q0 + s1 - 1:
                continue                # no query of this sub-tile sees a key of the tile
            _sub_tile(Kt, V, kv, att, work, vc2, s0, s1, k0, kn)
    for i in range(m):
        vinv = vsplat(O, 1.0 / lrow[i])
        for c in range(0, dk, W):
            vstore_n(out, o.off + i * o.ld + c, vmul(vload(O, i * ldv + c), vinv), dk - c)


@kernel(standalone=True, internal=True)
def _sub_tile(Kt, V, kv, att, work, vc2, s0, s1, k0, kn):
    """One key tile (keys k0..k0+kn-1) against the task's queries s0..s1-1 (relative to
    q0): scores, online-softmax update of mrow/lrow/O, O += P V.  S holds this
    sub-tile's scores, row i - s0.  vc2: scale * log2(e) in every lane."""
    Qt, S, O, mrow, lrow = work
    kt_off, v_off, ldv = kv
    dk, BK, causal = att.dk, att.bk, att.causal
    NR = panel_lanes(Kt)
    m = s1 - s0
    # S[i, j] = Q[q0+s0+i] . K[k0+j]  (raw, unscaled scores).  Under the causal mask a
    # micro-tile of MR queries needs only the keys up to its last query: panels entirely
    # above that are skipped here, and the softmax and P V below stop at the same bound
    # (klim), so a diagonal tile costs about half a tile.
    qa = att.q0 + s0
    for p in range(panels(kn, NR)):
        pb = kt_off + (k0 // NR + p) * dk * NR
        n = min(NR, kn - p * NR)
        for i in range(0, m, MR):
            if causal and k0 + p * NR > qa + min(m, i + MR) - 1:
                continue
            micro_kernel(Qt, Rows((s0 + i) * dk, dk), Kt, Rows(pb, NR), S, Rows(i * BK + p * NR, BK),
                         (min(MR, m - i), n, dk), False, -1)
    # online softmax: new running max, rescale what was accumulated, P = 2^(...)
    for i in range(m):
        nv = kn
        klim = kn
        if causal:
            nv = min(kn, qa + i + 1 - k0)
            # the P V product of this row's micro-tile reads keys up to klim
            klim = min(kn, qa + min(m, i // MR * MR + MR) - k0)
        softmax_update(work, i * BK, nv, klim, s0 + i, ldv, vc2, att.scale)
    # O += P V over this key tile (each micro-tile only up to its last key), in chunks
    # of KV_CHUNK keys (tiles.py)
    for vp in range(ldv // NR):
        for c0 in range(0, kn, KV_CHUNK):
            for i in range(0, m, MR):
                kl = kn
                if causal:
                    kl = min(kn, qa + min(m, i + MR) - k0)
                kl = min(kl, c0 + KV_CHUNK) - c0
                if kl <= 0:
                    continue
                micro_kernel(S, Rows(i * BK + c0, BK), V, Rows(v_off + (k0 + c0) * ldv + vp * NR, ldv), O,
                             Rows((s0 + i) * ldv + vp * NR, ldv), (min(MR, m - i), NR, kl), True, -1)


@kernel(standalone=True, internal=True)
def _one_query_tile(Kt, V, kv, att, work, vc2, k0, kn):
    """_sub_tile for a tile of one query that sees all kn keys k0..k0+kn-1 (a decode
    step's): the same scores, softmax update and O += P V.  The micro-kernel's one-row
    loop is one chain of FMAs per accumulator, each waiting on the one before, and with
    one query no other row fills the wait; here two chains run side by side (two key
    panels at once for the scores, even and odd keys for P V), for a head's K and V read
    from L2 (docs/perf-log.md).  Each score is the micro-kernel's sum, in its order; P V
    sums the two chains at the end of the tile."""
    Qt, S, O, mrow, lrow = work
    kt_off, v_off, ldv = kv
    dk = att.dk
    NR = panel_lanes(Kt)
    npn = panels(kn, NR)
    step = dk * NR                          # elements of one K^T panel
    pb = kt_off + k0 // NR * step
    for p in range(0, npn, 2):
        p2 = min(p + 1, npn - 1)            # an odd count: the last panel twice
        a0 = a1 = psplat(S, 0.0)
        for c in range(dk):
            qc = pbcast(Qt, c)
            a0 = vfma(qc, pload(Kt, pb + p * step + c * NR), a0)
            a1 = vfma(qc, pload(Kt, pb + p2 * step + c * NR), a1)
        pstore(S, p * NR, a0)               # whole panels: S holds panels(kn) * NR scores
        pstore(S, p2 * NR, a1)
    softmax_update(work, 0, kn, kn, 0, ldv, vc2, att.scale)
    for vp in range(ldv // NR):
        o0 = o1 = psplat(O, 0.0)
        vb = v_off + k0 * ldv + vp * NR
        for j in range(0, kn - 1, 2):
            o0 = vfma(pbcast(S, j), pload(V, vb + j * ldv), o0)
            o1 = vfma(pbcast(S, j + 1), pload(V, vb + (j + 1) * ldv), o1)
        if kn % 2:
            o0 = vfma(pbcast(S, kn - 1), pload(V, vb + (kn - 1) * ldv), o0)
        pstore(O, vp * NR, vadd(pload(O, vp * NR), vadd(o0, o1)))


@kernel(internal=True, inline="always")
def softmax_update(work, row, nv, klim, r, ldv, vc2, scale):
    """The online-softmax update of query r by one key tile's raw scores S[row : row + nv]
    (the keys it may see; work: the tile's FlashWork): its running max mrow[r] and sum
    lrow[r], its accumulated output O[r] (rows ldv apart) rescaled when the max moves, and
    S[row : row + klim] replaced by P = exp((s - max) * scale), zero past nv."""
    _, S, O, mrow, lrow = work
    W = lanes(S)
    zero = vsplat(S, 0.0)
    # two running maxima: one vmax chain would wait on its own latency at every vector
    mx = vsplat(S, -math.inf)
    mx2 = mx
    # nv <= 0 for a row the causal mask hides the whole tile from (a key tile that
    # starts inside the sub-tile): then neither loop may run
    nfull = max(nv, 0) // (2 * W) * (2 * W)
    for j in range(0, nfull, 2 * W):
        mx = vmax(mx, vload(S, row + j))
        mx2 = vmax(mx2, vload(S, row + j + W))
    for j in range(nfull, nv, W):
        x = vload(S, row + j)
        if j + W > nv:                      # masked or past-the-tile lanes
            x = vkeep(x, nv - j, -math.inf)
        mx = vmax(mx, x)
    m_old = mrow[r]
    m_new = max(m_old, vhmax(vmax(mx, mx2)))
    if m_new == -math.inf:
        # no allowed key yet for this query: contributes nothing
        for j in range(0, klim, W):
            vstore(S, row + j, zero)
        return
    # exp((s - m) * scale) = 2^((s - m) * c), c = scale * log2(e).  s - m is <= 0 and
    # exact near the max; the one-fma form s*c - m*c is not: at |s*c| ~ 1e9 (float32)
    # its rounding error alone overflowed 2^t and gave NaN
    vm = vsplat(S, m_new)
    acc = zero
    for j in range(0, klim, W):
        p_ = vexp2(vmul(vsub(vload(S, row + j), vm), vc2))
        if j + W > nv:
            p_ = vkeep(p_, nv - j, 0.0)
        vstore(S, row + j, p_)
        acc = vadd(acc, p_)
    if m_new == m_old:
        # the running max stands (most key tiles after the first few): alpha would
        # be exp(0) = 1, so skip the exp and the rescale of O
        lrow[r] += vhsum(acc)
        return
    alpha = math.exp((m_old - m_new) * scale)     # 0 on the first contribution
    lrow[r] = lrow[r] * alpha + vhsum(acc)
    mrow[r] = m_new
    va = vsplat(O, alpha)
    for c in range(0, ldv, W):
        vstore(O, r * ldv + c, vmul(vload(O, r * ldv + c), va))


@kernel
def attention_rows_direct(X, ldx, qkv, att, srow, out, o):
    """Attention of one head for short sequences, one query at a time: scores over the
    allowed keys into srow (>= T, float64), max-subtracted softmax, weighted sum of V.
    No packing and no tiles: for T up to a few dozen the tiled kernel's set-up costs
    more than this whole loop (the lesson's T=4 block).  Q[t, c] = X.flat[q + t*ldx + c]
    with (q, k, v) = qkv, K at k, V at v; T = att.keys queries and keys (att.q0, att.q1
    and att.bk unused); writes out.flat[o.off + i*o.ld + c]."""
    # Rows of Q, K and V are d_k wide (a few lanes at these sizes): one masked vector per
    # W columns instead of scalar loops over c, whose set-up cost more than their work
    q_off, k_off, v_off = qkv
    T, dk, causal, scale = att.keys, att.dk, att.causal, att.scale
    out_off, ldout = o
    W = lanes(X)
    zero = vsplat(X, 0.0)
    for i in range(T):
        n = i + 1 if causal else T
        qi = q_off + i * ldx
        m = -math.inf
        for j in range(n):
            kj = k_off + j * ldx
            acc = zero
            for c in range(0, dk, W):
                acc = vfma(vload_n(X, qi + c, dk - c), vload_n(X, kj + c, dk - c), acc)
            s = vhsum(acc) * scale
            srow[j] = s
            if s > m:
                m = s
        total = 0.0
        for j in range(n):
            e = math.exp(srow[j] - m)
            srow[j] = e
            total += e
        vinv = vsplat(X, 1.0 / total)
        oi = out_off + i * ldout
        for c in range(0, dk, W):
            acc = zero
            for j in range(n):
                acc = vfma(vsplat(X, srow[j]), vload_n(X, v_off + j * ldx + c, dk - c), acc)
            vstore_n(out, oi + c, vmul(acc, vinv), dk - c)
