"""The tasks of the block's FFN stage (stage 4 of kernels.block), after W_O's.

    ffn_tile        the FFN of a row tile, FF_CHUNK hidden columns at a time
    ffn_rows_task   a row tile's norms, residual and FFN fused (many rows)
    ffn_input_task, ffn_up_task, ffn_down_task   the FFN split by columns (few rows)
    ffn_pairs       their inputs' room as bf16 pairs, rounded once (dot "bf16")

The FFN is act(X W_1 + b1) W_2 + b2, or gated (dims.gated): (act(X W_gate + b_gate) *
(X W_1 + b1)) W_2 + b2.  The gated FFN's W_gate and W_1 are one packed matrix of
[gate | up] panel pairs (layout.ffn_cols), b_gate and b1 one bias likewise, so one GEMM
over a pair of panels makes both halves of a hidden panel in one pass over X and over a
contiguous run of weights; activations.gated_rows then multiplies them into the hidden
layer W_2 reads.
"""

from __future__ import annotations

import numpy as np

from .activations import bias_act_rows, gated_rows_if_gated
from .bgemm import pair_stride
from .layernorm import layernorm_rows
from .layout import block_layout, ffn_cols, norm_offsets, panels, row_piece
from .options import borrowed, keep_alive, kernel
from .records import Pairs, Panels, Rows, Tile
from .simd import panel_lanes
from .stages import copy_add, layernorm_piece
from .tiles import FF_CHUNK
from .wgemm import floats, pair_rows, round_pairs, wgemm_block, wgemm_panels


@kernel(readonly=("X", "Wf"), standalone=True)
def ffn_tile(X, x_off, m, dims, Wf, out, out_off, residual):
    """The feed-forward of m rows: out[r] = [out[r] +] b2 + FFN(X[r]) (module docstring),
    with X[r, c] = X.flat[x_off + r*d + c], out likewise at out_off; X must not overlap out
    (out is written before X is read for the last chunk).

    The hidden layer is made FF_CHUNK columns at a time: up-projection of the chunk,
    bias + activation (gated: the chunk's [gate | up] panels, then act(gate) * up), then
    its band of W_2 rows accumulated onto out.  The (m, FF_CHUNK) hidden chunk is the only
    place the hidden layer exists, and it stays in L2 while the down-projection reads it
    once per output panel (a whole (MF, d_ff) hidden tile spills to L3 and is read back
    from there once per panel).  The summation order over d_ff is the same as one GEMM's
    (k blocks of KC, ascending), so the result does not change."""
    NR = panel_lanes(floats(Wf))
    d, dff = dims.d, dims.dff
    o_1, o_2, o_b1, o_b2 = block_layout(dims, NR)[2:6]
    n1 = ffn_cols(dff, dims.gated, NR)
    ch = min(FF_CHUNK, panels(dff, NR) * NR)
    # rows one cache line longer than the chunk: rows a multiple of 4 KiB apart would all
    # fall in the same L1 sets, where the micro-kernel's six A rows evict each other
    ldh = ch + 64 // X.itemsize
    own = np.empty(m * ldh, dtype=X.dtype)
    hid = borrowed(own)         # scratch through a view that counts no references
    ldg = 2 * ch + 64 // X.itemsize
    own_g = np.empty(m * ldg, dtype=X.dtype) if dims.gated else own[:0]
    gu = borrowed(own_g)
    for r in range(m):
        if residual:
            copy_add(out, out_off + r * d, out, out_off + r * d, d, floats(Wf), o_b2, True)
        else:
            copy_add(floats(Wf), o_b2, out, out_off + r * d, d, floats(Wf), 0, False)
    # X's rows as the chunks' products take them, rounded once rather than once a chunk
    own_p, ldp = pair_rows(Wf, m, d, own[:0].view(np.uint32))
    round_pairs(Wf, X, Rows(x_off, d), m, d, own_p, Rows(0, ldp))
    Xp = Pairs(X, borrowed(own_p), ldp, x_off // d)
    for c0 in range(0, dff, ch):
        cw = min(ch, dff - c0)
        if dims.gated:
            # gu = X @ [gate | up] panel pairs of hidden panels c0/NR.. (+ their biases),
            # written from column 0; then hid[:, 0:cw] = act(gate) * up
            wgemm_block(Xp, Rows(x_off, d), Wf, Panels(o_1, d * NR, d, n1), gu, Rows(-2 * c0, ldg),
                        Tile(0, m, 2 * (c0 // NR), 2 * panels(c0 + cw, NR)), False, o_b1)
            gated_rows_if_gated(gu, 0, ldg, m, cw, hid, 0, ldh, dims)
        else:
            # hid[:, 0:cw] = X @ W_1[:, c0:c0+cw]: panels c0/NR.. of W_1, written at column p*NR - c0
            wgemm_block(Xp, Rows(x_off, d), Wf, Panels(o_1, d * NR, d, dff), hid, Rows(-c0, ldh),
                        Tile(0, m, c0 // NR, panels(c0 + cw, NR)), False, -1)
            bias_act_rows(hid, 0, ldh, m, cw, floats(Wf), o_b1 + c0, dims.act)
        # out += hid[:, 0:cw] @ W_2[c0:c0+cw, :]: the band of rows c0.. of every W_2 panel
        wgemm_panels(hid, Rows(0, ldh), Wf, Panels(o_2 + c0 * NR, dff * NR, cw, d), out, Rows(out_off, d),
                     Tile(0, m, 0, panels(d, NR)), True, -1)
    keep_alive(own, own_g, own_p)


@kernel(internal=True, inline="always")
def ffn_pairs(Wf, dims, rows, none):
    """Room for ``rows`` rows of the split stages' xn and hid as bf16 pairs (Output's xnp,
    hidp) where Wf's products take them (wgemm.pair_rows), else none (empty, uint32)."""
    return pair_rows(Wf, rows, dims.d, none)[0], pair_rows(Wf, rows, dims.dff, none)[0]


@kernel(readonly=("Wf",), standalone=True, internal=True)
def ffn_up_task(Wf, dims, rows, bufs, p0, p1):
    """Column panels p0..p1-1 of the FFN's hidden layer for all rows: hid[:, panels] =
    act(xn @ W_1[:, panels] + b1), xn (rows, d), hid of row stride ldh (bufs: Output);
    gated: the panels' [gate | up] pairs into bufs.gu (rows, ffn_cols), then act(gate) * up."""
    NR = panel_lanes(floats(Wf))
    d, dff = dims.d, dims.dff
    layout = block_layout(dims, NR)
    o_1, o_b1 = layout[2], layout[4]
    c0, c1 = p0 * NR, min(dff, p1 * NR)
    xn = Pairs(bufs.xn, bufs.xnp, pair_stride(d), 0)
    if dims.gated:
        n1 = ffn_cols(dff, True, NR)
        wgemm_block(xn, Rows(0, d), Wf, Panels(o_1, d * NR, d, n1), bufs.gu, Rows(0, n1),
                    Tile(0, rows, 2 * p0, 2 * p1), False, o_b1)
        gated_rows_if_gated(bufs.gu, 2 * c0, n1, rows, c1 - c0, bufs.hid, c0, bufs.ldh, dims)
    else:
        wgemm_block(xn, Rows(0, d), Wf, Panels(o_1, d * NR, d, dff), bufs.hid, Rows(0, bufs.ldh),
                    Tile(0, rows, p0, p1), False, -1)
        bias_act_rows(bufs.hid, c0, bufs.ldh, rows, c1 - c0, floats(Wf), o_b1 + c0, dims.act)
    # the panels' hidden columns as W_2's products take them, for every FFN_DOWN task
    round_pairs(Wf, bufs.hid, Rows(c0, bufs.ldh), rows, c1 - c0, bufs.hidp, Rows(c0 // 2, pair_stride(dff)))


@kernel(readonly=("Wf",), standalone=True, internal=True)
def ffn_down_task(Wf, dims, rows, bufs, p0, p1):
    """Column panels p0..p1-1 of the FFN's output added onto the residual in out, for all
    rows: out[:, panels] += b2 + hid @ W_2[:, panels] (bufs: Output).  The same sums, in the
    same order (b2 first, then k blocks of KC), as ffn_tile's chunks."""
    NR = panel_lanes(floats(Wf))
    d, dff, out = dims.d, dims.dff, bufs.out
    layout = block_layout(dims, NR)
    o_2, o_b2 = layout[3], layout[5]
    c0 = p0 * NR
    n = min(d, p1 * NR) - c0
    for r in range(rows):
        copy_add(out, r * d + c0, out, r * d + c0, n, floats(Wf), o_b2 + c0, True)
    hid = Pairs(bufs.hid, bufs.hidp, pair_stride(dff), 0)
    wgemm_block(hid, Rows(0, bufs.ldh), Wf, Panels(o_2, dff * NR, dff, d), out, Rows(0, d), Tile(0, rows, p0, p1),
                True, -1)


@kernel(readonly=("Wf",), standalone=True, internal=True)
def ffn_input_task(Wf, dims, t, pieces, rows, bufs):
    """Piece t of the FFN's input when its stages are split by columns: xn = LN(out) for
    the piece's rows (LN2 of H_mid Pre-LN, LN1 of H + A_out Post-LN); Post-LN also puts
    that H_mid = LN1(H + A_out) back into out, the FFN's residual (bufs: Output)."""
    d = dims.d
    layout = block_layout(dims, panel_lanes(floats(Wf)))
    o_g, o_be = norm_offsets(layout, 2 if dims.pre_ln else 1, dims.rms)
    layernorm_piece(bufs.out, bufs.xn, t, pieces, rows, d, floats(Wf), o_g, o_be, dims.eps)
    r0, r1 = row_piece(t, pieces, rows)
    round_pairs(Wf, bufs.xn, Rows(r0 * d, d), r1 - r0, d, bufs.xnp, Rows(r0 * pair_stride(d), pair_stride(d)))
    if not dims.pre_ln:
        copy_add(bufs.xn, r0 * d, bufs.out, r0 * d, (r1 - r0) * d, floats(Wf), 0, False)


@kernel(readonly=("Wf",), standalone=True, internal=True)
def ffn_rows_task(Wf, dims, out, r0, r1):
    """Stage 4 for rows r0..r1, the residual and LayerNorms fused: out holds H_mid (Pre-LN)
    or H + A_out (Post-LN) and gets the block's output."""
    m = r1 - r0
    d, pre_ln, eps = dims.d, dims.pre_ln, dims.eps
    layout = block_layout(dims, panel_lanes(floats(Wf)))
    # the FFN reads LN2(H_mid) (Pre-LN) or H_mid = LN1(H + A_out) (Post-LN), from xn: ffn_tile
    # writes out while it still reads its input
    o_g, o_be = norm_offsets(layout, 2 if pre_ln else 1, dims.rms)
    own = np.empty(m * d, dtype=out.dtype)
    xn = borrowed(own)
    layernorm_rows(out, Rows(r0 * d, d), xn, Rows(0, d), m, d, floats(Wf), o_g, o_be, eps)
    if not pre_ln:
        copy_add(xn, 0, out, r0 * d, m * d, floats(Wf), 0, False)      # H_mid is also the residual
    ffn_tile(xn, 0, m, dims, Wf, out, r0 * d, True)
    if not pre_ln:
        o_g2, o_be2 = norm_offsets(layout, 2, dims.rms)
        layernorm_rows(out, Rows(r0 * d, d), out, Rows(r0 * d, d), m, d, floats(Wf), o_g2, o_be2, eps)
    keep_alive(own)
