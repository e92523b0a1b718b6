"""The "dot" option of stored weights: products computed on inputs rounded to int8 blocks.

With dot="int8" (int8 and int4 weights), every product x @ W first rounds each row x, per
block of 32 inputs, to d * q: amax = max |x|, d = amax / 127 and q = rint(x * (127 / amax))
in float32, ties to even (tblock.formats).  The rule is written once more here, an input at
a time with Python's own round() (ties to even too), and checked against the oracle's numpy
code and the C reference's C code on the same inputs, bit for bit; then the whole block on
both, against each other, to 1e-12 relative as for the other stored-weight paths.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tblock
from tblock.backends import c as cb
from tblock.backends import numpy as oracle
from tblock.formats import QuantizedMatrix, quantize_matrix, round_inputs

from conftest import random_weights, rel_err
from test_formats import bf16_nearest

TOL = 1e-12


def rounded_by_hand(x: np.ndarray) -> np.ndarray:
    """The rule, an input at a time: float32 arithmetic on numpy scalars, Python's round()."""
    out = []
    for block in np.asarray(x, np.float32).reshape(-1, 32):
        amax = max(abs(v) for v in block)
        if amax == 0 or amax < np.float32(127) / np.finfo(np.float32).max:   # 127 / amax would overflow
            out += [0.0] * 32
            continue
        d, inv = amax / np.float32(127), np.float32(127) / amax      # float32 scalars
        out += [float(d) * round(float(v * inv)) for v in block]
    return np.array(out).reshape(x.shape)


def test_rounding_by_hand():
    # amax 127: d = 1 and x * 127/amax = x, so each input rounds to its nearest integer, ties to even
    x = np.zeros(32)
    x[:8] = [127, 63.5, 62.5, -0.5, 0.5, 1.5, -2.5, 3.49]
    want = np.zeros(32)
    want[:8] = [127, 64, 62, 0, 0, 2, -2, 3]
    assert np.array_equal(round_inputs(x[None], "int8")[0], want)
    # a zero block stays zero; a block of one value v is -127 * d, d = |v| / 127 in float32
    assert np.array_equal(round_inputs(np.zeros((2, 64)), "int8"), np.zeros((2, 64)))
    d = float(np.float32(0.3) / np.float32(127))
    assert np.array_equal(round_inputs(np.full((1, 32), -0.3), "int8"), np.full((1, 32), -127 * d))
    # fp32 leaves the rows alone, the very array
    assert round_inputs(x, "fp32") is x


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), blocks=st.integers(1, 4),
       scale=st.sampled_from([1e-40, 1e-37, 1e-30, 1e-3, 1.0, 1e3, 1e30]))
def test_oracle_rounding_equals_the_rule(seed, rows, blocks, scale):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 32 * blocks)) * scale
    x[:, :32] *= rng.integers(0, 2, (rows, 32))         # zeros inside a block
    if blocks > 1:
        x[:, 32:64] = 0.0                               # a block of zeros
    assert np.array_equal(round_inputs(x, "int8"), rounded_by_hand(x))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-40, 1e-38, 1e-30, 1e-3, 1.0, 1e3, 1e30]))
def test_bf16_rounding_of_inputs(seed, scale):
    x = np.random.default_rng(seed).standard_normal((3, 40)) * scale
    x32 = x.astype(np.float32)
    x32[np.abs(x32) < 2.0 ** -126] = 0.0                  # subnormals count as zero, as in vdpbf16ps
    want = (bf16_nearest(x32).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(round_inputs(x, "bf16"), want.astype(np.float64))
    d = 40
    cfg = tblock.BlockConfig(d, 1, d_ff=d, activation="relu")
    eye, zero = np.eye(d), np.zeros((d, d))
    w = tblock.quantize(tblock.BlockWeights(w_q=zero, w_k=zero, w_v=zero, w_o=zero, w_ff1=eye, w_ff2=eye),
                        "bf16", dot="bf16")                          # I and 0 are exact in bf16
    F = [np.full((3, d), np.nan) for _ in range(3)]
    cb.ffn_raw(F[0], F[1], F[2], x, 3, cb.config_fields(cfg, "bf16"), cb._float64_weights(w))
    assert np.array_equal(F[1], want)


def test_bf16_dot_reads_subnormal_weights_as_zero():
    d = 32
    cfg = tblock.BlockConfig(d, 1, d_ff=d, activation="relu")
    zero = np.zeros((d, d))
    W1 = np.eye(d)
    W1[3, 3] = 2.0 ** -130                                  # a bf16 subnormal: the product skips it
    w = tblock.quantize(tblock.BlockWeights(w_q=zero, w_k=zero, w_v=zero, w_o=zero, w_ff1=W1, w_ff2=np.eye(d)),
                        "bf16", dot="bf16")
    assert w.w_ff1.dequantize(np.float64)[3, 3] == 2.0 ** -130        # stored exactly
    X = np.ones((1, d))
    want = np.ones((1, d))
    want[0, 3] = 0.0
    tr = {}
    oracle.ffn(X, oracle.weight_arrays(w), cfg, tr)
    assert np.array_equal(tr["F_pre"], want)
    F = [np.full((1, d), np.nan) for _ in range(3)]
    cb.ffn_raw(F[0], F[1], F[2], X, 1, cb.config_fields(cfg, "bf16"), cb._float64_weights(w))
    assert np.array_equal(F[1], want)


def identity_ffn(d):
    """A block whose FFN's F_pre is its input rows: W1 = I, so F_pre = round(X) @ I = round(X)."""
    cfg = tblock.BlockConfig(d, 1, d_ff=d, activation="relu")
    eye, zero = np.eye(d), np.zeros((d, d))
    w = tblock.BlockWeights(w_q=zero, w_k=zero, w_v=zero, w_o=zero, w_ff1=eye, w_ff2=eye)
    return cfg, tblock.quantize(w, "int4", dot="int8")     # exact in Q4_0: d = -1/8, 1 = d * (0 - 8)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 5), blocks=st.integers(1, 3),
       scale=st.sampled_from([1e-40, 3e-37, 1.0, 1e30]))
def test_c_and_oracle_round_each_input_as_the_rule_says(seed, T, blocks, scale):
    d = 32 * blocks
    cfg, w = identity_ffn(d)
    rng = np.random.default_rng(seed)
    # ties on purpose: multiples of amax / 254 land on .5 after the scaling
    X = np.where(rng.random((T, d)) < 0.3, rng.integers(-127, 128, (T, d)) / 254.0,
                 rng.standard_normal((T, d)))
    X[:, 0] = 1.0                                       # amax 1 in the first block
    X *= scale                                          # tiny: 127 / amax overflows, the block is zero
    want = rounded_by_hand(X)
    tr = {}
    oracle.ffn(X, oracle.weight_arrays(w), cfg, tr)
    assert np.array_equal(tr["F_pre"], want)
    F_out, F_pre, F_post = np.full((T, d), np.nan), np.full((T, d), np.nan), np.full((T, d), np.nan)
    cb.ffn_raw(F_out, F_pre, F_post, X, T, cb.config_fields(cfg, "int8"), cb._float64_weights(w))
    assert np.array_equal(F_pre, want)


@st.composite
def block_cases(draw):
    return dict(fmt=draw(st.sampled_from(["int8", "int4", "bf16"])), B=draw(st.integers(1, 2)),
                T=draw(st.sampled_from([1, 2, 7, 33])), d_model=32 * draw(st.integers(1, 3)),
                n_heads=draw(st.sampled_from([1, 2, 4])), d_ff=32 * draw(st.integers(1, 4)),
                norm=draw(st.sampled_from(["pre", "post"])), causal=draw(st.booleans()),
                biases=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


def make_block(case):
    b = case["biases"]
    cfg = tblock.BlockConfig(case["d_model"], case["n_heads"], d_ff=case["d_ff"], causal=case["causal"],
                             norm=case["norm"], ffn_bias=b, ln_affine=b, attn_bias=b)
    rng = np.random.default_rng(case["seed"])
    dot = "bf16" if case["fmt"] == "bf16" else "int8"
    return cfg, tblock.quantize(random_weights(cfg, rng), case["fmt"], dot=dot), rng


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=block_cases())
@example(case=dict(fmt="int4", B=2, T=17, d_model=96, n_heads=4, d_ff=128, norm="post", causal=False,
                   biases=True, seed=1))
@example(case=dict(fmt="int8", B=1, T=1, d_model=32, n_heads=1, d_ff=32, norm="pre", causal=True,
                   biases=False, seed=2))
@example(case=dict(fmt="bf16", B=1, T=7, d_model=64, n_heads=2, d_ff=32, norm="pre", causal=True,
                   biases=True, seed=3))
def test_c_block_with_rounding_dots_matches_oracle(case):
    cfg, w, rng = make_block(case)
    H = rng.standard_normal((case["B"], case["T"], cfg.d_model))
    got, got_tr = tblock.forward(H, w, cfg, backend="c", trace=True)
    want, want_tr = tblock.forward(H, w, cfg, backend="numpy", trace=True)
    assert rel_err(got, want) < TOL
    for name in ("Q", "A_out", "F_pre", "F_out"):
        assert rel_err(getattr(got_tr, name), getattr(want_tr, name)) < TOL, name


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_int8_dot_is_the_product_of_rounded_rows(fmt):
    """The oracle's dot="int8" block equals its fp32-dot block on the same weights fed rows
    already on the int8 grid of every block: a projection of a rounded row changes nothing."""
    cfg = tblock.BlockConfig(64, 2, d_ff=64, activation="relu")
    rng = np.random.default_rng(5)
    w = random_weights(cfg, rng)
    q_int8, q_fp32 = tblock.quantize(w, fmt, dot="int8"), tblock.quantize(w, fmt)
    X = round_inputs(rng.standard_normal((9, 64)), "int8")
    a, b = oracle.weight_arrays(q_int8), oracle.weight_arrays(q_fp32)
    assert np.array_equal(oracle.projections(X, a, cfg)[0], oracle.projections(X, b, cfg)[0])
    # and on rows off the grid the two differ, by about the rounding step
    X = rng.standard_normal((9, 64))
    diff = rel_err(oracle.projections(X, a, cfg)[0], oracle.projections(X, b, cfg)[0])
    assert 1e-5 < diff < 5e-2


def test_the_head_rounds_its_rows_too():
    rng = np.random.default_rng(3)
    E = rng.standard_normal((64, 100)).astype(np.float32)                 # (d, vocab)
    H = rng.standard_normal((1, 4, 64))
    ln_f = np.concatenate([np.ones(64), np.zeros(64)])
    from tblock.backends import reference_lm_head
    out = lambda head: reference_lm_head(H, ln_f, 1e-5, head, np.empty((1, 4, 100)))  # noqa: E731
    exact, rounded = out(quantize_matrix(E, "int8")), out(quantize_matrix(E, "int8", dot="int8"))
    Xn = (H - H.mean(-1, keepdims=True)) / np.sqrt(H.var(-1, keepdims=True) + 1e-5)
    want = rounded_by_hand(Xn.reshape(4, 64)) @ quantize_matrix(E, "int8").dequantize(np.float64)
    assert rel_err(rounded[0], want) < 1e-12 and rel_err(exact[0], want) > 1e-5


def test_dot_survives_pickling_and_shows_on_the_weights():
    import pickle
    cfg = tblock.BlockConfig(32, 1)
    w = tblock.quantize(tblock.init_weights(cfg, 0), "int4", dot="int8")
    assert w.dot == "int8" and w.format == "int4"
    back = pickle.loads(pickle.dumps(w))
    assert back.dot == "int8" and back.w_ff1.dot == "int8"
    assert tblock.quantize(tblock.init_weights(cfg, 0), "int8").dot == "fp32"
    assert tblock.init_weights(cfg, 0).dot == "fp32"


@pytest.mark.parametrize("call, error, words", [
    (lambda w: tblock.quantize(w, "bf16", dot="int8"), ValueError, "for bf16 weights"),
    (lambda w: tblock.quantize(w, "int8", dot="bf16"), ValueError, "for int8 weights"),
    (lambda w: tblock.quantize(w, "fp32", dot="int8"), ValueError, "for fp32 weights"),
    (lambda w: tblock.quantize(w, "int8", dot="int4"), ValueError, "dot must be one of"),
    (lambda w: tblock.quantize(w, "int8", dot=None), TypeError, "dot must be a str"),
    (lambda w: quantize_matrix(w.w_q, "int4", dot="bf16"), ValueError, "dot must be one of"),
    (lambda w: QuantizedMatrix("bf16", (32, 32), np.zeros((32, 32), np.uint16), "int8"), ValueError,
     "for bf16 weights"),
])
def test_bad_dots_are_refused(call, error, words):
    w = tblock.init_weights(tblock.BlockConfig(32, 1), 0)
    with pytest.raises(error, match=words):
        call(w)


def test_matrices_of_mixed_dots_are_refused():
    w = tblock.init_weights(tblock.BlockConfig(32, 1), 0)
    a = tblock.quantize(w, "int8", dot="int8").arrays()
    a["w_o"] = quantize_matrix(w.w_o, "int8")                               # dot fp32
    with pytest.raises(ValueError, match="share one format and dot"):
        tblock.BlockWeights(**a)


def test_c_refuses_a_dot_its_dimensions_cannot_take():
    cfg = tblock.BlockConfig(48, 1, d_ff=64)       # 48: not a multiple of 32
    fields = cb.config_fields(cfg, "int8")
    with pytest.raises(cb.CRefError) as e:
        cb.scratch_len(fields, 3)
    assert e.value.name == "TB_ERR_DOT"
    with pytest.raises(cb.CRefError) as e:
        cb.scratch_len(dict(fields, dot=7), 3)
    assert e.value.name == "TB_ERR_DOT"
