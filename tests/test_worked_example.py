"""The lesson's worked example: every intermediate and every printed number."""

import numpy as np
import pytest

import tblock
from tblock.backends import numpy as oracle
from tblock.lesson.analysis import row_entropies_bits as entropy_bits

from conftest import rel_err

pytestmark = pytest.mark.isa

EX = tblock.load_worked_example()
P = tblock.LESSON_PRINTED
STREAM_NAMES = ["H_norm1", "Q", "K", "V", "out_concat", "A_out", "H_mid",
                "H_norm2", "F_pre", "F_post", "F_out", "H_out"]


@pytest.fixture(scope="module", params=tblock.available_backends())
def traced(request):
    H_out, tr = tblock.forward(EX.H_in, EX.weights, EX.cfg, backend=request.param, trace=True)
    return H_out, tr


def test_config_is_the_lessons():
    assert (EX.cfg.d_model, EX.cfg.n_heads, EX.cfg.d_ff, EX.cfg.d_k) == (8, 2, 32, 4)
    assert EX.cfg.causal and EX.cfg.norm == "pre" and EX.cfg.activation == "gelu_tanh"
    assert EX.H_in.shape == (4, 8)


@pytest.mark.parametrize("name", STREAM_NAMES)
def test_every_intermediate_to_1e12(traced, name):
    _, tr = traced
    assert rel_err(getattr(tr, name), EX.expected[name]) < 1e-12


def test_attention_matrices_to_1e12(traced):
    _, tr = traced
    assert rel_err(tr.A[0], EX.expected["A_1"]) < 1e-12
    assert rel_err(tr.A[1], EX.expected["A_2"]) < 1e-12


def test_returned_output_is_the_traced_one(traced):
    H_out, tr = traced
    np.testing.assert_array_equal(H_out, tr.H_out)


def test_printed_norms_and_ratios(traced):
    _, tr = traced
    n = np.linalg.norm
    assert n(EX.H_in) == pytest.approx(P["norm_H_in"], rel=1e-12)
    assert n(tr.H_mid) == pytest.approx(P["norm_H_mid"], rel=1e-12)
    assert n(tr.H_out) == pytest.approx(P["norm_H_out"], rel=1e-12)
    assert n(tr.A_out) / n(EX.H_in) == pytest.approx(P["mha_ratio"], rel=1e-12)
    assert n(tr.F_out) / n(tr.H_mid) == pytest.approx(P["ffn_ratio"], rel=1e-12)


def test_printed_H_mid_row1(traced):
    _, tr = traced
    np.testing.assert_allclose(tr.H_mid[0, :4], P["H_mid_row1_first4"], rtol=1e-12)


def test_printed_head_taps_and_entropies(traced):
    _, tr = traced
    # the lesson prints these to 6 decimals
    np.testing.assert_allclose(tr.A[0], P["A_1"], atol=5e-7)
    np.testing.assert_allclose(tr.A[1][3], P["A_2_row4"], atol=5e-7)
    np.testing.assert_allclose(entropy_bits(tr.A[0]), P["entropy_head1_bits"], atol=5e-7)
    np.testing.assert_allclose(entropy_bits(tr.A[1]), P["entropy_head2_bits"], atol=5e-7)
    np.testing.assert_allclose(np.log2(np.arange(1, 5)), P["entropy_bound_bits"], atol=5e-7)


def test_constant_V_passes_head1_unchanged(traced):
    # the lesson: max |A_1 V_const - 0.7| ~ 1e-16 (unit DC gain)
    _, tr = traced
    assert np.max(np.abs(tr.A[0] @ np.full((4, 4), 0.7) - 0.7)) < 1e-15


def _mha_sublayer(H):
    """MHA(LN1(H)) with the oracle's own pieces (the lesson's attn_sublayer)."""
    return oracle.attention(oracle.layernorm(H), EX.weights.arrays(), EX.cfg, {})


def _ffn_sublayer(H):
    """FFN(LN2(H)) (the lesson's ffn_sublayer)."""
    return oracle.ffn(oracle.layernorm(H), EX.weights.arrays(), EX.cfg, {})


def test_printed_perturbation_sums():
    t = P["perturb_token"] - 1                      # the lesson's token 3, 0-based
    H_mid = EX.expected["H_mid"]
    H_p = EX.H_in.copy()
    H_p[t, 0] += 1.0
    dA = _mha_sublayer(H_p) - EX.expected["A_out"]
    H_mid_p = H_mid.copy()
    H_mid_p[t, 0] += 1.0
    dF = _ffn_sublayer(H_mid_p) - EX.expected["F_out"]
    np.testing.assert_allclose(np.abs(dA).sum(axis=1), P["perturb_mha_sums"], atol=5e-7)
    np.testing.assert_allclose(np.abs(dF).sum(axis=1), P["perturb_ffn_sums"], atol=5e-7)
    assert np.max(np.abs(dA[:t])) == 0.0            # causality: tokens 1-2 exactly unchanged
    assert np.count_nonzero(dF[t]) == 8             # the FFN touches all 8 channels of token 3


def test_printed_parameter_counts():
    assert tblock.param_count(EX.cfg) == P["params"] == 808
    assert tblock.param_count(EX.cfg, ln_affine=True) == P["params_with_ln_affine"] == 840
    affine = tblock.BlockConfig(d_model=8, n_heads=2, ln_affine=True)
    assert tblock.param_count(affine) == 840


def test_float32_worked_example_close_to_lesson(backend):
    H_out = tblock.forward(EX.H_in.astype(np.float32), EX.weights, EX.cfg, backend=backend)
    assert H_out.dtype == np.float32
    assert rel_err(H_out, EX.expected["H_out"]) < 1e-5
