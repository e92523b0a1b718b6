"""Sidebar: dropout. Eval mode is the block; training mode drops at the lesson's four points.

The statistical bound. In training mode a dropped quantity is y = x m / (1 - p) with
m ~ Bernoulli(1 - p), so E[y] = x and Var[y] = x^2 p / (1 - p). A quantity z that is linear in
independently dropped terms, z = sum_i c_i x_i m_i / (1 - p), has E[z] = sum_i c_i x_i (its
eval value) and Var[z] = p / (1 - p) sum_i (c_i x_i)^2. The mean of n independent draws has
standard deviation sqrt(Var[z] / n); we allow 5 of those (plus rounding). By the CLT a
deviation beyond 5 sigma has probability ~6e-7 per entry, and the seeds are fixed, so the
test is deterministic. Only quantities linear in the masks are compared: A_out under
"attn" or "attn_out" dropout, H_out under "ffn_out" dropout (LayerNorm and GELU downstream
would make the mean of the full output differ from eval, as it does in real training).
"""

import numpy as np
import pytest

import tblock
from tblock.lesson import dropout as D

BACKENDS = tblock.available_backends()
EX = tblock.load_worked_example()
N_DRAWS = 2000


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def test_eval_is_the_default_and_is_tblock_forward(backend):
    want = tblock.forward(EX.H_in, EX.weights, EX.cfg, backend=backend)
    got = D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=0.5, backend=backend)      # training=False
    np.testing.assert_array_equal(got, want)
    block = D.DropoutBlock(EX.cfg, EX.weights, p=0.5, backend=backend)
    assert block.training is False
    np.testing.assert_array_equal(block(EX.H_in, rng=1), want)
    np.testing.assert_array_equal(block(EX.H_in, rng=2), want)                       # deterministic
    block.train()
    assert not np.array_equal(block(EX.H_in, rng=1), want)
    np.testing.assert_array_equal(block.eval()(EX.H_in), want)


def test_eval_reproduces_the_lesson():
    np.testing.assert_allclose(D.forward_dropout(EX.H_in, EX.weights, EX.cfg), EX.expected["H_out"],
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_p_zero_in_training_equals_eval(backend, norm):
    cfg = tblock.BlockConfig(d_model=12, n_heads=3, norm=norm, ffn_bias=True, ln_affine=True)
    w = tblock.init_weights(cfg, seed=4, dtype=np.float64)
    a = w.arrays()                                     # non-trivial biases and affines
    rng = np.random.default_rng(0)
    for k in ("b_ff1", "b_ff2", "ln1_gamma", "ln1_beta", "ln2_gamma", "ln2_beta"):
        a[k] = a[k] + 0.3 * rng.standard_normal(a[k].shape)
    w = tblock.BlockWeights(**a)
    H = rng.standard_normal((2, 5, 12))
    got = D.forward_dropout(H, w, cfg, p=0.0, training=True, rng=0)
    np.testing.assert_allclose(got, tblock.forward(H, w, cfg, backend=backend), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("p", [1.0, -0.1, 1.5, float("nan"), float("inf")])
def test_p_outside_0_1_is_an_error(p):
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=p, training=True, rng=0)
    with pytest.raises(ValueError, match="p must be"):
        D.DropoutBlock(EX.cfg, EX.weights, p=p)
    with pytest.raises(ValueError, match="p must be"):
        D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=p)           # checked in eval mode too


def test_bad_arguments():
    with pytest.raises(TypeError, match="p must be a real number"):
        D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p="0.1", training=True)
    with pytest.raises(ValueError, match="points"):
        D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=0.1, training=True, points=("residual",))
    with pytest.raises(TypeError, match="rng"):
        D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=0.1, training=True, rng="seed")
    with pytest.raises(TypeError, match="training"):
        D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=0.1, training=1)


def test_training_is_seeded_and_reproducible():
    f = lambda rng: D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=0.2, training=True, rng=rng)
    np.testing.assert_array_equal(f(7), f(7))
    np.testing.assert_array_equal(f(np.random.default_rng(7)), f(7))
    assert not np.array_equal(f(7), f(8))
    g = np.random.default_rng(3)
    assert not np.array_equal(f(g), f(g))             # a Generator advances between calls


def test_attention_dropout_zeroes_and_rescales_the_probabilities():
    p = 0.3
    _, tr_eval = tblock.forward(EX.H_in, EX.weights, EX.cfg, backend="numpy", trace=True)
    _, tr = D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=p, training=True, rng=11, points="attn", trace=True)
    kept = tr.A != 0
    np.testing.assert_allclose(tr.A[kept], tr_eval.A[kept] / (1 - p), rtol=1e-14)
    assert np.any(~kept & (tr_eval.A > 0))            # something was dropped
    np.testing.assert_array_equal(tr.H_norm1, tr_eval.H_norm1)   # nothing before the softmax changed


def test_embed_dropout_draws_one_mask_on_the_input(backend):
    p = 0.25
    keep = np.random.default_rng(5).random(EX.H_in.shape) >= p    # the documented first draw
    want = tblock.forward(np.where(keep, EX.H_in / (1 - p), 0.0), EX.weights, EX.cfg, backend=backend)
    got = D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=p, training=True, rng=5, points="embed")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_drop_fraction_is_p():
    p, T = 0.3, 400
    cfg = tblock.BlockConfig(d_model=16, n_heads=2)
    w = tblock.init_weights(cfg, seed=1, dtype=np.float64)
    H = np.random.default_rng(2).standard_normal((T, 16))
    _, tr = D.forward_dropout(H, w, cfg, p=p, training=True, rng=9, points="ffn_out", trace=True)
    n = tr.F_out.size
    frac = np.mean(tr.F_out == 0)
    assert abs(frac - p) < 5 * np.sqrt(p * (1 - p) / n)             # binomial, 5 sigma


def draws(points, p, field):
    out = []
    rng = np.random.default_rng(2026)
    for _ in range(N_DRAWS):
        H_out, tr = D.forward_dropout(EX.H_in, EX.weights, EX.cfg, p=p, training=True, rng=rng, points=points,
                                      trace=True)
        out.append(H_out if field == "H_out" else getattr(tr, field))
    return np.mean(out, axis=0)


def assert_within(mean, want, var):
    sigma = np.sqrt(var / N_DRAWS)
    assert np.all(np.abs(mean - want) <= 5 * sigma + 1e-12), np.max(np.abs(mean - want) / (sigma + 1e-300))


def test_training_mean_matches_eval_for_ffn_output_dropout():
    p = 0.2
    _, tr = tblock.forward(EX.H_in, EX.weights, EX.cfg, trace=True)
    # H_out = H_mid + F_out m / (1 - p): Var = F_out^2 p / (1 - p) per entry
    assert_within(draws("ffn_out", p, "H_out"), tr.H_out, tr.F_out ** 2 * p / (1 - p))


def test_training_mean_matches_eval_for_attention_output_dropout():
    p = 0.2
    _, tr = tblock.forward(EX.H_in, EX.weights, EX.cfg, trace=True)
    assert_within(draws("attn_out", p, "A_out"), tr.A_out, tr.A_out ** 2 * p / (1 - p))


def test_training_mean_matches_eval_for_attention_probability_dropout():
    p = 0.2
    _, tr = tblock.forward(EX.H_in, EX.weights, EX.cfg, trace=True)
    dk = EX.cfg.d_k
    # A_out[t, c] = sum_h sum_i A_h[t, i] m_hti / (1 - p) U_h[i, c], U_h = V_h W_O[head h rows]
    var = np.zeros_like(tr.A_out)
    for h in range(EX.cfg.n_heads):
        c = slice(h * dk, (h + 1) * dk)
        U = tr.V[:, c] @ EX.weights.w_o[c, :]                   # (T, d_model)
        var += np.einsum("ti,ic->tc", tr.A[h] ** 2, U ** 2)
    assert_within(draws("attn", p, "A_out"), tr.A_out, var * p / (1 - p))


def test_stack_dropout_eval_and_p_zero_are_the_stack(backend):
    stack = tblock.Stack.init(EX.cfg, 3, seed=1, dtype=np.float64)
    want = stack(EX.H_in, backend=backend)
    np.testing.assert_array_equal(D.stack_forward_dropout(EX.H_in, stack, p=0.3, backend=backend), want)
    np.testing.assert_allclose(D.stack_forward_dropout(EX.H_in, stack, p=0.0, training=True, rng=0), want,
                               rtol=1e-12, atol=1e-12)
    a = D.stack_forward_dropout(EX.H_in, stack, p=0.3, training=True, rng=4)
    np.testing.assert_array_equal(a, D.stack_forward_dropout(EX.H_in, stack, p=0.3, training=True, rng=4))
    assert not np.allclose(a, want)
