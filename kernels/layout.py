"""Where things are: the panel, stride and task arithmetic of the kernels, in one place.

    panels       column panels of NR that hold n columns
    kt_len       elements of one head's packed K^T (pack_kt's panels of NR keys)
    v_stride     row stride of one head's packed V (d_k rounded up to NR)
    packed_len   elements of a packed (K, N) weight in the flat weight buffer
    bias_len     elements of a projection's bias there (whole panels)
    weight_layout  offsets of every weight in that buffer (block_layout: for a Dims)
    ffn_cols     columns of the FFN's first matrix: d_ff, or the gated FFN's [gate | up]
    qkv_parts    where W_q, W_k, W_v and their biases start (K and V of d_kv columns)
    rows_per_task, stage_grid, task_tile   how a stage of the block splits into tasks
    take, take_f64   scratch from a caller's work buffer (a KVCache's), or new arrays
"""

from __future__ import annotations

import numpy as np

from .options import kernel
from .records import Tile
from .tiles import MR


@kernel(internal=True)
def ceil_div(n, k):
    """Pieces of k that hold n (the last one partial)."""
    return (n + k - 1) // k


@kernel
def panels(n, NR):
    """Column panels of NR that hold n columns (the last one padded)."""
    return ceil_div(n, NR)


@kernel(internal=True)
def row_piece(t, pieces, rows):
    """Rows r0:r1 of piece t of ``pieces`` near-equal row ranges."""
    return t * rows // pieces, (t + 1) * rows // pieces


@kernel(internal=True)
def kt_len(T, dk, NR):
    """Elements of one head's packed K^T: panels of NR keys, d_k rows each."""
    return panels(T, NR) * dk * NR


@kernel(internal=True)
def v_stride(dk, NR):
    """Row stride of one head's packed V: d_k rounded up to NR, zeros past d_k."""
    return panels(dk, NR) * NR


@kernel
def packed_len(K, N, NR):
    """Elements a packed (K, N) matrix takes in the flat weight buffer: its panels,
    rounded up to a whole number of 64-byte lines (16 float32 / 8 float64 elements, so
    16 serves both)."""
    return (panels(N, NR) * K * NR + 15) // 16 * 16


@kernel
def bias_len(n, NR):
    """Elements a projection's bias of n columns takes in the flat weight buffer: whole
    panels (the micro-kernel loads a panel's bias as one row), rounded up to a 64-byte line."""
    return (panels(n, NR) * NR + 15) // 16 * 16


@kernel(inline="always")
def weight_layout(d, dkv, n1, dff, NR):
    """Offsets in the flat weight buffer: b1, b2, gamma1, beta1, gamma2, beta2, the
    attention biases b_q, b_k, b_v (one after another from o_bqkv, each zero-padded to
    whole panels: the GEMM loads a panel's bias as one row) and b_o (padded likewise), then
    packed W_q, W_k, W_v (one after another from o_qkv: qkv_parts; no panel mixes two of
    them), W_o, W_1, W_2; each part starts on a 64-byte boundary.  K and V have dkv
    columns (d_kv: d_model without grouped-query attention); W_1 and b1 have n1 columns
    (ffn_cols: d_ff, or the gated FFN's [gate | up] panels).  The vectors come first:
    weights stored in another format (kernels.wgemm) keep only them in a float buffer, the
    o_qkv elements before the matrices."""
    def up(x):
        return (x + 15) // 16 * 16
    o_b1 = 0
    o_b2 = o_b1 + up(n1)
    o_g1 = o_b2 + up(d)
    o_be1 = o_g1 + up(d)
    o_g2 = o_be1 + up(d)
    o_be2 = o_g2 + up(d)
    o_bqkv = o_be2 + up(d)
    o_bo = o_bqkv + bias_len(d, NR) + 2 * bias_len(dkv, NR)
    o_qkv = o_bo + bias_len(d, NR)
    o_o = o_qkv + packed_len(d, d, NR) + 2 * packed_len(d, dkv, NR)
    o_1 = o_o + packed_len(d, d, NR)
    o_2 = o_1 + packed_len(d, n1, NR)
    total = o_2 + packed_len(dff, d, NR)
    return o_qkv, o_o, o_1, o_2, o_b1, o_b2, o_g1, o_be1, o_g2, o_be2, o_bqkv, o_bo, total


@kernel
def ffn_cols(dff, gated, NR):
    """Columns of the FFN's first packed matrix: d_ff, or for the gated FFN its [gate | up]
    panels, gate panel p then up panel p (each NR columns, zero past d_ff), so that one
    GEMM over panels 2p, 2p + 1 makes both halves of hidden panel p in one pass."""
    return 2 * panels(dff, NR) * NR if gated else dff


@kernel(inline="always")
def block_layout(dims, NR):
    """weight_layout of the block a Dims describes."""
    return weight_layout(dims.d, dims.kv_heads * (dims.d // dims.n_heads), ffn_cols(dims.dff, dims.gated, NR),
                         dims.dff, NR)


@kernel(inline="always")
def qkv_parts(d, dkv, NR, o_qkv, o_bqkv):
    """((W_q, W_k, W_v offsets), (b_q, b_k, b_v offsets)) in the flat weight buffer,
    weight_layout's o_qkv and o_bqkv given."""
    wk = o_qkv + packed_len(d, d, NR)
    bk = o_bqkv + bias_len(d, NR)
    return (o_qkv, wk, wk + packed_len(d, dkv, NR)), (o_bqkv, bk, bk + bias_len(dkv, NR))


@kernel(inline="always")
def norm_offsets(layout, i, rms):
    """(gamma, beta) offsets of norm i (1 or 2) in weight_layout ``layout``; beta -1 for
    RMSNorm (layernorm.layernorm_rows then takes no mean and adds no beta)."""
    g = layout[6] if i == 1 else layout[8]
    b = layout[7] if i == 1 else layout[9]
    return g, (-1 if rms else b)


@kernel(internal=True)
def rows_per_task(rows, cap, nthr):
    """Rows per task for a stage over ``rows`` rows: at most ``cap``, a multiple of the
    micro-tile height, and as many tasks as a multiple of the thread count nthr, so that
    no thread idles at the end while the other runs a last task (docs/perf-log.md)."""
    ntask = ceil_div(ceil_div(rows, cap), nthr) * nthr
    return max(MR, ceil_div(ceil_div(rows, ntask), MR) * MR)


@kernel(internal=True)
def panel_groups(npanels, nthr, per):
    """Tasks of a stage whose every task takes all the rows: one per column panel, or with
    per > 1 (tiles.TASK_PANELS) runs of about per panels, a multiple of nthr of them so that
    the threads end together (a decode step's halves, tasks.next_task: a run of them a
    thread)."""
    if per <= 1:
        return npanels
    return min(npanels, nthr * ceil_div(npanels, nthr * per))


@kernel(internal=True)
def stage_grid(rows, npanels, cap, nthr, per):
    """How a GEMM stage over ``rows`` rows and ``npanels`` column panels of its weight
    splits into tasks: (rows per task, panel groups, number of tasks); task_tile numbers them.

    With threads to spare (rows <= cap * nthr: at most one row block a thread), every
    task takes all the rows and a run of about per panels (panel_groups): each weight is then
    streamed by one thread only, and the many equal tasks balance the cores, where row
    blocks rounded to the micro-tile left one thread up to a tile-row behind (d_model=384,
    T=64: 64 rows in tasks of 36 and 28).  Otherwise row blocks of at most ``cap`` rows, a multiple of
    nthr of them, each split into column groups when there are few (a serial call gains
    nothing from the split)."""
    if nthr > 1 and rows <= cap * nthr:
        g = panel_groups(npanels, nthr, per)
        return rows, g, g
    mc = rows_per_task(rows, cap, nthr)
    nrb = ceil_div(rows, mc)
    groups = 1 if nthr == 1 else min(npanels, max(1, 8 // nrb))
    return mc, groups, nrb * groups


@kernel(internal=True)
def task_tile(t, groups, mc, rows, npanels):
    """Task t of a GEMM stage split into (row block of mc rows) x (one of ``groups`` groups
    of NR-wide column panels): the Tile of its rows and panels.  Splitting by columns too
    keeps both cores busy when there are fewer row blocks than threads."""
    r0 = (t // groups) * mc
    g = t % groups
    return Tile(r0, min(rows, r0 + mc), g * npanels // groups, (g + 1) * npanels // groups)


@kernel(internal=True)
def up16(n):
    """n rounded up to 16 elements, a multiple of 64 bytes in float32 and float64: each
    part of a work buffer starts on a cache line."""
    return (n + 15) // 16 * 16


@kernel(internal=True)
def take(work, pos, n):
    """n elements of scratch of work's dtype: work[pos : pos+n] and the next free
    position, or with no work buffer (work.size == 0) a new array and pos unchanged.  A
    decode step takes all its scratch from its KVCache's buffer this way, so it allocates
    nothing; the caller checks that the buffer holds everything it takes (work_len)."""
    if work.size == 0:
        return np.empty(n, dtype=work.dtype), pos
    return work[pos:pos + n], pos + up16(n)


@kernel(internal=True)
def take_f64(work, pos, n):
    """As take, n float64 elements (the softmax's running sums are float64 in float32 too)."""
    if work.size == 0:
        return np.empty(n), pos
    k = n * 8 // work.itemsize
    return work[pos:pos + k].view(np.float64), pos + up16(k)

