"""kernels.qdot, the products of dot "int8" (tblock.formats): inputs rounded to int8 blocks.

The rounding is written again here in numpy (float32 divisions and multiply, np.rint: half
to even) and the kernels' q and d must equal it bit for bit on the same float32 inputs.
The products are then checked against float64 sums of the rounded inputs times the
dequantized weights, to float32's accuracy:

    |y - want| <= (2 nb + 16) 2^-24 (sum_i |d_x q_x[i] w[i]| + |bias| + |y_0|)

for a row of nb blocks (each block's lanes are exact; a block's scale d_w d_x is one
rounding, each of the two accumulators about nb / 2 more, the lanes' tree 4 (Q4_0's
four lanes a row: 3), the bias and y_0 two; doubled for the generic path's unfused
multiply-add).  Every vector path runs these (marked isa): the lanes are the same
integers on each.
"""

import numpy as np
import pytest
from conftest import near_an_int8_tie, near_the_rounded_oracle, rows_near_an_int8_tie
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numba import njit

import tblock
from tblock.formats import QuantizedMatrix, quantize_matrix
from tblock.kernels.qdot import QCH, round_blocks, start_offset
from tblock.kernels.qgemv import DOTS, gemv_rows_parallel, gemv_rows_serial, stored_view
from tblock.kernels.records import Panels, Rows, Stored, Tile
from tblock.kernels.simd import panel_lanes
from tblock.kernels.wgemm import stored_gemm

pytestmark = pytest.mark.isa

U = 2.0 ** -24


def rounded(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8, d float32 per block) of x's blocks of 32, by the rule, in float32."""
    x = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = np.zeros_like(amax)
    inv = np.zeros_like(amax)
    nz = amax > 0
    d[nz] = amax[nz] / np.float32(127)
    inv[nz] = np.float32(127) / amax[nz]
    q = np.rint(x * inv[:, None])                   # float32 products, ties to even
    assert q.dtype == np.float32 and np.abs(q).max(initial=0) <= 127
    return q.astype(np.int8).reshape(-1), d


@njit
def _round(x, qs, ps, ds, offset):
    round_blocks(x, 0, x.size // 32, qs, ps, ds, offset)


def kernel_rounding(x: np.ndarray, offset: int = 1):
    nb = x.size // 32
    qs, ps, ds = np.empty(x.size, np.int8), np.empty(8 * nb, np.int32), np.empty(nb, np.float32)
    _round(np.ascontiguousarray(x, np.float32), qs, ps, ds, offset)
    return qs, ps, ds


def check_rounding(x):
    q, d = rounded(x)
    qs, ps, ds = kernel_rounding(x, 3)
    assert np.array_equal(qs, q)
    assert np.array_equal(ds.view(np.uint32), d.view(np.uint32))     # bit for bit, signed zeros too
    assert np.array_equal(ps, -3 * q.astype(np.int32).reshape(-1, 4).sum(axis=1))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), blocks=st.integers(1, 8),
       scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]))
def test_rounding_is_the_rule_bit_for_bit(seed, blocks, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(32 * blocks) * scale).astype(np.float32)
    x[:32] *= rng.integers(0, 2, 32)                    # zeros inside a block
    check_rounding(x)


def test_rounding_edges():
    x = np.zeros(6 * 32, np.float32)                      # block 0: all zeros -> d = 0, q = 0
    x[32:40] = [127, 63.5, 62.5, -0.5, 0.5, 1.5, -2.5, 3.49]    # block 1: amax 127, ties to even
    x[64] = 3e38                                          # block 2: one huge value, the rest rounds to 0
    x[65:96] = 1.0
    x[96:128] = -7.25                                     # block 3: all equal: q = -127
    x[128:160] = np.float32(2.0) ** np.arange(-16, 16)    # block 4: powers of two
    x[160] = -np.float32(1e-20)                           # block 5: one tiny negative input
    check_rounding(x)
    qs, _, ds = kernel_rounding(x)
    assert ds[0] == 0 and not qs[:32].any()
    assert list(qs[32:40]) == [127, 64, 62, 0, 0, 2, -2, 3]
    assert list(qs[96:100]) == [-127] * 4 and qs[160] == -127


def test_a_nan_input_makes_its_block_nan():
    x = np.ones(64, np.float32)
    x[40] = np.nan
    _, _, ds = kernel_rounding(x)
    assert ds[0] == np.float32(1) / np.float32(127) and np.isnan(ds[1])


def product_bound(xr, Wd, extra, nb):
    return (2 * nb + 16) * U * (np.abs(xr) @ np.abs(Wd) + extra)


def matrix(rng, fmt, d_in, d_out):
    W = rng.standard_normal((d_in, d_out)).astype(np.float32)
    return quantize_matrix(W, fmt, dot="int8")


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(["int8", "int4"]), d_in=st.sampled_from([32, 64, 96, 160, 768]),
       d_out=st.sampled_from([1, 2, 3, 4, 5, 7, 8, 9, 33, 70]), seed=st.integers(0, 2**32 - 1),
       serial=st.booleans(), accumulate=st.booleans(), biased=st.booleans())
@example(fmt="int8", d_in=QCH, d_out=5, seed=1, serial=True, accumulate=False, biased=False)
@example(fmt="int4", d_in=QCH + 32, d_out=9, seed=2, serial=False, accumulate=True, biased=True)
def test_gemv_equals_the_rounded_product(fmt, d_in, d_out, seed, serial, accumulate, biased):
    rng = np.random.default_rng(seed)
    m = matrix(rng, fmt, d_in, d_out)
    x = (rng.standard_normal(d_in) * rng.choice([1e-3, 1.0, 1e3], d_in // 32).repeat(32)).astype(np.float32)
    bias = rng.standard_normal(d_out).astype(np.float32) if biased else np.zeros(0, np.float32)
    y0 = rng.standard_normal(d_out).astype(np.float32)
    q, d = rounded(x)
    xr = q.astype(np.float64) * np.repeat(d.astype(np.float64), 32)
    Wd = m.dequantize(np.float64)
    want = xr @ Wd + (bias if biased else 0) + (y0 if accumulate else 0)
    y = y0.copy()
    (gemv_rows_serial if serial else gemv_rows_parallel)(x, stored_view(m), bias, y, accumulate, 3)
    extra = (np.abs(bias) if biased else 0) + (np.abs(y0) if accumulate else 0)
    assert (np.abs(y - want) <= product_bound(xr, Wd, extra, d_in // 32)).all()


@settings(max_examples=20, deadline=None)
@given(fmt=st.sampled_from(["int8", "int4"]), d_in=st.sampled_from([32, 64, 96, 768]), d_out=st.integers(1, 13),
       seed=st.integers(0, 2**32 - 1))
def test_a_rows_sum_does_not_depend_on_its_neighbours(fmt, d_in, d_out, seed):
    """Rows go four at a time (Q4_0: two a vector) and the rest one by one; a row's float
    sums are the same either way, bit for bit, so no split of rows into tasks moves them."""
    rng = np.random.default_rng(seed)
    m = matrix(rng, fmt, d_in, d_out)
    x = rng.standard_normal(d_in).astype(np.float32)
    none = np.zeros(0, np.float32)
    together = np.empty(d_out, np.float32)
    gemv_rows_serial(x, stored_view(m), none, together, False, 1)
    alone = np.empty(d_out, np.float32)
    for j in range(d_out):                  # row j alone: the one-row kernel
        one = QuantizedMatrix(fmt, (d_in, 1), m.data[j:j + 1], dot="int8")
        gemv_rows_serial(x, stored_view(one), none, alone[j:j + 1], False, 1)
    assert np.array_equal(together.view(np.uint32), alone.view(np.uint32))


@njit
def _stored_gemm(A, m, d_in, k0, k, q, dot, C, d_out):
    """C (m, d_out) = rows of A (m, k, row stride k) times inputs k0 : k0 + k of stored
    rows q (d_in inputs each) through wgemm.stored_gemm, one tile of every panel."""
    f = np.zeros(16, np.float32)
    NR = panel_lanes(f)
    W = Stored(f, q, np.empty(0, np.intp), dot)
    npn = (d_out + NR - 1) // NR
    stored_gemm(A, Rows(0, k), W, Panels(k0 * NR, d_in * NR, k, d_out), C, Rows(0, d_out), Tile(0, m, 0, npn),
                False, -1)


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(["int8", "int4"]), rows=st.sampled_from([1, 2, 7]), d_out=st.integers(1, 70),
       blocks=st.integers(1, 6), first=st.integers(0, 3), seed=st.integers(0, 2**32 - 1))
@example(fmt="int8", rows=2, d_out=3, blocks=QCH // 32 + 2, first=1, seed=3)     # rows past the stack scratch
@example(fmt="int4", rows=1, d_out=5, blocks=QCH // 32 + 1, first=0, seed=4)
def test_stored_gemm_bands_one_row_and_many(fmt, rows, d_out, blocks, first, seed):
    """A band of inputs (the FFN's chunks) of one row (the integer kernel) or many (rounded
    rows, then the float GEMM), against the rounded product in float64."""
    rng = np.random.default_rng(seed)
    d_in = 32 * (blocks + first + 1)
    k0, k = 32 * first, 32 * blocks
    m = matrix(rng, fmt, d_in, d_out)
    A = rng.standard_normal((rows, k)).astype(np.float32)
    C = np.full((rows, d_out), np.nan, np.float32)
    data, dot = stored_view(m)
    _stored_gemm(A.reshape(-1), rows, d_in, k0, k, data, dot, C.reshape(-1), d_out)
    q, d = rounded(A.reshape(-1))
    Ar = (q.astype(np.float64) * np.repeat(d.astype(np.float64), 32)).reshape(rows, k)
    Wd = m.dequantize(np.float64)[k0:k0 + k]
    assert (np.abs(C - Ar @ Wd) <= product_bound(Ar, Wd, 0, blocks)).all()


def test_fp32_dot_stays_the_float_product(rng):
    """The same stored bytes with dot "fp32" multiply x as it is (the rounding would move
    the result by far more than the bound)."""
    W = rng.standard_normal((64, 5)).astype(np.float32)
    x = rng.standard_normal(64).astype(np.float32)
    ys = {}
    for dot in ("fp32", "int8"):
        m = quantize_matrix(W, "int8", dot=dot)
        ys[dot] = np.empty(5, np.float32)
        gemv_rows_serial(x, stored_view(m), np.zeros(0, np.float32), ys[dot], False, 1)
    Wd = quantize_matrix(W, "int8").dequantize(np.float64)
    assert np.abs(ys["fp32"] - x.astype(np.float64) @ Wd).max() < 1e-5
    assert np.abs(ys["int8"] - x.astype(np.float64) @ Wd).max() > 1e-4


def test_the_views_say_the_dot():
    m = quantize_matrix(np.ones((32, 2), np.float32), "int4", dot="int8")
    data, dot = stored_view(m)
    assert dot is DOTS["int8"] and data.dtype == np.uint8 and data.size == m.data.size
    assert isinstance(stored_view(quantize_matrix(np.ones((32, 2), np.float32), "int4")), np.ndarray)


def test_start_offsets_are_the_paths():
    from tblock.kernels.qdot import KIND
    i8, u8 = np.zeros(1, np.int8), np.zeros(1, np.uint8)
    got = (njit(lambda w: start_offset(w))(i8), njit(lambda w: start_offset(w))(u8))
    assert got == {"vnni": (128, 8), "avx2": (0, 8), "generic": (0, 0)}[KIND]


# ----------------------------------------------------------------------------- the block


@settings(max_examples=20, deadline=None)
@given(fmt=st.sampled_from(["int8", "int4"]), d=st.sampled_from([32, 64, 96]), heads=st.sampled_from([1, 2]),
       B=st.integers(1, 2), T=st.sampled_from([1, 2, 7, 40]), pre=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(fmt="int4", d=96, heads=1, B=1, T=2, pre=True, seed=910)     # LN2 of row 0 at a tie
def test_block_with_int8_dot_matches_the_oracle(fmt, d, heads, B, T, pre, seed):
    from conftest import random_weights
    rng = np.random.default_rng(seed)
    cfg = tblock.BlockConfig(d_model=d, n_heads=heads, d_ff=2 * d, norm="pre" if pre else "post",
                             ffn_bias=True, attn_bias=True, ln_affine=True)
    w = tblock.quantize(random_weights(cfg, rng), fmt, dot="int8")
    H = rng.standard_normal((B, T, d)).astype(np.float32)
    want, trace = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy", trace=True)
    tie = pre and near_an_int8_tie(trace.H_norm1)       # Post-LN's QKV reads H itself
    rows = rows_near_an_int8_tie(trace, pre)
    assert near_the_rounded_oracle(tblock.forward(H, w, cfg), want, tie, rows)
    assert near_the_rounded_oracle(tblock.forward(np.asfortranarray(H[0]), w, cfg), want[0], tie, rows[:T])


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_cached_decode_and_head_match_the_oracle(fmt, rng):
    from conftest import random_weights

    from tblock.backends import reference_lm_head
    from tblock.backends.numba import lm_head, prepare_head
    cfg = tblock.BlockConfig(d_model=64, n_heads=2, d_ff=128, ffn_bias=True, attn_bias=True, ln_affine=True)
    stack = tblock.Stack(cfg, [tblock.quantize(random_weights(cfg, rng), fmt, dot="int8") for _ in range(3)])
    H = rng.standard_normal((2, 12, 64)).astype(np.float32)
    want = stack(H.astype(np.float64), backend="numpy")
    caches = stack.make_cache(16, batch=2)
    outs = [stack(H[:, :5], cache=caches)] + [stack(H[:, t:t + 1], cache=caches) for t in range(5, 12)]
    assert near_the_rounded_oracle(np.concatenate(outs, axis=1), want)
    E = quantize_matrix(rng.standard_normal((300, 64)).astype(np.float32).T, fmt, dot="int8")
    ln_f = rng.standard_normal(128).astype(np.float32)
    for B, T in ((1, 1), (2, 3), (1, 40)):
        Hh = rng.standard_normal((B, T, 64)).astype(np.float32)
        got = lm_head(Hh, ln_f, 1e-5, prepare_head(E, np.float32), np.empty((B, T, 300), np.float32))
        assert near_the_rounded_oracle(got, reference_lm_head(Hh, ln_f, 1e-5, E, np.empty((B, T, 300))))


def test_a_strided_input_is_refused_not_misread():
    """The kernels address memory by flat index: an input with strides does not type."""
    from numba.core.errors import TypingError
    m = quantize_matrix(np.ones((32, 3), np.float32), "int8", dot="int8")
    x = np.ones(64, np.float32)[::2]
    with pytest.raises(TypingError):
        gemv_rows_serial(x, stored_view(m), np.zeros(0, np.float32), np.empty(3, np.float32), False, 1)
