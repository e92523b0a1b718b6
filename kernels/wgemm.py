"""The block's weights as its kernels take them, and the GEMM over them, in any format.

A block's weights are the flat float array of layout.weight_layout, or a records.Stored:
the same layout's float vectors (biases, LayerNorm affines) and the six matrices in a
stored format (tblock.formats, read by kernels.qgemv).  The stages never look inside:

    as_weights(W)             an entry point's argument (an array, or (f, q, map, dot)) as one
    floats(W)                 the float vectors' array (the flat array itself, or W.f)
    borrow(W)                 options.borrowed views of W's arrays
    as_head, embed_row        a language model's tied embedding, float or stored
    wgemm_block, wgemm_panels gemm.gemm_block / gemm_panels, for a matrix of W given as
                              its float layout's Panels (the same call either way)
    weights_at(W, layers, i)  block i of a stack's table of addresses (block._cached)
    pair_rows, round_pairs    a stage's A rounded to bf16 pairs once, where W's products
                              take them, for the GEMMs of its tasks (A as a records.Pairs)

Numba compiles one build of each caller per weights type, so a user of float weights
compiles none of this module's stored paths, and each stored format (and dot: Stored.dot's
dtype) only its own.

A stored matrix times one row (a decode step) reads each stored row once
(qgemv.row_dot; with dot "int8", qdot.gemv_int8 on the row rounded once, or where the CPU
has VNNI qgroups.gemv_groups: the block's matrices are then held in groups of 16 rows,
Stored.dot int16, qgroups.GROUPED_DOT); times many
rows with dot "int8" on a CPU with VNNI, igemm multiplies the rounded rows by the stored
bytes in int32 (stored_igemm); otherwise the task's panels are first unpacked into
float32 panels in a scratch of its own (qgemv.unpack_row, k x NR per panel: L2-sized) and
multiplied by gemm_panels, so the unpacking is shared by the tile's rows (with dot
"int8", by rows rounded first: qdot.rounded_rows).

With dot "bf16" (Stored.dot uint16) a block's matrices are not stored rows but bf16 pair
panels (bgemm.pack_bf16_panels, uint32, the float GEMM's NR columns a panel), and every
product, one row or many, is bgemm's (stored_bgemm: vdpbf16ps where the CPU has it).  A
head stored as bf16 rows with dot "bf16" rounds its rows first (bgemm.bf16_rows) and then
multiplies them as dot "fp32" does: the same value up to float32 summation order.
"""

from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import overload

from .bgemm import NR as BF16_NR
from .bgemm import bf16_packed_size, bf16_rows, bgemm_packed, bgemm_panels, pack_pairs, pair_stride
from .gemm import gemm_block, gemm_panels
from .options import borrowed, borrowed_at, kernel
from .igemm import igemm
from .qdot import KIND, gemv_int8, rounded_rows
from .qgemv import row_dot, unpack_row
from .qgroups import gemv_groups, group_row, grouped, grouped_size
from .records import Pairs, Panels, Rows, Stored, Tile
from .simd import panel_lanes


INTEGER_GEMM = KIND == "vnni"     # elsewhere the widened float GEMM is faster (docs/perf-log.md)


def _is_stored(W):
    return isinstance(W, types.NamedTuple) and W.instance_class is Stored


def _is_bf16_dot(W):
    """Whether W is a Stored whose products are bgemm's (dot "bf16": pair panels, uint32)."""
    return _is_stored(W) and W[1].dtype == types.uint32


def _is_pairs(A):
    return isinstance(A, types.NamedTuple) and A.instance_class is Pairs


def floats(W):
    """The array of W's float vectors (and of its matrices, for float weights)."""


@overload(floats)
def _floats(W):
    if isinstance(W, types.Array):
        return lambda W: W
    if _is_stored(W):
        return lambda W: W.f
    return None


def borrow(W):
    """options.borrowed views of W's arrays."""


@overload(borrow, inline="always")
def _borrow(W):
    if isinstance(W, types.Array):
        return lambda W: borrowed(W)
    if _is_stored(W):
        return lambda W: Stored(borrowed(W.f), borrowed(W.q), borrowed(W.map), W.dot)
    return None


def as_weights(W):
    """An entry point's weights argument as the stages take it: a flat float array as it
    is, the plain tuple (f, q, map, dot) from Python as a Stored (records.py: a plain tuple
    is what Python hands over cheaply)."""


@overload(as_weights, inline="always")
def _as_weights(W):
    if isinstance(W, types.Array) or _is_stored(W):
        return lambda W: W
    if isinstance(W, types.BaseTuple) and len(W) == 4:
        return lambda W: Stored(W[0], W[1], W[2], W[3])
    return None


def weights_at(W, layers, i):
    """Block i's weights of a stack: W's arrays at the addresses in row i of ``layers``
    (columns 0 and 3: the float array, the stored matrices)."""


@overload(weights_at, inline="always")
def _weights_at(W, layers, i):
    if isinstance(W, types.Array):
        return lambda W, layers, i: borrowed_at(W, layers[i, 0], W.size)
    if _is_stored(W):
        return lambda W, layers, i: Stored(borrowed_at(W.f, layers[i, 0], W.f.size),
                                           borrowed_at(W.q, layers[i, 3], W.q.size), W.map, W.dot)
    return None


def wgemm_block(A, a, W, b, C, c, tile, accumulate, bias_off):
    """gemm.gemm_block with B a matrix of the weights W (b: its Panels in the float layout)."""


def _weights_gemm(float_gemm, wgemm):
    """The overload of wgemm, a GEMM over W's matrix: float_gemm (gemm_block or gemm_panels)
    on a flat float array, stored_gemm on a Stored.  A may be a Pairs: its rows already
    rounded to bf16 pairs serve a product over bf16 pair panels, its float rows any other."""
    def typer(A, a, W, b, C, c, tile, accumulate, bias_off):
        if _is_pairs(A) and _is_bf16_dot(W):
            return lambda A, a, W, b, C, c, tile, accumulate, bias_off: paired_bgemm(
                A, a, W, b, C, c, tile, accumulate, bias_off)
        if _is_pairs(A):                # other weights take the float rows
            return lambda A, a, W, b, C, c, tile, accumulate, bias_off: wgemm(
                A.x, a, W, b, C, c, tile, accumulate, bias_off)
        if isinstance(W, types.Array):
            return lambda A, a, W, b, C, c, tile, accumulate, bias_off: float_gemm(
                A, a, W, b, C, c, tile, accumulate, bias_off)
        if _is_bf16_dot(W):
            return lambda A, a, W, b, C, c, tile, accumulate, bias_off: stored_bgemm(
                A, a, W, b, C, c, tile, accumulate, bias_off)
        if _is_stored(W) and (W[3].dtype == types.int16 or (W[3].dtype == types.int8 and INTEGER_GEMM)):
            return lambda A, a, W, b, C, c, tile, accumulate, bias_off: stored_igemm(
                A, a, W, b, C, c, tile, accumulate, bias_off)
        if _is_stored(W):
            return lambda A, a, W, b, C, c, tile, accumulate, bias_off: stored_gemm(
                A, a, W, b, C, c, tile, accumulate, bias_off)
        return None
    return typer


def wgemm_panels(A, a, W, b, C, c, tile, accumulate, bias_off):
    """gemm.gemm_panels with B a matrix of the weights W, as wgemm_block."""


def _is_stored_rows(E):
    """Whether E is a stored matrix's qgemv.stored_view: its rows, or (rows, dot)."""
    if isinstance(E, types.BaseTuple) and len(E) == 2:
        return _is_stored_rows(E[0]) and isinstance(E[1], types.Array)
    return isinstance(E, types.Array) and E.dtype in (types.uint16, types.int8, types.uint8)


def as_head(Ep, like):
    """The vocabulary head's weights (kernels.lm_head): float panels as they are, a stored
    E (rows = tokens: qgemv's layout, as GGUF stores token_embd; qgemv.stored_view) as a
    Stored of one matrix (an empty map: the matrix at 0), its float array ``like``'s empty
    view."""


@overload(as_head, inline="always")
def _as_head(Ep, like):
    if isinstance(Ep, types.Array) and isinstance(Ep.dtype, types.Float):
        return lambda Ep, like: Ep
    if isinstance(Ep, types.Array) and _is_stored_rows(Ep):
        return lambda Ep, like: Stored(like[:0], Ep, np.empty(0, dtype=np.intp), np.empty(0, dtype=np.float32))
    if _is_stored_rows(Ep):
        return lambda Ep, like: Stored(like[:0], Ep[0], np.empty(0, dtype=np.intp), Ep[1])
    return None


def embed_row(E, v, d, out, o):
    """out[o : o + d] = row v of the token embedding E ((vocab, d) floats, or stored rows)."""


@overload(embed_row)
def _embed_row(E, v, d, out, o):
    if isinstance(E, types.Array) and isinstance(E.dtype, types.Float):
        def rows(E, v, d, out, o):
            for j in range(d):
                out[o + j] = E[v, j]
        return rows
    if isinstance(E, types.Array) and _is_stored_rows(E):
        return lambda E, v, d, out, o: unpack_row(E, v, d, 0, d, out, o, 1)
    if _is_stored_rows(E) and E[1].dtype == types.int16:       # rows in groups (qgroups)
        return lambda E, v, d, out, o: group_row(E[0], v, d, out, o)
    if _is_stored_rows(E):              # the embedding is the stored value, whatever the dot
        return lambda E, v, d, out, o: unpack_row(E[0], v, d, 0, d, out, o, 1)
    return None


@kernel(internal=True)
def stored_band(map_, off, ld, NR):
    """(first stored element of the matrix, its rows' inputs d_in, first input k0) of the
    matrix whose float-layout panels (row stride ld) hold the band starting at ``off``; an
    empty map: one matrix, at 0 (a head)."""
    if map_.size == 0:
        return 0, ld // NR, off // NR
    m = 0
    for i in range(1, 6):
        if map_[i] <= off:
            m = i
    return map_[6 + m], ld // NR, (off - map_[m]) // NR


def row_products(A, a_off, Wq, dot, band, bias, C, c_off, accumulate):
    """C[c_off + j] (+)= [bias[j] +] A[a_off : a_off + k] . inputs k0 : k0 + k of stored row j
    of Wq, j0 <= j < j1 (band = (d_in, k0, k, j0, j1)), as ``dot`` (Stored's) says."""


@overload(row_products)
def _row_products(A, a_off, Wq, dot, band, bias, C, c_off, accumulate):
    if dot.dtype == types.int8:
        return lambda A, a_off, Wq, dot, band, bias, C, c_off, accumulate: gemv_int8(
            A, a_off, Wq, band, bias, C, c_off, accumulate)
    if dot.dtype == types.int16:
        return lambda A, a_off, Wq, dot, band, bias, C, c_off, accumulate: gemv_groups(
            A, a_off, Wq, band, bias, C, c_off, accumulate)

    def rows(A, a_off, Wq, dot, band, bias, C, c_off, accumulate):
        d_in, k0, k, j0, j1 = band
        for j in range(j0, j1):
            s = row_dot(A, a_off, Wq, j, d_in, k0, k)
            if bias.size:
                s += bias[j]
            C[c_off + j] = C[c_off + j] + s if accumulate else s
    if dot.dtype == types.uint16:
        def rounded(A, a_off, Wq, dot, band, bias, C, c_off, accumulate):
            x = np.empty(band[2], dtype=np.float32)
            bf16_rows(A, a_off, 0, 1, band[2], x)
            row_products(x, 0, Wq, np.empty(0, dtype=np.float32), band, bias, C, c_off, accumulate)
        return rounded
    return rows


def rows_as_dot(A, a, i0, i1, k, dot):
    """(A, a) as a many-row product with ``dot`` takes rows i0:i1 of A's k columns (a:
    Rows): as they are, or rounded into a new array (qdot.rounded_rows to int8 blocks,
    bgemm.bf16_rows to bf16)."""


@overload(rows_as_dot)
def _rows_as_dot(A, a, i0, i1, k, dot):
    if dot.dtype not in (types.int8, types.uint16):
        return lambda A, a, i0, i1, k, dot: (A, a)
    round_rows = rounded_rows if dot.dtype == types.int8 else bf16_rows     # int8 blocks, or bf16

    def rounded(A, a, i0, i1, k, dot):
        out = np.empty((i1 - i0) * k, dtype=np.float32)
        round_rows(A, a.off + i0 * a.ld, a.ld, i1 - i0, k, out)
        return out, Rows(-i0 * k, k)        # row i at (i - i0) * k
    return rounded


@kernel(readonly=("A",), internal=True)
def stored_gemm(A, a, W, b, C, c, tile, accumulate, bias_off):
    """C[tile] (+)= [bias +] A[rows of tile, 0:b.k] @ B, B the band of stored rows that b
    names (module docstring), products as W.dot says; the bias of column j at
    W.f[bias_off + j]."""
    f = W.f
    NR = panel_lanes(f)
    q0, d_in, k0 = stored_band(W.map, b.off, b.ld, NR)
    Wq = W.q[q0:]
    i0, i1, p0, p1 = tile
    j0, j1 = p0 * NR, min(p1 * NR, b.n)
    if i1 - i0 == 1:
        bias = f[bias_off:] if bias_off >= 0 else f[:0]
        row_products(A, a.off + i0 * a.ld, Wq, W.dot, (d_in, k0, b.k, j0, j1), bias, C, c.off + i0 * c.ld,
                     accumulate)
        return
    npn = p1 - p0
    k = b.k
    Ax, ax = rows_as_dot(A, a, i0, i1, k, W.dot)
    Bs = np.zeros(npn * k * NR + npn * NR, dtype=f.dtype)   # the panels, then their bias row
    for j in range(j0, j1):
        p = j // NR - p0
        unpack_row(Wq, j, d_in, k0, k, Bs, p * k * NR + j % NR, NR)
    bias = -1
    if bias_off >= 0:
        bias = npn * k * NR
        Bs[bias:bias + npn * NR] = f[bias_off + j0:bias_off + j0 + npn * NR]
    gemm_panels(Ax, ax, Bs, Panels(0, k * NR, k, b.n - j0), C, Rows(c.off + j0, c.ld),
                Tile(i0, i1, 0, npn), accumulate, bias)


@kernel(readonly=("A",), internal=True)
def stored_igemm(A, a, W, b, C, c, tile, accumulate, bias_off):
    """stored_gemm for dot "int8" where the CPU has VNNI: many rows by igemm's integer GEMM
    on the stored bytes (no unpacking), one row as stored_gemm's."""
    f = W.f
    NR = panel_lanes(f)
    q0, d_in, k0 = stored_band(W.map, b.off, b.ld, NR)
    i0, i1, p0, p1 = tile
    band = (d_in, k0, b.k, p0 * NR, min(p1 * NR, b.n))
    bias = f[bias_off:] if bias_off >= 0 else f[:0]
    if i1 - i0 == 1:
        row_products(A, a.off + i0 * a.ld, W.q[q0:], W.dot, band, bias, C, c.off + i0 * c.ld, accumulate)
    else:
        igemm(A, a, W.q[q0:], band, (i0, i1), bias, C, c, accumulate, W.dot)


@kernel(internal=True)
def pair_band(W, b):
    """The Panels, in W.q's bf16 pair panels (module docstring), of the band of W's matrix
    that b names in the float layout, from its first pair row (b.off's k0 is even: FFN
    chunks are whole panels wide)."""
    q0, d_in, k0 = stored_band(W.map, b.off, b.ld, BF16_NR)
    return Panels(q0 + k0 // 2 * BF16_NR, (d_in + 1) // 2 * BF16_NR, b.k, b.n)


@kernel(readonly=("A",), internal=True)
def stored_bgemm(A, a, W, b, C, c, tile, accumulate, bias_off):
    """stored_gemm for dot "bf16": the band b names of W's pair panels, A's rows rounded to
    bf16 by bgemm_panels."""
    bgemm_panels(A, a, W.q, pair_band(W, b), C, c, tile, accumulate, W.f, bias_off)


@kernel(internal=True)
def paired_bgemm(A, a, W, b, C, c, tile, accumulate, bias_off):
    """stored_bgemm with A a Pairs: A.p's rows when they are there (a's row i0 + i at pair
    row i0 + i - A.r0, from pair a's column / 2: a band starts at an even input), else
    A.x's rounded here."""
    if A.p.size == 0:
        stored_bgemm(A.x, a, W, b, C, c, tile, accumulate, bias_off)
        return
    row = a.off // a.ld
    ap = Rows((row - A.r0) * A.ld + (a.off - row * a.ld) // 2, A.ld)
    bgemm_packed(A.p, ap, W.q, pair_band(W, b), C, c, tile, accumulate, W.f, bias_off)


def pair_rows(W, rows, k, none):
    """(p, ld): room for ``rows`` rows of k inputs as bf16 pairs (bgemm.pack_pairs, ld
    apart) where W's products take them (dot "bf16") and rows > 0, else (none, 0): none an
    empty uint32 array, a view (a decode step allocates nothing)."""


@overload(pair_rows)
def _pair_rows(W, rows, k, none):
    if _is_bf16_dot(W):
        def room(W, rows, k, none):
            if rows == 0:
                return none, 0
            ld = pair_stride(k)
            return np.empty(rows * ld, dtype=np.uint32), ld
        return room
    return lambda W, rows, k, none: (none, 0)


def round_pairs(W, A, a, rows, k, P, p):
    """Rows p.off + r * p.ld of P = row r of A (a: its Rows), r < rows, k inputs, rounded
    to bf16 pairs (bgemm.pack_pairs), where W's products take them and P is not empty;
    else nothing."""


@overload(round_pairs)
def _round_pairs(W, A, a, rows, k, P, p):
    if _is_bf16_dot(W):
        def rounded(W, A, a, rows, k, P, p):
            if P.size > 0:
                pack_pairs(A, a, rows, k, P, p)
        return rounded
    return lambda W, A, a, rows, k, P, p: None


overload(wgemm_block)(_weights_gemm(gemm_block, wgemm_block))
overload(wgemm_panels)(_weights_gemm(gemm_panels, wgemm_panels))


def stored_map(d: int, dkv: int, n1: int, dff: int, NR: int, fmt: str, layout, dot: str = "fp32") -> np.ndarray:
    """Stored's map for a block of d_model d, K/V columns dkv, d_ff dff and an FFN first
    matrix of n1 columns (layout.ffn_cols) stored as ``fmt``: the float offsets of W_q,
    W_k, W_v, W_o, W_1, W_2 (layout: weight_layout's offsets), then each one's first
    element in the stored array (in the order the backend concatenates them: stored rows,
    or with dot "bf16" bgemm's pair panels)."""
    from .layout import qkv_parts
    o_qkv, o_o, o_1, o_2 = layout[:4]
    moff = list(qkv_parts(d, dkv, NR, o_qkv, layout[10])[0]) + [o_o, o_1, o_2]
    shapes = [(d, d), (d, dkv), (d, dkv), (d, d), (d, n1), (dff, d)]
    qoff, pos = [], 0
    for d_in, d_out in shapes:
        qoff.append(pos)
        if dot == "bf16":
            pos += bf16_packed_size(d_in, d_out)
        else:
            pos += grouped_size(fmt, d_in, d_out) if grouped(dot) else d_out * stored_row(fmt, d_in)
    return np.array(moff + qoff, dtype=np.intp)


def stored_row(fmt: str, d_in: int) -> int:
    """Elements of one stored row of d_in inputs in the stored array of ``fmt``."""
    if fmt == "bf16":
        return d_in
    return d_in // 32 * (34 if fmt == "int8" else 18)
