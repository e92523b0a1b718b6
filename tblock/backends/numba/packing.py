"""The weights as the kernels read them, and what a call passes besides H.

A block's weights go into one flat, 64-byte aligned buffer per dtype (kernels.layout's
weight_layout: the matrices in the GEMM's packed panels, then biases and LayerNorm
affines), built once and kept on the BlockWeights.  A *plan* adds the block's scalar
arguments and its FLOP terms, so a call sizes itself without touching the config.
"""

from __future__ import annotations

import numpy as np

from ...config import BlockConfig
from ...counting import flops
from ...kernels.activations import ACTIVATION_CODES
from ...kernels.bgemm import bf16_packed_size, pack_bf16_panels
from ...kernels.gemm import pack_b, packed_size, panel_width
from ...kernels.layout import bias_len, packed_len, weight_layout
from ...kernels.qgemv import DOTS, stored_data
from ...kernels.wgemm import stored_map

PACKED = "numba-packed"     # the key of the packed buffer in a BlockWeights' prepared_state
PLAN = "numba-plan"


def aligned_empty(n: int, dtype) -> np.ndarray:
    """A 1-D array of n elements whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    raw = np.empty(n + 64 // dtype.itemsize, dtype=dtype)
    start = (-raw.ctypes.data % 64) // dtype.itemsize
    return raw[start:start + n]


def packed(weights, dtype):
    """The packed weights of ``dtype``, built once per BlockWeights: one flat array, or for
    stored matrices (bf16, int8, int4) the tuple (f, q, map, dot) of kernels.wgemm (float32)."""
    dtype = np.dtype(dtype)
    if weights.quantized:
        return weights.prepared((PACKED, "stored"), pack_stored)
    return weights.prepared((PACKED, dtype.char), lambda w: pack_weights(w, dtype))


def packed_addresses(weights, dtype) -> tuple[int, int]:
    """The data addresses of packed(weights, dtype): its float array, and its stored
    matrices (0 for float weights); the weights hold both as long as they live."""
    def build(w):
        p = packed(w, dtype)
        return (p.ctypes.data, 0) if isinstance(p, np.ndarray) else (p[0].ctypes.data, p[1].ctypes.data)
    return weights.prepared((PACKED + "-address", np.dtype(dtype).char), build)


def pack_stored(weights) -> tuple:
    """(f, q, map, dot) for weights whose matrices are stored (kernels.wgemm): f the float32
    vectors of weight_layout, q the six stored matrices one after another, as the
    kernels read them (qgemv.stored_data), map their offsets (wgemm.stored_map), dot the
    marker of how products are computed (qgemv.DOTS).  With dot "bf16", q holds the
    matrices as bgemm's pair panels (uint32) instead of their stored rows."""
    d, dff = weights.w_ff1.shape
    NR = panel_width(np.float32)
    layout = weight_layout(d, dff, NR)
    f = aligned_empty(layout[0], np.float32)
    pack_vectors(weights, np.float32, f, layout)
    f.flags.writeable = False
    names = ("w_q", "w_k", "w_v", "w_o", "w_ff1", "w_ff2")
    dot = getattr(weights, "dot", "fp32")
    q = bf16_panels(weights, names) if dot == "bf16" else stored_rows(weights, names)
    q.flags.writeable = False
    m = stored_map(d, dff, NR, weights.format, layout, dot)
    m.flags.writeable = False
    return f, q, m, DOTS[dot]


def stored_rows(weights, names) -> np.ndarray:
    """The matrices ``names`` as they are stored (qgemv.stored_data), one after another."""
    views = [stored_data(getattr(weights, n)) for n in names]
    q = aligned_empty(sum(v.size for v in views), views[0].dtype)
    q[:] = np.concatenate(views)
    return q


def bf16_panels(weights, names) -> np.ndarray:
    """The bf16 matrices ``names`` as bgemm's pair panels (pack_bf16_panels), one after
    another, each bf16_packed_size(d_in, d_out) uint32."""
    mats = [getattr(weights, n) for n in names]
    sizes = [bf16_packed_size(*m.shape) for m in mats]
    q = aligned_empty(sum(sizes), np.uint32)
    pos = 0
    for m, n in zip(mats, sizes):
        pack_bf16_panels(m.data, q[pos:pos + n])
        pos += n
    return q


def pack_weights(weights, dtype) -> np.ndarray:
    """All weights of the block in one flat array of ``dtype`` (see weight_layout)."""
    dtype = np.dtype(dtype)
    d, dff = weights.w_ff1.shape
    NR = panel_width(dtype)
    (o_qkv, o_o, o_1, o_2, o_b1, o_b2, o_g1, o_be1, o_g2, o_be2, o_bqkv, o_bo,
     total) = weight_layout(d, dff, NR)
    flat = aligned_empty(total, dtype)
    flat[:] = 0
    # the cast happens once here, so float64 weights with float32 inputs run in float32
    # (stored matrices are dequantized exactly: the report times them so, as float32)
    step = packed_len(d, d, NR)         # W_q, W_k, W_v packed one after another
    for j, name in enumerate(("w_q", "w_k", "w_v")):
        pack_b(weights.matrix(name, dtype), flat[o_qkv + j * step:o_qkv + j * step + packed_size(d, d, NR)])
    pack_b(weights.matrix("w_o", dtype), flat[o_o:o_1])
    pack_b(weights.matrix("w_ff1", dtype), flat[o_1:o_2])
    pack_b(weights.matrix("w_ff2", dtype), flat[o_2:total])
    pack_vectors(weights, dtype, flat, (o_qkv, o_o, o_1, o_2, o_b1, o_b2, o_g1, o_be1, o_g2, o_be2, o_bqkv, o_bo))
    flat.flags.writeable = False
    return flat


def pack_vectors(weights, dtype, flat, layout) -> None:
    """The biases and LayerNorm affines into ``flat`` at weight_layout's offsets (layout),
    zeros between them."""
    (o_qkv, o_o, o_1, o_2, o_b1, o_b2, o_g1, o_be1, o_g2, o_be2, o_bqkv, o_bo) = layout[:12]
    d, dff = weights.w_ff1.shape
    NR = panel_width(dtype)
    cast = lambda a: np.asarray(a, dtype=dtype)
    flat[:o_qkv] = 0
    # absent biases / LN affines are stored as their identity (0, and gamma=1, beta=0):
    # x + 0 and y * 1 + 0 are exact, so the kernels never need to branch on them
    flat[o_b1:o_b1 + dff] = 0 if weights.b_ff1 is None else cast(weights.b_ff1)
    flat[o_b2:o_b2 + d] = 0 if weights.b_ff2 is None else cast(weights.b_ff2)
    flat[o_g1:o_g1 + d] = 1 if weights.ln1_gamma is None else cast(weights.ln1_gamma)
    flat[o_be1:o_be1 + d] = 0 if weights.ln1_beta is None else cast(weights.ln1_beta)
    flat[o_g2:o_g2 + d] = 1 if weights.ln2_gamma is None else cast(weights.ln2_gamma)
    flat[o_be2:o_be2 + d] = 0 if weights.ln2_beta is None else cast(weights.ln2_beta)
    if weights.b_q is not None:         # otherwise zeros, the padding past d_model too
        bstep = bias_len(d, NR)
        for j, b in enumerate((weights.b_q, weights.b_k, weights.b_v)):
            flat[o_bqkv + j * bstep:o_bqkv + j * bstep + d] = cast(b)
        flat[o_bo:o_bo + d] = cast(weights.b_o)


# ----------------------------------------------------------------------------- FLOPs


def flop_terms(cfg) -> tuple[int, int]:
    """tblock.flops' matmuls as (per_row, per_key): a forward pass costs
    B*T*(per_row + per_key * (T + 1 if causal else 2T)) FLOPs, the projections and the FFN
    per row, scores and A V per visible key (at T=1 the full square is one key, counted 2T)."""
    one = flops(cfg, 1)
    return one.full["qkv"] + one.full["out_proj"] + one.ffn_matmul_flops, one.attention_core() // 2


def block_flops(B: int, T: int, d: int, dff: int, causal: bool) -> int:
    """The FLOPs of a forward pass of a block of this size."""
    per_row, per_key = flop_terms(BlockConfig(d_model=d, n_heads=1, d_ff=dff))
    return forward_flops(B, T, per_row, per_key, causal)


def forward_flops(B: int, T: int, per_row: int, per_key: int, causal: bool) -> int:
    """block_flops from flop_terms' parts (a plan holds them)."""
    return B * T * (per_row + per_key * (T + 1 if causal else 2 * T))


def cached_flops(B: int, T: int, past: int, per_row: int, per_key: int) -> int:
    """FLOPs of a cached block call: B sequences of T new rows after ``past`` cached tokens
    (each new token t sees past + t + 1 keys)."""
    return B * T * (per_row + per_key * (2 * past + T + 1))


# ----------------------------------------------------------------------------- plans


def refuse_unsupported(cfg) -> None:
    """ValueError naming the first option of cfg that this backend does not compute yet:
    none is silently computed as the lesson's block."""
    for name, computed in (("norm_type", "layernorm"), ("ffn", "mlp"), ("positions", "none")):
        if getattr(cfg, name) != computed:
            raise ValueError(f"backend 'numba' does not compute {name}={getattr(cfg, name)!r} yet "
                             f"(only {name}={computed!r})")
    if cfg.activation not in ACTIVATION_CODES:
        raise ValueError(f"backend 'numba' does not compute activation={cfg.activation!r} yet "
                         f"(only {tuple(ACTIVATION_CODES)})")
    if cfg.kv_heads != cfg.n_heads:
        raise ValueError(f"backend 'numba' does not compute n_kv_heads={cfg.n_kv_heads} yet "
                         f"(only n_kv_heads = n_heads = {cfg.n_heads})")
    if cfg.attn_bias not in (False, True):
        raise ValueError(f"backend 'numba' does not compute attn_bias={cfg.attn_bias!r} yet (only False or True)")


def make_plan(weights, cfg, dtype):
    """What every call with these weights, this config and this dtype passes besides H:
    (cfg, packed weights, the block's scalar arguments, then flop_terms)."""
    refuse_unsupported(cfg)
    scalars = (cfg.n_heads, cfg.d_ff, cfg.causal, cfg.norm == "pre", ACTIVATION_CODES[cfg.activation], cfg.eps)
    return (cfg, packed(weights, dtype), scalars) + flop_terms(cfg)


def plan_of(weights, cfg, dtype):
    """make_plan for these weights, cfg and dtype, made once (the weights keep it)."""
    state = weights.prepared_state
    plan = state.get((PLAN, dtype.char))
    if plan is None or plan[0] is not cfg:      # identity: cheaper than comparing configs
        plan = state[(PLAN, dtype.char)] = make_plan(weights, cfg, dtype)
    return plan

