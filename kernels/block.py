"""The whole block in one call: fused stages over flat buffers.

One compiled function runs a forward pass of the block over B sequences, so a call
from Python crosses into Numba once.  Its four stages are loops over independent
tasks (``stages``; their tile and stride arithmetic: ``layout``):

  1. QKV:   [LN1 of a row block into scratch] then X @ [W_q W_k W_v]: Q into ``q``,
            K and V through a task-sized scratch straight into the layouts attention
            reads (K^T in panels for the score micro-kernel, V in contiguous rows per
            head); for tiny T*T*d_k, Q, K and V side by side in one buffer instead
  2. attn:  per (sequence, head, query tile), flash attention (a decode step over a
            float cache: per (sequence, K/V head), its query group as one tile); the
            head's output is written over that head's Q columns of the same rows (each
            Q tile is read by exactly one task, before it writes there), so out_concat
            needs no buffer
  3. W_O:   out = H + out_concat @ W_O (the residual is the GEMM's initial C)
  4. FFN:   per row tile: [LN], then per chunk of FF_CHUNK hidden columns:
            up-projection, bias + activation, and the chunk's band of W_2 accumulated
            onto the residual already in ``out`` [LN]: the (rows, FF_CHUNK) hidden
            chunk is the only place the hidden layer exists.  When the rows are too few
            to give every thread its own row tiles: LN, then the up- and the
            down-projection as two stages split by column panels, through the whole
            (rows, d_ff) hidden layer, with the same sums in the same order.

With few rows for the threads, the GEMM stages give every task all the rows and a run
of about TASK_PANELS column panels (``stage_grid``), and the Pre-LN's LN1 becomes a stage
of its own.

A call plans the stages it needs and runs each stage's tasks from one loop per half of
the block (attention_stages_task: 1-2; output_stages_task: 3-4, once the output buffer
exists).  ``block_parallel`` runs a stage with ``prange`` over the threads: Numba builds
three modules for every prange loop, so one loop for all stages keeps a first call's
compile short.  Each thread claims the stage's tasks one at a time from a shared counter
(options.claim): tasks are coarse and causal attention tasks differ in cost, and Numba's
OpenMP layer would split a prange over the tasks statically, half to each thread; claimed
one by one (each head's costly query tiles first) they balance the cores.  With one row
tile (a decode step, where every stage streams weights) the tasks are two halves with a
counter each, so each thread streams its runs of neighbouring panels (next_task).  With few
rows (every GEMM task holds all of them: a decode step, a short sequence) the whole block
is one parallel region whose stages wait for the count of the previous stage's finished
tasks (options.finished, options.wait_for), not a region a stage.
``block_serial`` is the same code compiled without prange, for sizes where launching a
parallel region costs more than the work (the lesson's toy block); it writes into an
output its caller made (handing a Numba array back to Python costs more).  A stack of blocks
with KV caches runs in one call (``cached_parallel``, ``cached_serial``: the block
with a cache, over a table of blocks): a decode step crosses from Python into compiled
code once, not once a block, and takes its scratch from the cache (work_len).

Each body is written once and compiled into two builds defined by name:
``one_block_serial`` and ``one_block_parallel`` are ``_one_block`` without and with threads
for its prange loops (options.build), and ``cached_serial`` and ``cached_parallel`` each
hand ``_cached`` (inlined into both) the build of the block it runs.  A call's
dimensions, caches and buffers travel as records (kernels.records); from Python, as plain
tuples in the same order.

Threading: Numba's threads do all the work in parallel regions, one region at a time,
and every kernel inside a task is serial; no BLAS is called, so nothing else competes
for the cores.  Each output element is produced by exactly one task in a fixed
order, so results do not depend on the schedule, nor, but for the rounding of the
serial and the parallel build's fast-math code, on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.extending import overload

from .ffn import ffn_pairs
from .layout import ceil_div, ffn_cols, panel_groups, panels, rows_per_task, stage_grid, take, take_f64, up16
from .options import borrowed, borrowed_at, build, finished, keep_alive, kernel, wait_for
from .records import Attend, Cache, Dims, Grid, Output, Scratch, with_part
from .rotary import rope_table
from .simd import panel_lanes
from .stages import (attention_buffers, attention_direct_task, attention_task, attention_work, cached_attention_tasks,
                     pack_head)
from .tasks import (ATTEND, ATTEND_CACHED, ATTEND_DIRECT, CACHE_FIRST, CACHE_NEW, FFN_IN, FFN_DOWN, FFN_ROWS, FFN_UP,
                    HALF, LN1, LN_POST, OUT_PROJ, PLAN_COLS, PLAN_ROWS, QKV, ROPE, attention_stages_task,
                    inline_new_rows, next_task, output_stages_task, plan_stage, qkv_panels)
from .tiles import BQ, DIRECT_MAX, MC, MF, MR, TASK_PANELS
from .validate import all_finite_flat
from .wgemm import as_weights, borrow, floats, pair_rows, weights_at


@kernel(parallel=True)
def attention_core(qkv, T, d, n_heads, kv_heads, causal):
    """The block's attention on its own, for callers that time it alone: qkv is the
    flat (B*T, 3d) buffer of projection rows [Q | K | V] (K and V kv_heads heads wide);
    each head's output replaces its Q columns.  The block gets K and V already packed from
    its projection (qkv_task); here a packing pass (pack_head) comes first."""
    nseq = qkv.size // (3 * d) // T
    nbh = nseq * n_heads
    dk = d // n_heads
    dims = Dims(T, d, n_heads, 0, causal, False, 0, 0.0, kv_heads, None, None, None, 1.0)   # the FFN's unused
    if T * T * dk <= DIRECT_MAX:
        srow = np.empty(nbh * T)
        for t in prange(nbh):
            attention_direct_task(qkv, dims, t, srow)
        return
    kt, vp = attention_buffers(qkv, nseq, T, dk, kv_heads)
    for t in prange(nseq * kv_heads):
        pack_head(qkv, T, d, dk, kv_heads, t, kt, vp)
    for t in prange(nbh * ceil_div(T, BQ)):
        attention_task(qkv, 3 * d, dims, t, Cache(kt, vp, 0, T, np.empty(0, np.intp)), kt[:0], 0)


@kernel
def work_len(rows, T, d, dff, n_heads, keys, NR, itemsize):
    """Elements of a work buffer (of an itemsize-byte dtype) that holds all the scratch of
    one_block for ``rows`` rows, T per sequence, attending over ``keys`` keys, on the path
    of few keys (T * T * d_k <= DIRECT_MAX, or tokens cached): a KVCache keeps one for a
    decode step, so the step allocates nothing.  In the order one_block takes it: Q K V
    rows, LN1, the untiled attention's row, each attention task's tiles, two output
    buffers (a stack's blocks alternate), the FFN's input and hidden layer, the gated
    FFN's [gate | up] panels; then, from the end, the rotary table (rope_rows).  Grouped K
    and V and the gated FFN need no more than this counts for them."""
    w = 8 // itemsize
    nbh = rows // T * n_heads
    n = up16(rows * 3 * d) + up16(rows * d) + up16(nbh * T * w)
    n += nbh * ceil_div(T, BQ) * attention_work(min(T, BQ), keys, d // n_heads, NR, itemsize)
    n += 3 * up16(rows * d) + up16(rows * (dff + 64 // itemsize))
    return n + up16(rows * ffn_cols(dff, True, NR)) + up16(T * (d // n_heads))


@kernel(internal=True, fastmath=False)
def rope_rows(dims, first, work, seqs):
    """The rotary table (rotary.rope_table) of a call's T rows a sequence, tokens first..:
    the end of the work buffer when there is one (work_len keeps room for it there), else a
    new array (for a block with rotary positions: rope_rows_if_rotary).  A ragged decode
    step (seqs: [slot, past] pairs, T = 1): a new table, row b at sequence b's own
    position seqs[2b + 1]."""
    if dims.rope_theta <= 0:
        return work[:0]
    dk = dims.d // dims.n_heads
    if seqs.size > 0:
        R = np.empty(seqs.size // 2 * dk, dtype=work.dtype)
        for b in range(seqs.size // 2):
            rope_table(R[b * dk:(b + 1) * dk], 1, dk, seqs[2 * b + 1], dims.rope_theta, dims.rope_scale)
        return R
    n = dims.T * dk
    R = np.empty(n, dtype=work.dtype) if work.size == 0 else work[work.size - n:]
    rope_table(R, dims.T, dk, first, dims.rope_theta, dims.rope_scale)
    return R


@with_part("rope_theta", absent=lambda dims, first, work, seqs: work[:0])
def rope_rows_if_rotary(dims, first, work, seqs):
    """rope_rows for a block with rotary positions; an empty view of work for one without."""
    return rope_rows(dims, first, work, seqs)


def _one_block(H, Wf, dims, cache, scratch, nthr, few):
    """One block on the flat rows H (B*T*d), the body of one_block_serial and
    one_block_parallel: its output (B, T, d): scratch.dest when it is not empty (rows * d
    elements); else with a work buffer (scratch.work: work_len elements, few keys; empty:
    none) output buffer scratch.slot (0 or 1) of it, every scratch buffer taken from it
    too; else a new array.  scratch.plan: (PLAN_ROWS, PLAN_COLS) intp, room for the stage
    plan; scratch.rope: the rotary table of the call's rows (rope_rows).  cache: the
    block's Cache (seqs: a ragged decode step's, stages.seq_at), or None: no KV cache.
    few: True, or None for a call that takes no path of few rows or tiny sequences
    (takes_few_paths).  Numba compiles no branch on a None argument (it prunes them
    before typing), so a build for None compiles none of the kernels of those paths."""
    T, d, n_heads = dims.T, dims.d, dims.n_heads
    plan, work = scratch.plan, scratch.work
    past = -1 if cache is None else cache.past
    NR = panel_lanes(floats(Wf))
    rows = H.size // d
    nseq = rows // T
    # the new rows attend over cached tokens too; through a stored cache (bf16, int8: its
    # arrays are not float) every call does, a first chunk included: it reads its own
    # keys and values rounded, from the cache (kernels.kvstore)
    extend = cache is not None and (past > 0 or (past == 0 and cache.K.itemsize < 4))
    direct = extend or (few is not None and T * T * (d // n_heads) <= DIRECT_MAX)
    arena = work.size > 0
    pos = 0
    if direct:
        # tiny sequences: Q, K, V side by side in one (rows, 3d) buffer, read in place
        ldq = 3 * d
        q, pos = take(work, pos, rows * ldq)
        kt = vp = q                         # unused on this path (no allocation)
    else:
        # Q (rows, d), later overwritten by the heads' outputs; K and V packed per K/V head
        ldq = d
        q, pos = take(work, pos, rows * ldq)
        kt, vp = attention_buffers(q, nseq, T, d // n_heads, dims.kv_heads)
    n = 0
    # 1. [LN1 +] QKV projection (stage_grid: by rows, and by columns when there are few
    # rows for the threads)
    mc, groups, ntasks = stage_grid(rows, qkv_panels(dims, NR), MC, nthr, TASK_PANELS)
    X, ln_in_task = H, dims.pre_ln
    xp = none = work[:0].view(np.uint32)    # no bf16 pairs: an empty view, no allocation
    if dims.pre_ln and (groups > 4 or arena):
        # many column tasks per row block: LN1 once, in a stage of its own, rather than
        # in every task (each task of a group of four redoes its rows' LN1; a task's
        # own LN1 rows would be scratch of its own)
        X, pos = take(work, pos, rows * d)
        if not arena:                   # and as bf16 pairs where the products take them
            xp, _ = pair_rows(Wf, rows, d, none)
        n = plan_stage(plan, n, LN1, nthr)
        ln_in_task = False
    n = plan_stage(plan, n, QKV, ntasks)
    # 2. attention per (sequence, head[, query tile]), head by head, costly tiles first;
    # rotary positions and the cache's new rows per (sequence, K/V head) before it
    nbh = nseq * n_heads
    nkv = nseq * dims.kv_heads
    rotary = dims.rope_theta is not None
    nqt = ceil_div(T, BQ)
    srow, pos = take_f64(work, pos, nbh * T if direct and not extend else 0)
    a_pos = pos                         # the attention tasks' tiles (attention_task)
    if arena:
        pos += nbh * nqt * attention_work(min(T, BQ), max(past, 0) + T, d // n_heads, NR, H.itemsize)
    if extend:
        # with tokens cached: the new keys and values go into the cache, then the queries
        # attend over all of it (a decode step over a float cache: a K/V head's query
        # group as the rows of one tile)
        if not inline_new_rows(dims, cache):
            n = plan_stage(plan, n, CACHE_NEW, nkv)
        n = plan_stage(plan, n, ATTEND_CACHED, cached_attention_tasks(dims, nseq, cache))
    elif direct:
        # tiny sequences: one task per (sequence, head), no packing
        if not inline_new_rows(dims, None) and (rotary or past == 0):
            n = plan_stage(plan, n, CACHE_NEW, nkv)
        n = plan_stage(plan, n, ATTEND_DIRECT, nbh)
    else:
        if rotary:
            n = plan_stage(plan, n, ROPE, nkv)
        n = plan_stage(plan, n, ATTEND, nbh * nqt)
        if past == 0:
            # a first chunk into an empty cache: its keys and values, packed as the cache
            # holds them, copied there
            n = plan_stage(plan, n, CACHE_FIRST, nkv)
    # the tasks get borrowed views (no reference counts); the arguments outlive the call,
    # and keep_alive holds each buffer of this function until its last task has run
    Hb, Wb = borrowed(H), borrow(Wf)
    grid = Grid(nthr, mc, groups)
    attend = Attend(borrowed(X), ln_in_task, borrowed(q), ldq, borrowed(kt), borrowed(vp), not direct, borrowed(srow),
                    borrowed(work), a_pos, borrowed(scratch.rope), borrowed(xp))
    kv = borrowed_cache(cache)
    # one row tile (a decode step): every stage streams weights, each thread a run of
    # neighbouring panels (next_task); more rows: one counter, attention's tasks head by head
    halves = 2 if rows <= MR and nthr > 1 else 1
    if few is not None and nthr > 1 and rows <= MC * nthr:
        # few rows (a decode step, a short sequence: stage_grid gives every GEMM task all
        # the rows): both halves in one parallel region, its stages apart by
        # finished-task counts (wait_for), not a region each, whose start and join cost
        # a visible part of stages this short (docs/perf-log.md); every buffer is set
        # out before the region, which at these sizes adds little to the peak of memory
        out, xn, hid, ldh, mc2, groups2, mf, n2, gu = output_plan(dims, scratch, rows, pos, nthr, few)
        grid2 = Grid(nthr, mc2, groups2)    # built here: a prange loop takes no record unpacked from a tuple
        xnp, hidp = ffn_pairs(Wf, dims, rows if xn.size > 0 and not arena else 0, none)
        output = Output(borrowed(q), ldq, borrowed(out), borrowed(xn), borrowed(hid), ldh, mf, borrowed(gu),
                        borrowed(xnp), borrowed(hidp))
        for s in range(PLAN_ROWS):
            plan[s, 2] = plan[s, 3] = plan[s, 4] = 0
        for w in prange(nthr):
            for s in range(n):
                t = next_task(plan, s, w, halves, nthr)
                while t < plan[s, 1]:
                    attention_stages_task(plan[s, 0], t, Hb, Wb, dims, grid, attend, kv, few)
                    finished(plan, s, 4, nthr)
                    t = next_task(plan, s, w, halves, nthr)
                wait_for(plan, s, 4, plan[s, 1])
            for s in range(HALF, n2):
                t = next_task(plan, s, w, halves, nthr)
                while t < plan[s, 1]:
                    output_stages_task(plan[s, 0], t, Hb, Wb, dims, grid2, output, few)
                    finished(plan, s, 4, nthr)
                    t = next_task(plan, s, w, halves, nthr)
                wait_for(plan, s, 4, plan[s, 1])
        keep_alive(X, kt, vp, srow, q, out, xn, hid, gu, plan, work, scratch.rope, xp, xnp, hidp)
        return out.reshape((nseq, T, d))
    for s in range(n):
        plan[s, 2] = plan[s, 3] = 0
        for w in prange(min(nthr, plan[s, 1])):
            t = next_task(plan, s, w, halves, nthr)
            while t < plan[s, 1]:
                attention_stages_task(plan[s, 0], t, Hb, Wb, dims, grid, attend, kv, few)
                t = next_task(plan, s, w, halves, nthr)
    keep_alive(X, kt, vp, srow, scratch.rope, xp)

    # 3-4: W_O and the FFN.  The output is allocated only now, after the packed K and V
    # are freed, which keeps them off the peak of memory at long T
    out, xn, hid, ldh, mc2, groups2, mf, n2, gu = output_plan(dims, scratch, rows, pos, nthr, few)
    grid2 = Grid(nthr, mc2, groups2)
    xnp, hidp = ffn_pairs(Wf, dims, rows if xn.size > 0 and not arena else 0, none)
    output = Output(borrowed(q), ldq, borrowed(out), borrowed(xn), borrowed(hid), ldh, mf, borrowed(gu),
                    borrowed(xnp), borrowed(hidp))
    for s in range(HALF, n2):
        plan[s, 2] = plan[s, 3] = 0
        for w in prange(min(nthr, plan[s, 1])):
            t = next_task(plan, s, w, halves, nthr)
            while t < plan[s, 1]:
                output_stages_task(plan[s, 0], t, Hb, Wb, dims, grid2, output, few)
                t = next_task(plan, s, w, halves, nthr)
    keep_alive(q, out, xn, hid, gu, plan, work, xnp, hidp)
    return out.reshape((nseq, T, d))


@kernel(internal=True)     # not inlined: the parallel build's parfor passes grow with its body
def output_plan(dims, scratch, rows, pos, nthr, few):
    """The output half of _one_block (stages 3-4) planned into scratch.plan's rows HALF..:
    (out, xn, hid, ldh, mc, groups, mf, the row after its last stage, gu; mc and groups:
    its GEMM stage's split).
    pos: the work buffer's first position past the attention half's scratch.

    3. out = H + out_concat @ W_O + b_o (out_concat sits in the Q columns of q): out is
       scratch.dest when it is not empty, else output buffer scratch.slot of the work
       buffer (a new array without one).
    4. the FFN: with few rows for the threads (or a work buffer), LN into xn, then the
       hidden layer hid (rows, ldh) whole, in two GEMM stages split by columns
       (ffn_up_task, ffn_down_task), each weight streamed by one thread (with a work
       buffer on one thread too: the row tiles' hidden chunk is a task's own); else per
       row tile of mf rows, residual and LayerNorms fused (ffn_rows_task).  The gated FFN's
       split stages put each hidden panel's [gate | up] pair in gu (rows, ffn_cols).
    few: None when the call takes no path of few rows (_one_block)."""
    plan, work, slot, dest = scratch.plan, scratch.work, scratch.slot, scratch.dest
    d, dff = dims.d, dims.dff
    NR = panel_lanes(work)
    if dest.size > 0:
        out = dest
    else:
        out, _ = take(work, pos + slot * up16(rows * d), rows * d)
    pos += 2 * up16(rows * d)
    npo = panels(d, NR)
    mc, groups, ntasks = stage_grid(rows, npo, MC, nthr, TASK_PANELS)
    n = plan_stage(plan, HALF, OUT_PROJ, ntasks)
    mf = rows_per_task(rows, MF, nthr)
    ldh = dff + 64 // work.itemsize         # a cache line past 4 KiB multiples (ffn_tile)
    if few is not None and ((nthr > 1 and rows <= MF * nthr) or work.size > 0):
        xn, pos = take(work, pos, rows * d)
        hid, pos = take(work, pos, rows * ldh)
        gu, pos = take(work, pos, rows * ffn_cols(dff, True, NR) if dims.gated else 0)
        n = plan_stage(plan, n, FFN_IN, nthr)
        n = plan_stage(plan, n, FFN_UP, panel_groups(panels(dff, NR), nthr, TASK_PANELS))
        n = plan_stage(plan, n, FFN_DOWN, panel_groups(npo, nthr, TASK_PANELS))
        if not dims.pre_ln:
            n = plan_stage(plan, n, LN_POST, nthr)
    else:
        xn = hid = gu = work[:0]        # unused: an empty view, not an allocation
        n = plan_stage(plan, n, FFN_ROWS, ceil_div(rows, mf))
    return out, xn, hid, ldh, mc, groups, mf, n, gu


# _one_block's builds: its prange loops run in turn, or on Numba's threads
one_block_serial = build(_one_block, "one_block_serial", readonly=("H", "Wf"), standalone=True, internal=True)
one_block_parallel = build(_one_block, "one_block_parallel", parallel=True, readonly=("H", "Wf"), standalone=True,
                           internal=True)


@kernel
def block_parallel(H3, Wf, cfg, few, nthr):
    """The block on H3 (B, T, d) C-contiguous, its tasks on nthr threads: (H_out, -1) with
    H_out a new (B, T, d) array, or (an empty array, 0) when H3 holds a NaN or an Inf.
    Wf: the flat weights (weight_layout).  cfg: (n_heads, dff, causal, pre_ln, act, eps,
    kv_heads, rms, gated, rope_theta, rope_scale), the fields of a Dims after T and d
    (act: an activations.*_CODE).  few: takes_few_paths(...) or None, the build to run
    (_one_block; either gives the same result).  nthr: the number of
    threads the tasks are sized for (numba.get_num_threads()) - an argument because
    calling get_num_threads in here makes the function uncacheable.  With a KV cache:
    cached_parallel; into a given array, serially: block_serial."""
    H = H3.reshape(H3.size)
    Wf = as_weights(Wf)
    # The API leaves this backend the check that H is finite: in here it costs no second
    # crossing into compiled code; the caller reports where the NaN or the Inf is.
    if not all_finite_flat(H):
        return np.empty((0, 0, 0), dtype=H3.dtype), 0
    none = np.empty(0, dtype=H3.dtype)      # no cache (past = -1), no work buffer, no dest
    plan = np.empty((PLAN_ROWS, PLAN_COLS), dtype=np.intp)
    dims = Dims(H3.shape[-2], H3.shape[-1], *cfg)
    seqs = plan.reshape(plan.size)[:0]      # uniform: no ragged pairs
    rope = rope_rows_if_rotary(dims, 0, none, seqs)
    return one_block_parallel(H, Wf, dims, None, Scratch(plan, none, 0, none, rope), nthr, few), -1


@kernel
def block_serial(H3, Wf, out3, cfg, nthr):
    """The block on H3 (B, T, d) or (T, d) C-contiguous, serially, writing H_out into out3
    (of H3's shape), the caller's: -1, or 0 when H3 holds a NaN or an Inf (out3 untouched).
    cfg as block_parallel's.  For small blocks (the lesson's toy): handing an array Numba
    made back to Python costs more than numpy's made in the caller (docs/perf-log.md)."""
    H = H3.reshape(H3.size)
    if not all_finite_flat(H):
        return 0
    none = out3.reshape(out3.size)[:0]     # no cache, no work buffer: a view, not an allocation
    plan = np.empty((PLAN_ROWS, PLAN_COLS), dtype=np.intp)
    # borrowed views: the body then counts no references to them (options.borrowed)
    nothing = borrowed(none)
    dims = Dims(H3.shape[-2], H3.shape[-1], *cfg)
    Wf = as_weights(Wf)
    seqs = borrowed(plan.reshape(plan.size)[:0])      # uniform: no ragged pairs
    rope = rope_rows_if_rotary(dims, 0, none, seqs)
    one_block_serial(borrowed(H), borrow(Wf), dims, None,
                     Scratch(borrowed(plan), nothing, 0, borrowed(out3).reshape(out3.size), borrowed(rope)), nthr, True)
    keep_alive(H, Wf, none, plan, out3, rope)
    return -1


@kernel(inline="always")
def _cached(H3, Wf, cfg, cache, nthr, one_block):
    """The body of cached_serial and cached_parallel, which hand it the build of the block
    to run (one_block_serial, one_block_parallel): block_parallel with a KV cache (causal),
    and as many blocks as the cache's table holds: (H_out, -1), or (an empty array, i)
    when the input of block i holds a NaN or an Inf.

    cache = (K, V, past, max_T, layers, plan, work[, seqs]).  K, V: the cache's flat keys and
    values (K^T panels and V rows per head, for max_T tokens, in the cache's format:
    tblock.KVCache, kernels.kvstore), holding
    tokens 0..past-1; H3's rows (B, T, d) are tokens past..past+T-1, their keys and values
    are written there, and with past > 0 they attend over the cached tokens too, with the
    same flash kernel.

    layers: (n, 4) addresses of the flat weights, K, V and stored matrices (wgemm; 0 for
    float weights) of n blocks of this config (each array the size of block 0's), run one after another in this call, each on the previous
    one's output: a stack with its caches (tblock.Stack), where a decode step's blocks
    would otherwise each cross from Python into Numba.  (0, 4): the one block of Wf, K, V.

    plan: (PLAN_ROWS, PLAN_COLS) intp, room for the stage plan.  work: a buffer for all
    other scratch (work_len; a KVCache's), used when it is large enough for this call (a
    decode step): the call then allocates nothing, and H_out is one of its two output
    buffers.  Empty: every buffer new.

    seqs (2B,) intp (ragged_pairs): a ragged decode step (T = 1): row b is the new token of the
    cache's sequence seqs[2b] after its seqs[2b + 1] >= 1 tokens (its key and value
    written there, attending over keys 0..seqs[2b + 1]), past their largest; other
    sequences untouched.  A ragged call of another shape: (an empty array, 0)."""
    K, V, past, max_T, layers, plan, work = cache[:7]
    seqs = ragged_pairs(cache)
    H = H3.reshape(H3.size)
    Wf = as_weights(Wf)
    dims = Dims(H3.shape[1], H3.shape[2], *cfg)
    T, d = dims.T, dims.d
    nblocks = max(1, layers.shape[0])
    d_k = d // dims.n_heads
    if seqs.size > 0 and (T != 1 or past < 1 or seqs.size != 2 * (H.size // d)):
        return np.empty((0, 0, 0), dtype=H3.dtype), 0       # the caller checks: never reached
    few_keys = past > 0 or K.itemsize < 4 or T * T * d_k <= DIRECT_MAX       # a stored cache: always
    if work.size > 0 and (not few_keys or work.size < work_len(H.size // d, T, d, dims.dff, dims.n_heads,
                                                                 max(past, 0) + T, panel_lanes(floats(Wf)), floats(Wf).itemsize)):
        work = work[:0]                     # not for this call: new buffers
    rope = rope_rows_if_rotary(dims, max(past, 0), work, seqs)     # every block's: one config, the same tokens
    for blk in range(nblocks):
        if layers.shape[0] > 0:
            W = weights_at(Wf, layers, blk)
            Kb = borrowed_at(K, layers[blk, 1], K.size)
            Vb = borrowed_at(V, layers[blk, 2], V.size)
        else:
            W, Kb, Vb = borrow(Wf), borrowed(K), borrowed(V)
        if not all_finite_flat(H):         # as in block_parallel
            break
        kv = Cache(Kb, Vb, past, max_T, borrowed(seqs))
        out3 = one_block(H, W, dims, kv, Scratch(plan, work, blk % 2, work[:0], rope), nthr, True)
        if blk == nblocks - 1:
            return out3, -1
        H = out3.reshape(H.size)            # the next block's input
    return np.empty((0, 0, 0), dtype=H3.dtype), blk


def ragged_pairs(cache):
    """A cached call's ragged [slot, past] pairs: cache[7] of a cache argument of 8 (a
    ragged decode step), else none (an empty view of the plan: a uniform call passes and
    allocates no more arrays than before ragged steps existed)."""


@overload(ragged_pairs, inline="always")
def _ragged_pairs(cache):
    if len(cache.types) == 8:
        return lambda cache: cache[7]
    return lambda cache: cache[5].reshape(cache[5].size)[:0]


def borrowed_cache(cache):
    """The Cache with borrowed views of its arrays (options.borrowed), or None for None."""


@overload(borrowed_cache, inline="always")
def _borrowed_cache(cache):
    if isinstance(cache, types.NoneType):
        return lambda cache: None
    return lambda cache: Cache(borrowed(cache.K), borrowed(cache.V), cache.past, cache.max_T, borrowed(cache.seqs))


def takes_few_paths(rows, T, dk, nthr):
    """Whether a call without a KV cache, of ``rows`` rows, T a sequence, head size dk on
    nthr threads, can take a path of _one_block's for few rows or tiny sequences (its one
    parallel region, the FFN split by columns, attention without tiles): block_parallel's
    ``few``, True, or None for the build that compiles none of them."""
    return True if (nthr > 1 and rows <= max(MC, MF) * nthr) or T * T * dk <= DIRECT_MAX else None


# standalone: kernels.decode calls them by address; H3 typed read-only, as the API hands it
@kernel(readonly=("H3", "Wf"), standalone=True)
def cached_serial(H3, Wf, cfg, cache, nthr):
    """_cached with the serial block (sized for nthr = 1)."""
    return _cached(H3, Wf, cfg, cache, nthr, one_block_serial)


@kernel(readonly=("H3", "Wf"), standalone=True)
def cached_parallel(H3, Wf, cfg, cache, nthr):
    """_cached with the parallel block, its tasks on nthr threads."""
    return _cached(H3, Wf, cfg, cache, nthr, one_block_parallel)
