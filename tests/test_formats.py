"""Stored weight formats (tblock.formats, tblock.quantize): the bytes, the values, the errors.

Expected values come from computations written here apart from tblock.formats: bf16's
rounding by comparing distances in float64, blocks built byte by byte by hand, and the
error bounds the formats promise.  The bytes are also compared with llama.cpp's own
quantizers (gguf) in tests/interop/test_gguf_bytes.py.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tblock
from tblock.formats import QuantizedMatrix, dequantize, quantize_matrix


def bf16_nearest(x: np.ndarray) -> np.ndarray:
    """bf16 by definition: of the two bf16 values around each float32, the nearer one in
    float64, the one with an even last bit on a tie."""
    u = x.astype(np.float32).view(np.uint32)
    lo = (u & 0xFFFF0000).view(np.float32).astype(np.float64)
    hi_bits = (u & 0xFFFF0000) + 0x10000
    hi = hi_bits.view(np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    pick_hi = (np.abs(hi - xd) < np.abs(xd - lo)) | ((np.abs(hi - xd) == np.abs(xd - lo)) & (((u >> 16) & 1) == 1))
    return np.where(pick_hi, hi_bits >> 16, u >> 16).astype(np.uint16)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]))
def test_bf16_rounds_to_nearest_even(seed, scale):
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((24, 7)) * scale).astype(np.float32)
    W[0, :4] = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 0.0], np.float32)    # ties
    q = quantize_matrix(W, "bf16")
    assert np.array_equal(q.data, bf16_nearest(W).T)
    widened = (bf16_nearest(W).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(q.dequantize(np.float64), widened.astype(np.float64))


def q8_block(d16: int, qs) -> bytes:
    return int(d16).to_bytes(2, "little") + bytes(np.asarray(qs, np.int8).view(np.uint8))


def test_q8_0_bytes_by_hand():
    # one output row of 64 inputs: block 0 has the peak 127 * 0.5 at input 3; block 1 is zero
    x = np.zeros(64, np.float32)
    x[3], x[4], x[5] = 63.5, -1.0, 0.25             # d = 63.5 / 127 = 0.5 (float16 0x3800)
    q = quantize_matrix(x[:, None], "int8")
    want = np.zeros(32, np.int8)
    want[3], want[4], want[5] = 127, -2, 1          # 0.25 / 0.5 = 0.5 rounds away from zero
    assert q.data.tobytes() == q8_block(0x3800, want) + q8_block(0, np.zeros(32))
    assert q.dequantize()[:6, 0].tolist() == [0, 0, 0, 63.5, -1.0, 0.5]


def test_q4_0_bytes_by_hand():
    # the signed peak -4 maps to -8, so d = -4 / -8 = 0.5 (float16 0x3800), 1/d = 2, and each
    # nibble is trunc(x / d + 8.5): -4 -> 0, 1 -> 10, 3.5 -> 15, -0.75 -> 7, 0 -> 8
    x = np.zeros(32, np.float32)
    x[0], x[1], x[16], x[17] = -4.0, 1.0, 3.5, -0.75
    q = quantize_matrix(x[:, None], "int4")
    nib = np.full(32, 8)
    nib[0], nib[1], nib[16], nib[17] = 0, 10, 15, 7
    packed = bytes((nib[:16] | (nib[16:] << 4)).astype(np.uint8))     # byte j: input j low, j + 16 high
    assert q.data.tobytes() == (0x3800).to_bytes(2, "little") + packed
    got = q.dequantize()[:, 0]                       # d * (nibble - 8)
    assert got[[0, 1, 16, 17]].tolist() == [-4.0, 1.0, 3.5, -0.5]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), blocks=st.integers(1, 4), cols=st.integers(1, 9),
       scale=st.sampled_from([1e-2, 1.0, 1e4]))
def test_blocked_formats_keep_their_error_bounds(seed, blocks, cols, scale):
    """int8: |x - x~| <= d / 2 (round to nearest of d * q); int4: <= |d| (nearest, except
    a value at +8|d| which clamps to 7).  Scales where d is a normal float16: below ~6e-5
    it is subnormal and coarse, and the bounds hold for the float32 d only (as in ggml)."""
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((32 * blocks, cols)) * scale).astype(np.float32)
    # the stored d is the float32 one rounded to float16 (relative error <= 2^-11), and the
    # nibbles and bytes were rounded against the float32 one: |q| <= 127 (int8), 8 (int4)
    # times that rounding adds to the bound
    for fmt, bound in (("int8", 0.5 + 127 * 2**-11), ("int4", 1.0 + 8 * 2**-11)):
        q = quantize_matrix(W, fmt)
        rows = q.data.reshape(cols, blocks, -1)
        d = rows[..., :2].copy().view("<f2")[..., 0].astype(np.float64)      # (cols, blocks)
        err = np.abs(q.dequantize(np.float64) - W).T.reshape(cols, blocks, 32)
        assert (err <= bound * np.abs(d)[..., None] * (1 + 2**-10)).all(), fmt


def test_dequantize_is_exact_in_float32():
    W = np.random.default_rng(3).standard_normal((64, 5)).astype(np.float32)
    for fmt in ("bf16", "int8", "int4"):
        q = quantize_matrix(W, fmt)
        assert np.array_equal(q.dequantize(np.float32).astype(np.float64), q.dequantize(np.float64))
        assert np.array_equal(dequantize(fmt, q.data, q.shape), q.dequantize(np.float32))


def test_quantize_weights_keeps_vectors_and_reports_bytes():
    cfg = tblock.BlockConfig(d_model=64, n_heads=2, d_ff=128, ffn_bias=True, attn_bias=True)
    w = tblock.init_weights(cfg, 0)
    sizes = {}
    for fmt in tblock.FORMATS:
        q = tblock.quantize(w, fmt)
        assert q.format == fmt and q.dtype == np.float32
        assert np.array_equal(q.b_ff1, w.b_ff1) and np.array_equal(q.ln1_gamma, w.ln1_gamma)
        sizes[fmt] = q.nbytes
    vectors = sum(a.nbytes for n, a in w.arrays().items() if n.startswith(("b_", "ln")))
    matrices = 4 * 64 * 64 + 2 * 64 * 128
    assert sizes["fp32"] == 4 * matrices + vectors
    assert sizes["bf16"] == 2 * matrices + vectors
    assert sizes["int8"] == matrices // 32 * 34 + vectors
    assert sizes["int4"] == matrices // 32 * 18 + vectors
    assert tblock.init_weights(cfg, 0, dtype=np.float64).format == "fp64"


@pytest.mark.parametrize("call, error, words", [
    (lambda: quantize_matrix(np.ones((40, 3)), "int8"), ValueError, ["multiple of 32", "40"]),
    (lambda: quantize_matrix(np.ones((32, 3)), "int5"), ValueError, ["format", "int5"]),
    (lambda: quantize_matrix(np.ones((32, 3)), 8), TypeError, ["format", "int"]),
    (lambda: quantize_matrix(np.full((32, 2), np.finfo(np.float32).max), "bf16"), ValueError, ["bf16", "Inf"]),
    (lambda: quantize_matrix(np.full((32, 2), 1e10), "int8"), ValueError, ["float16", "8.32e+06"]),
    (lambda: QuantizedMatrix("int8", (32, 2), np.zeros((2, 33), np.uint8)), ValueError, ["uint8 (2, 34)", "(2, 33)"]),
    (lambda: QuantizedMatrix("int8", (32, 1), np.full((1, 34), 0xFF, np.uint8)), ValueError, ["scale", "NaN"]),
    (lambda: QuantizedMatrix("fp32", (32, 1), np.zeros((1, 32), np.float32)), ValueError, ["holds one of"]),
    (lambda: QuantizedMatrix("bf16", (3, 1), np.array([[0, 0x7F80, 0]], np.uint16)), ValueError, ["bf16", "NaN"]),
    (lambda: quantize_matrix(np.full((32, 1), 6e5), "int4"), ValueError, ["float16", "5.24e+05"]),
])
def test_bad_formats_are_refused(call, error, words):
    with pytest.raises(error) as e:
        call()
    for w in words:
        assert w in str(e.value)


def test_weights_refuse_mixed_or_requantized_matrices():
    cfg = tblock.BlockConfig(d_model=32, n_heads=1, d_ff=64)
    w = tblock.init_weights(cfg, 0)
    q = tblock.quantize(w, "int8")
    mixed = {**w.arrays(), "w_q": q.w_q}
    with pytest.raises(ValueError, match="share one format"):
        tblock.BlockWeights(**mixed)
    with pytest.raises(ValueError, match="int8 already"):
        tblock.quantize(q, "int4")
    with pytest.raises(TypeError, match="then quantize"):
        q.scaled(0.5)
    with pytest.raises(ValueError, match="multiple of 32"):
        tblock.quantize(tblock.init_weights(tblock.BlockConfig(d_model=8, n_heads=2), 0), "int4")
    with pytest.raises(ValueError, match="d_model=64"):
        q.check(tblock.BlockConfig(d_model=64, n_heads=1, d_ff=64))


def test_stored_matrices_are_private_and_read_only():
    W = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    data = quantize_matrix(W, "int8").data.copy()
    q = QuantizedMatrix("int8", (32, 4), data)
    data[:] = 0                                      # the caller's array changes later
    assert q.data.any()
    with pytest.raises(ValueError):
        q.data.flags.writeable = True
