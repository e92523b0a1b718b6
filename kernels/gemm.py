"""Register-blocked GEMM: C (+)= A @ B with B pre-packed in column panels.

Layout (the operands' records: kernels.records)
  * A: a flat array and its Rows (offset of A[0, 0], row stride); it is read in place,
    never packed: a micro-kernel reads MR rows, each sequentially in k, which the
    prefetchers follow (packing A was no faster: docs/perf-log.md).
  * B: packed once into panels of NR columns, panel p holding B[:, p*NR:(p+1)*NR] as a
    (K, NR) row-major block, zero-padded past N (``pack_b``; its Panels).  Weights are
    packed when they are prepared, so the hot loop reads B as one contiguous stream per
    panel.
  * C: a flat array and its Rows; only the valid m x n corner of a micro-tile is ever
    written, so C and A need no padding.

Every GEMM driver (gemm_block, gemm_panels, gemv_panels) has the one signature (A, a, Bp,
b, C, c, tile, accumulate, bias_off), and the micro-kernel the same with (m, n, k) for
the tile.

The micro-kernel keeps an MR x NR tile of C in registers, MR = 6 rows of one panel
vector each (NV native vectors, NR = NV * lanes columns: tiles.py): 6 x 4 zmm on avx512,
6 x 2 ymm on avx2, 6 x 2 (or 4) xmm on generic.  Per k step it loads one row of B (NV
vectors) and broadcasts 6 elements of A: 6 NV fmas per NV + 6 loads, and 6 NV + NV + 1
registers live, within the register file of every path.
"""

from __future__ import annotations

import numpy as np

from .isa import PATH
from .options import kernel
from .records import Rows
from .simd import (lanes, panel_lanes, pbcast, pload, pload_n, prefetch_l2, psplat, pstore, pstore_n,
                   vadd, vfma)
from .tiles import KC, KC_ONE, MR, NV


def panel_width(dtype) -> int:
    """NR for a dtype: NV vectors of the path's width."""
    return NV * PATH.vector_bytes // np.dtype(dtype).itemsize


@kernel(readonly=("A", "B"), internal=True)
def micro_kernel(A, a, B, b, C, c, mnk, accumulate, bias_off):
    """C[0:m, 0:n] (+)= [bias +] A[0:m, 0:k] @ B[0:k, 0:NR] for m <= MR, n <= NR, with
    mnk = (m, n, k) and a, b, c the Rows of A, B and C in their flat arrays.

    With bias_off >= 0 the accumulators start from the bias row B.flat[bias_off :
    bias_off + NR] instead of zero: a projection's bias costs one load per micro-tile,
    not a pass over C.

    Rows past m are computed from a repeated row 0 (no out-of-bounds reads) and never
    stored; B must have NR readable columns per row.  One row (a decode step's GEMV) has
    a loop of its own: the six-row body ran it at a fraction of the memory bandwidth.  Two
    to four rows (the last row tile of T = 64 or 128) have a four-row loop: the six-row
    body spent a third or more of its FMAs on rows it never stores.  Every loop's sums are
    those rows' sums of the six-row body, in the same order."""
    m, n, K = mnk
    a_off, a_rs = a
    b_off, ldb = b
    c_off, ldc = c
    if m == 1:
        c0 = pload(B, bias_off) if bias_off >= 0 else psplat(B, 0.0)
        for k in range(K):
            c0 = vfma(pbcast(A, a_off + k), pload(B, b_off + k * ldb), c0)
        _store_row(C, c_off, n, accumulate, c0)
        return
    if m <= 4:
        a1 = a_off + a_rs                   # m >= 2 here
        a2 = a_off + (2 * a_rs if m > 2 else 0)
        a3 = a_off + (3 * a_rs if m > 3 else 0)
        c0 = c1 = c2 = c3 = pload(B, bias_off) if bias_off >= 0 else psplat(B, 0.0)
        for k in range(K):
            bk = pload(B, b_off + k * ldb)
            c0 = vfma(pbcast(A, a_off + k), bk, c0)
            c1 = vfma(pbcast(A, a1 + k), bk, c1)
            c2 = vfma(pbcast(A, a2 + k), bk, c2)
            c3 = vfma(pbcast(A, a3 + k), bk, c3)
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
        bk = pload(B, b_off + k * ldb)
        c0 = vfma(pbcast(A, a_off + k), bk, c0)
        c1 = vfma(pbcast(A, a1 + k), bk, c1)
        c2 = vfma(pbcast(A, a2 + k), bk, c2)
        c3 = vfma(pbcast(A, a3 + k), bk, c3)
        c4 = vfma(pbcast(A, a4 + k), bk, c4)
        c5 = vfma(pbcast(A, a5 + k), bk, c5)
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
def gemm_block(A, a, Bp, b, C, c, tile, accumulate, bias_off):
    """C[tile] (+)= [bias +] A[rows of tile, 0:k] @ B, serially: gemm_panels, or
    gemv_panels for one row (the same sums).  Inlined where it is called: a call layer
    costs as much as a small GEMM's work, and the lesson's toy block makes six."""
    if tile.i1 - tile.i0 == 1:
        gemv_panels(A, a, Bp, b, C, c, tile, accumulate, bias_off)
    else:
        gemm_panels(A, a, Bp, b, C, c, tile, accumulate, bias_off)


@kernel(readonly=("A", "Bp"), standalone=True, internal=True)
def gemv_panels(A, a, Bp, b, C, c, tile, accumulate, bias_off):
    """gemm_panels for one row (a decode step's GEMV, the head of one token): row tile.i0
    of A times the panels of tile, in the same k blocks of KC_ONE and so the same sums.  A
    function of its own, with m = 1 written at its one call of the micro-kernel: the copy
    of the micro-kernel inlined here is then its one-row loop alone, which streams the
    weights at a plain read's rate, where gemm_panels' call with m a variable did not
    (docs/perf-log.md)."""
    NR = panel_lanes(Bp)
    a_off = a.off + tile.i0 * a.ld
    c_off = c.off + tile.i0 * c.ld
    for p in range(tile.p0, tile.p1):
        for kc0 in range(0, b.k, KC_ONE):
            micro_kernel(A, Rows(a_off + kc0, 0), Bp, Rows(b.off + p * b.ld + kc0 * NR, NR), C,
                         Rows(c_off + p * NR, 0), (1, min(NR, b.n - p * NR), min(KC_ONE, b.k - kc0)),
                         accumulate or kc0 > 0, bias_off + p * NR if bias_off >= 0 and kc0 == 0 else -1)


@kernel(readonly=("A", "Bp"), standalone=True)
def gemm_panels(A, a, Bp, b, C, c, tile, accumulate, bias_off):
    """C[tile] (+)= [bias +] A[rows of tile, 0:k] @ B, serially: a, c the Rows of A and C,
    b the Panels of B, tile the rows and column panels of C to compute.

    bias_off >= 0: the bias of column j is Bp.flat[bias_off + j], zero-padded to whole
    panels; it enters with the first k block (micro_kernel), so it is added once.

    B can be a band of k rows out of a taller packed matrix (b.ld = its rows times NR,
    b.off pointing at the band's first row in panel 0).  Loop order: panels, then k
    blocks of KC, then micro row-tiles: the KC x NR slice of a panel stays in L1 while
    every row tile of the block passes over it, and the block's C panel stays in L1/L2
    across the k blocks.

    The weights (B) do not fit L2 and each slice is used for only one pass of row tiles,
    so while one slice is in use the next one is prefetched into L2, a few lines before
    each micro-kernel call: the first row tile of a slice then finds it in L2 instead of
    waiting on L3."""
    NR = panel_lanes(Bp)
    a_off, lda = a
    b_off, ldp, K, N = b
    c_off, ldc = c
    i0, i1, p0, p1 = tile
    kb = KC_ONE if i1 - i0 <= MR else KC      # one row tile: no slice of B is used twice
    if p1 - p0 == 1 and K <= kb and i1 - i0 <= MR:
        # one micro-tile (the lesson's toy block is made of these): straight to the
        # micro-kernel, as the loops below would, without their set-up and divisions
        micro_kernel(A, Rows(a_off + i0 * lda, lda), Bp, Rows(b_off + p0 * ldp, NR), C,
                     Rows(c_off + i0 * ldc + p0 * NR, ldc), (i1 - i0, min(NR, N - p0 * NR), K), accumulate,
                     bias_off + p0 * NR if bias_off >= 0 else -1)
        return
    W = lanes(Bp)
    ntiles = (i1 - i0 + MR - 1) // MR
    end = b_off + (p1 - 1) * ldp + K * NR     # nothing past the last band is prefetched
    for p in range(p0, p1):
        n = min(NR, N - p * NR)
        for kc0 in range(0, K, kb):
            kc = min(kb, K - kc0)
            acc = accumulate or kc0 > 0
            bias = bias_off + p * NR if bias_off >= 0 and kc0 == 0 else -1
            pb = b_off + p * ldp + kc0 * NR
            # the next slice: the rest of this panel's band, else the next panel's
            nxt = pb + kc * NR if kc0 + kc < K else b_off + (p + 1) * ldp
            per = (kc * NR // W + ntiles - 1) // ntiles    # its cache lines per row tile
            if (kc0 + kc >= K and p + 1 >= p1) or ntiles == 1:
                # the last slice: nothing follows it; one row tile: the whole next slice
                # at once stalled the stream the hardware prefetcher follows anyway
                per = 0
            line = nxt
            for i in range(i0, i1, MR):
                for q in range(per):
                    if line < end:
                        prefetch_l2(Bp, line)
                    line += W
                micro_kernel(A, Rows(a_off + i * lda + kc0, lda), Bp, Rows(pb, NR), C,
                             Rows(c_off + i * ldc + p * NR, ldc), (min(MR, i1 - i), n, kc), acc, bias)
