"""The bf16 GEMM (kernels.bgemm) against numpy in float64, on every vector path.

The reference rounds A itself: each float32 to bf16, to nearest even, a subnormal to +-0,
a NaN to a NaN; W is the stored bf16, a bf16 subnormal taken as 0 (the kernel's inputs:
kernels/bgemm.py's docstring).  The products of those are exact; the kernel sums them in
float32, n = 2 ceil(K/2) + ceil(K/128) + 2 rounded additions at most per output (two per
k pair, one per k block into C (blocks of 64 pairs or more), the bias, the accumulated C),
so

    |C - ref| <= 1.01 n 2^-24 (sum_k |a_ik w_kj| + |bias_j| + |C0_ij|) + n 2^-126

the last term for vdpbf16ps's flushes of subnormal intermediate sums.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tblock.formats import quantize_matrix
from tblock.kernels import isa
from tblock.kernels.bgemm import (BF16_DOT, NR, bf16_packed_size, bgemm, bgemm_panels,
                                  pack_bf16_panels)
from tblock.kernels.records import Panels, Rows, Tile

pytestmark = pytest.mark.isa


def bf16_of_f32(A):
    """A's float32s rounded to bf16 (nearest even; subnormal -> +-0; NaN -> NaN), as float64."""
    A = np.asarray(A, np.float32)
    out = np.empty(A.shape, np.float64)
    for idx, x in np.ndenumerate(A):
        if np.isnan(x):
            out[idx] = np.nan
        elif x == 0 or abs(x) < np.finfo(np.float32).tiny:
            out[idx] = np.copysign(0.0, x)
        elif np.isinf(x):
            out[idx] = x
        else:
            m, e = np.frexp(np.float64(x))             # x = m 2^e, 0.5 <= |m| < 1
            q = np.round(m * 256.0)                     # 8 significant bits; numpy rounds half to even
            v = np.ldexp(q / 256.0, e)
            out[idx] = v if abs(v) < 2.0 ** 128 else np.copysign(np.inf, x)
    return out


def stored_values(data):
    """The bf16 stored rows (uint16, (N, K)) as float64 W (K, N), subnormals as 0."""
    h = data.astype(np.int64)
    sign = np.where(h & 0x8000, -1.0, 1.0)
    exp = (h >> 7) & 0xFF
    frac = h & 0x7F
    vals = sign * np.ldexp(1.0 + frac / 128.0, exp - 127)
    return np.where(exp == 0, 0.0, vals).T


def packed(W):
    q = quantize_matrix(W, "bf16")
    Bp = np.zeros(bf16_packed_size(*W.shape), np.uint32)
    pack_bf16_panels(q.data, Bp)
    return q, Bp


def check(C, C0, Ar, Wd, bias, accumulate):
    """C against Ar @ Wd (+ bias) (+ C0) in float64, to the module's bound."""
    K = Ar.shape[1]
    n = 2 * (-(-K // 2)) + -(-K // 128) + 2
    b = np.zeros(Wd.shape[1]) if bias is None else bias.astype(np.float64)
    ref = Ar @ Wd + b + (C0 if accumulate else 0)
    mag = np.abs(Ar) @ np.abs(Wd) + np.abs(b) + (np.abs(C0) if accumulate else 0)
    bound = 1.01 * n * 2.0 ** -24 * mag + n * 2.0 ** -126
    err = np.abs(C.astype(np.float64) - ref)
    assert (err <= bound).all(), f"max error / bound {(err / bound).max():.3g}"


def test_rounding_of_a_is_nearest_even_with_subnormals_zero():
    """One input times W = 1: C is bf16(a) itself, for ties, carries, subnormals, -0,
    the float32 maximum (to inf) and NaNs (one whose rounding would carry into the sign)."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x477FFFFF, 0x00400000, 0x807FFFFF,
                     0x00800000, 0x80000000, 0x7F7FFFFF, 0xFF7F0000, 0x7FC00001, 0xFFFFFFFF, 0x7F800000],
                    np.uint32)
    A = bits.view(np.float32).reshape(-1, 1)
    _, Bp = packed(np.ones((1, 1), np.float32))
    C = np.full((A.shape[0], 1), 7.0, np.float32)
    bgemm(A, Bp, 1, 1, C)
    want = bf16_of_f32(A)
    np.testing.assert_array_equal(C[:, 0], want[:, 0])          # NaN == NaN here; -0 == 0 (a sum from +0)


def test_rounding_of_whole_rows_is_exact():
    """A (of ties, near ties, subnormals, large and tiny values) times the identity: C is
    bf16(A) exactly, each output one product and zeros, through the full-vector rounding
    of long rows as well as the tail's."""
    rng = np.random.default_rng(2)
    M, K = 5, 77
    hi = rng.integers(0x0001, 0x7F7F, size=(M, K)).astype(np.uint32) << 16
    lo = rng.choice(np.array([0x8000, 0x7FFF, 0x8001, 0x0000, 0xFFFF], np.uint32), size=(M, K))
    bits = (hi | lo) ^ (rng.integers(0, 2, size=(M, K)).astype(np.uint32) << 31)
    bits[0, :10] = [0x00400000, 0x807FFFFF, 0x00800000, 0x007FFFFF, 0x477FFFFF, 0, 0x80000000, 0x3F808000,
                    0x3F818000, 0x7F7F7FFF]
    A = bits.view(np.float32)
    _, Bp = packed(np.eye(K, dtype=np.float32))
    C = np.empty((M, K), np.float32)
    bgemm(A, Bp, K, K, C)
    np.testing.assert_array_equal(C, bf16_of_f32(A))


def test_pack_layout_pairs_k_rows():
    """Panel p, pair row r, column j holds W[2r, j] | W[2r + 1, j] << 16, zero past K and N."""
    rng = np.random.default_rng(1)
    K, N = 5, NR + 3
    q, Bp = packed(rng.standard_normal((K, N)).astype(np.float32) + 4)   # no subnormals
    Wt = q.data.astype(np.uint32)                                         # (N, K)
    Kp = 3
    for p in range(2):
        for r in range(Kp):
            for j in range(NR):
                col = p * NR + j
                lo = Wt[col, 2 * r] if col < N else 0
                hi = Wt[col, 2 * r + 1] if col < N and 2 * r + 1 < K else 0
                assert Bp[(p * Kp + r) * NR + j] == lo | (hi << 16)


@pytest.mark.parametrize("M", [1, 2, 6, 10, 15, 17])
@pytest.mark.parametrize("K", [1, 2, 31, 33, 129])
@pytest.mark.parametrize("N", [1, 17, NR, 2 * NR + 5])
def test_edge_shapes(M, K, N):
    rng = np.random.default_rng(M * 10_000 + K * 100 + N)
    A = rng.standard_normal((M, K)).astype(np.float32)
    q, Bp = packed(rng.standard_normal((K, N)).astype(np.float32))
    C = np.empty((M, N), np.float32)
    bgemm(A, Bp, K, N, C)
    check(C, None, bf16_of_f32(A), stored_values(q.data), None, False)


@settings(max_examples=40, deadline=None)
@given(M=st.integers(1, 40), K=st.integers(1, 300), N=st.integers(1, 3 * NR + 7), pad_a=st.integers(0, 5),
       pad_c=st.integers(0, 5), use_bias=st.booleans(), accumulate=st.booleans(), scale=st.integers(-60, 60),
       seed=st.integers(0, 2 ** 31))
def test_random_shapes_strides_bias(M, K, N, pad_a, pad_c, use_bias, accumulate, scale, seed):
    """Any shape, A and C views with wider rows (the rest untouched), a bias, C accumulated,
    and magnitudes from 2^-60 to 2^60 (A and W scaled apart, products near 1)."""
    rng = np.random.default_rng(seed)
    big_a = rng.standard_normal((M, K + pad_a)).astype(np.float32) * np.float32(2.0 ** scale)
    A = big_a[:, pad_a:]
    W = rng.standard_normal((K, N)).astype(np.float32) * np.float32(2.0 ** -scale)
    q, Bp = packed(W)
    bias = rng.standard_normal(N).astype(np.float32) if use_bias else None
    big_c = rng.standard_normal((M, N + pad_c)).astype(np.float32)
    before = big_c.copy()
    C = big_c[:, :N]
    C0 = C.astype(np.float64)
    bgemm(A, Bp, K, N, C, bias=bias, accumulate=accumulate)
    check(C, C0, bf16_of_f32(A), stored_values(q.data), bias, accumulate)
    np.testing.assert_array_equal(big_c[:, N:], before[:, N:])


def test_zero_and_huge_values():
    """Zero rows and columns give exact zeros; products near 2^120 stay finite; an A that
    rounds to inf gives inf (or NaN against a zero weight) as the reference does."""
    rng = np.random.default_rng(3)
    M, K, N = 9, 40, 70
    A = rng.standard_normal((M, K)).astype(np.float32) * np.float32(2.0 ** 60)
    A[2] = 0
    W = rng.standard_normal((K, N)).astype(np.float32) * np.float32(2.0 ** 60)
    W[:, 5] = 0
    q, Bp = packed(W)
    C = np.empty((M, N), np.float32)
    bgemm(A, Bp, K, N, C)
    Ar, Wd = bf16_of_f32(A), stored_values(q.data)
    check(C, None, Ar, Wd, None, False)
    assert (C[2] == 0).all() and (C[:, 5] == 0).all()
    A[4, 7] = np.finfo(np.float32).max                  # rounds to +inf in bf16
    bgemm(A, Bp, K, N, C)
    with np.errstate(invalid="ignore"):
        ref = bf16_of_f32(A) @ Wd
    np.testing.assert_array_equal(np.isnan(C), np.isnan(ref))
    np.testing.assert_array_equal(C[4][np.isinf(ref[4])], ref[4][np.isinf(ref[4])])


def test_subnormal_weights_count_as_zero():
    """A stored bf16 subnormal is 0 to the kernel on every path (vdpbf16ps reads its
    inputs so): 2^-130 times 2^100 would otherwise be 2^-30."""
    W = np.full((3, 2), 2.0 ** -130, np.float32)
    W[1, 1] = 1.0
    q, Bp = packed(W)
    assert (q.data[:, 0] & 0x7F80 == 0).all()            # stored as subnormals
    A = np.full((1, 3), 2.0 ** 100, np.float32)
    C = np.empty((1, 2), np.float32)
    bgemm(A, Bp, 3, 2, C)
    np.testing.assert_array_equal(C, [[0.0, 2.0 ** 100]])


@pytest.mark.parametrize("k0, kb", [(0, 128), (128, 200), (300, 33), (2, 1)])
def test_panels_band_and_tile(k0, kb):
    """bgemm_panels on a band of k rows (an even k0) of a taller packed W, its panel stride
    the whole matrix's, over a sub-tile of rows and panels, the bias at an offset of a
    float array (as wgemm would pass a block's): nothing outside the tile written."""
    rng = np.random.default_rng(k0 + kb)
    Kfull, N, M = 333, 3 * NR - 9, 20
    q, Bp = packed(rng.standard_normal((Kfull, N)).astype(np.float32))
    A = rng.standard_normal((M, kb + 2)).astype(np.float32)
    f = rng.standard_normal(40 + 3 * NR).astype(np.float32)     # the bias at 40 of a float array, as
    f[40 + N:] = 0                                                # a block's (whole panels, zero-padded)
    bias = f[40:]
    C = rng.standard_normal((M, N)).astype(np.float32)
    want = C.astype(np.float64)
    i0, i1, p0, p1 = 3, 17, 1, 3
    bgemm_panels(A.reshape(-1), Rows(1, kb + 2), Bp, Panels(k0 // 2 * NR, -(-Kfull // 2) * NR, kb, N), C.reshape(-1),
                 Rows(0, N), Tile(i0, i1, p0, p1), False, f, 40)
    c0 = p0 * NR
    Ar = bf16_of_f32(A[i0:i1, 1:1 + kb])
    Wd = stored_values(q.data)[k0:k0 + kb, c0:]
    check(C[i0:i1, c0:], None, Ar, Wd, bias[c0:N], False)
    want[i0:i1, c0:] = C[i0:i1, c0:]
    np.testing.assert_array_equal(C, want.astype(np.float32))


def test_bad_input_names_the_argument():
    A = np.ones((2, 4), np.float32)
    C = np.empty((2, 3), np.float32)
    _, Bp = packed(np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match="A must be a 2-D float32"):
        bgemm(A.astype(np.float64), Bp, 4, 3, C)
    with pytest.raises(TypeError, match="C must be a numpy array"):
        bgemm(A, Bp, 4, 3, [[0.0] * 3] * 2)
    with pytest.raises(ValueError, match="A must be \\(M, 5\\)"):
        bgemm(A, Bp, 5, 3, C)
    with pytest.raises(ValueError, match="Bp must be 1-D uint32"):
        bgemm(A, Bp[:-1], 4, 3, C)
    with pytest.raises(ValueError, match="bias must be \\(3,\\)"):
        bgemm(A, Bp, 4, 3, C, bias=np.ones(4, np.float32))
    frozen = C.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="C must be writeable"):
        bgemm(A, Bp, 4, 3, frozen)
    with pytest.raises(ValueError, match="W16 must be a non-empty 2-D uint16"):
        pack_bf16_panels(np.ones((3, 4), np.float32), Bp)
    with pytest.raises(ValueError, match="out must be 1-D uint32 of at least"):
        pack_bf16_panels(np.ones((3, 4), np.uint16), Bp[:1])
    with pytest.raises(ValueError, match="contiguous rows"):
        bgemm(np.ones((2, 8), np.float32)[:, ::2], Bp, 4, 3, C)


def test_bf16_dot_where_the_target_has_it():
    """vdpbf16ps on the avx512 path of a target with AVX512_BF16 only (isa._make)."""
    def path(name, features):
        return isa._make(name, "x86_64-unknown-linux-gnu", "znver4", features, False, (name,))
    assert path("avx512", "+avx512f,+avx512bf16").bf16_dot
    assert not path("avx512", "+avx512f,-avx512bf16").bf16_dot
    assert not path("avx2", "+avx2,+avx512bf16").bf16_dot
    assert BF16_DOT == isa.PATH.bf16_dot
    if isa.PATH.name != "avx512":
        assert not BF16_DOT


# a child on another path: A @ W of the .npy files argv[1], argv[2] into argv[3]
_CHILD = """
import sys
import numpy as np
from tblock.formats import quantize_matrix
from tblock.kernels.bgemm import bf16_packed_size, bgemm, pack_bf16_panels
A, W = np.load(sys.argv[1]), np.load(sys.argv[2])
q = quantize_matrix(W, "bf16")
Bp = np.zeros(bf16_packed_size(*W.shape), np.uint32)
pack_bf16_panels(q.data, Bp)
C = np.empty((A.shape[0], W.shape[1]), np.float32)
bgemm(A, Bp, W.shape[0], W.shape[1], C)
np.save(sys.argv[3], C)
"""


@pytest.mark.subprocess
def test_every_path_gives_the_same_bits(tmp_path):
    """vdpbf16ps and the widened FMAs of the other paths sum in the same order with the
    same roundings: the same float32 bits (no sum here comes near the subnormals)."""
    others = [p for p in isa.PATH.runnable if p != isa.PATH.name]
    if not others:
        pytest.skip(f"this machine runs only the {isa.PATH.name} path")
    rng = np.random.default_rng(11)
    A = (rng.standard_normal((19, 301)) * np.exp(rng.uniform(-6, 6, (19, 301)))).astype(np.float32)
    W = (rng.standard_normal((301, 150)) * np.exp(rng.uniform(-6, 6, (301, 150)))).astype(np.float32)
    np.save(tmp_path / "a.npy", A)
    np.save(tmp_path / "w.npy", W)
    q, Bp = packed(W)
    here = np.empty((19, 150), np.float32)
    bgemm(A, Bp, 301, 150, here)
    for path in others:
        out = tmp_path / f"{path}.npy"
        env = {**os.environ, "TBLOCK_ISA": path}
        env.pop("NUMBA_CPU_NAME", None)
        env.pop("NUMBA_CPU_FEATURES", None)
        p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "a.npy"), str(tmp_path / "w.npy"), str(out)],
                           env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        np.testing.assert_array_equal(np.load(out).view(np.uint32), here.view(np.uint32), err_msg=path)
