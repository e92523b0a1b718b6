"""Attention-projection biases (b_q, b_k, b_v, b_o; issue #16) on every backend.

Expected values come from properties of the equations, not from the code under test:
  * b_k adds q_t . b_k to every score of row t: the softmax does not change, so the
    output is the bias-free one;
  * b_v shifts every head output by its slice of b_v (each row of A sums to 1), so A_out
    shifts by b_v @ W_O;
  * b_o shifts A_out, and with Pre-LN H_mid, by exactly b_o;
and the random fuzz (test_numba_block, test_properties, test_c_ref) compares against the
oracle with the biases drawn among the other flags.
"""

import numpy as np
import pytest

import tblock

from conftest import rel_err

pytestmark = pytest.mark.isa

BACKENDS = tblock.available_backends()
GPT2_SMALL = tblock.BlockConfig(d_model=768, n_heads=12, ffn_bias=True, ln_affine=True, attn_bias=True)


def with_biases(weights, **biases):
    """The worked example's weights plus attention biases (zeros unless given)."""
    d = weights.w_q.shape[0]
    a = weights.arrays()
    for name in ("b_q", "b_k", "b_v", "b_o"):
        a[name] = np.asarray(biases.get(name, np.zeros(d)), dtype=np.float64)
    return tblock.BlockWeights(**a)


@pytest.fixture(scope="module")
def example():
    ex = tblock.load_worked_example()
    cfg = tblock.BlockConfig(**{**ex.cfg.__dict__, "attn_bias": True})
    return ex, cfg


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_biases_reproduce_the_lesson(example, backend):
    ex, cfg = example
    out = tblock.forward(ex.H_in, with_biases(ex.weights), cfg, backend=backend)
    assert rel_err(out, ex.expected["H_out"]) < 1e-12
    assert np.linalg.norm(out) == pytest.approx(tblock.LESSON_PRINTED["norm_H_out"], rel=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_key_bias_leaves_attention_unchanged(example, backend):
    ex, cfg = example
    b_k = np.random.default_rng(0).standard_normal(cfg.d_model) * 3
    out, tr = tblock.forward(ex.H_in, with_biases(ex.weights, b_k=b_k), cfg, backend=backend, trace=True)
    assert rel_err(out, ex.expected["H_out"]) < 1e-12
    assert rel_err(tr.K, ex.expected["K"] + b_k) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_value_and_output_biases_shift_the_stream(example, backend):
    ex, cfg = example
    rng = np.random.default_rng(1)
    b_v, b_o = rng.standard_normal(cfg.d_model), rng.standard_normal(cfg.d_model)
    _, tr = tblock.forward(ex.H_in, with_biases(ex.weights, b_v=b_v, b_o=b_o), cfg, backend=backend, trace=True)
    assert rel_err(tr.out_concat, ex.expected["out_concat"] + b_v) < 1e-12
    want_A_out = ex.expected["A_out"] + b_v @ ex.weights.w_o + b_o
    assert rel_err(tr.A_out, want_A_out) < 1e-12
    assert rel_err(tr.H_mid, ex.H_in + want_A_out) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_query_bias_enters_the_scores(example, backend):
    # Q + b_q: the scores move, so the probabilities do; compare with the oracle's equations
    # written out here for head 1 (columns 0..3)
    ex, cfg = example
    b_q = np.random.default_rng(2).standard_normal(cfg.d_model)
    _, tr = tblock.forward(ex.H_in, with_biases(ex.weights, b_q=b_q), cfg, backend=backend, trace=True)
    Q = ex.expected["Q"] + b_q
    S = Q[:, :4] @ ex.expected["K"][:, :4].T / 2.0           # d_k = 4
    S[np.triu_indices(4, 1)] = -np.inf
    A = np.exp(S - S.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    assert rel_err(tr.A[0], A) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-6), (np.float64, 1e-12)])
@pytest.mark.parametrize("shape", [(1, 1), (2, 37), (1, 300)])      # tiny, odd, tiled attention
def test_random_biases_match_the_oracle(backend, dtype, tol, shape):
    B, T = shape
    cfg = tblock.BlockConfig(d_model=40, n_heads=5, ffn_bias=True, ln_affine=True, attn_bias=True)
    rng = np.random.default_rng(T)
    a = tblock.init_weights(cfg, seed=3, dtype=np.float64).arrays()
    for name in ("b_q", "b_k", "b_v", "b_o"):
        a[name] = rng.standard_normal(40).astype(np.float32).astype(np.float64)
    w = tblock.BlockWeights(**a)
    H = rng.standard_normal((B, T, 40)).astype(dtype)
    want = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy")
    assert rel_err(tblock.forward(H, w, cfg, backend=backend), want) < tol


def test_parameter_count_of_a_gpt2_small_block():
    assert tblock.param_count(GPT2_SMALL) == 7_087_872
    assert tblock.param_breakdown(GPT2_SMALL)["attn_bias"] == 4 * 768
    lesson = tblock.BlockConfig(d_model=8, n_heads=2)
    assert tblock.param_count(lesson) == 808 and tblock.param_count(lesson, ln_affine=True) == 840
    w = tblock.init_weights(GPT2_SMALL, seed=0)
    assert sum(a.size for a in w.arrays().values()) == 7_087_872


def test_flops_count_the_bias_adds():
    plain = tblock.flops(tblock.BlockConfig(d_model=16, n_heads=2), 8)
    biased = tblock.flops(tblock.BlockConfig(d_model=16, n_heads=2, attn_bias=True), 8)
    assert biased.full["qkv"] - plain.full["qkv"] == 3 * 8 * 16
    assert biased.full["out_proj"] - plain.full["out_proj"] == 8 * 16


def test_init_weights_gives_zero_biases():
    w = tblock.init_weights(tblock.BlockConfig(d_model=8, n_heads=2, attn_bias=True), seed=0)
    for name in ("b_q", "b_k", "b_v", "b_o"):
        assert getattr(w, name).shape == (8,) and not getattr(w, name).any()
    assert w.has_attn_bias


# ---------------------------------------------------------------------------- bad input

def test_biases_must_come_together():
    a = tblock.init_weights(tblock.BlockConfig(d_model=8, n_heads=2), seed=0).arrays()
    with pytest.raises(ValueError, match="b_q, b_k, b_v must be given together, got only b_q"):
        tblock.BlockWeights(**a, b_q=np.zeros(8), b_o=np.zeros(8))


def test_config_and_weights_must_agree():
    cfg = tblock.BlockConfig(d_model=8, n_heads=2)
    biased = tblock.BlockConfig(d_model=8, n_heads=2, attn_bias=True)
    H = np.zeros((3, 8))
    with pytest.raises(ValueError, match="cfg.attn_bias=True asks for b_q/b_k/b_v/b_o but the weights have none"):
        tblock.forward(H, tblock.init_weights(cfg, seed=0), biased)
    with pytest.raises(ValueError, match="cfg.attn_bias=False asks for no biases but the weights have b_q/b_k/b_v/b_o"):
        tblock.forward(H, tblock.init_weights(biased, seed=0), cfg)


def test_bias_shape_dtype_and_values_are_checked():
    cfg = tblock.BlockConfig(d_model=8, n_heads=2, attn_bias=True)
    a = tblock.init_weights(cfg, seed=0).arrays()
    with pytest.raises(ValueError, match=r"weights.b_v must have shape \(8,\) for d_model=8"):
        tblock.BlockWeights(**{**a, "b_v": np.zeros(9, np.float32)}).check(cfg)
    with pytest.raises(ValueError, match="b_o must be 1-D"):
        tblock.BlockWeights(**{**a, "b_o": np.zeros((1, 8), np.float32)})
    with pytest.raises(TypeError, match="b_k must have dtype float32 or float64, got int64"):
        tblock.BlockWeights(**{**a, "b_k": np.zeros(8, np.int64)})
    with pytest.raises(ValueError, match="b_q must be finite, found nan at index"):
        tblock.BlockWeights(**{**a, "b_q": np.full(8, np.nan, np.float32)})
    with pytest.raises(TypeError, match="attn_bias must be True, False or 'qkv', got int 1"):
        tblock.BlockConfig(d_model=8, n_heads=2, attn_bias=1)
