"""kernels.igemm, the integer GEMM of dot "int8" for many rows, against float64.

Every path compiles it (vpdpbusd where the CPU has VNNI, the products widened in LLVM IR
elsewhere), so these run on each (marked isa).  The expected value is written here from
tblock.formats' own pieces, independent of the kernels: each row of A rounded by
formats.round_inputs (numpy), times the stored bytes dequantized by formats.dequantize,
in float64.  The bound is test_int8_dot's for a row of nb blocks:

    |C - want| <= (2 nb + 16) 2^-24 (sum_i |a_r[i] w[i]| + |bias| + |C_0|)

(each block's integer sum is exact; its scale one rounding, the accumulation nb more).
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numba import njit

from tblock.formats import quantize_matrix, round_inputs
from tblock.kernels.igemm import JB, NC, RW, igemm
from tblock.kernels.qgemv import DOTS, stored_view
from tblock.kernels.qgroups import GROUPED_DOT, group_rows
from tblock.kernels.records import Rows

pytestmark = pytest.mark.isa

U = 2.0 ** -24


@njit
def _igemm(A, lda, q, band, rows, bias, C, ldc, accumulate, dot):
    igemm(A, Rows(0, lda), q, band, rows, bias, C, Rows(1, ldc), accumulate, dot)


def weights(data, fmt, d_out, grouped):
    """What igemm takes for a matrix's stored rows (stored_view's flat data): the rows and
    DOTS["int8"], or the rows in groups of 16 (kernels.qgroups) and GROUPED_DOT."""
    if grouped:
        return group_rows(data.view(np.uint8).reshape(d_out, -1), fmt), GROUPED_DOT
    return data, DOTS["int8"]


def run(A, m, fmt, d_out, first, seed, accumulate, biased, pad=0, with_min=False, grouped=False):
    """C[i0:i1] of an (i1 + 1, d_out + pad) C (offset 1, so C[0] is a guard) from rows
    i0:i1 of A against the float64 value, the matrix's rows as they are stored or in
    groups; returns the largest error over the bound."""
    rng = np.random.default_rng(seed)
    rows_all, k = A.shape
    d_in = k + 32 * first + 32
    W = rng.standard_normal((d_in, d_out)).astype(np.float32)
    qm = quantize_matrix(W, fmt, dot="int8")
    data = stored_view(qm)[0]
    if with_min and fmt == "int8":              # -128: no quantizer writes it, a file can
        data = data.copy()
        data.reshape(d_out, -1)[:, 2 + 5] = -128
    Wd = _dequantized(data, fmt, d_in, d_out)[32 * first:32 * first + k]
    i0, i1 = rows_all - m, rows_all
    ldc = d_out + pad
    C0 = rng.standard_normal(1 + rows_all * ldc).astype(np.float32)
    C = C0.copy()
    bias = rng.standard_normal(d_out).astype(np.float32) if biased else np.zeros(0, np.float32)
    lda = k + pad
    Af = np.zeros((rows_all, lda), np.float32)
    Af[:, :k] = A
    q, dot = weights(data, fmt, d_out, grouped)
    _igemm(Af.reshape(-1), lda, q, (d_in, 32 * first, k, 0, d_out), (i0, i1), bias, C, ldc, accumulate, dot)
    Ar = round_inputs(A[i0:i1], "int8").astype(np.float64)
    want = Ar @ Wd + (bias if biased else 0)
    got = C[1:].reshape(rows_all, ldc)
    before = C0[1:].reshape(rows_all, ldc)
    if accumulate:
        want = want + before[i0:i1, :d_out]
    extra = (np.abs(bias) if biased else 0) + (np.abs(before[i0:i1, :d_out]) if accumulate else 0)
    bound = (2 * (k // 32) + 16) * U * (np.abs(Ar) @ np.abs(Wd) + extra)
    assert C[0] == C0[0]                                            # nothing before C's rows
    assert np.array_equal(got[:i0], before[:i0])                    # rows outside the tile
    assert np.array_equal(got[i0:i1, d_out:], before[i0:i1, d_out:])   # columns past d_out
    return (np.abs(got[i0:i1, :d_out] - want) / bound).max()


def _dequantized(data, fmt, d_in, d_out):
    from tblock.formats import dequantize
    return dequantize(fmt, np.ascontiguousarray(data).view(np.uint8), (d_in, d_out)).astype(np.float64)


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(["int8", "int4"]),
       m=st.sampled_from([2, 3, RW - 1, RW, RW + 1, 2 * RW, 2 * RW + 1, 3 * RW + 5]),
       d_out=st.sampled_from([1, 2, NC - 1, NC, NC + 1, 2 * NC + 1, 37, JB, JB + 3]),
       blocks=st.integers(1, 5), first=st.integers(0, 2), extra_rows=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1), accumulate=st.booleans(), biased=st.booleans(), pad=st.sampled_from([0, 3]),
       grouped=st.booleans())
@example(fmt="int8", m=2 * RW + 1, d_out=JB + 3, blocks=24, first=0, extra_rows=1, seed=1, accumulate=True,
         biased=True, pad=0, grouped=True)
def test_igemm_equals_the_rounded_product(fmt, m, d_out, blocks, first, extra_rows, seed, accumulate, biased, pad,
                                          grouped):
    rng = np.random.default_rng(seed)
    k = 32 * blocks
    scales = rng.choice([1e-3, 1.0, 1e3], (m + extra_rows, blocks)).repeat(32, axis=1)
    A = (rng.standard_normal((m + extra_rows, k)) * scales).astype(np.float32)
    assert run(A, m, fmt, d_out, first, seed, accumulate, biased, pad, grouped=grouped) <= 1


@pytest.mark.parametrize("grouped", [False, True])
def test_a_weight_of_minus_128_and_zero_blocks(grouped):
    """The byte -128 (outside ggml's quantizer, inside the format) and rows whose blocks are
    all zero (d_a = 0) or tiny, at a row group's edge."""
    rng = np.random.default_rng(5)
    A = rng.standard_normal((RW + 2, 96)).astype(np.float32)
    A[1, :32] = 0
    A[RW, 32:64] = 1e-30
    assert run(A, RW + 2, "int8", 9, 1, 6, True, True, with_min=True, grouped=grouped) <= 1


@pytest.mark.parametrize("grouped", [False, True])
def test_the_sums_are_exact_integers(grouped):
    """Integer rows and weights whose products are exact in float32: C equals the integer
    product exactly (a lane that lost a product, or a wrong offset, would not)."""
    rng = np.random.default_rng(7)
    m, k, n = 2 * RW + 3, 128, 11
    A = rng.integers(-127, 128, (m, k)).astype(np.float32)
    A[:, ::32] = 127                                 # amax 127: q = A, d = 1
    W = rng.integers(-127, 128, (k, n)).astype(np.float32)
    W[::32] = 127                                    # d_w = 1 for every block (Q8_0)
    q, dot = weights(stored_view(quantize_matrix(W, "int8", dot="int8"))[0], "int8", n, grouped)
    C = np.zeros(1 + m * n, np.float32)
    _igemm(A.reshape(-1), k, q, (k, 0, k, 0, n), (0, m), np.zeros(0, np.float32), C, n, False, dot)
    assert np.array_equal(C[1:].reshape(m, n), (A.astype(np.int64) @ W.astype(np.int64)).astype(np.float32))
