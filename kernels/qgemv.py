"""One row times a stored matrix: x @ W for W in a stored format (tblock.formats).

A decode step multiplies one row by each weight once, so it is bound by the bytes it
reads.  These kernels read the stored rows as they are (one per output feature, GGUF's
blocks for int8 and int4: no repacking), widen them in registers (widen.py) and keep
every sum in float32:

    row j:  sum_b d_b * sum_{i < 32} x[32 b + i] * q_b[i]      (int8, int4)
            sum_i x[i] * W[i, j]                                (bf16, and float32 rows)

A block's 32 products are summed into one vector first and then scaled once by the
block's d (one FMA a block instead of a multiply per weight).  ``row_dot`` takes a band
of inputs k0 : k0 + k of a row (a multiple of 32 for the blocked formats), as the FFN's
chunks need; ``unpack_row`` writes the same band of a row as float32s (the many-row path
of kernels.wgemm, which hands them to the GEMM).  The format is the stored array's type:
uint16 bf16, int8 Q8_0, uint8 Q4_0, float32 rows (the baseline the others are measured
against; bench/bench_qgemv.py), so a caller compiles only the format it is given.

``gemv_rows_serial`` / ``gemv_rows_parallel``: a whole matrix, output rows split into
near-equal ranges, one per task (the check and the rate: bench/bench_qgemv.py).

A matrix whose dot is "int8" (tblock.formats) is multiplied by kernels.qdot instead: its
kernels take ``stored_view``'s pair (the rows, DOTS["int8"]), so that the dot, like the
format, is a type, and a caller compiles only the products it makes.  With dot "bf16"
(DOTS["bf16"]) x is rounded to bf16 first (bgemm.bf16_rows) and the rows read as above.
"""

from __future__ import annotations

import numpy as np
from numba import prange
from numba.core import types
from numba.extending import overload

from .bgemm import bf16_rows
from .layout import row_piece
from .options import build, kernel
from .qdot import gemv_int8
from .simd import lanes, vfma, vhsum, vload, vsplat
from .widen import bf16_load, bf16_scalar, half_load, i8_load, nibble_load

QBLOCK = 32
Q8_BYTES = 34                   # a Q8_0 block: float16 d, 32 int8
Q4_BYTES = 18                   # a Q4_0 block: float16 d, 16 bytes of two nibbles


@kernel(internal=True)
def dot_rows(x, x_off, W, off, n):
    """sum_i x[x_off + i] * W[off + i] for i < n, W float32 or bf16 (row_load, row_value),
    in two chains (an FMA's latency is several loads')."""
    L = lanes(x)
    acc0 = vsplat(x, 0.0)
    acc1 = vsplat(x, 0.0)
    i = 0
    while i + 2 * L <= n:
        acc0 = vfma(vload(x, x_off + i), row_load(W, off + i), acc0)
        acc1 = vfma(vload(x, x_off + i + L), row_load(W, off + i + L), acc1)
        i += 2 * L
    s = vhsum(acc0) + vhsum(acc1)
    for k in range(i, n):
        s += x[x_off + k] * row_value(W, off + k)
    return s


def row_load(W, i):
    """The float32 vector W[i : i + L] of float32 or bf16 (uint16) rows."""


@overload(row_load, inline="always")
def _row_load(W, i):
    if W.dtype == types.float32:
        return lambda W, i: vload(W, i)
    if W.dtype == types.uint16:
        return lambda W, i: bf16_load(W, i)
    return None


def row_value(W, i):
    """The float32 W[i] of float32 or bf16 (uint16) rows."""


@overload(row_value, inline="always")
def _row_value(W, i):
    if W.dtype == types.float32:
        return lambda W, i: W[i]
    if W.dtype == types.uint16:
        return lambda W, i: bf16_scalar(W[i])
    return None


@kernel(internal=True)
def dot_q8(x, x_off, Wq, off, nblocks):
    """The Q8_0 blocks at Wq[off:] (an int8 array) times x[x_off:]."""
    L = lanes(x)
    acc = vsplat(x, 0.0)
    for b in range(nblocks):
        o = off + b * Q8_BYTES
        xb = x_off + b * QBLOCK
        inner = vsplat(x, 0.0)
        for v in range(0, QBLOCK, L):
            inner = vfma(vload(x, xb + v), i8_load(Wq, o + 2 + v), inner)
        acc = vfma(vsplat(x, half_load(Wq, o)), inner, acc)
    return vhsum(acc)


@kernel(internal=True)
def dot_q4(x, x_off, W8, off, nblocks):
    """The Q4_0 blocks at W8[off:] times x[x_off:]."""
    L = lanes(x)
    acc = vsplat(x, 0.0)
    for b in range(nblocks):
        o = off + b * Q4_BYTES
        xb = x_off + b * QBLOCK
        inner = vsplat(x, 0.0)
        for v in range(0, QBLOCK // 2, L):
            inner = vfma(vload(x, xb + v), nibble_load(W8, o + 2 + v, False), inner)
            inner = vfma(vload(x, xb + QBLOCK // 2 + v), nibble_load(W8, o + 2 + v, True), inner)
        acc = vfma(vsplat(x, half_load(W8, o)), inner, acc)
    return vhsum(acc)


def row_dot(x, x_off, W, j, d_in, k0, k):
    """x[x_off : x_off + k] times inputs k0 : k0 + k of stored row j of W (rows of d_in
    inputs), by W's type."""


@overload(row_dot)
def _row_dot(x, x_off, W, j, d_in, k0, k):
    if W.dtype in (types.float32, types.uint16):
        return lambda x, x_off, W, j, d_in, k0, k: dot_rows(x, x_off, W, j * d_in + k0, k)
    if W.dtype == types.int8:
        return lambda x, x_off, W, j, d_in, k0, k: dot_q8(
            x, x_off, W, (j * (d_in // QBLOCK) + k0 // QBLOCK) * Q8_BYTES, k // QBLOCK)
    if W.dtype == types.uint8:
        return lambda x, x_off, W, j, d_in, k0, k: dot_q4(
            x, x_off, W, (j * (d_in // QBLOCK) + k0 // QBLOCK) * Q4_BYTES, k // QBLOCK)
    return None


def unpack_row(W, j, d_in, k0, k, out, o, stride):
    """out[o + i * stride] = the float32 value of input k0 + i of stored row j, i < k."""


@overload(unpack_row)
def _unpack_row(W, j, d_in, k0, k, out, o, stride):
    if W.dtype in (types.float32, types.uint16):
        def rows(W, j, d_in, k0, k, out, o, stride):
            for i in range(k):
                out[o + i * stride] = row_value(W, j * d_in + k0 + i)
        return rows
    if W.dtype in (types.int8, types.uint8):
        q8 = W.dtype == types.int8
        size = Q8_BYTES if q8 else Q4_BYTES

        def blocks(W, j, d_in, k0, k, out, o, stride):
            for b in range(k // QBLOCK):
                blk = (j * (d_in // QBLOCK) + k0 // QBLOCK + b) * size
                d = half_load(W, blk)
                for i in range(QBLOCK):
                    if q8:
                        q = np.float32(W[blk + 2 + i])
                    else:
                        byte = np.int32(W[blk + 2 + i % 16])
                        q = np.float32(((byte >> 4) if i >= 16 else (byte & 15)) - 8)
                    out[o + (b * QBLOCK + i) * stride] = d * q
        return blocks
    return None


def rows_product(x, W, j0, j1, bias, y, accumulate):
    """y[j] (+)= x @ column j of W (+ bias[j]) for j0 <= j < j1: W a stored_view."""


@overload(rows_product)
def _rows_product(x, W, j0, j1, bias, y, accumulate):
    if isinstance(W, types.Array):
        def rows(x, W, j0, j1, bias, y, accumulate):
            for j in range(j0, j1):
                s = row_dot(x, 0, W, j, x.size, 0, x.size)
                if bias.size:
                    s += bias[j]
                y[j] = y[j] + s if accumulate else s
        return rows
    if isinstance(W, types.BaseTuple) and len(W) == 2 and W[1].dtype == types.int8:
        return lambda x, W, j0, j1, bias, y, accumulate: gemv_int8(
            x, 0, W[0], (x.size, 0, x.size, j0, j1), bias, y, 0, accumulate)
    if isinstance(W, types.BaseTuple) and len(W) == 2 and W[1].dtype == types.uint16:
        def rounded(x, W, j0, j1, bias, y, accumulate):     # dot "bf16": x rounded, then W's rows
            xr = np.empty(x.size, dtype=np.float32)
            bf16_rows(x, 0, x.size, 1, x.size, xr)
            rows_product(xr, W[0], j0, j1, bias, y, accumulate)
        return rounded
    return None


def _gemv_rows(x, W, bias, y, accumulate, ntasks):
    """y[0:d_out] (+)= x @ W (+ bias): x (d_in,) float32, W a stored_view, bias (d_out,)
    or empty, y (d_out,) float32; ntasks ranges of output rows."""
    for t in prange(ntasks):
        j0, j1 = row_piece(t, ntasks, y.size)
        rows_product(x, W, j0, j1, bias, y, accumulate)


gemv_rows_serial = build(_gemv_rows, "gemv_rows_serial", readonly=("x", "W", "bias"))
gemv_rows_parallel = build(_gemv_rows, "gemv_rows_parallel", parallel=True, readonly=("x", "W", "bias"))


# an empty array whose dtype says how products are computed (records.Stored's dot)
DOTS = {"fp32": np.empty(0, np.float32), "int8": np.empty(0, np.int8), "bf16": np.empty(0, np.uint16)}


def stored_data(m) -> np.ndarray:
    """A QuantizedMatrix's data as the flat array these kernels take for its format."""
    flat = m.data.reshape(-1)
    return flat.view(np.int8) if m.format == "int8" else flat


def stored_view(m):
    """What the kernels take for a QuantizedMatrix: stored_data, or with dot "int8" or
    "bf16" the pair (stored_data, DOTS[dot])."""
    dot = getattr(m, "dot", "fp32")
    return stored_data(m) if dot == "fp32" else (stored_data(m), DOTS[dot])
