"""kernels.qgroups: stored rows regrouped 16 to a group, and one row times them (dot "int8").

The layout is checked byte by byte against its description, written here as loops over
rows, blocks and bytes (not the packing's reshapes).  The product is checked as
test_int8_dot checks the row kernels: x rounded by the rule in numpy (test_int8_dot.rounded)
times the matrix dequantized by tblock.formats from its stored rows, in float64, within

    |y - want| <= (2 nb + 16) 2^-24 (sum_i |d_x q_x[i] w[i]| + |bias| + |y_0|)

(each block's sum is an exact integer, its scale one rounding, the two accumulators about
nb / 2 more).  Every path compiles the kernel (marked isa).
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numba import njit
from test_int8_dot import product_bound, rounded

from tblock.formats import quantize_matrix
from tblock.kernels.qdot import QCH
from tblock.kernels.qgroups import (GROUP, PAYLOAD, gemv_groups, gemv_groups_parallel, group_row, group_rows,
                                    grouped_size)

pytestmark = pytest.mark.isa


def matrix(rng, fmt, d_in, d_out):
    return quantize_matrix(rng.standard_normal((d_in, d_out)).astype(np.float32), fmt, dot="int8")


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("d_out", [1, 15, 16, 17, 40])
def test_every_byte_is_where_the_layout_says(rng, fmt, d_out):
    nb = 3
    S = 2 + PAYLOAD[fmt]
    rows = rng.integers(0, 256, (d_out, nb * S), dtype=np.uint8)
    got = group_rows(rows, fmt).view(np.uint8)
    ng = -(-d_out // GROUP)
    assert got.size == grouped_size(fmt, 32 * nb, d_out) == ng * GROUP * nb * S
    want = np.full(got.size, 0x80 if fmt == "int8" else 0, np.uint8)    # padding rows: q = 0
    for j in range(ng * GROUP):
        g, r = divmod(j, GROUP)
        for b in range(nb):
            chunk = (g * nb + b) * GROUP * S
            block = rows[j, b * S:(b + 1) * S] if j < d_out else np.zeros(S, np.uint8)
            want[chunk + 2 * r:chunk + 2 * r + 2] = block[:2]
            for p in range(S - 2):
                byte = block[2 + p] ^ 0x80 if fmt == "int8" else block[2 + p]
                want[chunk + 2 * GROUP + 4 * (GROUP * (p // 4) + r) + p % 4] = byte
    assert np.array_equal(got, want)



@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_grouped_into_a_slice_writes_only_the_slice(rng, fmt):
    S = 2 + PAYLOAD[fmt]
    rows = rng.integers(0, 256, (20, 2 * S), dtype=np.uint8)
    n = grouped_size(fmt, 64, 20)
    buf = np.full(n + 64, 7, np.int8 if fmt == "int8" else np.uint8)
    group_rows(rows, fmt, buf[32:32 + n])
    assert np.array_equal(buf[32:32 + n], group_rows(rows, fmt))
    assert (buf[:32] == 7).all() and (buf[32 + n:] == 7).all()
    for bad in (buf[32:31 + n], np.zeros(2 * n, buf.dtype)[::2], np.zeros(n, np.int16)):      # short, strided, wide
        with pytest.raises(ValueError, match="out must be"):
            group_rows(rows, fmt, bad)

@njit
def _band(x, x_off, Wg, band, bias, y, accumulate):
    gemv_groups(x, x_off, Wg, band, bias, y, 1, accumulate)


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(["int8", "int4"]), d_out=st.sampled_from([1, 5, 15, 16, 17, 33, 48, 70]),
       blocks=st.integers(1, 6), first=st.integers(0, 2), rows=st.tuples(st.integers(0, 70), st.integers(0, 70)),
       seed=st.integers(0, 2**32 - 1), accumulate=st.booleans(), biased=st.booleans())
@example(fmt="int8", d_out=17, blocks=QCH // 32 + 1, first=1, rows=(3, 17), seed=1, accumulate=True, biased=True)
@example(fmt="int4", d_out=33, blocks=QCH // 32, first=0, rows=(16, 33), seed=2, accumulate=False, biased=False)
def test_a_band_of_rows_and_inputs_equals_the_rounded_product(fmt, d_out, blocks, first, rows, seed, accumulate,
                                                               biased):
    """Inputs k0 : k0 + k of rows j0 : j1 (any, not only whole groups), into y at an offset;
    every other entry of y stays as it was."""
    rng = np.random.default_rng(seed)
    j0, j1 = sorted(min(r, d_out) for r in rows)
    k0, k = 32 * first, 32 * blocks
    d_in = k0 + k + 32
    m = matrix(rng, fmt, d_in, d_out)
    x = (rng.standard_normal(k + 5) * rng.choice([1e-3, 1.0, 1e3], k + 5)).astype(np.float32)
    bias = rng.standard_normal(d_out).astype(np.float32) if biased else np.zeros(0, np.float32)
    y0 = rng.standard_normal(d_out + 2).astype(np.float32)
    y = y0.copy()
    _band(x, 5, group_rows(m.data, fmt), (d_in, k0, k, j0, j1), bias, y, accumulate)
    q, d = rounded(x[5:])
    xr = q.astype(np.float64) * np.repeat(d.astype(np.float64), 32)
    Wd = m.dequantize(np.float64)[k0:k0 + k, j0:j1]
    before = y0[1 + j0:1 + j1].astype(np.float64)
    want = xr @ Wd + (bias[j0:j1] if biased else 0) + (before if accumulate else 0)
    extra = (np.abs(bias[j0:j1]) if biased else 0) + (np.abs(before) if accumulate else 0)
    assert (np.abs(y[1 + j0:1 + j1] - want) <= product_bound(xr, Wd, extra, blocks)).all()
    outside = np.r_[0:1 + j0, 1 + j1:d_out + 2]
    assert np.array_equal(y[outside], y0[outside])


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("nthr", [1, 3])
def test_integer_inputs_give_the_integer_product(rng, fmt, nthr):
    """Weights and inputs whose products are exact in float32: y equals the integer product
    exactly (a lost product, a wrong offset or start, or a row in the wrong lane would not)."""
    d_in, d_out = 128, 37
    top = 127 if fmt == "int8" else 7
    W = rng.integers(-top, top + 1, (d_in, d_out)).astype(np.float32)
    W[::32] = top                                   # d_w = 1 for every block
    if fmt == "int4":
        W[::32] = -8                                # Q4_0: amax at -8 gives d = 1
    x = rng.integers(-127, 128, d_in).astype(np.float32)
    x[::32] = 127                                   # d_x = 1
    m = quantize_matrix(W, fmt, dot="int8")
    assert np.array_equal(m.dequantize(np.float64), W)
    y = np.zeros(d_out, np.float32)
    gemv_groups_parallel(x, group_rows(m.data, fmt), d_out, np.zeros(0, np.float32), y, False, nthr)
    assert np.array_equal(y, (x.astype(np.int64) @ W.astype(np.int64)).astype(np.float32))


@njit
def _rows_of(Wg, d, vocab):
    out = np.empty(vocab * d, np.float32)
    for v in range(vocab):
        group_row(Wg, v, d, out, v * d)
    return out


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_row_read_back_is_the_stored_value(rng, fmt):
    """A stored embedding's rows (a token's row) read back from the groups equal the
    matrix dequantized from its stored rows, exactly."""
    d, vocab = 96, 37
    m = matrix(rng, fmt, d, vocab)
    got = _rows_of(group_rows(m.data, fmt), d, vocab).reshape(vocab, d)
    assert np.array_equal(got, m.dequantize(np.float32).T)
