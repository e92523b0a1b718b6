"""Flash-style attention for one head: tiles of queries against tiles of keys with an
online softmax, so the extra memory is O(tile) and the T x T scores never exist.

The operands come from the fused projection buffer X (one row per token: [Q | K | V]
for all heads, row stride ldx).  Per head, K is packed transposed into NR-wide panels
(``pack_kt``: the micro-kernel wants the key index along the vector lanes for
S = Q K^T) and V into contiguous rows (``pack_v``); each task copies its query tile.
In X a head's row is 64 elements in a 9 KiB stride, a new page per token: read in
place, a key tile would touch a page per key and miss the TLB.
"""

from __future__ import annotations

import math


from .gemm import MR, micro_kernel
from .layout import panels
from .options import kernel
from .simd import (lanes, panel_lanes, pbcast, pload, psplat, pstore, vadd, vexp2, vfma, vhmax, vhsum,
                   vkeep, vload, vload_n, vmax, vmul, vsub, vsplat, vstore, vstore_n)

LOG2E = 1.4426950408889634
KV_CHUNK = 128   # keys per P V pass (see _sub_tile)
QSUB = 96        # queries per sub-tile: the S tile is QSUB x BK (96 KiB at BK=256)


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
def flash_rows(X, ldx, q_off, T, dk, Kt, kt_off, V, v_off, ldv, q0, q1, causal, scale,
               BK, Qt, S, O, mrow, lrow, out, out_off, ldout):
    """Attention output of queries q0..q1-1 of one head of one sequence.

    Q[t, c] = X.flat[q_off + t*ldx + c]; K^T packed at Kt[kt_off] (pack_kt); V[t, c] =
    V.flat[v_off + t*ldv + c] with ldv >= dk a multiple of NR, zero past dk (pack_rows).
    Scratch: Qt >= (q1-q0)*dk, S >= min(q1-q0, QSUB)*BK, O >= (q1-q0)*ldv, mrow/lrow >=
    q1-q0 (float64).  BK must be a multiple of NR.  Writes out.flat[out_off + i*ldout + c]
    for i < q1-q0, c < dk.

    Loop order: key tiles outside, sub-tiles of QSUB queries inside, so each key tile
    (K^T and V: 2 x 64 KiB at BK=256, dk=64) is used by all the task's queries while it
    is in L2; at T=4096 a head's K and V (1 MiB each) no longer fit L2, and re-reading
    them from L3 for every few dozen queries would cost more than the tile loop saves.
    With ``causal`` the key tiles at or beyond q1 (entirely above the diagonal) are never
    visited, nor the parts of a tile above a sub-tile's or micro-tile's last query."""
    W = lanes(Kt)
    NR = panel_lanes(Kt)
    m = q1 - q0
    zero = vsplat(O, 0.0)
    vc2 = vsplat(S, scale * LOG2E)
    pack_rows(X, q_off + q0 * ldx, ldx, m, dk, Qt, 0, dk)
    for i in range(m):
        mrow[i] = -math.inf
        lrow[i] = 0.0
        for c in range(0, ldv, W):
            vstore(O, i * ldv + c, zero)
    kv_end = q1 if causal else T
    for k0 in range(0, kv_end, BK):
        kn = min(BK, kv_end - k0)
        if m == 1:
            # one query (a decode step): it sees every key of every tile
            _one_query_tile(Qt, dk, Kt, kt_off, V, v_off, ldv, k0, kn, scale, vc2, S, O, mrow, lrow, NR, W, zero)
            continue
        for s0 in range(0, m, QSUB):
            s1 = min(m, s0 + QSUB)
            if causal and k0 > q0 + s1 - 1:
                continue                # no query of this sub-tile sees a key of the tile
            _sub_tile(Qt, dk, Kt, kt_off, V, v_off, ldv, q0, s0, s1, k0, kn, causal, scale,
                      vc2, BK, S, O, mrow, lrow, NR, W, zero)
    for i in range(m):
        vinv = vsplat(O, 1.0 / lrow[i])
        for c in range(0, dk, W):
            vstore_n(out, out_off + i * ldout + c, vmul(vload(O, i * ldv + c), vinv), dk - c)


@kernel(standalone=True, internal=True)
def _sub_tile(Qt, dk, Kt, kt_off, V, v_off, ldv, q0, s0, s1, k0, kn, causal, scale, vc2,
              BK, S, O, mrow, lrow, NR, W, zero):
    """One key tile (keys k0..k0+kn-1) against the task's queries s0..s1-1 (relative to
    q0): scores, online-softmax update of mrow/lrow/O, O += P V.  S holds this
    sub-tile's scores, row i - s0."""
    m = s1 - s0
    # S[i, j] = Q[q0+s0+i] . K[k0+j]  (raw, unscaled scores).  Under the causal mask a
    # micro-tile of MR queries needs only the keys up to its last query: panels entirely
    # above that are skipped here, and the softmax and P V below stop at the same bound
    # (klim), so a diagonal tile costs about half a tile.
    qa = q0 + s0
    for p in range(panels(kn, NR)):
        pb = kt_off + (k0 // NR + p) * dk * NR
        n = min(NR, kn - p * NR)
        for i in range(0, m, MR):
            if causal and k0 + p * NR > qa + min(m, i + MR) - 1:
                continue
            micro_kernel(Qt, (s0 + i) * dk, dk, 1, min(MR, m - i), Kt, pb, NR, dk,
                         S, i * BK + p * NR, BK, n, False, -1)
    # online softmax: new running max, rescale what was accumulated, P = 2^(...)
    for i in range(m):
        nv = kn
        klim = kn
        if causal:
            nv = min(kn, qa + i + 1 - k0)
            # the P V product of this row's micro-tile reads keys up to klim
            klim = min(kn, qa + min(m, i // MR * MR + MR) - k0)
        _softmax_row(S, i * BK, nv, klim, s0 + i, mrow, lrow, O, ldv, vc2, scale, W, zero)
    # O += P V over this key tile (each micro-tile only up to its last key), in chunks
    # of KV_CHUNK keys: a 128 x 64 float32 slice of V (32 KiB) stays in L1 while all the
    # micro-tiles pass over it; a whole 256-key tile would not
    for vp in range(ldv // NR):
        for c0 in range(0, kn, KV_CHUNK):
            for i in range(0, m, MR):
                kl = kn
                if causal:
                    kl = min(kn, qa + min(m, i + MR) - k0)
                kl = min(kl, c0 + KV_CHUNK) - c0
                if kl <= 0:
                    continue
                micro_kernel(S, i * BK + c0, BK, 1, min(MR, m - i),
                             V, v_off + (k0 + c0) * ldv + vp * NR, ldv, kl,
                             O, (s0 + i) * ldv + vp * NR, ldv, NR, True, -1)


@kernel(standalone=True, internal=True)
def _one_query_tile(Qt, dk, Kt, kt_off, V, v_off, ldv, k0, kn, scale, vc2, S, O, mrow, lrow, NR, W, zero):
    """_sub_tile for a tile of one query that sees all kn keys k0..k0+kn-1 (a decode
    step's): the same scores, softmax update and O += P V.  The micro-kernel's one-row
    loop is one chain of FMAs per accumulator, each waiting on the one before, and with
    one query no other row fills the wait; here two chains run side by side (two key
    panels at once for the scores, even and odd keys for P V), a fifth less time for a
    head's K and V read from L2 (docs/perf-log.md).  Each score is the micro-kernel's
    sum, in its order; P V sums the two chains at the end of the tile."""
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
    _softmax_row(S, 0, kn, kn, 0, mrow, lrow, O, ldv, vc2, scale, W, zero)
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
def _softmax_row(S, row, nv, klim, r, mrow, lrow, O, ldv, vc2, scale, W, zero):
    """The online-softmax update of query r by one key tile's raw scores S[row : row + nv]
    (the keys it may see): its running max mrow[r] and sum lrow[r], its accumulated
    output O[r] rescaled when the max moves, and S[row : row + klim] replaced by
    P = exp((s - max) * scale), zero past nv."""
    # two running maxima: one vmax chain waits on its own latency (4 cycles a vector)
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
def attention_rows_direct(X, ldx, q_off, k_off, v_off, T, dk, causal, scale, srow, out,
                          out_off, ldout):
    """Attention of one head for short sequences, one query at a time: scores over the
    allowed keys into srow (>= T, float64), max-subtracted softmax, weighted sum of V.
    No packing and no tiles: for T up to a few dozen the tiled kernel's set-up costs
    more than this whole loop (the lesson's T=4 block).  Q[t, c] = X.flat[q_off + t*ldx
    + c], K at k_off, V at v_off; writes out.flat[out_off + i*ldout + c]."""
    # Rows of Q, K and V are d_k wide (a few lanes at these sizes): one masked vector per
    # W columns instead of scalar loops over c, whose set-up cost more than their work
    # (the two heads of the lesson's block: 850 ns scalar)
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
        o = out_off + i * ldout
        for c in range(0, dk, W):
            acc = zero
            for j in range(n):
                acc = vfma(vsplat(X, srow[j]), vload_n(X, v_off + j * ldx + c, dk - c), acc)
            vstore_n(out, o + c, vmul(acc, vinv), dk - c)
