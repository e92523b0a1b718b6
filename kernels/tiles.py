"""Every tile and block size of the kernels, for each vector path: the one table they read.

As in BLIS's context, a path (``isa.PATH``) binds the GEMM's micro-kernel to its shape,
MR rows by NV vectors, and to the k block KC around it; the other sizes do not depend on
the path.  Each size says why it is what it is; the measurements behind them are in
docs/perf-log.md.

    path     vector  micro-tile        registers    why
    avx512   64 B    6 x 4 vectors     24 of 32     two 512-bit FMA ports, 32 zmm
    avx2     32 B    6 x 2 vectors     12 of 16     16 ymm: 6 x 4 would spill
    generic  16 B    6 x 2 (x 4 on     12 of 16     any LLVM target (SSE2, NEON, ...);
                     32-register ISAs)              4 on AArch64, whose NEON has 32

Rows are tokens of all sequences together, except in attention (queries and keys of one
head).  NR, a panel's columns, is NV vectors of the array's dtype (``simd.panel_lanes``).
"""

from __future__ import annotations

from .isa import PATH, VectorPath

# ----------------------------------------------------------------------------- per path

MR = 6                  # rows of the GEMM micro-tile on every path
NV_BY_PATH = {"avx512": 4, "avx2": 2, "generic": 2}     # vectors per micro-tile row (the table above)


def micro_tile_vectors(path: VectorPath) -> int:
    """NV for a path: the table's, but 4 on AArch64's generic path (32 NEON registers)."""
    if path.name == "generic" and path.arch in ("aarch64", "arm64"):
        return 4
    return NV_BY_PATH[path.name]


def k_block(vector_bytes: int, nv: int, l1d: int) -> int:
    """KC: the largest power of two in 64..256 whose KC x NR slice of a B panel fits in
    the L1 (l1d bytes).  Each k block costs a store and a reload of the C tile, and the
    row tiles after the first find the slice in L1 or L2, either of which feeds the
    micro-kernel's row of B a k step faster than its FMAs use it (128 beat 64 in a 32 KiB
    L1: docs/perf-log.md); FF_CHUNK must stay a multiple of it."""
    kc = 64
    while kc < 256 and 2 * kc * nv * vector_bytes <= l1d:
        kc *= 2
    return kc


NV = micro_tile_vectors(PATH)
KC = k_block(PATH.vector_bytes, NV, PATH.l1d)

# ----------------------------------------------------------------------------- GEMM

KC_ONE = 256    # k block with one row tile (a GEMV: a decode step, the vocabulary head), a
                # multiple of KC on every path: no row tile comes back for a slice, and each
                # k block costs a store and a reload of C
TASK_PANELS = 3     # column panels a task takes, with all rows in every task (layout.panel_groups):
                    # a task's first slice of B comes from L3 unprefetched, and on stored
                    # weights a task first rounds its rows (bf16 pairs, int8 blocks) or
                    # unpacks its panels, once for all of its panels; and a decode step's
                    # task claims itself and counts itself done on counters both threads
                    # write (one panel a task: 5-10% of an int8 step, docs/perf-log.md)
MC = 192        # rows per QKV / W_O task at most (rows_per_task balances them): each task
                # streams all of W_qkv or W_o, so more rows read them less often, while the
                # task's A block still fits L2

# ----------------------------------------------------------------------------- FFN

MF = 192        # rows per FFN task at most: every task streams all of W_1 and W_2 (from L3),
                # so more rows per task mean fewer passes over them
FF_CHUNK = KC_ONE   # hidden columns per FFN step, a multiple of KC and NR on every path: the
                    # (MF, FF_CHUNK) chunk stays in L2, where a whole (MF, d_ff) hidden tile
                    # spills to L3; with one row tile, the same k blocks as ffn_down_task's

# ----------------------------------------------------------------------------- attention

BQ = 384        # queries per attention task, in sub-tiles of QSUB (a multiple of MR)
BK = 256        # keys per attention tile, a multiple of NR on every path and dtype (more
                # keys amortise the per-row softmax bookkeeping)
QSUB = 96       # queries per sub-tile: its QSUB x BK scores stay in L2 beside the key tile
KV_CHUNK = 128  # keys per P V pass: a KV_CHUNK x d_k slice of V stays in L1 while every
                # micro-tile passes over it; a whole key tile would not
DIRECT_MAX = 8192   # attention runs per query without tiles (attention_rows_direct) when
                    # T * T * d_k is at most this: below it, packing and tiles cost more
                    # than the whole untiled loop

# ----------------------------------------------------------------------------- the head

HEAD_ROWS = 512     # rows per head task at most: the A slice (HEAD_ROWS x KC) and the C
                    # panel stay in L2 while a panel's slices pass
HEAD_PANELS = 8     # column panels per head task of more than one row: groups large
                    # enough for gemm_panels to prefetch the next panel's slice

# ----------------------------------------------------------------------------- checks

FINITE_BLOCK = 4096     # elements summed between two looks at the sum (all_finite_flat)
