"""Register-blocked GEMM: C (+)= A @ B with B pre-packed in column panels.

Layout
  * A: addressed as (flat array, offset of A[0, 0], row stride, k stride); it is read
    in place, never packed: a micro-kernel reads MR rows, each sequentially in k, which
    the prefetchers follow (packing A measured no faster here).
  * B: packed once into panels of NR columns, panel p holding B[:, p*NR:(p+1)*NR] as a
    (K, NR) row-major block, zero-padded past N (``pack_b``).  Weights are packed when
    they are prepared, so the hot loop reads B as one contiguous stream per panel.
  * C: row-major (flat array, offset, row stride ldc); only the valid m x n corner of a
    micro-tile is ever written, so C and A need no padding.

The micro-kernel keeps a 6 x 4-vector tile of C in 24 registers (6 x 64 float32 or
6 x 32 float64) and per k step loads 4 vectors of B and broadcasts 6 elements of A:
24 fmas per 10 loads, within the two load ports of the cores this targets.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .simd import lanes, prefetch_l2, vadd, vbcast, vfma, vload, vload_n, vsplat, vstore, vstore_n
from .options import JIT

MR = 6          # rows of the micro-tile
NV = 4          # vectors per row of the micro-tile: NR = NV * lanes columns


def panel_width(dtype) -> int:
    """NR for a dtype: 4 vectors of 64 bytes."""
    return NV * 64 // np.dtype(dtype).itemsize


@njit(**JIT)
def micro_kernel(A, a_off, a_rs, a_ks, m, B, b_off, ldb, K, C, c_off, ldc, n, accumulate):
    """C[0:m, 0:n] (+)= A[0:m, 0:K] @ B[0:K, 0:NR] for m <= MR, n <= NR.

    A[r, k] is A.flat[a_off + r*a_rs + k*a_ks]: (lda, 1) for a row-major matrix, (1, MR)
    for a packed panel.  Rows past m are computed from a repeated row 0 (no
    out-of-bounds reads) and never stored; B must have NR readable columns per row."""
    W = lanes(B)
    a1 = a_off + (a_rs if m > 1 else 0)
    a2 = a_off + (2 * a_rs if m > 2 else 0)
    a3 = a_off + (3 * a_rs if m > 3 else 0)
    a4 = a_off + (4 * a_rs if m > 4 else 0)
    a5 = a_off + (5 * a_rs if m > 5 else 0)
    z = vsplat(B, 0.0)
    c00 = c01 = c02 = c03 = z
    c10 = c11 = c12 = c13 = z
    c20 = c21 = c22 = c23 = z
    c30 = c31 = c32 = c33 = z
    c40 = c41 = c42 = c43 = z
    c50 = c51 = c52 = c53 = z
    for k in range(K):
        bo = b_off + k * ldb
        ak = k * a_ks
        b0 = vload(B, bo)
        b1 = vload(B, bo + W)
        b2 = vload(B, bo + 2 * W)
        b3 = vload(B, bo + 3 * W)
        x = vbcast(A, a_off + ak)
        c00 = vfma(x, b0, c00)
        c01 = vfma(x, b1, c01)
        c02 = vfma(x, b2, c02)
        c03 = vfma(x, b3, c03)
        x = vbcast(A, a1 + ak)
        c10 = vfma(x, b0, c10)
        c11 = vfma(x, b1, c11)
        c12 = vfma(x, b2, c12)
        c13 = vfma(x, b3, c13)
        x = vbcast(A, a2 + ak)
        c20 = vfma(x, b0, c20)
        c21 = vfma(x, b1, c21)
        c22 = vfma(x, b2, c22)
        c23 = vfma(x, b3, c23)
        x = vbcast(A, a3 + ak)
        c30 = vfma(x, b0, c30)
        c31 = vfma(x, b1, c31)
        c32 = vfma(x, b2, c32)
        c33 = vfma(x, b3, c33)
        x = vbcast(A, a4 + ak)
        c40 = vfma(x, b0, c40)
        c41 = vfma(x, b1, c41)
        c42 = vfma(x, b2, c42)
        c43 = vfma(x, b3, c43)
        x = vbcast(A, a5 + ak)
        c50 = vfma(x, b0, c50)
        c51 = vfma(x, b1, c51)
        c52 = vfma(x, b2, c52)
        c53 = vfma(x, b3, c53)
    _store_row(C, c_off, n, W, accumulate, c00, c01, c02, c03)
    if m > 1:
        _store_row(C, c_off + ldc, n, W, accumulate, c10, c11, c12, c13)
    if m > 2:
        _store_row(C, c_off + 2 * ldc, n, W, accumulate, c20, c21, c22, c23)
    if m > 3:
        _store_row(C, c_off + 3 * ldc, n, W, accumulate, c30, c31, c32, c33)
    if m > 4:
        _store_row(C, c_off + 4 * ldc, n, W, accumulate, c40, c41, c42, c43)
    if m > 5:
        _store_row(C, c_off + 5 * ldc, n, W, accumulate, c50, c51, c52, c53)


@njit(**JIT)
def _store_row(C, off, n, W, accumulate, v0, v1, v2, v3):
    """C.flat[off : off + n] (+)= [v0 v1 v2 v3][:n], full-width stores where possible."""
    if n >= 4 * W:
        if accumulate:
            v0 = vadd(vload(C, off), v0)
            v1 = vadd(vload(C, off + W), v1)
            v2 = vadd(vload(C, off + 2 * W), v2)
            v3 = vadd(vload(C, off + 3 * W), v3)
        vstore(C, off, v0)
        vstore(C, off + W, v1)
        vstore(C, off + 2 * W, v2)
        vstore(C, off + 3 * W, v3)
    else:
        _store_part(C, off, n, accumulate, v0)
        _store_part(C, off + W, n - W, accumulate, v1)
        _store_part(C, off + 2 * W, n - 2 * W, accumulate, v2)
        _store_part(C, off + 3 * W, n - 3 * W, accumulate, v3)


@njit(**JIT)
def _store_part(C, off, n, accumulate, v):
    if n > 0:
        if accumulate:
            v = vadd(vload_n(C, off, n), v)
        vstore_n(C, off, v, n)


def packed_size(K: int, N: int, NR: int) -> int:
    """Elements of the packed form of a (K, N) matrix."""
    return -(-N // NR) * K * NR


def pack_b(B: np.ndarray, out: np.ndarray) -> None:
    """Write (K, N) ``B`` into the flat ``out`` (packed_size elements) as panels:
    panel p = B[:, p*NR:(p+1)*NR] as a (K, NR) row-major block, zero past column N."""
    K, N = B.shape
    NR = panel_width(out.dtype)
    NP = -(-N // NR)
    panels = out.reshape(NP, K, NR)
    panels[...] = 0
    for p in range(NP):
        cols = B[:, p * NR:(p + 1) * NR]
        panels[p, :, :cols.shape[1]] = cols


@njit(inline="always", **JIT)
def gemm_block(A, a_off, lda, i0, i1, Bp, b_off, K, N, p0, p1, C, c_off, ldc, accumulate, KC):
    """C[i0:i1, columns of panels p0..p1) (+)= A[i0:i1, 0:K] @ B, serially, for a packed
    B of K rows (gemm_panels with the panel stride K * NR).  Inlined where it is called:
    a call layer costs ~50 ns, and the lesson's toy block makes six of these calls."""
    NR = NV * lanes(Bp)
    gemm_panels(A, a_off, lda, i0, i1, Bp, b_off, K * NR, K, N, p0, p1, C, c_off, ldc, accumulate, KC)


@njit(**JIT)
def gemm_panels(A, a_off, lda, i0, i1, Bp, b_off, ldp, K, N, p0, p1, C, c_off, ldc, accumulate, KC):
    """C[i0:i1, columns of panels p0..p1) (+)= A[i0:i1, 0:K] @ B, serially.

    A[i, k] = A.flat[a_off + i*lda + k]; C[i, j] = C.flat[c_off + i*ldc + j]; B[k, j] of
    panel p is Bp[b_off + p*ldp + k*NR + j - p*NR]: a packed matrix's panels are ldp
    apart, so B can be a band of K rows out of a taller packed matrix (ldp = its rows
    times NR, b_off pointing at the band's first row in panel 0).  Loop order: panels,
    then k blocks of KC, then micro row-tiles: the KC x NR slice of a panel (KC=128:
    32 KiB of float32) stays in L1 while every row tile of the block passes over it,
    and the block's C panel stays in L1/L2 across the k blocks (measured 5-10% faster
    than k blocks outermost).

    The weights (B) do not fit L2 and each slice is used for only one pass of row tiles,
    so while one slice is in use the next one is prefetched into L2, a few lines before
    each micro-kernel call: the first row tile of a slice then finds it in L2 instead of
    waiting on L3 (4-9% on the d_model=768 FFN, measured side by side)."""
    NR = NV * lanes(Bp)
    if p1 - p0 == 1 and K <= KC and i1 - i0 <= MR:
        # one micro-tile (the lesson's toy block is made of these): straight to the
        # micro-kernel, as the loops below would, without their set-up and divisions
        micro_kernel(A, a_off + i0 * lda, lda, 1, i1 - i0, Bp, b_off + p0 * ldp, NR, K,
                     C, c_off + i0 * ldc + p0 * NR, ldc, min(NR, N - p0 * NR), accumulate)
        return
    W = lanes(Bp)
    ntiles = (i1 - i0 + MR - 1) // MR
    end = b_off + (p1 - 1) * ldp + K * NR     # nothing past the last band is prefetched
    for p in range(p0, p1):
        n = min(NR, N - p * NR)
        for kc0 in range(0, K, KC):
            kc = min(KC, K - kc0)
            acc = accumulate or kc0 > 0
            pb = b_off + p * ldp + kc0 * NR
            # the next slice: the rest of this panel's band, else the next panel's
            nxt = pb + kc * NR if kc0 + kc < K else b_off + (p + 1) * ldp
            per = (kc * NR // W + ntiles - 1) // ntiles    # its cache lines per row tile
            if kc0 + kc >= K and p + 1 >= p1:
                per = 0                     # the last slice: nothing follows it
            line = nxt
            for i in range(i0, i1, MR):
                for q in range(per):
                    if line < end:
                        prefetch_l2(Bp, line)
                    line += W
                micro_kernel(A, a_off + i * lda + kc0, lda, 1, min(MR, i1 - i), Bp, pb, NR, kc,
                             C, c_off + i * ldc + p * NR, ldc, n, acc)
