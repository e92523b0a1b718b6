"""Kernel-level checks of tblock.kernels: the GEMM, masking, extreme values, the vector exp."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import tblock
from tblock.backends import numpy as oracle
from tblock.kernels import isa
from tblock.kernels.activations import ACTIVATION_CODES, bias_act_rows
from tblock.kernels.attention import attention_rows_direct, flash_rows, pack_kt, pack_rows
from tblock.kernels.gemm import gemm_block, gemm_panels, pack_b, packed_size, panel_width
from tblock.kernels.layernorm import layernorm_rows
from tblock.kernels.options import JIT
from tblock.kernels.records import KV, Att, FlashWork, Panels, Rows, Tile
from tblock.kernels.simd import lanes, panel_lanes, vexp, vexp2, vload_n, vstore_n
from tblock.kernels.softmax import masked_softmax_rows
from tblock.kernels.stages import store_kt, store_v
from tblock.kernels.tiles import BK, FINITE_BLOCK, QSUB
from tblock.kernels.validate import all_finite_flat

pytestmark = pytest.mark.isa


def reference_softmax(S, scale, allowed):
    """Max-subtracted softmax over the allowed entries; a row with none gives zeros."""
    out = np.zeros_like(S, dtype=np.float64)
    for i in range(S.shape[0]):
        keep = allowed[i] & np.isfinite(S[i])
        if keep.any():
            x = np.where(keep, S[i] * scale, -np.inf)
            e = np.exp(x - x[keep].max())
            out[i] = e / e.sum()
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masked_softmax_kinds(dtype):
    rng = np.random.default_rng(0)
    S = rng.standard_normal((7, 9)).astype(dtype) * 3
    out = np.empty_like(S)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    # none and causal
    masked_softmax_rows(S, 0.5, False, out)
    np.testing.assert_allclose(out, reference_softmax(S, 0.5, np.ones(S.shape, bool)), atol=tol)
    masked_softmax_rows(S, 0.5, True, out)
    np.testing.assert_allclose(out, reference_softmax(S, 0.5, np.tril(np.ones(S.shape, bool))), atol=tol)
    # -inf scores drop out; a row of only -inf gives zeros, not NaN
    S[2, ::2] = -np.inf
    S[3] = -np.inf
    masked_softmax_rows(S, 1.0, False, out)
    np.testing.assert_allclose(out, reference_softmax(S, 1.0, np.ones(S.shape, bool)), atol=tol)
    assert np.all(out[3] == 0) and np.all(out[2, ::2] == 0) and not np.isnan(out).any()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("M, K, N", [(1, 1, 1), (4, 8, 8), (6, 128, 64), (5, 129, 65), (13, 300, 130),
                                     (7, 16, 200), (20, 257, 33), (1, 600, 70), (6, 513, 129)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_block_matches_numpy(M, K, N, dtype, with_bias):
    """C (+)= [bias +] A @ B over row and panel sub-ranges, on the one-micro-tile shortcut
    (M <= 6, one panel, K <= KC_ONE) and on the tiled loops (k blocks of KC, or of KC_ONE
    with one row tile: a GEMV of 600 or 513 columns runs three; partial panels and row
    tiles; row tiles of one row, of two to four and of five or six, each with its own
    loop); A and C with row strides wider than their rows; nothing outside the range
    written; the bias (after the packed matrix, zero-padded to whole panels) added once."""
    rng = np.random.default_rng(M * 1000 + K + N)
    NR = panel_width(dtype)
    A = rng.standard_normal((M, K + 3)).astype(dtype)         # lda = K + 3
    B = rng.standard_normal((K, N)).astype(dtype)
    npan = -(-N // NR)
    size = packed_size(K, N, NR)
    Bp = np.zeros(size + npan * NR, dtype)                     # the packed B, then the bias
    pack_b(B, Bp)
    bias = rng.standard_normal(N).astype(dtype) if with_bias else np.zeros(N, dtype)
    Bp[size:size + N] = bias
    for i0, i1, p0, p1 in [(0, M, 0, npan), (M // 2, M, npan // 2, npan), (0, (M + 1) // 2, 0, 1)]:
        c0, c1 = p0 * NR, min(N, p1 * NR)
        for accumulate in (False, True):
            C = rng.standard_normal((M, N + 5)).astype(dtype)  # ldc = N + 5
            want = C.copy()
            prod = A[i0:i1, :K].astype(np.float64) @ B[:, c0:c1].astype(np.float64) + bias[c0:c1]
            want[i0:i1, c0:c1] = prod + (want[i0:i1, c0:c1] if accumulate else 0)
            gemm_block(A.reshape(-1), Rows(0, K + 3), Bp, Panels(0, K * NR, K, N), C.reshape(-1), Rows(0, N + 5),
                       Tile(i0, i1, p0, p1), accumulate, size if with_bias else -1)
            tol = 1e-12 if dtype == np.float64 else 1e-5
            np.testing.assert_allclose(C, want, rtol=tol, atol=tol * np.sqrt(K))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gemm_panels_reads_a_band_of_rows(dtype):
    """A band of rows k0..k0+kb of a packed B (the FFN's chunk of W_2): with the full
    matrix's panel stride, the result is A @ B[k0:k0+kb, :]."""
    rng = np.random.default_rng(9)
    NR = panel_width(dtype)
    Kfull, N, M = 600, 150, 11
    B = rng.standard_normal((Kfull, N)).astype(dtype)
    Bp = np.empty(packed_size(Kfull, N, NR), dtype)
    pack_b(B, Bp)
    for k0, kb in [(0, 256), (256, 256), (512, 88), (5, 3)]:
        A = rng.standard_normal((M, kb)).astype(dtype)
        C = np.zeros((M, N), dtype)
        gemm_panels(A.reshape(-1), Rows(0, kb), Bp, Panels(k0 * NR, Kfull * NR, kb, N), C.reshape(-1), Rows(0, N),
                    Tile(0, M, 0, -(-N // NR)), False, -1)
        want = A.astype(np.float64) @ B[k0:k0 + kb].astype(np.float64)
        tol = 1e-12 if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(C, want, rtol=tol, atol=tol * np.sqrt(kb))


def test_softmax_extreme_logits_stay_finite():
    S = np.array([[1e4, -1e4, 0.0, 1e4 - 1], [-1e4, -1e4 - 5, -1e4 + 3, -1e4]])
    out = np.empty_like(S)
    masked_softmax_rows(S, 1.0, False, out)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, reference_softmax(S, 1.0, np.ones(S.shape, bool)), atol=1e-15)


@njit
def _exp_all(x, y):
    W = lanes(x)
    for i in range(0, x.size, W):
        vstore_n(y, i, vexp(vload_n(x, i, x.size - i)), x.size - i)


@pytest.mark.parametrize("dtype, ulps", [(np.float64, 2), (np.float32, 2)])
def test_vector_exp_accuracy_and_edges(dtype, ulps):
    lo, hi = (-708.0, 709.0) if dtype == np.float64 else (-87.0, 88.0)
    x = np.concatenate([np.linspace(lo, hi, 100_003), np.random.default_rng(1).uniform(-5, 5, 10_000),
                        [0.0, -0.0, 1e-30, -1e-30]]).astype(dtype)
    y = np.empty_like(x)
    _exp_all(x, y)
    want = np.exp(x.astype(np.float64))
    err_ulps = np.abs(y - want) / np.spacing(want.astype(dtype)).astype(np.float64)
    assert err_ulps.max() <= ulps, err_ulps.max()
    edge = np.array([-np.inf, np.inf, np.nan, lo - 1, -1e30, hi + 1], dtype=dtype)
    out = np.empty_like(edge)
    _exp_all(edge, out)
    assert out[0] == 0 and out[1] == np.inf and np.isnan(out[2])
    assert out[3] == 0 and out[4] == 0 and out[5] == np.inf


# compiled with the kernels' own options: their fast-math flags (reassoc) once let LLVM
# fold vexp2's rounding step away, which a plain @njit does not show
@njit(**{**JIT, "cache": False})
def _exp2_all(x, y):
    W = lanes(x)
    for i in range(0, x.size, W):
        vstore_n(y, i, vexp2(vload_n(x, i, x.size - i)), x.size - i)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_vector_exp2_accuracy_and_edges(dtype):
    """vexp2 (the softmax's 2^t, t <= 0) within 1 ulp of exp2 down to the smallest normal
    number (1.5 ulp on a target without FMA, whose Horner steps round twice: 1.01
    measured on the x86-64 baseline); below it, 2^lo (never 0 or a subnormal); NaN stays NaN."""
    lo = -1022.0 if dtype == np.float64 else -126.0
    x = np.concatenate([np.linspace(lo, 0.0, 100_003), np.random.default_rng(3).uniform(-30, 0, 10_000),
                        -np.arange(0, 60, 0.5),        # ties of the rounding to an integer
                        [0.0, -0.0, -1e-30, lo + 0.49, lo + 0.5]]).astype(dtype)
    y = np.empty_like(x)
    _exp2_all(x, y)
    want = np.exp2(x.astype(np.longdouble))
    err_ulps = np.abs(y - want) / np.spacing(want.astype(dtype)).astype(np.longdouble)
    assert float(err_ulps.max()) <= (1.0 if isa.PATH.fma else 1.5), float(err_ulps.max())
    edge = np.array([np.nan, -np.inf, lo - 1, -1e30], dtype=dtype)
    out = np.empty_like(edge)
    _exp2_all(edge, out)
    assert np.isnan(out[0])
    np.testing.assert_array_equal(out[1:], np.exp2(dtype(lo)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layernorm_rows_matches_oracle_and_constant_rows_stay_finite(dtype):
    rng = np.random.default_rng(2)
    for d in (1, 3, 16, 17, 100):
        X = rng.standard_normal((5, d)).astype(dtype) * 7 + 3
        X[1] = 2.5                                   # a constant row: var = 0
        X[2] = 1e6                                   # constant and large
        g = rng.standard_normal(d).astype(dtype)
        b = rng.standard_normal(d).astype(dtype)
        P = np.concatenate([g, b])
        Y = np.empty_like(X)
        layernorm_rows(X.reshape(-1), Rows(0, d), Y.reshape(-1), Rows(0, d), 5, d, P, 0, d, 1e-5)
        assert np.isfinite(Y).all()
        want = oracle.layernorm(X.astype(np.float64), g.astype(np.float64), b.astype(np.float64), 1e-5)
        tol = 2e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(Y, want, atol=tol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["gelu_tanh", "gelu_erf", "relu"])
def test_bias_activation_matches_oracle(dtype, act):
    rng = np.random.default_rng(3)
    for n in (1, 15, 16, 17, 50):
        X = (rng.standard_normal((3, n)) * 4).astype(dtype)
        X[0, 0] = -30.0                  # deep in the negative tail
        bias = rng.standard_normal(n).astype(dtype)
        Y = X.copy()
        bias_act_rows(Y.reshape(-1), 0, n, 3, n, bias, 0, ACTIVATION_CODES[act])
        want = oracle.ACTIVATION[act]((X + bias).astype(np.float64))
        tol = 2e-6 if dtype == np.float32 else 2e-15
        np.testing.assert_allclose(Y, want, rtol=tol, atol=tol)


def test_block_with_huge_logits_and_constant_rows():
    """Scores around +-1e4 and constant input rows: finite and equal to the oracle."""
    cfg = tblock.BlockConfig(d_model=16, n_heads=2)
    w = tblock.init_weights(cfg, 0, dtype=np.float64)
    a = w.arrays()
    a["w_q"] = a["w_q"] * 300.0
    a["w_k"] = a["w_k"] * 300.0
    w = tblock.BlockWeights(**a)
    H = np.random.default_rng(0).standard_normal((40, 16))
    H[5] = 3.0                                   # LN1 sees a constant row
    _, tr = tblock.forward(H, w, cfg, backend="numpy", trace=True)
    assert np.abs(tr.Q[:, :8] @ tr.K[:, :8].T).max() / np.sqrt(8) > 5e3   # logits really are ~1e4
    for dtype in (np.float64, np.float32):
        got = tblock.forward(H.astype(dtype), w, cfg, backend="numba")
        assert np.isfinite(got).all()
    got = tblock.forward(H, w, cfg, backend="numba")
    want = tblock.forward(H, w, cfg, backend="numpy")
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-10
    assert math.isfinite(float(tblock.forward(np.full((6, 16), 2.0), w, cfg, backend="numba").sum()))


def head_rows(rng, T, dk, dtype, pad=5):
    """One head's [Q | K | V] rows with some padding after them, as in the block's buffer."""
    ld = 3 * dk + pad
    X = rng.standard_normal(T * ld).astype(dtype)
    rows = X.reshape(T, ld).astype(np.float64)
    return X, ld, rows[:, :dk], rows[:, dk:2 * dk], rows[:, 2 * dk:3 * dk]


def attention_reference(Q, K, V, scale, causal):
    S = Q @ K.T * scale
    if causal:
        S = np.where(oracle.causal_mask(len(Q)), S, -np.inf)
    return oracle.softmax_rows(S) @ V


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T, dk", [(1, 1), (1, 8), (2, 3), (5, 1), (20, 8), (9, 17), (3, 40)])
def test_direct_attention_matches_oracle(causal, T, dk, dtype):
    """The untiled per-query kernel the block uses for short sequences (T*T*d_k up to
    kernels.block.DIRECT_MAX)."""
    X, ld, Q, K, V = head_rows(np.random.default_rng(4), T, dk, dtype)
    out = np.full(T * dk, np.nan, dtype=dtype)
    attention_rows_direct(X, ld, (0, dk, 2 * dk), Att(0, T, T, dk, causal, 0.3, 0), np.empty(T), out, Rows(0, dk))
    tol = 1e-13 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(out.reshape(T, dk), attention_reference(Q, K, V, 0.3, causal),
                               rtol=tol, atol=tol)


@njit
def _guarded(n, dtype):
    """n elements of scratch between two 256-element runs of 1e30: a kernel that reads
    outside its scratch picks one up, and the result shows it (a huge score or weight
    wins every max and swamps every sum; a NaN could be dropped by a max)."""
    buf = np.full(n + 512, 1e30, dtype)
    return buf[256:256 + n]


@njit
def _tiled_head(X, ld, T, dk, causal, scale, out):
    """One head through the block's tiled path: pack K^T and V, flash_rows over all queries."""
    NR = panel_lanes(X)
    ldv = (dk + NR - 1) // NR * NR
    kt = np.empty((T + NR - 1) // NR * dk * NR, X.dtype)
    vp = np.empty(T * ldv, X.dtype)
    pack_kt(X, dk, ld, T, dk, kt, 0)
    pack_rows(X, 2 * dk, ld, T, dk, vp, 0, ldv)
    bk = min(BK, (T + NR - 1) // NR * NR)
    work = FlashWork(_guarded(T * dk, X.dtype), _guarded(min(T, QSUB) * bk, X.dtype), _guarded(T * ldv, X.dtype),
                     _guarded(T, np.float64), _guarded(T, np.float64))
    flash_rows(X, Rows(0, ld), kt, vp, KV(0, 0, ldv), Att(0, T, T, dk, causal, scale, bk), work, out, Rows(0, dk))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T, dk", [(1, 1), (1, 64), (2, 3), (7, 1), (63, 8), (65, 17), (97, 64), (300, 5),
                                   (530, 16)])
def test_tiled_attention_matches_oracle_at_edge_shapes(causal, T, dk, dtype):
    """The flash kernel on shapes the block sends down the direct path (short T) and on
    tile edges (a partial key panel, a partial query sub-tile, d_k not a lane multiple,
    key tiles that start inside a query sub-tile: at T=300 and 530 the causal mask hides
    the whole of a visited key tile from the sub-tile's first rows)."""
    X, ld, Q, K, V = head_rows(np.random.default_rng(5), T, dk, dtype)
    out = np.full(T * dk, np.nan, dtype=dtype)
    _tiled_head(X, ld, T, dk, causal, 0.3, out)
    tol = 1e-12 if dtype == np.float64 else 5e-6
    np.testing.assert_allclose(out.reshape(T, dk), attention_reference(Q, K, V, 0.3, causal),
                               rtol=tol, atol=tol)


def stored_as_packing_gives(B, T, n_heads, dk, dtype, rcuts, ccuts, rng):
    """store_kt and store_v over the pieces (row cuts x column cuts) of random K and V
    rows give exactly what packing whole heads gives (pack_kt, pack_rows), padding included."""
    d = n_heads * dk
    rows = B * T
    NR = panel_width(dtype)
    ktn = -(-T // NR) * dk * NR
    ldv = -(-dk // NR) * NR
    K = rng.standard_normal((rows, d)).astype(dtype)
    V = rng.standard_normal((rows, d)).astype(dtype)
    want_kt = np.full(B * n_heads * ktn, np.nan, dtype)
    want_vp = np.full(B * n_heads * T * ldv, np.nan, dtype)
    for b in range(B):
        for h in range(n_heads):
            bh = b * n_heads + h
            pack_kt(K.reshape(-1), b * T * d + h * dk, d, T, dk, want_kt, bh * ktn)
            pack_rows(V.reshape(-1), b * T * d + h * dk, d, T, dk, want_vp, bh * T * ldv, ldv)
    got_kt = np.full_like(want_kt, np.nan)
    got_vp = np.full_like(want_vp, np.nan)
    for r0, r1 in zip(rcuts[:-1], rcuts[1:]):
        for c0, c1 in zip(ccuts[:-1], ccuts[1:]):
            # the scratch holds just the piece: rows r0..r1, columns c0..c1
            store_kt(np.ascontiguousarray(K[r0:r1, c0:c1]).reshape(-1), c1 - c0, r0, r1, c0, c1,
                     T, n_heads, dk, got_kt)
            store_v(np.ascontiguousarray(V[r0:r1, c0:c1]).reshape(-1), c1 - c0, r0, r1, c0, c1,
                    T, n_heads, dk, got_vp)
    np.testing.assert_array_equal(got_kt, want_kt)
    np.testing.assert_array_equal(got_vp, want_vp)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("B, T, n_heads, dk", [(1, 1, 1, 1), (2, 5, 2, 1), (3, 70, 3, 17),
                                               (1, 130, 2, 64), (2, 33, 4, 40)])
def test_projection_stores_k_and_v_in_the_packed_layouts(B, T, n_heads, dk, dtype):
    """The block's projection tasks write K and V straight into the layouts attention reads,
    a block of rows and a range of columns at a time (store_kt, store_v).  Pieces whose rows
    cross a sequence boundary and whose columns split heads must give exactly what packing
    whole heads gives (pack_kt, pack_rows, as attention_core does), padding included."""
    rng = np.random.default_rng(7)
    rows, d = B * T, n_heads * dk
    rcuts = np.unique(np.r_[0, rng.integers(0, rows, 3), rows])
    ccuts = np.unique(np.r_[0, rng.integers(0, d, 2), d])
    stored_as_packing_gives(B, T, n_heads, dk, dtype, rcuts, ccuts, rng)


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 80), n_heads=st.integers(1, 3), dk=st.sampled_from([1, 8, 16, 17, 32]),
       dtype=st.sampled_from([np.float32, np.float64]), data=st.data())
def test_projection_stores_any_pieces(B, T, n_heads, dk, dtype, data):
    """As above, over any cuts: pieces that start and end mid-panel, whole panels (store_kt's
    own loop), a sequence's last panel (the keys past T zeroed)."""
    rows, d = B * T, n_heads * dk
    rcuts = sorted(set(data.draw(st.lists(st.integers(0, rows), max_size=4)) + [0, rows]))
    ccuts = sorted(set(data.draw(st.lists(st.integers(0, d), max_size=2)) + [0, d]))
    stored_as_packing_gives(B, T, n_heads, dk, dtype, rcuts, ccuts, np.random.default_rng(B * 1000 + T))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_all_finite_flat_finds_every_nan_and_inf(dtype):
    """The block's vectorised finiteness check: a NaN, +Inf or -Inf anywhere (the first and
    last element, either side of a panel vector and of a FINITE_BLOCK, the scalar tail)
    is found; the largest finite values, -0 and empty arrays pass."""
    P = panel_width(dtype)
    big = np.finfo(dtype).max
    for n in (1, P - 1, P, P + 1, 3 * P + 5, FINITE_BLOCK - 1, FINITE_BLOCK, FINITE_BLOCK + P + 3, 3 * FINITE_BLOCK):
        assert all_finite_flat(np.full(n, big, dtype)) and all_finite_flat(np.full(n, -0.0, dtype))
        for pos in sorted({0, P - 1, P, n // 2, FINITE_BLOCK - 1, FINITE_BLOCK, n - P - 1, n - 1} & set(range(n))):
            for bad in (np.nan, np.inf, -np.inf):
                a = np.full(n, -big, dtype)
                a[pos] = bad
                assert not all_finite_flat(a), (n, pos, bad)
    assert all_finite_flat(np.empty(0, dtype))
