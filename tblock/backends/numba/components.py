"""The block's pieces one at a time, for the report's per-component timings.

The fused block runs LN, QKV, attention, W_O, FFN and the residuals in one compiled call;
its attention core is exposed on its own (kernels.block.attention_core), and the
projections and the FFN are driven here with the block's own kernels, tiles and task split.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...kernels.activations import ACTIVATION_CODES
from ...kernels.block import attention_core
from ...kernels.gemm import gemm_block, panel_width
from ...kernels.layernorm import layernorm_rows
from ...kernels.layout import bias_len, ceil_div, packed_len, panels, rows_per_task, stage_grid, task_tile, weight_layout
from ...kernels.options import JIT
from ...kernels.records import Panels, Rows
from ...kernels.simd import panel_lanes
from ...kernels.softmax import masked_softmax_rows
from ...kernels.stages import ffn_tile
from ...kernels.tiles import MC, MF
from ..components import ComponentSet, block_fn
from .packing import packed, refuse_unsupported
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
    mc, groups, ntasks = stage_grid(rows, npn, MC, nthr)
    for t in prange(ntasks):
        gemm_block(A, a, Wf, b, C, c, task_tile(t, groups, mc, rows, npn), False, bias_off)


@njit(parallel=True, **DRIVER_JIT)
def _ffn(X, Wf, rows, d, dff, act, out, nthr):
    """The block's FFN stage without its LayerNorm and residual: the same row tiles
    and the same ffn_tile (up-projection, bias + activation, down-projection + b_ff2)."""
    mf = rows_per_task(rows, MF, nthr)
    for t in prange(ceil_div(rows, mf)):
        r0 = t * mf
        ffn_tile(X, r0 * d, min(rows, r0 + mf) - r0, d, dff, Wf, act, out, r0 * d, False)


def components(cfg, weights, dtype):
    """The block's own kernels on the backend's own packed weights (one copy, one layout)."""
    refuse_unsupported(cfg)
    cs = ComponentSet("numba", cfg, dtype, dtype)
    Wf = packed(weights, dtype)
    d, dff, n_heads = cfg.d_model, cfg.d_ff, cfg.n_heads
    NR = panel_width(dtype)             # the panel width pack_weights used
    o_qkv, o_o, _, _, _, _, o_g1, o_be1, _, _, o_bqkv, o_bo, _ = weight_layout(d, dff, NR)
    act = ACTIVATION_CODES[cfg.activation]

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
        # the block keeps Q, K, V as rows [Q | K | V] of one buffer: the copy in is O(T d)
        rows = np.concatenate([Q, K, V], axis=1)
        parallel_call(attention_core, rows.reshape(-1), Q.shape[0], d, n_heads, cfg.causal)
        return rows[:, :d]

    def attention(X):
        T = X.shape[0]
        qkv = np.empty(T * 3 * d, dtype=dtype)
        step = packed_len(d, d, NR)     # W_q, W_k, W_v are packed one after another
        bstep = bias_len(d, NR)         # and so are their biases
        for j in range(3):              # Q, K, V: columns j*d.. of the (T, 3d) rows
            parallel_call(_projection, X.reshape(-1), Rows(0, d), T, Wf, Panels(o_qkv + j * step, d * NR, d, d),
                          qkv[j * d:], Rows(0, 3 * d), o_bqkv + j * bstep, pass_threads=True)
        parallel_call(attention_core, qkv, T, d, n_heads, cfg.causal)
        out = np.empty((T, d), dtype=dtype)
        parallel_call(_projection, qkv, Rows(0, 3 * d), T, Wf, Panels(o_o, d * NR, d, d), out.reshape(-1), Rows(0, d),
                      o_bo, pass_threads=True)
        return out

    def ffn(X):
        out = np.empty_like(X)
        parallel_call(_ffn, X.reshape(-1), Wf, X.shape[0], d, dff, act, out.reshape(-1), pass_threads=True)
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
