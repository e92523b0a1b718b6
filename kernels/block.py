"""The whole block in one call: fused stages over flat buffers.

One compiled function runs a forward pass of the block over B sequences, so a call
from Python crosses into Numba once.  Its four stages are loops over independent
tasks (``stages``; their tile and stride arithmetic: ``layout``):

  1. QKV:   [LN1 of a row block into scratch] then X @ [W_q W_k W_v]: Q into ``q``,
            K and V through a task-sized scratch straight into the layouts attention
            reads (K^T in panels for the score micro-kernel, V in contiguous rows per
            head); for tiny T*T*d_k, Q, K and V side by side in one buffer instead
  2. attn:  per (sequence, head, query tile), flash attention; the head's output is
            written over that head's Q columns of the same rows (each Q tile is read
            by exactly one task, before it writes there), so out_concat needs no buffer
  3. W_O:   out = H + out_concat @ W_O (the residual is the GEMM's initial C)
  4. FFN:   per row tile: [LN], then per chunk of FF_CHUNK hidden columns:
            up-projection, bias + activation, and the chunk's band of W_2 accumulated
            onto the residual already in ``out`` [LN]: the (rows, FF_CHUNK) hidden
            chunk is the only place the hidden layer exists.  When the rows are too few
            to give every thread its own row tiles: LN, then the up- and the
            down-projection as two stages split by column panels, through the whole
            (rows, d_ff) hidden layer, with the same sums in the same order.

With few rows for the threads, the GEMM stages give every task all the rows and one
column panel (``stage_grid``), and the Pre-LN's LN1 becomes a stage of its own.

A call plans the stages it needs and runs each stage's tasks from one loop per half of
the block (attention_stages_task: 1-2; output_stages_task: 3-4, once the output buffer
exists).  ``block_parallel`` runs a stage with ``prange`` over the threads: Numba builds
three modules for every prange loop, so one loop for all stages keeps a first call's
compile short.  Each thread claims the stage's tasks one at a time from a shared counter
(options.claim): tasks are coarse and causal attention tasks differ in cost, and Numba's
OpenMP layer would split a prange over the tasks statically, half to each thread; claimed
one by one (each head's costly query tiles first) they balance the cores.  With one row
tile (a decode step, where every stage streams weights) the tasks are two halves with a
counter each, so each thread streams a run of neighbouring panels (next_task), and the
whole block is one parallel region whose stages wait for the count of the previous
stage's finished tasks (options.finished, options.wait_for).
``block_serial`` is the same code compiled without prange, for sizes where launching a
parallel region costs more than the work (the lesson's toy block); it writes into an
output its caller made (handing a Numba array back to Python costs more).  A stack of blocks
with KV caches runs in one call (``cached_parallel``, ``cached_serial``: the block
with a cache, over a table of blocks): a decode step crosses from Python into compiled
code once, not once a block, and takes its scratch from the cache (work_len).

Threading: Numba's threads do all the work in parallel regions, one region at a time,
and every kernel inside a task is serial; no BLAS is called, so nothing else competes
for the cores.  Each output element is produced by exactly one task in a fixed
order, so results do not depend on the schedule, nor, but for the rounding of the
serial and the parallel build's fast-math code, on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .layout import (ceil_div, panels, rows_per_task, stage_grid, take, take_f64, task_tile, up16,
                     weight_layout)
from .isa import MR
from .options import borrowed, borrowed_at, claim, finished, keep_alive, kernel, serial_and_parallel, wait_for
from .simd import panel_lanes
from .stages import (BQ, DIRECT_MAX, MC, MF, attention_buffers, attention_direct_task, attention_task,
                     attention_work, cache_packed_task, cache_rows_task, ffn_down_task, ffn_input_task,
                     ffn_rows_task, ffn_up_task, layernorm_piece, out_proj_task, pack_head, qkv_task)
from .validate import all_finite_flat


@kernel(parallel=True)
def attention_core(qkv, T, d, n_heads, causal):
    """The block's attention on its own, for callers that time it alone: qkv is the
    flat (B*T, 3d) buffer of projection rows [Q | K | V]; each head's output replaces
    its Q columns.  The block gets K and V already packed from its projection (qkv_task);
    here a packing pass (pack_head) comes first."""
    nseq = qkv.size // (3 * d) // T
    nbh = nseq * n_heads
    if T * T * (d // n_heads) <= DIRECT_MAX:
        srow = np.empty(nbh * T)
        for t in prange(nbh):
            attention_direct_task(qkv, T, d, n_heads, causal, t, srow)
        return
    kt, vp = attention_buffers(qkv, nseq, T, d, n_heads)
    for t in prange(nbh):
        pack_head(qkv, T, d, n_heads, t, kt, vp)
    for t in prange(nbh * ceil_div(T, BQ)):
        attention_task(qkv, 3 * d, T, d, n_heads, causal, t, kt, vp, 0, T, kt[:0], 0)


# The stages of a forward pass, in the order a call runs those it needs: 1-2 (until the
# heads' outputs are in q) are attention_stages_task's, 3-4 output_stages_task's.
LN1, QKV, CACHE_NEW, ATTEND_CACHED, ATTEND_DIRECT, ATTEND, CACHE_FIRST = range(7)
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
    other.  For a GEMV (a decode step) a task is a panel of one weight matrix: two
    threads taking neighbouring panels in turn streamed ~2% slower than each streaming a
    run of its own (docs/perf-log.md)."""
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


@kernel(readonly=("H", "Wf"), standalone=True, internal=True)
def attention_stages_task(stage, t, H, X, Wf, T, d, n_heads, dff, causal, eps, nthr, mc, groups,
                          ln_in_task, q, ldq, kt, vp, packed, srow, Kc, Vc, past, max_T, work, w_pos):
    """Task t of ``stage`` (LN1 .. CACHE_FIRST) of _block, which sets out the arguments."""
    NR = panel_lanes(Wf)
    layout = weight_layout(d, dff, NR)
    o_qkv, o_g1, o_be1, o_bqkv = layout[0], layout[6], layout[7], layout[10]
    rows = H.size // d
    if stage == LN1:
        layernorm_piece(H, X, t, nthr, rows, d, Wf, o_g1, o_be1, eps)
    elif stage == QKV:
        r0, r1, p0, p1 = task_tile(t, groups, mc, rows, 3 * panels(d, NR))
        qkv_task(X, Wf, o_qkv, o_g1, o_be1, o_bqkv, ln_in_task, eps, T, d, n_heads, r0, r1, p0, p1,
                 q, ldq, kt, vp, packed)
    elif stage == CACHE_NEW:
        cache_rows_task(q, T, d, n_heads, t, Kc, Vc, past, max_T)
    elif stage == ATTEND_CACHED:
        if T <= BQ:                 # one query tile: the task's own head, appended before it is read
            cache_rows_task(q, T, d, n_heads, t, Kc, Vc, past, max_T)
        attention_task(q, ldq, T, d, n_heads, causal, t, Kc, Vc, past, max_T, work, w_pos)
    elif stage == ATTEND_DIRECT:
        if past == 0:
            cache_rows_task(q, T, d, n_heads, t, Kc, Vc, 0, max_T)
        attention_direct_task(q, T, d, n_heads, causal, t, srow)
    elif stage == ATTEND:
        attention_task(q, ldq, T, d, n_heads, causal, t, kt, vp, 0, T, work, w_pos)
    else:
        cache_packed_task(kt, vp, T, d, n_heads, t, Kc, Vc, max_T)


@kernel(readonly=("H", "q", "Wf"), standalone=True, internal=True)
def output_stages_task(stage, t, H, q, ldq, Wf, d, dff, act, pre_ln, eps, nthr, mc, groups, mf,
                       out, xn, hid, ldh):
    """Task t of ``stage`` (OUT_PROJ .. FFN_ROWS) of _block, which sets out the arguments."""
    NR = panel_lanes(Wf)
    layout = weight_layout(d, dff, NR)
    o_o, o_g1, o_be1, o_g2, o_be2, o_bo = layout[1], layout[6], layout[7], layout[8], layout[9], layout[11]
    rows = H.size // d
    if stage == OUT_PROJ:
        r0, r1, p0, p1 = task_tile(t, groups, mc, rows, panels(d, NR))
        out_proj_task(q, ldq, H, Wf, o_o, o_bo, d, r0, r1, p0, p1, out)
    elif stage == FFN_IN:
        # the FFN's LayerNorm: LN2 of H_mid (Pre-LN), LN1 of H + A_out (Post-LN)
        o_g, o_be = (o_g2, o_be2) if pre_ln else (o_g1, o_be1)
        ffn_input_task(out, xn, t, nthr, rows, d, Wf, o_g, o_be, eps, pre_ln)
    elif stage == FFN_UP:
        ffn_up_task(xn, rows, d, dff, Wf, act, hid, ldh, t)
    elif stage == FFN_DOWN:
        ffn_down_task(hid, ldh, rows, d, dff, Wf, out, t)
    elif stage == LN_POST:
        layernorm_piece(out, out, t, nthr, rows, d, Wf, o_g2, o_be2, eps)
    else:
        ffn_rows_task(out, t * mf, min(rows, (t + 1) * mf), d, dff, Wf, act, pre_ln, eps)


@kernel
def work_len(rows, T, d, dff, n_heads, keys, NR, itemsize):
    """Elements of a work buffer (of an itemsize-byte dtype) that holds all the scratch of
    one_block for ``rows`` rows, T per sequence, attending over ``keys`` keys, on the path
    of few keys (T * T * d_k <= DIRECT_MAX, or tokens cached): a KVCache keeps one for a
    decode step, so the step allocates nothing.  In the order one_block takes it: Q K V
    rows, LN1, the untiled attention's row, each attention task's tiles, two output
    buffers (a stack's blocks alternate), the FFN's input and hidden layer."""
    w = 8 // itemsize
    nbh = rows // T * n_heads
    n = up16(rows * 3 * d) + up16(rows * d) + up16(nbh * T * w)
    n += nbh * ceil_div(T, BQ) * attention_work(min(T, BQ), keys, d // n_heads, NR, itemsize)
    return n + 3 * up16(rows * d) + up16(rows * (dff + 64 // itemsize))


def _one_block(H, Wf, T, d, n_heads, dff, causal, pre_ln, act, eps, Kc, Vc, past, max_T, nthr, plan, work, slot,
               dest):
    """One block of _block and _cached (which set out the arguments) on the flat rows H:
    its output (B, T, d): dest when it is not empty (rows * d elements); else with a work
    buffer (work_len elements, few keys; empty: none) output buffer ``slot`` (0 or 1) of
    it, every scratch buffer taken from it too; else a new array.  plan: (PLAN_ROWS,
    PLAN_COLS) intp, room for the stage plan.  Both callers call the one build
    (one_block_serial, one_block_parallel): the body with its parallel loops is compiled
    once."""
    NR = panel_lanes(Wf)
    rows = H.size // d
    nseq = rows // T
    extend = past > 0                   # the new rows attend over cached tokens too
    direct = extend or T * T * (d // n_heads) <= DIRECT_MAX
    arena = work.size > 0
    pos = 0
    if direct:
        # tiny sequences: Q, K, V side by side in one (rows, 3d) buffer, read in place
        ldq = 3 * d
        q, pos = take(work, pos, rows * ldq)
        kt = vp = q                         # unused on this path (no allocation)
    else:
        # Q (rows, d), later overwritten by the heads' outputs; K and V packed per head
        ldq = d
        q, pos = take(work, pos, rows * ldq)
        kt, vp = attention_buffers(q, nseq, T, d, n_heads)
    n = 0
    # 1. [LN1 +] QKV projection (stage_grid: by rows, and by columns when there are few
    # rows for the threads)
    mc, groups, ntasks = stage_grid(rows, 3 * panels(d, NR), MC, nthr)
    X, ln_in_task = H, pre_ln
    if pre_ln and (groups > 4 or arena):
        # many column tasks per row block: LN1 once, in a stage of its own, rather than
        # in every task (each task of a group of four redoes its rows' LN1; a task's
        # own LN1 rows would be scratch of its own)
        X, pos = take(work, pos, rows * d)
        n = plan_stage(plan, n, LN1, nthr)
        ln_in_task = False
    n = plan_stage(plan, n, QKV, ntasks)
    # 2. attention per (sequence, head[, query tile]), head by head, costly tiles first
    nbh = nseq * n_heads
    nqt = ceil_div(T, BQ)
    srow, pos = take_f64(work, pos, nbh * T if direct and not extend else 0)
    a_pos = pos                         # the attention tasks' tiles (attention_task)
    if arena:
        pos += nbh * nqt * attention_work(min(T, BQ), max(past, 0) + T, d // n_heads, NR, H.itemsize)
    if extend:
        # with tokens cached: the new keys and values go into the cache, then the queries
        # attend over all of it; a decode step's query reads the cached keys and values
        # through the micro-kernel's one-row loop
        if nqt > 1:
            n = plan_stage(plan, n, CACHE_NEW, nbh)
        n = plan_stage(plan, n, ATTEND_CACHED, nbh * nqt)
    elif direct:
        # tiny sequences: one task per (sequence, head), no packing
        n = plan_stage(plan, n, ATTEND_DIRECT, nbh)
    else:
        n = plan_stage(plan, n, ATTEND, nbh * nqt)
        if past == 0:
            # a first chunk into an empty cache: its keys and values, packed as the cache
            # holds them, copied there
            n = plan_stage(plan, n, CACHE_FIRST, nbh)
    # the tasks get borrowed views (no reference counts); the arguments outlive the call,
    # and keep_alive holds each buffer of this function until its last task has run
    Hb, Xb, Wb, qb, ktb, vpb, srowb, Kcb, Vcb, wb = (borrowed(H), borrowed(X), borrowed(Wf), borrowed(q),
                                                     borrowed(kt), borrowed(vp), borrowed(srow), borrowed(Kc),
                                                     borrowed(Vc), borrowed(work))
    # one row tile (a decode step): every stage streams weights, each thread a run of
    # neighbouring panels (next_task); more rows: one counter, attention's tasks head by head
    halves = 2 if rows <= MR and nthr > 1 else 1
    if halves == 2:
        # a decode step: both halves in one parallel region, its stages apart by
        # finished-task counts (wait_for), not a region each, whose start and join cost
        # a visible part of a stage this short (docs/perf-log.md); every buffer is set
        # out before the region
        out, xn, hid, ldh, mc2, groups2, mf, n2 = output_plan(plan, rows, d, dff, pre_ln, nthr, NR, work, pos, slot,
                                                              dest)
        outb, xnb, hidb = borrowed(out), borrowed(xn), borrowed(hid)
        for s in range(PLAN_ROWS):
            plan[s, 2] = plan[s, 3] = plan[s, 4] = 0
        for w in prange(nthr):
            for s in range(n):
                t = next_task(plan, s, w, halves, nthr)
                while t < plan[s, 1]:
                    attention_stages_task(plan[s, 0], t, Hb, Xb, Wb, T, d, n_heads, dff, causal, eps, nthr, mc,
                                          groups, ln_in_task, qb, ldq, ktb, vpb, not direct, srowb, Kcb, Vcb, past,
                                          max_T, wb, a_pos)
                    finished(plan, s, 4, nthr)
                    t = next_task(plan, s, w, halves, nthr)
                wait_for(plan, s, 4, plan[s, 1])
            for s in range(HALF, n2):
                t = next_task(plan, s, w, halves, nthr)
                while t < plan[s, 1]:
                    output_stages_task(plan[s, 0], t, Hb, qb, ldq, Wb, d, dff, act, pre_ln, eps, nthr, mc2, groups2,
                                       mf, outb, xnb, hidb, ldh)
                    finished(plan, s, 4, nthr)
                    t = next_task(plan, s, w, halves, nthr)
                wait_for(plan, s, 4, plan[s, 1])
        keep_alive(X, kt, vp, srow, q, out, xn, hid, plan, work)
        return out.reshape((nseq, T, d))
    for s in range(n):
        plan[s, 2] = plan[s, 3] = 0
        for w in prange(min(nthr, plan[s, 1])):
            t = next_task(plan, s, w, halves, nthr)
            while t < plan[s, 1]:
                attention_stages_task(plan[s, 0], t, Hb, Xb, Wb, T, d, n_heads, dff, causal, eps, nthr, mc, groups,
                                      ln_in_task, qb, ldq, ktb, vpb, not direct, srowb, Kcb, Vcb, past, max_T,
                                      wb, a_pos)
                t = next_task(plan, s, w, halves, nthr)
    keep_alive(X, kt, vp, srow)

    # 3-4: W_O and the FFN.  The output is allocated only now, after the packed K and V
    # are freed: at d_model=768, T=4096 that keeps 12 MiB off the peak
    out, xn, hid, ldh, mc, groups, mf, n2 = output_plan(plan, rows, d, dff, pre_ln, nthr, NR, work, pos, slot, dest)
    outb, xnb, hidb = borrowed(out), borrowed(xn), borrowed(hid)
    for s in range(HALF, n2):
        plan[s, 2] = plan[s, 3] = 0
        for w in prange(min(nthr, plan[s, 1])):
            t = next_task(plan, s, w, halves, nthr)
            while t < plan[s, 1]:
                output_stages_task(plan[s, 0], t, Hb, qb, ldq, Wb, d, dff, act, pre_ln, eps, nthr, mc, groups,
                                   mf, outb, xnb, hidb, ldh)
                t = next_task(plan, s, w, halves, nthr)
    keep_alive(q, out, xn, hid, plan, work)
    return out.reshape((nseq, T, d))


@kernel(internal=True, inline="always")
def output_plan(plan, rows, d, dff, pre_ln, nthr, NR, work, pos, slot, dest):
    """The output half of _one_block (stages 3-4) planned into plan's rows HALF..: (out,
    xn, hid, ldh, mc, groups, mf, the row after its last stage).  pos: the work buffer's
    first position past the attention half's scratch.

    3. out = H + out_concat @ W_O + b_o (out_concat sits in the Q columns of q): out is
       dest when it is not empty, else output buffer ``slot`` of work (a new array
       without one).
    4. the FFN: with few rows for the threads (or a work buffer), LN into xn, then the
       hidden layer hid (rows, ldh) whole, in two GEMM stages split by columns
       (ffn_up_task, ffn_down_task), each weight streamed by one thread (with a work
       buffer on one thread too: the row tiles' hidden chunk is a task's own); else per
       row tile of mf rows, residual and LayerNorms fused (ffn_rows_task)."""
    if dest.size > 0:
        out = dest
    else:
        out, _ = take(work, pos + slot * up16(rows * d), rows * d)
    pos += 2 * up16(rows * d)
    npo = panels(d, NR)
    mc, groups, ntasks = stage_grid(rows, npo, MC, nthr)
    n = plan_stage(plan, HALF, OUT_PROJ, ntasks)
    mf = rows_per_task(rows, MF, nthr)
    ldh = dff + 64 // work.itemsize         # a cache line past 4 KiB multiples (ffn_tile)
    if (nthr > 1 and rows <= MF * nthr) or work.size > 0:
        xn, pos = take(work, pos, rows * d)
        hid, pos = take(work, pos, rows * ldh)
        n = plan_stage(plan, n, FFN_IN, nthr)
        n = plan_stage(plan, n, FFN_UP, panels(dff, NR))
        n = plan_stage(plan, n, FFN_DOWN, npo)
        if not pre_ln:
            n = plan_stage(plan, n, LN_POST, nthr)
    else:
        xn = hid = work[:0]             # unused: an empty view, not an allocation
        n = plan_stage(plan, n, FFN_ROWS, ceil_div(rows, mf))
    return out, xn, hid, ldh, mc, groups, mf, n


one_block_serial, one_block_parallel = serial_and_parallel(_one_block, "one_block", internal=True, standalone=True,
                                                           readonly=("H", "Wf"))


def _block(H3, Wf, T, d, n_heads, dff, causal, pre_ln, act, eps, nthr):
    """The block on H3 (B, T, d) C-contiguous: (H_out, -1) with H_out a new (B, T, d)
    array, or (an empty array, 0) when H3 holds a NaN or an Inf; Wf: the flat weights
    (weight_layout).  act: an activations.*_CODE.  nthr: the number of threads the tasks
    are sized for (numba.get_num_threads()) - an argument because calling
    get_num_threads in here makes the function uncacheable.  The output is allocated
    after the attention's packed K and V are freed (at d_model=768, T=4096 that keeps
    12 MiB off the peak).  With a KV cache: _cached; into a given array: _block_into."""
    H = H3.reshape(H3.size)
    # The API leaves this backend the check that H is finite: in here it costs no second
    # crossing into compiled code; the caller reports where the NaN or the Inf is.
    if not all_finite_flat(H):
        return np.empty((0, 0, 0), dtype=H3.dtype), 0
    none = np.empty(0, dtype=H3.dtype)      # no cache (past = -1), no work buffer, no dest
    plan = np.empty((PLAN_ROWS, PLAN_COLS), dtype=np.intp)
    return one_block(H, Wf, T, d, n_heads, dff, causal, pre_ln, act, eps, none, none, -1, 0, nthr, plan, none, 0,
                     none), -1


def _block_into(H3, Wf, out3, T, d, n_heads, dff, causal, pre_ln, act, eps, nthr):
    """_block writing H_out into out3 (B, T, d) C-contiguous, the caller's: -1, or 0 when
    H3 holds a NaN or an Inf (out3 untouched); H3 and out3 may also be (T, d).  For
    small blocks (the lesson's toy): handing an array Numba made back to Python costs
    ~0.4 us, numpy's in the caller ~0.15 (docs/perf-log.md)."""
    H = H3.reshape(H3.size)
    if not all_finite_flat(H):
        return 0
    none = out3.reshape(out3.size)[:0]     # no cache, no work buffer: a view, not an allocation
    plan = np.empty((PLAN_ROWS, PLAN_COLS), dtype=np.intp)
    # borrowed views: the body then counts no references to them (options.borrowed)
    nothing = borrowed(none)
    one_block(borrowed(H), borrowed(Wf), T, d, n_heads, dff, causal, pre_ln, act, eps, nothing, nothing, -1, 0,
              nthr, borrowed(plan), nothing, 0, borrowed(out3).reshape(out3.size))
    keep_alive(H, Wf, none, plan, out3)
    return -1


BODY = {"one_block": (one_block_serial, one_block_parallel)}     # the build each copy calls
# the parallel block hands back an output it allocates late; the serial one, for small
# blocks (and forked children), writes into its caller's
_, block_parallel = serial_and_parallel(_block, "block", calls=BODY, loops=False)
block_serial, _ = serial_and_parallel(_block_into, "block_into", calls=BODY, loops=False)


def _cached(H3, Wf, T, d, n_heads, dff, causal, pre_ln, act, eps, Kc, Vc, past, max_T, layers, plan, work, nthr):
    """_block with a KV cache (causal), and as many blocks as ``layers`` holds: (H_out,
    -1), or (an empty array, i) when the input of block i holds a NaN or an Inf.

    Kc, Vc: the cache's flat keys and values (K^T panels and V rows per head, for max_T
    tokens: tblock.KVCache), holding tokens 0..past-1; H3's rows are tokens past..past+T-1,
    their keys and values are written there, and with past > 0 they attend over the
    cached tokens too, with the same flash kernel.

    layers: (n, 3) addresses of the flat weights, Kc and Vc of n blocks of this config
    (each array the size of Wf, Kc, Vc), run one after another in this call, each on the
    previous one's output: a stack with its caches (tblock.Stack), where a decode step's
    blocks would otherwise each cross from Python into Numba.  (0, 3): the one block of
    Wf, Kc, Vc.

    plan: (PLAN_ROWS, PLAN_COLS) intp, room for the stage plan (one_block).  work: a buffer for
    all other scratch (work_len; a KVCache's), used when it is large enough for this call
    (a decode step): the call then allocates nothing, and H_out is one of its two output
    buffers.  Empty: every buffer new."""
    H = H3.reshape(H3.size)
    nblocks = max(1, layers.shape[0])
    d_k = d // n_heads
    few_keys = past > 0 or T * T * d_k <= DIRECT_MAX
    if work.size > 0 and (not few_keys or work.size < work_len(H.size // d, T, d, dff, n_heads, max(past, 0) + T,
                                                                 panel_lanes(Wf), Wf.itemsize)):
        work = work[:0]                     # not for this call: new buffers
    for blk in range(nblocks):
        if layers.shape[0] > 0:
            W = borrowed_at(Wf, layers[blk, 0], Wf.size)
            K = borrowed_at(Kc, layers[blk, 1], Kc.size)
            V = borrowed_at(Vc, layers[blk, 2], Vc.size)
        else:
            W, K, V = borrowed(Wf), borrowed(Kc), borrowed(Vc)
        if not all_finite_flat(H):         # as in _block
            break
        out3 = one_block(H, W, T, d, n_heads, dff, causal, pre_ln, act, eps, K, V, past, max_T, nthr, plan, work,
                         blk % 2, work[:0])
        if blk == nblocks - 1:
            return out3, -1
        H = out3.reshape(H.size)            # the next block's input
    return np.empty((0, 0, 0), dtype=H3.dtype), blk


# standalone: kernels.decode calls them by address; H3 typed read-only, as the API hands it
cached_serial, cached_parallel = serial_and_parallel(_cached, "cached", calls=BODY, loops=False, standalone=True,
                                                     readonly=("H3", "Wf"))
