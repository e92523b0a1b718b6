"""The stages of kernels.block's forward pass, and the task of each that a worker runs.

A call plans the stages it needs (plan_stage) into rows of a stage plan and runs each
stage's tasks from one loop per half of the block (block._one_block):
attention_stages_task (stages 1-2, until the heads' outputs are in q) and
output_stages_task (stages 3-4, W_O and the FFN).  next_task hands a worker its tasks.

Rotary positions and the KV cache's new rows are per (sequence, K/V head) work
(new_rows, rope_packed): the new rows' Q and K are turned (kernels.rotary) and the keys
and values written to the cache before any query reads them, inside the attention task
of the one query head of its K/V head when there is one such task (no grouped-query
attention, one query tile), else in a stage of their own before attention.
"""

from __future__ import annotations

import numpy as np

from .bgemm import pair_stride
from .ffn import ffn_down_task, ffn_input_task, ffn_rows_task, ffn_up_task
from .layout import block_layout, kt_len, norm_offsets, panel_groups, panels, row_piece, task_tile
from .kvstore import attend_cache, cache_first, cache_new_rows
from .options import claim, kernel
from .records import Cache, Rows, with_part
from .rotary import rotate_kt, rotate_rows
from .simd import panel_lanes
from .stages import attention_direct_task, attention_task, grouped_decode, layernorm_piece, out_proj_task, qkv_task
from .tiles import BQ, TASK_PANELS
from .wgemm import floats, round_pairs

# The stages of a forward pass, in the order a call runs those it needs: 1-2 (until the
# heads' outputs are in q) are attention_stages_task's, 3-4 output_stages_task's.
LN1, QKV, CACHE_NEW, ATTEND_CACHED, ATTEND_DIRECT, ATTEND, CACHE_FIRST, ROPE = range(8)
OUT_PROJ, FFN_IN, FFN_UP, FFN_DOWN, LN_POST, FFN_ROWS = range(6)
# The stage plan is (PLAN_ROWS, PLAN_COLS) intp: a row per stage, the attention half's
# from row 0, the output half's from row HALF (5 stages a half at most); its columns: the
# stage, its number of tasks, the next task of each half (next_task), tasks finished
# (finished, wait_for: a decode step's one parallel region)
HALF = 5
PLAN_ROWS = 2 * HALF
PLAN_COLS = 5


@kernel(internal=True)
def plan_stage(plan, n, stage, ntasks):
    """Append (stage, ntasks) as row n of plan; the next free row."""
    plan[n, 0] = stage
    plan[n, 1] = ntasks
    return n + 1


@kernel(internal=True)
def next_task(plan, s, w, halves, nthr):
    """The next task of stage s for worker w (plan[s, 1] when none is left).  halves=1:
    from one counter, as the workers ask.  halves=2: the tasks are two contiguous halves
    with a counter each (columns 2 and 3); worker w takes from half w % 2, then from the
    other.  For a GEMV (a decode step) a task is a run of panels of one weight matrix:
    two threads taking neighbouring runs in turn streamed slower than each streaming a
    half of its own (docs/perf-log.md)."""
    n = plan[s, 1]
    if halves == 1:
        return claim(plan, s, 2, nthr)
    size = (n + 1) // 2
    for j in range(2):
        g = (w + j) % 2
        t = g * size + claim(plan, s, 2 + g, nthr)
        if t < min(n, (g + 1) * size):
            return t
    return n


@kernel(internal=True)
def qkv_panels(dims, NR):
    """Column panels of the QKV stage: W_q's, then W_k's and W_v's (d_kv columns each)."""
    return panels(dims.d, NR) + 2 * panels(dims.kv_heads * (dims.d // dims.n_heads), NR)


@kernel(internal=True)
def inline_new_rows(dims, cache):
    """Whether each attention task (ATTEND_CACHED over the Cache ``cache``, or
    ATTEND_DIRECT: None) makes its own K/V head's new rows (new_rows) before attending:
    with one task per K/V head, that is a grouped decode step (stages.grouped_decode), or
    one query head a K/V head and (cached) one query tile; else a CACHE_NEW stage does."""
    if cache is None:
        return dims.kv_heads == dims.n_heads
    return grouped_decode(dims, cache) or (dims.kv_heads == dims.n_heads and dims.T <= BQ)


# inlined: a caller loaded from Numba's cache publishes the standalone kernels it calls
# (options._call_by_address), which a function between them would hide (cache_rows_task)
@kernel(internal=True, inline="always")
def new_rows(bufs, dims, t, cache):
    """The new rows of K/V head g = t % kv_heads of sequence b = t // kv_heads, in q as
    rows [Q | K | V] of 3d (bufs: Attend): with rotary positions, its K head and the
    group's Q heads turned; with a cache (None: none), its keys and values written there."""
    ragged = cache is not None and cache.seqs.size > 0      # the rotary table: a row a sequence
    turn_new_rows_if_rotary(bufs, dims, t, ragged)
    if cache is not None:
        cache_new_rows(bufs.q, dims, t, cache)


@with_part("rope_theta")
def turn_new_rows_if_rotary(bufs, dims, t, ragged):
    """turn_new_rows for a block with rotary positions."""
    turn_new_rows(bufs, dims, t, ragged)


@kernel(internal=True)
def turn_new_rows(bufs, dims, t, ragged):
    """Rotary positions for K/V head g = t % kv_heads of sequence b = t // kv_heads in q's
    rows [Q | K | V] of 3d: its K head and the group's Q heads turned, at the table's rows
    from 0, or from b*T for a ragged step's table (ragged: a row a sequence)."""
    d, T = dims.d, dims.T
    dk = d // dims.n_heads
    group = dims.n_heads // dims.kv_heads
    b, g = t // dims.kv_heads, t % dims.kv_heads
    base = b * T * 3 * d
    r0 = b * T if ragged else 0
    rotate_rows(bufs.q, base + g * group * dk, 3 * d, T, group, dk, bufs.rope, r0)
    rotate_rows(bufs.q, base + d + g * dk, 3 * d, T, 1, dk, bufs.rope, r0)


@with_part("rope_theta")
def rope_packed_if_rotary(bufs, dims, t):
    """rope_packed for a block with rotary positions."""
    rope_packed(bufs, dims, t)


@kernel(internal=True)
def rope_packed(bufs, dims, t):
    """Rotary positions for K/V head g = t % kv_heads of sequence b = t // kv_heads on the
    packed path: the group's Q heads in q (rows of d) and the head's K^T panels in kt."""
    d, T = dims.d, dims.T
    dk = d // dims.n_heads
    group = dims.n_heads // dims.kv_heads
    b, g = t // dims.kv_heads, t % dims.kv_heads
    rotate_rows(bufs.q, b * T * d + g * group * dk, d, T, group, dk, bufs.rope, 0)
    rotate_kt(bufs.kt, t * kt_len(T, dk, panel_lanes(bufs.kt)), T, dk, bufs.rope)


@kernel(readonly=("H", "Wf"), standalone=True, internal=True)
def attention_stages_task(stage, t, H, Wf, dims, grid, bufs, cache, few):
    """Task t of ``stage`` (LN1 .. ROPE) of block._one_block, which sets out the records
    and says what cache and few are: H the flat rows, bufs the Attend buffers, cache the
    block's Cache or None.  The stages of a cache and those of few rows (ATTEND_DIRECT)
    are compiled only into builds that can run them (cache, few not None)."""
    d = dims.d
    rows = H.size // d
    NR = panel_lanes(floats(Wf))
    if stage == LN1:
        g_off, b_off = norm_offsets(block_layout(dims, NR), 1, dims.rms)
        layernorm_piece(H, bufs.X, t, grid.nthr, rows, d, floats(Wf), g_off, b_off, dims.eps)
        r0, r1 = row_piece(t, grid.nthr, rows)
        round_pairs(Wf, bufs.X, Rows(r0 * d, d), r1 - r0, d, bufs.xp, Rows(r0 * pair_stride(d), pair_stride(d)))
    elif stage == QKV:
        qkv_task(Wf, dims, task_tile(t, grid.groups, grid.mc, rows, qkv_panels(dims, NR)), bufs)
    elif stage == ATTEND:
        seqs = np.empty(0, np.intp) if cache is None else cache.seqs        # uniform: no ragged pairs
        attention_task(bufs.q, bufs.ldq, dims, t, Cache(bufs.kt, bufs.vp, 0, dims.T, seqs), bufs.work, bufs.w_pos)
    elif stage == ROPE:
        rope_packed_if_rotary(bufs, dims, t)
    elif (few is not None or cache is not None) and stage == CACHE_NEW:   # rotary positions without a cache too
        new_rows(bufs, dims, t, cache)
    elif few is not None and stage == ATTEND_DIRECT:
        if inline_new_rows(dims, None):
            new_rows(bufs, dims, t, cache)
        attention_direct_task(bufs.q, dims, t, bufs.srow)
    elif cache is not None and stage == ATTEND_CACHED:
        if inline_new_rows(dims, cache):    # the task's own head, appended before it is read
            new_rows(bufs, dims, t, cache)
        attend_cache(bufs.q, bufs.ldq, dims, t, cache, bufs.work, bufs.w_pos)
    elif cache is not None:
        cache_first(bufs.kt, bufs.vp, dims, t, cache)


@kernel(readonly=("H", "Wf"), standalone=True, internal=True)
def output_stages_task(stage, t, H, Wf, dims, grid, bufs, few):
    """Task t of ``stage`` (OUT_PROJ .. FFN_ROWS) of block._one_block, which sets out the
    records: H the flat rows, bufs the Output buffers; the FFN's stages split by columns
    (FFN_IN .. LN_POST, few rows) are compiled only into builds that can run them (few
    not None)."""
    d = dims.d
    rows = H.size // d
    NR = panel_lanes(floats(Wf))
    if stage == OUT_PROJ:
        out_proj_task(H, Wf, dims, task_tile(t, grid.groups, grid.mc, rows, panels(d, NR)), bufs)
    elif stage == FFN_ROWS:
        ffn_rows_task(Wf, dims, bufs.out, t * bufs.mf, min(rows, (t + 1) * bufs.mf))
    elif few is None:
        pass
    elif stage == FFN_IN:
        ffn_input_task(Wf, dims, t, grid.nthr, rows, bufs)
    elif stage == FFN_UP or stage == FFN_DOWN:
        # task t: the t-th of the stage's runs of panels (layout.panel_groups)
        npn = panels(dims.dff if stage == FFN_UP else d, NR)
        g = panel_groups(npn, grid.nthr, TASK_PANELS)
        if stage == FFN_UP:
            ffn_up_task(Wf, dims, rows, bufs, t * npn // g, (t + 1) * npn // g)
        else:
            ffn_down_task(Wf, dims, rows, bufs, t * npn // g, (t + 1) * npn // g)
    else:
        g_off, b_off = norm_offsets(block_layout(dims, NR), 2, dims.rms)
        layernorm_piece(bufs.out, bufs.out, t, grid.nthr, rows, d, floats(Wf), g_off, b_off, dims.eps)
