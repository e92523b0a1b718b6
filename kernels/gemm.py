"""Register-blocked GEMM: C (+)= A @ B with B pre-packed in column panels.

Layout
  * A: addressed as (flat array, offset of A[0, 0], row stride, k stride); it is read
    in place, never packed: a micro-kernel reads MR rows, each sequentially in k, which
    the prefetchers follow (packing A was no faster: docs/perf-log.md).
  * B: packed once into panels of NR columns, panel p holding B[:, p*NR:(p+1)*NR] as a
    (K, NR) row-major block, zero-padded past N (``pack_b``).  Weights are packed when
    they are prepared, so the hot loop reads B as one contiguous stream per panel.
  * C: row-major (flat array, offset, row stride ldc); only the valid m x n corner of a
    micro-tile is ever written, so C and A need no padding.

The micro-kernel keeps an MR x NR tile of C in registers, MR = 6 rows of one panel
vector each (NV native vectors, NR = NV * lanes columns: isa.PATH): 6 x 4 zmm on avx512,
6 x 2 ymm on avx2, 6 x 2 (or 4) xmm on generic.  Per k step it loads one row of B (NV
vectors) and broadcasts 6 elements of A: 6 NV fmas per NV + 6 loads, and 6 NV + NV + 1
registers live, within the register file of every path.
"""

from __future__ import annotations

import numpy as np

from .isa import MR, PATH
from .options import kernel
from .simd import (lanes, panel_lanes, pbcast, pload, pload_n, prefetch_l2, psplat, pstore, pstore_n,
                   vadd, vfma)

NV = PATH.nv    # vectors per row of the micro-tile: NR = NV * lanes columns
KC = PATH.kc    # k block: a KC x NR slice of a B panel stays in L1 while row tiles pass
KC_ONE = 256    # k block with one row tile (a GEMV: a decode step, the vocabulary head), a
                # multiple of KC on every path: no row tile comes back for the slice, and each
                # k block's store and reload of C cost ~4% of the weights' stream


def panel_width(dtype) -> int:
    """NR for a dtype: NV vectors of the path's width."""
    return NV * PATH.vector_bytes // np.dtype(dtype).itemsize


@kernel(readonly=("A", "B"), internal=True)
def micro_kernel(A, a_off, a_rs, a_ks, m, B, b_off, ldb, K, C, c_off, ldc, n, accumulate, bias_off):
    """C[0:m, 0:n] (+)= [bias +] A[0:m, 0:K] @ B[0:K, 0:NR] for m <= MR, n <= NR.

    With bias_off >= 0 the accumulators start from the bias row B.flat[bias_off :
    bias_off + NR] instead of zero: a projection's bias costs one load per micro-tile,
    not a pass over C.

    A[r, k] is A.flat[a_off + r*a_rs + k*a_ks]: (lda, 1) for a row-major matrix, (1, MR)
    for a packed panel.  Rows past m are computed from a repeated row 0 (no
    out-of-bounds reads) and never stored; B must have NR readable columns per row.
    One row (a decode step's GEMV) has a loop of its own: the six-row body ran it at
    a third of the memory bandwidth.  Two to four rows (the last row tile of T = 64 or
    128) have a four-row loop: the six-row body spent a third or more of its FMAs on
    rows it never stores.  Every loop's sums are those rows' sums of the six-row body,
    in the same order."""
    if m == 1:
        c0 = pload(B, bias_off) if bias_off >= 0 else psplat(B, 0.0)
        for k in range(K):
            c0 = vfma(pbcast(A, a_off + k * a_ks), pload(B, b_off + k * ldb), c0)
        _store_row(C, c_off, n, accumulate, c0)
        return
    if m <= 4:
        a1 = a_off + a_rs                   # m >= 2 here
        a2 = a_off + (2 * a_rs if m > 2 else 0)
        a3 = a_off + (3 * a_rs if m > 3 else 0)
        c0 = c1 = c2 = c3 = pload(B, bias_off) if bias_off >= 0 else psplat(B, 0.0)
        for k in range(K):
            b = pload(B, b_off + k * ldb)
            ak = k * a_ks
            c0 = vfma(pbcast(A, a_off + ak), b, c0)
            c1 = vfma(pbcast(A, a1 + ak), b, c1)
            c2 = vfma(pbcast(A, a2 + ak), b, c2)
            c3 = vfma(pbcast(A, a3 + ak), b, c3)
        _store_row(C, c_off, n, accumulate, c0)
        _store_row(C, c_off + ldc, n, accumulate, c1)
        if m > 2:
            _store_row(C, c_off + 2 * ldc, n, accumulate, c2)
        if m > 3:
            _store_row(C, c_off + 3 * ldc, n, accumulate, c3)
        return
    a1 = a_off + (a_rs if m > 1 else 0)
    a2 = a_off + (2 * a_rs if m > 2 else 0)
    a3 = a_off + (3 * a_rs if m > 3 else 0)
    a4 = a_off + (4 * a_rs if m > 4 else 0)
    a5 = a_off + (5 * a_rs if m > 5 else 0)
    c0 = c1 = c2 = c3 = c4 = c5 = pload(B, bias_off) if bias_off >= 0 else psplat(B, 0.0)
    for k in range(K):
        b = pload(B, b_off + k * ldb)
        ak = k * a_ks
        c0 = vfma(pbcast(A, a_off + ak), b, c0)
        c1 = vfma(pbcast(A, a1 + ak), b, c1)
        c2 = vfma(pbcast(A, a2 + ak), b, c2)
        c3 = vfma(pbcast(A, a3 + ak), b, c3)
        c4 = vfma(pbcast(A, a4 + ak), b, c4)
        c5 = vfma(pbcast(A, a5 + ak), b, c5)
    _store_row(C, c_off, n, accumulate, c0)
    if m > 1:
        _store_row(C, c_off + ldc, n, accumulate, c1)
    if m > 2:
        _store_row(C, c_off + 2 * ldc, n, accumulate, c2)
    if m > 3:
        _store_row(C, c_off + 3 * ldc, n, accumulate, c3)
    if m > 4:
        _store_row(C, c_off + 4 * ldc, n, accumulate, c4)
    if m > 5:
        _store_row(C, c_off + 5 * ldc, n, accumulate, c5)


@kernel(internal=True)
def _store_row(C, off, n, accumulate, v):
    """C.flat[off : off + n] (+)= v[:n]: one full-width store when the row is whole."""
    if n >= panel_lanes(C):
        if accumulate:
            v = vadd(pload(C, off), v)
        pstore(C, off, v)
    elif n > 0:
        if accumulate:
            v = vadd(pload_n(C, off, n), v)
        pstore_n(C, off, v, n)


def packed_size(K: int, N: int, NR: int) -> int:
    """Elements of the packed form of a (K, N) matrix."""
    return -(-N // NR) * K * NR


def pack_b(B: np.ndarray, out: np.ndarray) -> None:
    """Write (K, N) ``B`` into the flat ``out`` (packed_size elements or more) as panels:
    panel p = B[:, p*NR:(p+1)*NR] as a (K, NR) row-major block, zero past column N."""
    K, N = B.shape
    NR = panel_width(out.dtype)
    NP = -(-N // NR)
    panels = out[:NP * K * NR].reshape(NP, K, NR)     # out may be longer (packed_len)
    panels[...] = 0
    for p in range(NP):
        cols = B[:, p * NR:(p + 1) * NR]
        panels[p, :, :cols.shape[1]] = cols


@kernel(inline="always", readonly=("A", "Bp"))
def gemm_block(A, a_off, lda, i0, i1, Bp, b_off, K, N, p0, p1, C, c_off, ldc, accumulate, KC, bias_off):
    """C[i0:i1, columns of panels p0..p1) (+)= [bias +] A[i0:i1, 0:K] @ B, serially, for a
    packed B of K rows (gemm_panels with the panel stride K * NR; gemv_panels for one row).
    Inlined where it is called: a call layer costs ~50 ns, and the lesson's toy block makes
    six of these calls."""
    NR = panel_lanes(Bp)
    if i1 - i0 == 1:
        gemv_panels(A, a_off + i0 * lda, Bp, b_off, K * NR, K, N, p0, p1, C, c_off + i0 * ldc, accumulate,
                    bias_off)
    else:
        gemm_panels(A, a_off, lda, i0, i1, Bp, b_off, K * NR, K, N, p0, p1, C, c_off, ldc, accumulate, KC,
                    bias_off)


@kernel(readonly=("A", "Bp"), standalone=True, internal=True)
def gemv_panels(A, a_off, Bp, b_off, ldp, K, N, p0, p1, C, c_off, accumulate, bias_off):
    """gemm_panels for one row (a decode step's GEMV, the head of one token): the row
    A.flat[a_off : a_off + K] times panels p0..p1 into C.flat[c_off + p0*NR ...], in the
    same k blocks of KC_ONE and so the same sums.  A function of its own, with m = 1
    written at its one call of the micro-kernel: the copy of the micro-kernel inlined
    here is then its one-row loop alone, which streams the weights at a plain read's
    rate, where gemm_panels' call with m a variable ran 3-5% slower (docs/perf-log.md)."""
    NR = panel_lanes(Bp)
    for p in range(p0, p1):
        for kc0 in range(0, K, KC_ONE):
            micro_kernel(A, a_off + kc0, 0, 1, 1, Bp, b_off + p * ldp + kc0 * NR, NR, min(KC_ONE, K - kc0),
                         C, c_off + p * NR, 0, min(NR, N - p * NR), accumulate or kc0 > 0,
                         bias_off + p * NR if bias_off >= 0 and kc0 == 0 else -1)


@kernel(readonly=("A", "Bp"), standalone=True)
def gemm_panels(A, a_off, lda, i0, i1, Bp, b_off, ldp, K, N, p0, p1, C, c_off, ldc, accumulate, KC,
                bias_off):
    """C[i0:i1, columns of panels p0..p1) (+)= [bias +] A[i0:i1, 0:K] @ B, serially.

    bias_off >= 0: the bias of column j is Bp.flat[bias_off + j], zero-padded to whole
    panels; it enters with the first k block (micro_kernel), so it is added once.

    A[i, k] = A.flat[a_off + i*lda + k]; C[i, j] = C.flat[c_off + i*ldc + j]; B[k, j] of
    panel p is Bp[b_off + p*ldp + k*NR + j - p*NR]: a packed matrix's panels are ldp
    apart, so B can be a band of K rows out of a taller packed matrix (ldp = its rows
    times NR, b_off pointing at the band's first row in panel 0).  Loop order: panels,
    then k blocks of KC, then micro row-tiles: the KC x NR slice of a panel (KC=128:
    32 KiB of float32) stays in L1 while every row tile of the block passes over it,
    and the block's C panel stays in L1/L2 across the k blocks.

    The weights (B) do not fit L2 and each slice is used for only one pass of row tiles,
    so while one slice is in use the next one is prefetched into L2, a few lines before
    each micro-kernel call: the first row tile of a slice then finds it in L2 instead of
    waiting on L3."""
    NR = panel_lanes(Bp)
    if i1 - i0 <= MR:
        KC = KC_ONE                     # one row tile: no slice of B is used twice
    if p1 - p0 == 1 and K <= KC and i1 - i0 <= MR:
        # one micro-tile (the lesson's toy block is made of these): straight to the
        # micro-kernel, as the loops below would, without their set-up and divisions
        micro_kernel(A, a_off + i0 * lda, lda, 1, i1 - i0, Bp, b_off + p0 * ldp, NR, K,
                     C, c_off + i0 * ldc + p0 * NR, ldc, min(NR, N - p0 * NR), accumulate,
                     bias_off + p0 * NR if bias_off >= 0 else -1)
        return
    W = lanes(Bp)
    ntiles = (i1 - i0 + MR - 1) // MR
    end = b_off + (p1 - 1) * ldp + K * NR     # nothing past the last band is prefetched
    for p in range(p0, p1):
        n = min(NR, N - p * NR)
        for kc0 in range(0, K, KC):
            kc = min(KC, K - kc0)
            acc = accumulate or kc0 > 0
            bias = bias_off + p * NR if bias_off >= 0 and kc0 == 0 else -1
            pb = b_off + p * ldp + kc0 * NR
            # the next slice: the rest of this panel's band, else the next panel's
            nxt = pb + kc * NR if kc0 + kc < K else b_off + (p + 1) * ldp
            per = (kc * NR // W + ntiles - 1) // ntiles    # its cache lines per row tile
            if (kc0 + kc >= K and p + 1 >= p1) or ntiles == 1:
                # the last slice: nothing follows it; one row tile: the whole next slice
                # at once (512 prefetches before a GEMV's slice) stalled the stream the
                # hardware prefetcher follows anyway
                per = 0
            line = nxt
            for i in range(i0, i1, MR):
                for q in range(per):
                    if line < end:
                        prefetch_l2(Bp, line)
                    line += W
                micro_kernel(A, a_off + i * lda + kc0, lda, 1, min(MR, i1 - i), Bp, pb, NR, kc,
                             C, c_off + i * ldc + p * NR, ldc, n, acc, bias)
