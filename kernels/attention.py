"""Flash-style attention for one head: tiles of queries against tiles of keys with an
online softmax, so the extra memory is O(tile) and the T x T scores never exist.

Operands live in the fused projection buffer X (one row per token: [Q | K | V] for all
heads, row stride ldx), read in place; only K is repacked, transposed into NR-wide
panels (``pack_kt``), because the micro-kernel wants the key index along the vector
lanes for S = Q K^T.  For O += P V the value rows are already in the right shape.
"""

from __future__ import annotations

import math

from numba import njit

from .gemm import MR, NV, micro_kernel
from .options import FASTMATH
from .simd import (lanes, vadd, vexp, vhmax, vhsum, vkeep, vload, vmax, vmul, vsplat, vstore,
                   vsub)


@njit(fastmath=FASTMATH, cache=True, nogil=True)
def pack_kt(X, x_off, ldx, T, dk, Kt, kt_off):
    """K^T panels of one head: for panel p (keys p*NR .. p*NR+NR-1),
    Kt[kt_off + p*dk*NR + c*NR + j] = K[p*NR + j, c], zero for keys >= T.
    K[t, c] = X.flat[x_off + t*ldx + c]."""
    NR = NV * lanes(Kt)
    for p in range((T + NR - 1) // NR):
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


def kt_size(T: int, dk: int, NR: int) -> int:
    """Elements of one head's packed K^T."""
    return -(-T // NR) * dk * NR


@njit(fastmath=FASTMATH, cache=True, nogil=True)
def flash_rows(X, ldx, x_row0, T, q_col, v_col, dk, Kt, kt_off, q0, q1, causal, scale,
               BK, S, O, ldo, mrow, lrow, out, out_off, ldout):
    """Attention output of queries q0..q1-1 of one head of one sequence.

    Q[t, c] = X.flat[(x_row0 + t)*ldx + q_col + c], V likewise at v_col; K^T packed at
    Kt[kt_off] (pack_kt).  Scratch: S >= (q1-q0)*BK, O >= (q1-q0)*ldo with ldo >= dk a
    multiple of NR, mrow/lrow >= q1-q0.  BK must be a multiple of NR.  Writes
    out.flat[out_off + i*ldout + c] for i < q1-q0, c < dk.

    With ``causal`` the key tiles at or beyond q1 (entirely above the diagonal) are
    never visited; inside the diagonal tile the masked scores are dropped lane-wise."""
    W = lanes(Kt)
    NR = NV * W
    m = q1 - q0
    zero = vsplat(O, 0.0)
    vscale = vsplat(S, scale)
    for i in range(m):
        mrow[i] = -math.inf
        lrow[i] = 0.0
        for c in range(0, ldo, W):
            vstore(O, i * ldo + c, zero)
    kv_end = q1 if causal else T
    for k0 in range(0, kv_end, BK):
        kn = min(BK, kv_end - k0)
        # S[i, j] = Q[q0+i] . K[k0+j]  (raw, unscaled scores)
        for p in range((kn + NR - 1) // NR):
            pb = kt_off + (k0 // NR + p) * dk * NR
            n = min(NR, kn - p * NR)
            for i in range(0, m, MR):
                micro_kernel(X, (x_row0 + q0 + i) * ldx + q_col, ldx, 1, min(MR, m - i),
                             Kt, pb, NR, dk, S, i * BK + p * NR, BK, n, False)
        # online softmax: new running max, rescale what was accumulated, P = exp(...)
        for i in range(m):
            nv = kn
            if causal:
                nv = min(kn, q0 + i + 1 - k0)
            row = i * BK
            mx = vsplat(S, -math.inf)
            for j in range(0, nv, W):
                mx = vmax(mx, vkeep(vload(S, row + j), nv - j, -math.inf))
            m_old = mrow[i]
            m_new = max(m_old, vhmax(mx))
            if m_new == -math.inf:
                # no allowed key yet for this query: contributes nothing
                for j in range(0, kn, W):
                    vstore(S, row + j, zero)
                continue
            vm = vsplat(S, m_new)
            acc = zero
            for j in range(0, kn, W):
                p_ = vexp(vmul(vsub(vload(S, row + j), vm), vscale))
                p_ = vkeep(p_, nv - j, 0.0)
                vstore(S, row + j, p_)
                acc = vadd(acc, p_)
            alpha = math.exp((m_old - m_new) * scale)     # 0 on the first contribution
            lrow[i] = lrow[i] * alpha + vhsum(acc)
            mrow[i] = m_new
            if alpha != 1.0:
                va = vsplat(O, alpha)
                for c in range(0, ldo, W):
                    vstore(O, i * ldo + c, vmul(vload(O, i * ldo + c), va))
        # O += P V over this key tile
        for vp in range((dk + NR - 1) // NR):
            n = min(NR, dk - vp * NR)
            for i in range(0, m, MR):
                micro_kernel(S, i * BK, BK, 1, min(MR, m - i),
                             X, (x_row0 + k0) * ldx + v_col + vp * NR, ldx, kn,
                             O, i * ldo + vp * NR, ldo, n, True)
    for i in range(m):
        inv = 1.0 / lrow[i]
        for c in range(dk):
            out[out_off + i * ldout + c] = O[i * ldo + c] * inv
