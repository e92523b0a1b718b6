"""The block's pieces one at a time, for the report's per-component timings.

The fused block runs LN, QKV, attention, W_O, FFN and the residuals in one compiled call;
its attention core is exposed on its own (kernels.block.attention_core), and the
projections and the FFN are driven here with the block's own kernels, tiles and task split.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...kernels.block import attention_core
from ...kernels.ffn import ffn_tile
from ...kernels.gemm import gemm_block, panel_width
from ...kernels.layernorm import layernorm_rows
from ...kernels.layout import ceil_div, panels, qkv_parts, rows_per_task, stage_grid, task_tile
from ...kernels.options import JIT
from ...kernels.records import Dims, Panels, Rows
from ...kernels.rotary import rope_table, rotate_rows
from ...kernels.simd import panel_lanes
from ...kernels.softmax import masked_softmax_rows
from ...kernels.tiles import MC, MF
from ..components import ComponentSet, block_fn
from .packing import layout_of, packed, scalars_of
from .parallel import parallel_call

# not cached: Numba's on-disk cache is keyed on this file alone, so after a change to the
# kernels these drivers would keep the old kernels compiled in
DRIVER_JIT = {**JIT, "cache": False}


@njit(parallel=True, **DRIVER_JIT)
def _projection(A, a, rows, Wf, b, C, c, bias_off, nthr):
    """C[0:rows, 0:n] = A[0:rows, 0:k] @ B + (the padded bias at Wf[bias_off]), a and c the
    Rows of A and C, b the Panels of B in Wf; split into tasks as the block's QKV and W_O
    stages are (stage_grid)."""
    npn = panels(b.n, panel_lanes(Wf))
    mc, groups, ntasks = stage_grid(rows, npn, MC, nthr, 1)
    for t in prange(ntasks):
        gemm_block(A, a, Wf, b, C, c, task_tile(t, groups, mc, rows, npn), False, bias_off)


@njit(parallel=True, **DRIVER_JIT)
def _ffn(X, Wf, rows, dims, out, nthr):
    """The block's FFN stage without its LayerNorm and residual: the same row tiles
    and the same ffn_tile (up-projection, bias + activation, down-projection + b_ff2)."""
    mf = rows_per_task(rows, MF, nthr)
    d = dims.d
    for t in prange(ceil_div(rows, mf)):
        r0 = t * mf
        ffn_tile(X, r0 * d, min(rows, r0 + mf) - r0, dims, Wf, out, r0 * d, False)


def components(cfg, weights, dtype):
    """The block's own kernels on the backend's own packed weights (one copy, one layout)."""
    cs = ComponentSet("numba", cfg, dtype, dtype)
    Wf = packed(weights, dtype)
    d, n_heads, kv, dkv = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.d_kv
    NR = panel_width(dtype)             # the panel width pack_weights used
    layout = layout_of(weights, NR)
    o_qkv, o_o, o_g1, o_bqkv, o_bo = layout[0], layout[1], layout[6], layout[10], layout[11]
    o_be1 = -1 if cfg.norm_type == "rmsnorm" else layout[7]
    mats, biases = qkv_parts(d, dkv, NR, o_qkv, o_bqkv)
    dims = Dims(1, d, *scalars_of(cfg))

    def layernorm(X):
        Y = np.empty_like(X)
        layernorm_rows(X.reshape(-1), Rows(0, d), Y.reshape(-1), Rows(0, d), X.shape[0], d, Wf, o_g1, o_be1, cfg.eps)
        return Y

    def softmax(S):
        out = np.empty_like(S)
        for h in range(S.shape[0]):
            masked_softmax_rows(S[h], 1.0, cfg.causal, out[h])
        return out

    def core(Q, K, V):
        # the block keeps Q, K, V as rows [Q | K | V] of one buffer, each 3d wide (K and V
        # d_kv wide: the first of theirs when given d_model): the copy in is O(T d)
        T = Q.shape[0]
        rows = np.zeros((T, 3 * d), dtype=Q.dtype)
        rows[:, :d], rows[:, d:d + dkv], rows[:, 2 * d:2 * d + dkv] = Q, K[:, :dkv], V[:, :dkv]
        parallel_call(attention_core, rows.reshape(-1), T, d, n_heads, kv, cfg.causal)
        return rows[:, :d]

    def attention(X):
        T = X.shape[0]
        qkv = np.empty(T * 3 * d, dtype=dtype)
        for j in range(3):              # Q, K, V: columns j*d.. of the (T, 3d) rows
            n = d if j == 0 else dkv
            parallel_call(_projection, X.reshape(-1), Rows(0, d), T, Wf, Panels(mats[j], d * NR, d, n),
                          qkv[j * d:], Rows(0, 3 * d), biases[j], pass_threads=True)
        if cfg.positions == "rotary":   # the block turns Q and K after its QKV stage, as here
            rope = np.empty(T * cfg.d_k, dtype=dtype)
            rope_table(rope, T, cfg.d_k, 0, cfg.rope_theta, cfg.rope_scale)
            rotate_rows(qkv, 0, 3 * d, T, n_heads, cfg.d_k, rope, 0)
            rotate_rows(qkv, d, 3 * d, T, kv, cfg.d_k, rope, 0)
        parallel_call(attention_core, qkv, T, d, n_heads, kv, cfg.causal)
        out = np.empty((T, d), dtype=dtype)
        parallel_call(_projection, qkv, Rows(0, 3 * d), T, Wf, Panels(o_o, d * NR, d, d), out.reshape(-1), Rows(0, d),
                      o_bo, pass_threads=True)
        return out

    def ffn(X):
        out = np.empty_like(X)
        parallel_call(_ffn, X.reshape(-1), Wf, X.shape[0], dims, out.reshape(-1), pass_threads=True)
        return out

    cs.fns.update(layernorm=layernorm, softmax=softmax, attention_core=core, attention=attention,
                  ffn=ffn, block=block_fn("numba", cfg, weights))
    cs.square = "causal"        # flash_rows never visits key tiles above the diagonal
    cs.notes.append("numba: the block is one fused compiled call (tblock.forward); the attention core is "
                    "the block's own kernels.block.attention_core; the projections and the FFN are driven "
                    "here with the block's kernels and tiles (not cached: compiled on the first call); "
                    "layernorm and softmax are the serial row kernels (the fused attention never "
                    "materialises the scores: its online softmax runs on tiles)")
    return cs
