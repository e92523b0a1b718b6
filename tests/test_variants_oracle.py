"""The block variants of the models in use today (RMSNorm, the gated FFN, rotary positions,
grouped-query attention, Q/K/V biases without b_o) in the numpy oracle, checked against what
each variant means rather than against another implementation of it (tests/interop compares
whole models with transformers; tests/test_c_variants.py and test_numba_variants.py compare
the other backends with this oracle), and their parameter and FLOP counts."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tblock
from tblock.backends import numpy as oracle

RNG = np.random.default_rng(0)


def cfg_of(**kw):
    return tblock.BlockConfig(**{"d_model": 32, "n_heads": 4, "d_ff": 48, **kw})


def random_weights(cfg, seed=0):
    """init_weights with every bias and gain moved off 0 and 1."""
    rng = np.random.default_rng(seed)
    a = tblock.init_weights(cfg, seed).arrays()
    for n, v in a.items():
        if v.ndim == 1:
            a[n] = (1.0 if "gamma" in n else 0.0) + 0.3 * rng.standard_normal(v.shape)
    return tblock.BlockWeights(**a)


def run(H, w, cfg):
    return tblock.forward(H, w, cfg, backend="numpy", trace=True)


# ---------------------------------------------------------------------------- RMSNorm

def test_rmsnorm_equals_layernorm_on_rows_of_mean_zero():
    X = RNG.standard_normal((5, 16))
    X -= X.mean(axis=1, keepdims=True)          # then mean(x^2) is the population variance
    g = RNG.standard_normal(16)
    np.testing.assert_allclose(oracle.rmsnorm(X, g, 1e-5), oracle.layernorm(X, g, np.zeros(16), 1e-5), rtol=1e-13)


def test_rmsnorm_rows_have_unit_root_mean_square():
    X = 3.0 + RNG.standard_normal((4, 64))      # a mean RMSNorm keeps
    Y = oracle.rmsnorm(X, eps=0.0)
    np.testing.assert_allclose(np.sqrt((Y ** 2).mean(axis=1)), 1.0, rtol=1e-14)
    assert (Y.mean(axis=1) > 0.5).all()         # LayerNorm would have made it 0


def test_an_rmsnorm_block_has_gammas_only():
    cfg = cfg_of(norm_type="rmsnorm", ln_affine=True)
    w = tblock.init_weights(cfg, 0)
    assert w.ln1_gamma is not None and w.ln1_beta is None
    with pytest.raises(ValueError, match="RMSNorm has gamma only"):
        tblock.forward(np.zeros((2, 32)), tblock.init_weights(cfg_of(ln_affine=True), 0), cfg, backend="numpy")


# ---------------------------------------------------------------------------- gated FFN

def test_gated_ffn_is_silu_gate_times_up_projection():
    cfg = cfg_of(ffn="gated", activation="silu", ffn_bias=True)
    w = random_weights(cfg)
    X = RNG.standard_normal((3, 32))
    gate = X @ w.w_gate + w.b_gate
    want = (gate / (1 + np.exp(-gate)) * (X @ w.w_ff1 + w.b_ff1)) @ w.w_ff2 + w.b_ff2
    np.testing.assert_allclose(oracle.ffn(X, oracle.weight_arrays(w), cfg, {}), want, rtol=1e-12)


def test_a_zero_gate_leaves_the_output_bias():
    cfg = cfg_of(ffn="gated", activation="silu", ffn_bias=True)
    a = random_weights(cfg).arrays()
    a.update(w_gate=np.zeros_like(a["w_gate"]), b_gate=np.zeros_like(a["b_gate"]))   # silu(0) = 0
    out = oracle.ffn(RNG.standard_normal((3, 32)), oracle.weight_arrays(tblock.BlockWeights(**a)), cfg, {})
    np.testing.assert_array_equal(out, np.broadcast_to(a["b_ff2"], out.shape))


# ---------------------------------------------------------------------------- rotary

def test_rotary_is_the_identity_at_position_zero_and_keeps_lengths():
    cfg = cfg_of(positions="rotary")
    X = RNG.standard_normal((6, 32))
    np.testing.assert_array_equal(oracle.rotary(X[:1], [0], cfg), X[:1])
    Y = oracle.rotary(X, np.arange(6), cfg)
    pairs = lambda M: M.reshape(6, 4, 2, 4)     # (T, head, half, j): pair j is (half 0, half 1)
    np.testing.assert_allclose(np.hypot(*pairs(Y).transpose(2, 0, 1, 3)), np.hypot(*pairs(X).transpose(2, 0, 1, 3)),
                               rtol=1e-13)


@given(t=st.integers(0, 500), s=st.integers(0, 500), shift=st.integers(1, 300))
@settings(max_examples=30, deadline=None)
def test_rotary_scores_depend_on_the_distance_only(t, s, shift):
    """q(t) . k(s) = q(t + n) . k(s + n): rotary's reason to exist."""
    cfg = cfg_of(positions="rotary", rope_theta=500.0)
    q, k = RNG.standard_normal((1, 32)), RNG.standard_normal((1, 32))
    dot = lambda a, b: oracle.rotary(q, [a], cfg)[0, :8] @ oracle.rotary(k, [b], cfg)[0, :8]
    assert dot(t, s) == pytest.approx(dot(t + shift, s + shift), rel=1e-9, abs=1e-9)


def test_rotary_pairs_column_j_with_j_plus_half_at_the_hf_frequencies():
    cfg = cfg_of(d_model=8, n_heads=1, positions="rotary", rope_theta=100.0, rope_scale=2.0)
    x = np.zeros((1, 8))
    x[0, 1] = 1.0                               # pair j = 1: columns 1 and 5
    angle = 7 / 2.0 * 100.0 ** (-2 / 8)
    np.testing.assert_allclose(oracle.rotary(x, [7], cfg)[0], [0, np.cos(angle), 0, 0, 0, np.sin(angle), 0, 0],
                               atol=1e-15)


# ---------------------------------------------------------------------------- grouped-query attention

@pytest.mark.parametrize("n_kv", [1, 2])
def test_gqa_equals_mha_with_each_kv_head_repeated(n_kv):
    """Widening W_K and W_V by repeating each K/V head's columns for its group is MHA."""
    cfg = cfg_of(n_kv_heads=n_kv, positions="rotary", attn_bias="qkv")
    w = random_weights(cfg)
    d_k, group = cfg.d_k, cfg.group
    cols = np.concatenate([np.arange(h // group * d_k, (h // group + 1) * d_k) for h in range(cfg.n_heads)])
    a = w.arrays()
    a.update(w_k=a["w_k"][:, cols], w_v=a["w_v"][:, cols], b_k=a["b_k"][cols], b_v=a["b_v"][cols])
    mha = dataclasses.replace(cfg, n_kv_heads=None)
    H = RNG.standard_normal((2, 7, 32))
    np.testing.assert_allclose(run(H, w, cfg)[0], run(H, tblock.BlockWeights(**a), mha)[0], rtol=1e-12)


def test_qkv_biases_without_b_o():
    cfg = cfg_of(attn_bias="qkv")
    w = tblock.init_weights(cfg, 0)
    assert w.b_q is not None and w.b_o is None and cfg.qkv_bias and not cfg.out_bias
    with pytest.raises(ValueError, match="asks for b_q/b_k/b_v but the weights have b_q/b_k/b_v/b_o"):
        tblock.forward(np.zeros((2, 32)), tblock.init_weights(cfg_of(attn_bias=True), 0), cfg, backend="numpy")


def test_the_cache_holds_the_kv_heads_only():
    cfg = cfg_of(n_kv_heads=1, positions="rotary")
    w = random_weights(cfg)
    H = RNG.standard_normal((2, 6, 32))
    cache = tblock.KVCache(cfg, 8, batch=2, dtype=np.float64)
    tblock.forward(H[:, :4], w, cfg, backend="numpy", cache=cache)
    tblock.forward(H[:, 4:], w, cfg, backend="numpy", cache=cache)
    _, tr = run(H, w, cfg)
    np.testing.assert_allclose(cache.keys(), tr.K, rtol=1e-13)      # (2, 6, d_kv): rotated keys
    assert cache.keys().shape == (2, 6, 8)


# ---------------------------------------------------------------------------- config checks

@pytest.mark.parametrize("kw,message", [
    (dict(n_kv_heads=3), "n_kv_heads must divide n_heads"),
    (dict(n_kv_heads=0), "n_kv_heads must be >= 1"),
    (dict(d_model=12, n_heads=4, positions="rotary"), "d_model // n_heads must be even"),
    (dict(positions="alibi"), "positions must be one of"),
    (dict(ffn="moe"), "ffn must be one of"),
    (dict(norm_type="batchnorm"), "norm_type must be one of"),
    (dict(attn_bias="qk"), "attn_bias must be True, False or .qkv."),
    (dict(rope_theta=0.0), "rope_theta must be positive"),
    (dict(rope_scale=float("nan")), "rope_scale must be positive"),
])
def test_bad_variant_options_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        cfg_of(**kw)


def test_the_lessons_block_is_the_default():
    cfg = tblock.BlockConfig(d_model=8, n_heads=2)
    assert cfg.lesson_block and cfg.kv_heads == 2 and cfg.d_kv == 8 and cfg.n_kv_heads is None
    assert dataclasses.replace(cfg, n_heads=4).kv_heads == 4       # MHA stays MHA


# ---------------------------------------------------------------------------- counts

def test_param_count_matches_the_weights_held():
    for kw in (dict(n_kv_heads=2, ffn="gated", norm_type="rmsnorm", ln_affine=True, attn_bias="qkv"),
               dict(n_kv_heads=1, ffn="gated", ffn_bias=True, attn_bias=True, ln_affine=True),
               dict(ffn_bias=True, ln_affine=True, attn_bias=True)):
        cfg = cfg_of(**kw)
        held = sum(a.size for a in tblock.init_weights(cfg, 0).arrays().values())
        missing_ffn_bias = 0 if cfg.ffn_bias else tblock.param_breakdown(cfg)["ffn_bias"]
        assert tblock.param_count(cfg) == held + missing_ffn_bias, kw     # the lesson counts FFN biases always


def test_smollm2_135m_has_its_published_parameter_count():
    """SmolLM2-135M: 134,515,008 parameters (30 blocks, d 576, 9/3 heads, d_ff 1536, tied vocab 49152)."""
    cfg = tblock.BlockConfig(d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536, norm_type="rmsnorm", ffn="gated",
                             activation="silu", positions="rotary", ln_affine=True)
    per_block = tblock.param_count(cfg) - tblock.param_breakdown(cfg)["ffn_bias"]    # no FFN biases
    assert 30 * per_block + 49152 * 576 + 576 == 134_515_008


def test_crossover_of_the_gated_ffn():
    cfg = cfg_of(ffn="gated", activation="silu", n_kv_heads=2)
    for T in (8, 64):
        fc = tblock.flops(cfg, T)
        assert fc.ffn_matmul_flops == 6 * T * 32 * 48
        assert fc.full["scores"] + fc.full["av"] == 4 * T * T * 32          # GQA: every query head still scores
    T = int(tblock.crossover_T(cfg))
    fc = tblock.flops(cfg, T)
    assert fc.full["scores"] + fc.full["av"] == fc.ffn_matmul_flops         # T = 1.5 d_ff
    Tc = int(tblock.crossover_T(cfg, causal=True))
    fc = tblock.flops(cfg, Tc)
    assert fc.causal["scores"] + fc.causal["av"] == fc.ffn_matmul_flops     # T = 3 d_ff - 1
    assert tblock.flops(cfg, 4).full["qkv"] == 2 * 4 * 32 * (32 + 2 * 16)   # K, V: d_kv = 16 columns


def test_the_torch_reference_refuses_the_variants():
    pytest.importorskip("torch", reason="the torch backend needs torch (make test-interop installs it)")
    cfg = cfg_of(norm_type="rmsnorm")
    with pytest.raises(ValueError, match="nanoGPT's Block, the lesson's block only"):
        tblock.forward(np.zeros((2, 32)), tblock.init_weights(cfg, 0), cfg, backend="torch")
