"""The C reference's own reading of the stored formats (tb_dequantize) and backend "c" on
quantized weights.

tb_dequantize unpacks bf16, Q8_0 and Q4_0 bytes in C, apart from tblock.formats' numpy code;
both are exact, so they must agree bit for bit. Bytes written by hand here, with their values
worked out by hand, check both against the layout itself, so that a misreading the two share
is caught too. The block on quantized weights is checked against the NumPy oracle on the same
weights, per array, to 1e-12 relative (as tests/test_c_ref.py).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tblock
from tblock import formats
from tblock.api import TRACE_NAMES
from tblock.backends import c as cb
from tblock.backends import numpy as oracle
from tblock.formats import QuantizedMatrix

from conftest import random_weights, rel_err

STORED = ("bf16", "int8", "int4")
TOL = 1e-12
SENTINEL = 777.25


def bits(a) -> np.ndarray:
    """The float64 bit patterns of ``a``: equal bits are equal values with equal signed zeros."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def numpy_dequantize(m: QuantizedMatrix) -> np.ndarray:
    return formats.dequantize(m.format, m.data, m.shape).astype(np.float64)


def assert_same_bits(got, want):
    assert got.shape == want.shape
    differ = np.argwhere(bits(got) != bits(want))
    assert differ.size == 0, (f"{len(differ)} elements differ, first at {tuple(differ[0])}: "
                              f"{got[tuple(differ[0])]!r} != {want[tuple(differ[0])]!r}")


# ---------------------------------------------------------------------------------------
# C against tblock.formats, bit for bit

# block magnitudes: all-zero, tiny (float16 subnormal scales), ordinary, large
KINDS = {"zero": (0.0, 0.0), "tiny": (-5.5, -3.0), "unit": (0.0, 0.0), "large": (2.0, 4.5)}


@st.composite
def matrices(draw):
    fmt = draw(st.sampled_from(STORED))
    d_in, d_out = 32 * draw(st.integers(1, 8)), draw(st.integers(1, 70))
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=4))
    return fmt, d_in, d_out, kinds, draw(st.integers(0, 2**32 - 1))


def draw_matrix(d_in, d_out, kinds, seed) -> np.ndarray:
    """W (d_in, d_out) float32 whose blocks of 32 inputs each take a magnitude of ``kinds``."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d_in, d_out))
    blocks = W.reshape(d_in // 32, 32, d_out)
    for b in range(d_in // 32):
        for o in range(d_out):
            kind = kinds[rng.integers(len(kinds))]
            lo, hi = KINDS[kind]
            blocks[b, :, o] *= 0.0 if kind == "zero" else 10.0 ** rng.uniform(lo, hi)
    return W.astype(np.float32)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=matrices())
@example(case=("int8", 32, 1, ["zero"], 0))
@example(case=("int4", 32, 1, ["zero"], 0))       # scale -0.0: every value a signed zero
@example(case=("int8", 256, 70, ["tiny"], 1))
@example(case=("int4", 256, 70, ["tiny", "large"], 2))
@example(case=("bf16", 256, 70, ["zero", "tiny", "unit", "large"], 3))
def test_c_dequantize_equals_numpy_bitwise(case):
    fmt, d_in, d_out, kinds, seed = case
    m = formats.quantize_matrix(draw_matrix(d_in, d_out, kinds, seed), fmt)
    assert_same_bits(cb.dequantize(m), numpy_dequantize(m))


def finite_fp16_patterns() -> np.ndarray:
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    return h[(h & 0x7C00) != 0x7C00]                     # exponent all ones: Inf or NaN


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_every_finite_fp16_scale(fmt):
    """Each finite float16 (subnormals, both zeros, the largest) once as a block's scale, the
    quantized values random bytes: C and numpy agree on all of them."""
    scales = finite_fp16_patterns()                      # (63488,)
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, (scales.size, formats.BLOCK_BYTES[fmt]), dtype=np.uint8)
    blocks[:, :2] = scales.astype("<u2")[:, None].view(np.uint8)
    m = QuantizedMatrix(fmt, (32, scales.size), blocks)  # one block per output row
    assert_same_bits(cb.dequantize(m), numpy_dequantize(m))


def test_every_finite_bf16_value():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    h = h[(h & 0x7F80) != 0x7F80]                        # 65280 finite patterns
    m = QuantizedMatrix("bf16", (256, h.size // 256), h.reshape(-1, 256))
    got = cb.dequantize(m)
    assert_same_bits(got, numpy_dequantize(m))
    assert np.count_nonzero(got) == h.size - 2           # only +0.0 and -0.0 are zero


# ---------------------------------------------------------------------------------------
# bytes written by hand, values worked out by hand: a shared misreading is caught too

def hand_cases():
    # bf16, (d_in, d_out) = (3, 2): stored row o is column o of W
    bf16 = np.frombuffer(bytes([0x80, 0x3F, 0x00, 0xC0, 0x00, 0x3E,     # 1.0, -2.0, 0.125
                                0x01, 0x00, 0x7F, 0x7F, 0x00, 0x80]),   # 2^-133, largest, -0.0
                         dtype="<u2").astype(np.uint16).reshape(2, 3)
    W_bf16 = np.array([[1.0, float.fromhex("0x1p-133")],
                       [-2.0, float.fromhex("0x1.fep127")],
                       [0.125, -0.0]])

    # Q8_0, (32, 2): row 0 scale 0.5 (fp16 0x3800: bytes 00 38), q = 1, -1, 127, -128, 0, 2, 0...;
    # row 1 scale 2^-24 (0x0001, the smallest subnormal), q[0] = 3, q[31] = -2 (byte FE)
    q8 = np.zeros((2, 34), np.uint8)
    q8[0, :8] = [0x00, 0x38, 0x01, 0xFF, 0x7F, 0x80, 0x00, 0x02]
    q8[1, :3] = [0x01, 0x00, 0x03]
    q8[1, 33] = 0xFE
    W_q8 = np.zeros((32, 2))
    W_q8[:6, 0] = [0.5, -0.5, 63.5, -64.0, 0.0, 1.0]
    W_q8[0, 1], W_q8[31, 1] = 3 * 2.0**-24, -2 * 2.0**-24

    # Q4_0, (64, 1): two blocks. Block 0 scale 0.5; byte 0 = 9F: input 0 = (15 - 8) * 0.5,
    # input 16 = (9 - 8) * 0.5; byte 15 = 08: input 31 = (0 - 8) * 0.5. Block 1 scale -2.0
    # (bytes 00 C0); byte 3 = 1E: input 35 = (14 - 8) * -2, input 51 = (1 - 8) * -2. Every
    # other byte is 88 (nibbles 8: value 0, -0.0 under the negative scale)
    q4 = np.full((1, 36), 0x88, np.uint8)
    q4[0, [0, 1, 2, 17]] = [0x00, 0x38, 0x9F, 0x08]
    q4[0, [18, 19, 23]] = [0x00, 0xC0, 0x1E]
    W_q4 = np.zeros((64, 1))
    W_q4[32:] = -0.0
    W_q4[[0, 16, 31, 35, 51], 0] = [3.5, 0.5, -4.0, -12.0, 14.0]
    return {"bf16": (bf16, W_bf16), "int8": (q8, W_q8), "int4": (q4, W_q4)}


@pytest.mark.parametrize("fmt", STORED)
def test_hand_written_bytes(fmt):
    data, want = hand_cases()[fmt]
    m = QuantizedMatrix(fmt, want.shape, data)
    assert_same_bits(cb.dequantize(m), want)
    assert_same_bits(numpy_dequantize(m), want)


# ---------------------------------------------------------------------------------------
# every error status, through the cffi call: a CRefError naming it, nothing written

def good_q8():
    """A valid Q8_0 (64, 3) matrix: its bytes, and an output filled with SENTINEL."""
    m = formats.quantize_matrix(np.random.default_rng(3).standard_normal((64, 3)), "int8")
    return cb.stored_bytes(m).copy(), np.full((64, 3), SENTINEL)


def with_scale(pattern):
    def change(args):
        args["data"][-34:-32] = np.array([pattern], "<u2").view(np.uint8)    # the last block's
    return change


def _set(**kw):
    return lambda args: args.update(kw)


def _shorten(name, by=1):
    return lambda args: args.setdefault("lens", {}).update({name: args[name].size - by})


def _overlap(args):
    args["data"] = args["out"].reshape(-1).view(np.uint8)[:args["data"].size]   # the right length, inside out


MSG = {"TB_ERR_DATA_SIZE": "not exactly the stored size in bytes", "TB_ERR_BLOCK": "not a multiple of 32",
       "TB_ERR_FORMAT": "format is not TB_FMT_BF16 (0), TB_FMT_Q8_0 (1) or TB_FMT_Q4_0 (2)",
       "TB_ERR_NOT_FINITE": "NaN or infinite", "TB_ERR_DIM": "is < 1", "TB_ERR_NULL_ARG": "pointer argument is NULL",
       "TB_ERR_OUTPUT_SIZE": "output buffer is shorter", "TB_ERR_OVERFLOW": "does not fit in size_t",
       "TB_ERR_OVERLAP": "overlaps another buffer"}

BAD = [
    ("data one byte short", _shorten("data"), "TB_ERR_DATA_SIZE"),
    ("data one block short", _shorten("data", 34), "TB_ERR_DATA_SIZE"),
    ("data longer than the shape", _set(d_out=2), "TB_ERR_DATA_SIZE"),
    ("d_in not a multiple of 32", _set(d_in=48), "TB_ERR_BLOCK"),
    ("d_in 16", _set(d_in=16), "TB_ERR_BLOCK"),
    ("d_in 0", _set(d_in=0), "TB_ERR_DIM"),
    ("d_out -1", _set(d_out=-1), "TB_ERR_DIM"),
    ("format 3", _set(fmt=3), "TB_ERR_FORMAT"),
    ("format -1", _set(fmt=-1), "TB_ERR_FORMAT"),
    ("NaN scale", with_scale(0x7E00), "TB_ERR_NOT_FINITE"),
    ("+Inf scale", with_scale(0x7C00), "TB_ERR_NOT_FINITE"),
    ("-Inf scale", with_scale(0xFC00), "TB_ERR_NOT_FINITE"),
    ("signalling NaN scale", with_scale(0x7C01), "TB_ERR_NOT_FINITE"),
    ("output one double short", _shorten("out"), "TB_ERR_OUTPUT_SIZE"),
    ("NULL output", _set(out=None), "TB_ERR_NULL_ARG"),
    ("NULL data", _set(data=None), "TB_ERR_NULL_ARG"),
    ("d_in * d_out overflows", _set(d_in=2**61, d_out=2**61), "TB_ERR_OVERFLOW"),
    ("data inside the output", _overlap, "TB_ERR_OVERLAP"),
]


@pytest.mark.parametrize("change, want", [(c, w) for _, c, w in BAD], ids=[d for d, _, _ in BAD])
def test_bad_argument_is_a_c_error_and_writes_nothing(change, want):
    data, out = good_q8()
    args = dict(out=out, data=data, fmt=cb.format_code("int8"), d_in=64, d_out=3)
    cb.dequantize_raw(**args)                            # the good call succeeds
    out[...] = SENTINEL
    change(args)
    with pytest.raises(cb.CRefError) as e:
        cb.dequantize_raw(**args)
    assert isinstance(e.value, ValueError)
    assert e.value.name == want and e.value.function == "tb_dequantize", str(e.value)
    assert f"tb_dequantize() failed with {want}" in str(e.value) and MSG[want] in str(e.value)
    assert np.all(out == SENTINEL)


@pytest.mark.parametrize("value", [0x7FC0, 0x7F80, 0xFF80, 0xFFFF])
def test_bf16_nan_or_inf_is_refused(value):
    data = np.full((2, 32), 0x3F80, np.uint16)           # 1.0 everywhere, then one NaN or Inf
    data[1, 31] = value
    out = np.full((32, 2), SENTINEL)
    with pytest.raises(cb.CRefError, match="NaN or infinite") as e:
        cb.dequantize_raw(out, data.astype("<u2").view(np.uint8).reshape(-1), cb.format_code("bf16"), 32, 2)
    assert e.value.name == "TB_ERR_NOT_FINITE" and np.all(out == SENTINEL)


def test_python_side_refusals():
    with pytest.raises(ValueError, match=r"stored formats \('bf16', 'int8', 'int4'\), got 'fp32'"):
        cb.format_code("fp32")
    out = np.empty((32, 1))
    with pytest.raises(TypeError, match="data: raw C calls take C-contiguous uint8"):
        cb.dequantize_raw(out, np.zeros(34, np.int8), cb.format_code("int8"), 32, 1)
    with pytest.raises(ValueError, match=r"lens\['data'\]=35 must be between 0 and the array's size 34"):
        cb.dequantize_raw(out, np.zeros(34, np.uint8), cb.format_code("int8"), 32, 1, lens={"data": 35})


def test_new_status_codes_are_named():
    codes = cb.status_codes()
    for name in ("TB_ERR_FORMAT", "TB_ERR_BLOCK", "TB_ERR_DATA_SIZE", "TB_ERR_NOT_FINITE"):
        assert name in codes and codes[name] > 0
    assert len(codes) == len(set(codes.values()))


# ---------------------------------------------------------------------------------------
# backend "c" on quantized weights against the oracle on the same weights

def compare_to_oracle(H, weights, cfg):
    """Max relative error of every trace array (and the output) of C against the oracle."""
    got_out, got = tblock.forward(H, weights, cfg, backend="c", trace=True)
    want_out, want = tblock.forward(H, weights, cfg, backend="numpy", trace=True)
    errs = {name: rel_err(getattr(got, name), getattr(want, name)) for name in TRACE_NAMES}
    errs["output"] = rel_err(got_out, want_out)
    return errs


@st.composite
def block_cases(draw):
    n_heads = draw(st.sampled_from([1, 2, 4, 8]))
    d_model = 32 * draw(st.integers(1, 3))
    return dict(fmt=draw(st.sampled_from(STORED)), B=draw(st.integers(1, 3)),
                T=draw(st.sampled_from([1, 2, 5, 17, 40])), d_model=d_model,
                n_heads=n_heads, d_ff=32 * draw(st.integers(1, 4)),
                norm=draw(st.sampled_from(["pre", "post"])),
                activation=draw(st.sampled_from(["gelu_tanh", "gelu_erf", "relu"])),
                causal=draw(st.booleans()), ffn_bias=draw(st.booleans()), ln_affine=draw(st.booleans()),
                attn_bias=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


def make_block(case):
    cfg = tblock.BlockConfig(d_model=case["d_model"], n_heads=case["n_heads"], d_ff=case["d_ff"],
                             causal=case["causal"], norm=case["norm"], activation=case["activation"],
                             ffn_bias=case["ffn_bias"], ln_affine=case["ln_affine"], attn_bias=case["attn_bias"])
    rng = np.random.default_rng(case["seed"])
    return cfg, tblock.quantize(random_weights(cfg, rng), case["fmt"]), rng


def _case(**kw):
    base = dict(fmt="int8", B=1, T=1, d_model=32, n_heads=1, d_ff=32, norm="pre", activation="gelu_tanh",
                causal=True, ffn_bias=False, ln_affine=False, attn_bias=False, seed=0)
    base.update(kw)
    return base


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=block_cases())
@example(case=_case())
@example(case=_case(fmt="int4", B=3, T=17, d_model=96, n_heads=8, d_ff=128, norm="post", causal=False,
                    ffn_bias=True, ln_affine=True, attn_bias=True))
@example(case=_case(fmt="bf16", B=2, T=40, d_model=64, n_heads=2, d_ff=64, activation="relu",
                    ffn_bias=True))
def test_c_on_quantized_weights_matches_oracle(case):
    cfg, weights, rng = make_block(case)
    assert weights.quantized and weights.format == case["fmt"]
    H = rng.standard_normal((case["B"], case["T"], case["d_model"]))
    errs = compare_to_oracle(H, weights, cfg)
    worst = max(errs, key=errs.get)
    assert errs[worst] < TOL, f"{worst}: relative error {errs[worst]:.3g} ({errs})"


@pytest.mark.parametrize("fmt", STORED)
def test_c_on_quantized_weights_matches_dequantized_float64_weights(fmt):
    """The oracle on float64 weights built from tblock.formats.dequantize, the quantized
    weights left out of it: the same rows, so the C backend's weights are those values."""
    cfg, weights, rng = make_block(_case(fmt=fmt, B=2, T=6, d_model=64, n_heads=4, d_ff=96,
                                         ffn_bias=True, ln_affine=True, attn_bias=True, seed=11))
    as_float = {name: (numpy_dequantize(a) if isinstance(a, QuantizedMatrix) else a.astype(np.float64))
                for name, a in weights.arrays().items()}
    H = rng.standard_normal((2, 6, 64))
    want = tblock.forward(H, tblock.BlockWeights(**as_float), cfg, backend="numpy")
    assert rel_err(tblock.forward(H, weights, cfg, backend="c"), want) < TOL


@pytest.mark.parametrize("fmt", STORED)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_kv_cache_on_quantized_weights(fmt, norm):
    """A prefix, then one token at a time, through the C cache path: the rows the oracle's
    full forward gives."""
    cfg, weights, rng = make_block(_case(fmt=fmt, B=2, d_model=64, n_heads=4, d_ff=64, norm=norm,
                                         ffn_bias=True, ln_affine=True, attn_bias=True, seed=5))
    N, p = 9, 4
    H = rng.standard_normal((2, N, 64))
    cache = tblock.KVCache(cfg, max_T=N, batch=2, dtype=np.float64)
    got = [tblock.forward(H[:, :p], weights, cfg, backend="c", cache=cache)]
    got += [tblock.forward(H[:, t:t + 1], weights, cfg, backend="c", cache=cache) for t in range(p, N)]
    want = tblock.forward(H, weights, cfg, backend="numpy")
    assert rel_err(np.concatenate(got, axis=1), want) < TOL


def test_component_ffn_on_quantized_weights():
    cfg, weights, rng = make_block(_case(fmt="int4", d_model=64, d_ff=96, ffn_bias=True, seed=8))
    cs = cb.components(cfg, weights, np.float64)
    X = rng.standard_normal((5, 64))
    assert rel_err(cs.fns["ffn"](X), oracle.ffn(X, weights.float_arrays(np.float64), cfg, {})) < TOL


# ---------------------------------------------------------------------------------------
# the C backend reads the bytes itself: no Python dequantization on its path

def _refuse(*_a, **_k):
    raise AssertionError("the C backend called a Python dequantizer")


@pytest.mark.parametrize("fmt", STORED)
def test_c_backend_does_not_call_python_dequantizers(monkeypatch, fmt):
    cfg, weights, rng = make_block(_case(fmt=fmt, B=2, T=3, d_model=64, n_heads=2, d_ff=64, seed=9))
    H = rng.standard_normal((2, 3, 64))
    want = tblock.forward(H, weights, cfg, backend="numpy")
    assert ("c_ref", "float64") not in weights.prepared_state
    monkeypatch.setattr(formats, "dequantize", _refuse)
    monkeypatch.setattr(QuantizedMatrix, "dequantize", _refuse)
    monkeypatch.setattr(tblock.BlockWeights, "matrix", _refuse)
    monkeypatch.setattr(tblock.BlockWeights, "float_arrays", _refuse)
    assert rel_err(tblock.forward(H, weights, cfg, backend="c"), want) < TOL
    cache = tblock.KVCache(cfg, max_T=3, batch=2, dtype=np.float64)
    assert rel_err(tblock.forward(H, weights, cfg, backend="c", cache=cache), want) < TOL


def test_a_python_unpacking_bug_shows_against_c(monkeypatch):
    """Swap Q4_0's nibble halves in tblock.formats: the oracle moves, C does not."""
    cfg, weights, rng = make_block(_case(fmt="int4", d_model=64, n_heads=2, d_ff=64, seed=10))
    H = rng.standard_normal((4, 64))
    right = tblock.forward(H, weights, cfg, backend="numpy")
    real = formats.dequantize

    def swapped(fmt, data, shape):
        d_in, d_out = shape
        blocks = data.reshape(d_out, d_in // 32, 18).copy()
        blocks[..., 2:] = (blocks[..., 2:] >> 4) | (blocks[..., 2:] << 4)
        return real(fmt, blocks.reshape(data.shape), shape)

    monkeypatch.setattr(formats, "dequantize", swapped)
    wrong = tblock.forward(H, weights, cfg, backend="numpy")
    got = tblock.forward(H, weights, cfg, backend="c")
    assert rel_err(got, right) < TOL and rel_err(got, wrong) > 1e-3
