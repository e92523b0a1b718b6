"""The lesson's lenses (tblock.lesson.analysis) on every backend: perturbation test, per-block gain,
the Systems-lens stack, the filter bank, and the exercises."""

import math

import numpy as np
import pytest
from conftest import proc
from scipy.special import erf

import tblock
from tblock.lesson import analysis, depth, sublayers
from tblock.backends import numpy as oracle
from tblock.rustlab import Rng

BACKENDS = tblock.available_backends()
EX = tblock.load_worked_example()
P = tblock.LESSON_PRINTED
PRINTED_6 = 5e-7 + 1e-12          # the lesson prints these to 6 decimals


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def small_case(norm="pre", causal=True, seed=0, T=6, d=12, heads=3, activation="gelu_tanh"):
    cfg = tblock.BlockConfig(d_model=d, n_heads=heads, d_ff=20, norm=norm, causal=causal, activation=activation)
    w = tblock.init_weights(cfg, seed=seed, dtype=np.float64)
    H = np.random.default_rng(seed + 100).standard_normal((T, d))
    return cfg, w, H


# ---- the two mixing axes ----------------------------------------------------------------

def test_perturbation_reproduces_the_lesson(backend):
    pt = analysis.perturb(EX.H_in, EX.weights, EX.cfg, token=P["perturb_token"] - 1, channel=0, delta=1.0,
                          backend=backend)
    np.testing.assert_allclose(pt.mha_sums, P["perturb_mha_sums"], atol=PRINTED_6, rtol=0)
    np.testing.assert_allclose(pt.ffn_sums, P["perturb_ffn_sums"], atol=PRINTED_6, rtol=0)
    assert pt.mha_max_before == 0.0                          # the lesson prints exactly 0
    assert np.all(pt.dA[:2] == 0.0)                           # causality: rows 1, 2 never move
    assert pt.ffn_channels_touched == 8                       # "8 of 8"
    assert list(pt.ffn_rows_moved) == [2] and list(pt.mha_rows_moved) == [2, 3]


def test_perturbation_default_is_the_lessons_bump():
    pt = analysis.perturb(EX.H_in, EX.weights, EX.cfg)
    assert (pt.token, pt.channel, pt.delta) == (2, 0, 1.0)


def test_exercise4_bump_on_token_1_spreads_to_every_later_row(backend):
    pt = analysis.perturb(EX.H_in, EX.weights, EX.cfg, token=0, backend=backend)
    assert np.all(pt.mha_sums > 1e-3)                          # rows 1..T all move: the maximum spread
    assert list(pt.ffn_rows_moved) == [0]
    assert pt.ffn_channels_touched == 8


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_mixing_axes_hold_for_every_token(backend, norm):
    cfg, w, H = small_case(norm=norm)
    T = H.shape[0]
    for t in range(T):
        pt = analysis.perturb(H, w, cfg, token=t, channel=t % cfg.d_model, delta=0.5, backend=backend)
        assert np.all(pt.dA[:t] == 0.0), f"token {t}: attention moved an earlier row"
        assert np.all(pt.mha_sums[t:] > 0.0)
        others = np.delete(pt.dF, t, axis=0)
        assert np.all(others == 0.0), f"token {t}: the FFN moved another row"
        assert pt.ffn_channels_touched == cfg.d_model


def test_unmasked_attention_moves_earlier_rows_too(backend):
    cfg, w, H = small_case(causal=False)
    pt = analysis.perturb(H, w, cfg, token=4, backend=backend)
    assert np.all(pt.mha_sums > 0.0)                            # no mask: every row sees token 5


def gelu(x, kind):
    if kind == "gelu_erf":
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ln(X, eps=1e-5):
    return (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + eps)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_ffn_sublayer_is_ffn_of_ln_or_ffn(backend, norm):
    cfg, w, H = small_case(norm=norm)
    X = 3.0 * H + 1.0                                            # far from standardised
    want_in = ln(X) if norm == "pre" else X
    want = gelu(want_in @ w.w_ff1, cfg.activation) @ w.w_ff2
    np.testing.assert_allclose(sublayers.ffn_sublayer(X, w, cfg, backend), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_attn_sublayer_is_mha_of_ln_or_mha(backend, norm):
    cfg, w, H = small_case(norm=norm)
    X = ln(H) if norm == "pre" else H
    T, dk = X.shape[0], cfg.d_k
    Q, K, V = X @ w.w_q, X @ w.w_k, X @ w.w_v
    heads = []
    for h in range(cfg.n_heads):
        c = slice(h * dk, (h + 1) * dk)
        S = Q[:, c] @ K[:, c].T / math.sqrt(dk)
        S[np.triu_indices(T, 1)] = -np.inf
        A = np.exp(S - S.max(1, keepdims=True))
        heads.append(A / A.sum(1, keepdims=True) @ V[:, c])
    want = np.hstack(heads) @ w.w_o
    np.testing.assert_allclose(sublayers.attn_sublayer(H, w, cfg, backend), want, rtol=1e-10, atol=1e-12)


def test_perturb_rejects_bad_indices():
    with pytest.raises(ValueError, match="token"):
        analysis.perturb(EX.H_in, EX.weights, EX.cfg, token=4)
    with pytest.raises(ValueError, match="channel"):
        analysis.perturb(EX.H_in, EX.weights, EX.cfg, channel=8)
    with pytest.raises(TypeError, match="token"):
        analysis.perturb(EX.H_in, EX.weights, EX.cfg, token=True)
    with pytest.raises(ValueError, match="one sequence"):
        analysis.perturb(EX.H_in[None], EX.weights, EX.cfg)


# ---- Exercise 2: no residuals -----------------------------------------------------------

@pytest.mark.parametrize("norm", ["pre", "post"])
def test_no_residual_block_matches_its_equations(backend, norm):
    cfg, w, H = small_case(norm=norm)
    tr = {}
    if norm == "pre":
        A_out = oracle.attention(ln(H), w.arrays(), cfg, tr)
        want = oracle.ffn(ln(A_out), w.arrays(), cfg, tr)                   # H_out = FFN(LN2(A_out))
    else:
        H_mid = ln(oracle.attention(H, w.arrays(), cfg, tr))                # LN1(MHA(H))
        want = ln(oracle.ffn(H_mid, w.arrays(), cfg, tr))                   # LN2(FFN(H_mid))
    np.testing.assert_allclose(sublayers.forward_no_residual(H, w, cfg, backend), want, rtol=1e-10, atol=1e-12)


# ---- per-block gain ---------------------------------------------------------------------

def test_zero_block_is_the_identity_so_its_gain_is_one(backend):
    cfg, w, H = small_case()
    zero = tblock.BlockWeights(**{k: np.zeros_like(v) for k, v in w.arrays().items()})
    for scheme in depth.SCHEMES:
        g = depth.block_gain(H, zero, cfg, scheme=scheme, backend=backend)
        assert abs(g - 1.0) < 1e-9


def test_ffn_only_jacobian_matches_the_analytic_one(backend):
    """With attention zeroed, H_out_t = x + W2^T gelu(W1^T LN(x)) for token t's own row x, so
    J = I + W2^T diag(gelu'(z)) W1^T J_LN with J_LN = (I - 11^T/d - y y^T/d) / s (column form)."""
    cfg, w, H = small_case(activation="gelu_erf", seed=3)
    w0 = sublayers.without_attention(w)
    d, t = cfg.d_model, 2
    x = H[t]
    mu, s = x.mean(), math.sqrt(x.var() + cfg.eps)
    y = (x - mu) / s
    J_ln = (np.eye(d) - np.ones((d, d)) / d - np.outer(y, y) / d) / s
    z = y @ w.w_ff1
    dgelu = 0.5 * (1 + erf(z / math.sqrt(2))) + z * np.exp(-z ** 2 / 2) / math.sqrt(2 * math.pi)
    J_exact = np.eye(d) + w.w_ff2.T @ np.diag(dgelu) @ w.w_ff1.T @ J_ln
    f = lambda B: tblock.forward(B, w0, cfg, backend=backend)
    J_c = depth.token_jacobian(f, H, token=t, scheme="central")
    J_f = depth.token_jacobian(f, H, token=t, scheme="forward")
    np.testing.assert_allclose(J_c, J_exact, atol=1e-7)
    np.testing.assert_allclose(J_f, J_exact, atol=1e-4)
    assert abs(depth.sigma_max(J_c) - np.linalg.norm(J_exact, 2)) < 1e-7


def test_forward_and_central_difference_gains_agree(backend):
    gf = depth.block_gain(EX.H_in, EX.weights, EX.cfg, backend=backend)
    gc = depth.block_gain(EX.H_in, EX.weights, EX.cfg, scheme="central", backend=backend)
    assert abs(gf - gc) < 1e-4
    assert gf > 1.0                                               # the residual path adds the identity


def test_jacobian_rejects_bad_arguments():
    f = lambda B: B
    with pytest.raises(ValueError, match="scheme"):
        depth.token_jacobian(f, EX.H_in, scheme="backward")
    with pytest.raises(ValueError, match="step"):
        depth.token_jacobian(f, EX.H_in, step=0.0)


# ---- residual stream along depth, the Systems-lens table --------------------------------

@pytest.fixture(scope="module")
def table():
    return depth.systems_table(EX.H_in, Ns=(2, 4, 8), cfg=EX.cfg, seed=1300)


def test_scaling_the_branches_bounds_the_stream(table):
    rows = {r.N: r for r in table}
    for N in (4, 8):
        assert rows[N].scaled.norm_ratio < rows[N].unscaled.norm_ratio
    for r in table:
        assert r.scaled.max_gain <= r.unscaled.max_gain + 1e-12
        for st in (r.unscaled, r.scaled):
            assert np.all(st.gains > 0.9)                         # ~1 or more with the identity path
            np.testing.assert_allclose(st.gains, st.gains_central, atol=1e-4)
    assert rows[8].unscaled.norm_ratio > 2.0                      # as initialised the stream grows


def test_deeper_stacks_start_with_the_same_blocks(table):
    rows = {r.N: r for r in table}
    np.testing.assert_allclose(rows[8].unscaled.norms[:3], rows[2].unscaled.norms, rtol=1e-13)
    np.testing.assert_allclose(rows[8].unscaled.gains[:2], rows[2].unscaled.gains, rtol=1e-12)


def test_stack_trace_norms_are_the_stacks_residual_norms(backend):
    cfg = EX.cfg
    for scale_branches in (False, True):
        N = 3
        stack = tblock.Stack.init(cfg, N, 1300, scale_branches=scale_branches, dtype=np.float64)
        st = depth.stack_trace(EX.H_in, N, 1 / math.sqrt(2 * N) if scale_branches else 1.0, cfg=cfg,
                                  seed=1300, backend=backend)
        np.testing.assert_allclose(st.norms, stack.residual_norms(EX.H_in, backend=backend), rtol=1e-12)
    both = depth.residual_norms_along_depth(EX.H_in, cfg, 3, seed=1300, backend=backend)
    np.testing.assert_allclose(both["scaled"], st.norms, rtol=1e-12)


def test_stack_trace_without_residuals_chains_the_no_residual_block(backend):
    ws = depth.stack_weights(EX.cfg, 2, seed=5)
    st = depth.stack_trace(EX.H_in, 2, 1.0, ws, EX.cfg, backend=backend, residual=False)
    H = EX.H_in
    norms = [np.linalg.norm(H)]
    for w in ws:
        H = sublayers.forward_no_residual(H, w, EX.cfg, backend)
        norms.append(np.linalg.norm(H))
    np.testing.assert_allclose(st.norms, norms, rtol=1e-12)


def test_stack_trace_rejects_too_few_weights():
    with pytest.raises(ValueError, match="at least N=3"):
        depth.stack_trace(EX.H_in, 3, 1.0, [EX.weights], EX.cfg)


# ---- the lesson's own stacks (generator="rustlab") --------------------------------------

# The Systems lens as the lesson prints it: N -> (|H_N|/|H_0| unscaled, scaled, max sigma_max(J)
# unscaled, scaled), typed from the lesson's output
LESSON_TABLE = {
    2: (2.110514497741098, 1.2876085953458334, 2.1436353496367158, 1.6271641931427017),
    4: (3.4271154139164315, 1.3965030076089215, 2.1436353496367158, 1.4986869084529262),
    8: (4.259092877559233, 1.2613544565561314, 2.1436353496367158, 1.3894371112628576),
}


def test_the_lessons_systems_table(backend):
    """seed(1300) stacks from the lesson's generator give the lesson's table: the norm ratios to
    rounding, the gains to the finite difference's noise (a 1e-5 step magnifies the forward
    pass's rounding ~1e5 times, and the lesson's forward pass is not ours bit for bit)."""
    rows = depth.systems_table(EX.H_in, Ns=(2, 4, 8), cfg=EX.cfg, seed=1300, backend=backend,
                                  generator="rustlab")
    for r in rows:
        nu, ns, gu, gs = LESSON_TABLE[r.N]
        np.testing.assert_allclose([r.unscaled.norm_ratio, r.scaled.norm_ratio], [nu, ns], rtol=1e-13)
        np.testing.assert_allclose([r.unscaled.max_gain, r.scaled.max_gain], [gu, gs], rtol=0, atol=1e-8)


def test_the_lessons_block_2(backend):
    """Block 2 from seed(14) on block 1's output: the lesson prints |H| = 14.85162630563989."""
    w2 = depth.lesson_block_weights(EX.cfg, Rng(14))
    H_out = tblock.forward(EX.H_in, EX.weights, EX.cfg, backend=backend)
    H_out2 = tblock.forward(H_out, w2, EX.cfg, backend=backend)
    assert abs(np.linalg.norm(H_out2) - 14.85162630563989) < 2e-14


def test_rustlab_stack_weights_are_one_stream():
    ws = depth.stack_weights(EX.cfg, 3, seed=1300, generator="rustlab")
    rng = Rng(1300)
    for w in ws:
        expected = depth.lesson_block_weights(EX.cfg, rng)
        assert all(np.array_equal(a, b) for a, b in zip(w.arrays().values(), expected.arrays().values()))
    deeper = depth.stack_weights(EX.cfg, 5, seed=1300, generator="rustlab")
    assert np.array_equal(deeper[2].w_ff2, ws[2].w_ff2)           # a deeper stack starts with the same blocks
    # seed 13's stream: H_in's 32 draws, then the worked example's block
    rng = Rng(13)
    rng.randn(4, 8)
    assert np.array_equal(depth.lesson_block_weights(EX.cfg, rng).w_ff2, EX.weights.w_ff2)


def test_rustlab_residual_norms_are_the_stack_traces(backend):
    both = depth.residual_norms_along_depth(EX.H_in, EX.cfg, 3, seed=1300, backend=backend, generator="rustlab")
    for key, scale in (("unscaled", 1.0), ("scaled", 1 / math.sqrt(6))):
        st = depth.stack_trace(EX.H_in, 3, scale, cfg=EX.cfg, seed=1300, backend=backend, generator="rustlab")
        np.testing.assert_allclose(both[key], st.norms, rtol=1e-12)
    # its first two blocks are the lesson's N = 2 stack
    np.testing.assert_allclose(both["unscaled"][2] / both["unscaled"][0], LESSON_TABLE[2][0], rtol=1e-13)


def test_generator_is_checked():
    with pytest.raises(ValueError, match=r"generator must be one of \('numpy', 'rustlab'\), got 'torch'"):
        depth.stack_weights(EX.cfg, 2, generator="torch")
    with pytest.raises(ValueError, match="generator must be one of"):
        depth.systems_table(EX.H_in, Ns=(2,), cfg=EX.cfg, generator="Rustlab")
    with pytest.raises(TypeError, match="seed must be a non-negative integer"):
        depth.stack_weights(EX.cfg, 2, seed=np.random.SeedSequence(1), generator="rustlab")
    with pytest.raises(ValueError, match="n_layers must be a non-negative integer, got -1"):
        depth.stack_weights(EX.cfg, -1, generator="rustlab")


# ---- attention as a filter bank ---------------------------------------------------------

def test_filter_bank_reproduces_the_lessons_entropies_and_taps(backend):
    fb = analysis.filter_bank(EX.H_in, EX.weights, EX.cfg, backend=backend)
    np.testing.assert_allclose(fb.bound, P["entropy_bound_bits"], atol=1e-6)
    np.testing.assert_allclose(fb.entropies[0], P["entropy_head1_bits"], atol=1e-6)
    np.testing.assert_allclose(fb.entropies[1], P["entropy_head2_bits"], atol=1e-6)
    np.testing.assert_allclose(fb.A[0], P["A_1"], atol=PRINTED_6)
    np.testing.assert_allclose(fb.A[1, 3], P["A_2_row4"], atol=PRINTED_6)
    np.testing.assert_allclose(fb.row_sums, 1.0, atol=1e-12)     # unit DC gain
    assert fb.causal_leak == 0.0                                   # exactly zero above the diagonal
    assert fb.min_tap >= 0.0
    assert fb.dc_gain_error < 1e-12                                # a constant V passes unchanged
    assert np.all(fb.deficits >= -1e-12)
    assert fb.entropies[0, 0] == 0.0                               # one key: no uncertainty


def test_row_entropies_of_known_distributions():
    T = 5
    uniform_prefix = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    np.testing.assert_allclose(analysis.row_entropies_bits(uniform_prefix), np.log2(np.arange(1, T + 1)),
                               atol=1e-15)
    np.testing.assert_array_equal(analysis.row_entropies_bits(np.eye(T)), np.zeros(T))
    np.testing.assert_allclose(analysis.row_entropies_bits([[0.5, 0.25, 0.25]]), [1.5])


def test_unmasked_bound_is_log2_T(backend):
    cfg, w, H = small_case(causal=False)
    fb = analysis.filter_bank(H, w, cfg, backend=backend)
    np.testing.assert_allclose(fb.bound, math.log2(H.shape[0]))
    assert fb.causal_leak > 0.0
    assert np.all(fb.entropies <= fb.bound + 1e-12)


# ---- Exercise 5 ------------------------------------------------------------------------

def test_exercise5_ln_affines():
    assert tblock.param_count(EX.cfg, ln_affine=True) - tblock.param_count(EX.cfg) == 840 - 808
    assert analysis.ln_affine_delta(EX.cfg) == 4 * 8
    assert analysis.ln_affine_fraction(8) == pytest.approx(1 / 24)
    brute = next(d for d in range(1, 1000) if 4 * d / (12 * d * d) < 0.01)
    assert analysis.ln_affine_negligible_from(0.01) == brute == 34
    assert analysis.ln_affine_negligible_from(0.1) == next(d for d in range(1, 100) if 1 / (3 * d) < 0.1)
    with pytest.raises(ValueError, match="d_model"):
        analysis.ln_affine_fraction(0)


@pytest.mark.subprocess
def test_submodules_load_lazily_from_the_package():
    import subprocess
    subprocess.run(proc("import_check", "submodules"), check=True)
