"""The weights as the kernels read them, and what a call passes besides H.

A block's weights go into one flat, 64-byte aligned buffer per dtype (kernels.layout's
weight_layout: the biases and norms' affines, then the matrices in the GEMM's packed
panels, the gated FFN's W_gate and W_1 as one matrix of [gate | up] panel pairs), built
once and kept on the BlockWeights.  A *plan* adds the block's scalar
arguments and its FLOP terms, so a call sizes itself without touching the config.
"""

from __future__ import annotations

import numpy as np

from ...config import BlockConfig
from ...counting import flops
from ...kernels.activations import ACTIVATION_CODES
from ...kernels.bgemm import bf16_packed_size, pack_bf16_panels
from ...kernels.gemm import pack_b, packed_size, panel_width
from ...kernels.layout import ffn_cols, qkv_parts, weight_layout
from ...formats import QuantizedMatrix
from ...kernels.qgemv import DOTS, stored_view
from ...kernels.qgroups import GROUP, GROUPED_DOT, group_rows, grouped
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


def block_shape(weights) -> tuple[int, int, int, bool]:
    """(d_model, d_kv, d_ff, gated) of the weights' matrices."""
    d, dff = weights.w_ff1.shape
    return d, weights.w_k.shape[1], dff, weights.w_gate is not None


def layout_of(weights, NR: int) -> tuple:
    """kernels.layout.weight_layout of these weights in panels of NR."""
    d, dkv, dff, gated = block_shape(weights)
    return weight_layout(d, dkv, ffn_cols(dff, gated, NR), dff, NR)


def gate_up_pairs(gate: np.ndarray, up: np.ndarray, NR: int, axis: int = -1) -> np.ndarray:
    """gate and up (d_ff entries along ``axis``) as one array of [gate | up] panel pairs
    along it: gate's entries p*NR .. p*NR + NR - 1, then up's, zeros past d_ff (the gated
    FFN's first matrix and bias: kernels.layout.ffn_cols)."""
    g, u = np.moveaxis(gate, axis, 0), np.moveaxis(up, axis, 0)
    dff, rest = g.shape[0], g.shape[1:]
    npf = -(-dff // NR)
    out = np.zeros((npf, 2, NR) + rest, dtype=g.dtype)
    for j, a in enumerate((g, u)):
        padded = np.zeros((npf * NR,) + rest, dtype=g.dtype)
        padded[:dff] = a
        out[:, j] = padded.reshape((npf, NR) + rest)
    return np.moveaxis(out.reshape((2 * npf * NR,) + rest), 0, axis)


def ffn_first(weights, dtype, NR: int) -> np.ndarray:
    """The FFN's first matrix as the kernels multiply by it: W_1, or the gated FFN's
    [W_gate | W_1] panel pairs (gate_up_pairs), in ``dtype``."""
    if weights.w_gate is None:
        return weights.matrix("w_ff1", dtype)
    return gate_up_pairs(weights.matrix("w_gate", dtype), weights.matrix("w_ff1", dtype), NR, axis=1)


def pack_stored(weights) -> tuple:
    """(f, q, map, dot) for weights whose matrices are stored (kernels.wgemm): f the float32
    vectors of weight_layout, q the six stored matrices one after another, as the
    kernels read them (qgemv.stored_data; the gated FFN's W_gate and W_1 as one matrix of
    [gate | up] panel pairs of stored rows, zero rows past d_ff), map their offsets
    (wgemm.stored_map), dot the marker of how products are computed (qgemv.DOTS).  With
    dot "bf16", q holds the matrices as bgemm's pair panels (uint32) instead of their
    stored rows; with dot "int8" on a CPU with VNNI, as rows in groups of 16
    (kernels.qgroups, marker GROUPED_DOT)."""
    d, dkv, dff, gated = block_shape(weights)
    NR = panel_width(np.float32)
    layout = layout_of(weights, NR)
    f = aligned_empty(layout[0], np.float32)
    pack_vectors(weights, np.float32, f, layout)
    f.flags.writeable = False
    rows = [weights.w_q.data, weights.w_k.data, weights.w_v.data, weights.w_o.data]
    first = weights.w_ff1.data if not gated else gate_up_pairs(weights.w_gate.data, weights.w_ff1.data, NR, axis=0)
    rows += [first, weights.w_ff2.data]
    dot = getattr(weights, "dot", "fp32")
    if dot == "bf16":
        q = bf16_panels(rows)
    else:
        q = held_rows(rows, weights.format, dot)
    q.flags.writeable = False
    m = stored_map(d, dkv, ffn_cols(dff, gated, NR), dff, NR, weights.format, layout, dot)
    m.flags.writeable = False
    return f, q, m, held_dot(dot)


def held_rows(rows, fmt: str, dot: str) -> np.ndarray:
    """Stored matrices' rows (each QuantizedMatrix.data-like, (d_out, row)) one after
    another, flat (int8 as int8, bf16 as uint16), as the kernels read them with ``dot``: as stored
    (qgemv.stored_data), or in groups of 16 (kernels.qgroups) where grouped(dot); each
    matrix written once, into its place."""
    group = grouped(dot)
    sizes = [(-(-r.shape[0] // GROUP) * GROUP if group else r.shape[0]) * r.shape[1] for r in rows]
    q = aligned_empty(sum(sizes), np.int8 if fmt == "int8" else rows[0].dtype)        # bf16: uint16
    pos = 0
    for r, n in zip(rows, sizes):
        if group:
            group_rows(r, fmt, q[pos:pos + n])
        else:
            q[pos:pos + n] = r.reshape(-1).view(q.dtype)
        pos += n
    return q


def held_dot(dot: str) -> np.ndarray:
    """The kernels' marker of matrices held by held_rows with ``dot`` (records.Stored's dot)."""
    return GROUPED_DOT if grouped(dot) else DOTS[dot]


def held_matrix(m: QuantizedMatrix):
    """What the kernels take for one stored matrix (the vocabulary head): qgemv.stored_view
    (its bytes in place), or where its rows are held in groups a grouped copy and its marker."""
    if grouped(m.dot):
        return held_rows([m.data], m.format, m.dot), held_dot(m.dot)
    return stored_view(m)


def bf16_panels(rows) -> np.ndarray:
    """The bf16 matrices (stored rows, uint16 (d_out, d_in) each) as bgemm's pair panels
    (pack_bf16_panels), one after another, each bf16_packed_size(d_in, d_out) uint32."""
    sizes = [bf16_packed_size(r.shape[1], r.shape[0]) for r in rows]
    q = aligned_empty(sum(sizes), np.uint32)
    pos = 0
    for r, n in zip(rows, sizes):
        pack_bf16_panels(r, q[pos:pos + n])
        pos += n
    return q


def pack_weights(weights, dtype) -> np.ndarray:
    """All weights of the block in one flat array of ``dtype`` (see weight_layout)."""
    dtype = np.dtype(dtype)
    d, dkv, dff, gated = block_shape(weights)
    NR = panel_width(dtype)
    layout = layout_of(weights, NR)
    o_qkv, o_o, o_1, o_2 = layout[:4]
    total = layout[12]
    flat = aligned_empty(total, dtype)
    flat[:] = 0
    # the cast happens once here, so float64 weights with float32 inputs run in float32
    # (stored matrices are dequantized exactly: the report times them so, as float32)
    mats, _ = qkv_parts(d, dkv, NR, o_qkv, layout[10])      # W_q, W_k, W_v one after another
    for off, name in zip(mats, ("w_q", "w_k", "w_v")):
        W = weights.matrix(name, dtype)
        pack_b(W, flat[off:off + packed_size(*W.shape, NR)])
    pack_b(weights.matrix("w_o", dtype), flat[o_o:o_1])
    pack_b(ffn_first(weights, dtype, NR), flat[o_1:o_2])
    pack_b(weights.matrix("w_ff2", dtype), flat[o_2:total])
    pack_vectors(weights, dtype, flat, layout)
    flat.flags.writeable = False
    return flat


def pack_vectors(weights, dtype, flat, layout) -> None:
    """The biases and norms' affines into ``flat`` at weight_layout's offsets (layout),
    zeros between them."""
    (o_qkv, o_o, o_1, o_2, o_b1, o_b2, o_g1, o_be1, o_g2, o_be2, o_bqkv, o_bo) = layout[:12]
    d, dkv, dff, gated = block_shape(weights)
    NR = panel_width(dtype)
    cast = lambda a: np.asarray(a, dtype=dtype)
    flat[:o_qkv] = 0
    # absent biases / LN affines are stored as their identity (0, and gamma=1, beta=0):
    # x + 0 and y * 1 + 0 are exact, so the kernels never need to branch on them
    if gated:       # b_gate and b1 as [gate | up] panel pairs, as the matrix
        zeros = np.zeros(dff, dtype)
        b_gate = zeros if weights.b_gate is None else cast(weights.b_gate)
        b_up = zeros if weights.b_ff1 is None else cast(weights.b_ff1)
        flat[o_b1:o_b1 + ffn_cols(dff, True, NR)] = gate_up_pairs(b_gate, b_up, NR)
    else:
        flat[o_b1:o_b1 + dff] = 0 if weights.b_ff1 is None else cast(weights.b_ff1)
    flat[o_b2:o_b2 + d] = 0 if weights.b_ff2 is None else cast(weights.b_ff2)
    flat[o_g1:o_g1 + d] = 1 if weights.ln1_gamma is None else cast(weights.ln1_gamma)
    flat[o_be1:o_be1 + d] = 0 if weights.ln1_beta is None else cast(weights.ln1_beta)
    flat[o_g2:o_g2 + d] = 1 if weights.ln2_gamma is None else cast(weights.ln2_gamma)
    flat[o_be2:o_be2 + d] = 0 if weights.ln2_beta is None else cast(weights.ln2_beta)
    if weights.b_q is not None:         # otherwise zeros, the padding past d_model too
        _, biases = qkv_parts(d, dkv, NR, o_qkv, o_bqkv)
        for off, b in zip(biases, (weights.b_q, weights.b_k, weights.b_v)):
            flat[off:off + b.shape[0]] = cast(b)
    if weights.b_o is not None:         # attn_bias "qkv": none
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


def scalars_of(cfg) -> tuple:
    """The block's scalar arguments (kernels.block's cfg: the fields of a Dims after T and d);
    gated and rope_theta None for a block without the gated FFN or rotary positions, so
    that its build compiles none of their kernels (kernels.records.with_part)."""
    rope_theta = cfg.rope_theta if cfg.positions == "rotary" else None
    gated = True if cfg.ffn == "gated" else None
    return (cfg.n_heads, cfg.d_ff, cfg.causal, cfg.norm == "pre", ACTIVATION_CODES[cfg.activation], cfg.eps,
            cfg.kv_heads, cfg.norm_type == "rmsnorm", gated, rope_theta, cfg.rope_scale)


def make_plan(weights, cfg, dtype):
    """What every call with these weights, this config and this dtype passes besides H:
    (cfg, packed weights, the block's scalar arguments, then flop_terms)."""
    return (cfg, packed(weights, dtype), scalars_of(cfg)) + flop_terms(cfg)


def plan_of(weights, cfg, dtype):
    """make_plan for these weights, cfg and dtype, made once (the weights keep it)."""
    state = weights.prepared_state
    plan = state.get((PLAN, dtype.char))
    if plan is None or plan[0] is not cfg:      # identity: cheaper than comparing configs
        plan = state[(PLAN, dtype.char)] = make_plan(weights, cfg, dtype)
    return plan

