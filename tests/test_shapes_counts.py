"""Exercise 1 shapes, Post-LN shape, parameter counts, and FLOPs against a brute-force count."""

import numpy as np
import pytest

import tblock
from tblock.backends import numpy as oracle


def test_exercise1_shapes(backend, rng):
    cfg = tblock.BlockConfig(d_model=64, n_heads=8)
    w = tblock.init_weights(cfg, seed=1, dtype=np.float64)
    H_in = rng.standard_normal((16, 64))
    H_out, tr = tblock.forward(H_in, w, cfg, backend=backend, trace=True)
    assert H_out.shape == tr.H_mid.shape == tr.F_out.shape == (16, 64)
    assert tr.F_pre.shape == tr.F_post.shape == (16, 256)
    assert tr.A.shape == (8, 16, 16)          # only the per-head pieces depend on H
    assert tr.Q.shape == tr.K.shape == tr.V.shape == tr.out_concat.shape == (16, 64)


def test_post_ln_shape_and_normalised_rows(backend, rng):
    cfg = tblock.BlockConfig(d_model=64, n_heads=8, norm="post")
    w = tblock.init_weights(cfg, seed=2, dtype=np.float64)
    H_out, tr = tblock.forward(rng.standard_normal((16, 64)), w, cfg, backend=backend, trace=True)
    assert H_out.shape == (16, 64)
    # Post-LN ends on a LayerNorm: every output row has mean 0 and variance 1 - eps/(var+eps)
    np.testing.assert_allclose(H_out.mean(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(H_out.var(axis=1), 1.0, atol=1e-4)
    np.testing.assert_array_equal(tr.H_norm1, tr.H_mid)
    np.testing.assert_array_equal(tr.H_norm2, tr.H_out)


def test_batched_shapes(backend, rng):
    cfg = tblock.BlockConfig(d_model=12, n_heads=3, d_ff=20)
    w = tblock.init_weights(cfg, seed=3)
    H_out, tr = tblock.forward(rng.standard_normal((2, 5, 12)).astype(np.float32), w, cfg,
                               backend=backend, trace=True)
    assert H_out.shape == (2, 5, 12) and H_out.dtype == np.float32
    assert tr.A.shape == (2, 3, 5, 5) and tr.F_pre.shape == (2, 5, 20)


@pytest.mark.parametrize("d_model, d_ff, expected", [
    (8, 32, 808), (384, 1536, 1_771_392), (768, 3072, 7_081_728), (1, 4, 17)])
def test_param_count_formula(d_model, d_ff, expected):
    cfg = tblock.BlockConfig(d_model=d_model, n_heads=1, d_ff=d_ff)
    assert tblock.param_count(cfg) == expected
    # 12 d^2 + O(d): attention 4 d^2, FFN 8 d^2 when d_ff = 4 d
    assert expected == 4 * d_model**2 + 2 * d_model * d_ff + d_ff + d_model


def test_param_count_matches_the_weights_it_describes():
    cfg = tblock.BlockConfig(d_model=8, n_heads=2, ffn_bias=True, ln_affine=True)
    w = tblock.init_weights(cfg, seed=0)
    assert sum(a.size for a in w.arrays().values()) == tblock.param_count(cfg) == 840


def test_gpt2_small_attention_bias_gap():
    # GPT-2 small: 12 blocks of d_model 768 hold 85,054,464 parameters (with LN affines and
    # the Q, K, V, O biases); the lesson's convention leaves out exactly 12 * 4 * 768 of them
    cfg = tblock.BlockConfig(d_model=768, n_heads=12, ln_affine=True)
    ours = 12 * tblock.param_count(cfg)
    assert 85_054_464 - ours == 36_864 == 12 * 4 * 768


def _brute_force_matmul_flops(cfg, T, causal):
    """Walk the oracle's matmuls on a real input, counting 2*m*k*n from the operand shapes
    and, for the causal case, only the score entries the mask lets through."""
    w = tblock.init_weights(cfg, seed=0, dtype=np.float64).arrays()
    X = np.random.default_rng(0).standard_normal((T, cfg.d_model))
    mm = lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1]
    counts = {"qkv": sum(mm(X, w[k]) for k in ("w_q", "w_k", "w_v"))}
    kept = np.count_nonzero(oracle.causal_mask(T)) if causal else T * T
    per_head_scores = 2 * cfg.d_k * kept        # one d_k dot product per kept entry
    per_head_av = 2 * cfg.d_k * kept            # one d_k-wide axpy per kept entry
    counts["scores"] = cfg.n_heads * per_head_scores
    counts["av"] = cfg.n_heads * per_head_av
    counts["out_proj"] = mm(X, w["w_o"])
    F_pre = X @ w["w_ff1"]
    counts["ffn_up"] = mm(X, w["w_ff1"])
    counts["ffn_down"] = mm(F_pre, w["w_ff2"])
    return counts


@pytest.mark.parametrize("d_model, n_heads, d_ff, T", [(8, 2, 32, 4), (64, 8, 256, 16), (12, 3, 20, 7), (5, 1, 7, 1)])
def test_flops_against_brute_force(d_model, n_heads, d_ff, T):
    cfg = tblock.BlockConfig(d_model=d_model, n_heads=n_heads, d_ff=d_ff)
    fc = tblock.flops(cfg, T)
    for causal, table in ((False, fc.full), (True, fc.causal)):
        for k, v in _brute_force_matmul_flops(cfg, T, causal).items():
            assert table[k] == v, (k, causal)
    assert fc.ffn_matmul_flops == fc.full["ffn_up"] + fc.full["ffn_down"]
    assert fc.total(causal=True) < fc.total() or T == 1


def test_flops_default_config_and_crossover():
    cfg = tblock.BlockConfig(d_model=768, n_heads=12)
    fc = tblock.flops(cfg, 1024)
    d, T = 768, 1024
    assert fc.full["qkv"] + fc.full["out_proj"] + fc.ffn_matmul_flops == 24 * T * d * d
    assert fc.attention_core() == 4 * T * T * d
    assert fc.crossover_full == 4 * d                       # 4 T^2 d = 16 T d^2
    assert fc.crossover_causal == 8 * d - 1                 # 2 d T (T+1) = 16 T d^2
    at = tblock.flops(cfg, 4 * d)
    assert at.attention_core() == at.ffn_matmul_flops
    at = tblock.flops(cfg, 8 * d - 1)
    assert at.attention_core(causal=True) == at.ffn_matmul_flops
    below, above = tblock.flops(cfg, 4 * d - 1), tblock.flops(cfg, 4 * d + 1)
    assert below.attention_core() < below.ffn_matmul_flops < tblock.flops(cfg, 4 * d).attention_core() + 1
    assert above.attention_core() > above.ffn_matmul_flops


def test_flops_options_change_only_their_parts():
    base = tblock.flops(tblock.BlockConfig(d_model=16, n_heads=2), 8)
    bias = tblock.flops(tblock.BlockConfig(d_model=16, n_heads=2, ffn_bias=True), 8)
    relu = tblock.flops(tblock.BlockConfig(d_model=16, n_heads=2, activation="relu"), 8)
    assert bias.full["ffn_up"] - base.full["ffn_up"] == 8 * 64
    assert bias.full["ffn_down"] - base.full["ffn_down"] == 8 * 16
    assert relu.full["activation"] == 8 * 64 < base.full["activation"]


@pytest.mark.parametrize("T", [0, -1, 2.5, True, "4"])
def test_flops_rejects_bad_T(T):
    with pytest.raises(ValueError, match="T must be a positive integer"):
        tblock.flops(tblock.BlockConfig(d_model=8, n_heads=2), T)
