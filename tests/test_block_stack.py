"""Block, Stack and init_weights."""

import numpy as np
import pytest

import tblock
from tblock.backends import numpy as oracle

CFG = tblock.BlockConfig(d_model=16, n_heads=4)


def test_block_is_forward_with_its_weights(backend, rng):
    w = tblock.init_weights(CFG, seed=5, dtype=np.float64)
    H = rng.standard_normal((6, 16))
    block = tblock.Block(CFG, w, backend=backend)
    np.testing.assert_array_equal(block(H), tblock.forward(H, w, CFG, backend=backend))


def test_stack_chains_blocks_by_hand(backend, rng):
    ws = [tblock.init_weights(CFG, seed=s, dtype=np.float64) for s in (1, 2, 3)]
    H = rng.standard_normal((5, 16))
    by_hand = H
    for w in ws:
        by_hand, _ = oracle.block_forward_one(by_hand, w.arrays(), CFG)
    stack = tblock.Stack(CFG, ws)
    np.testing.assert_allclose(stack(H, backend=backend), by_hand, rtol=1e-12, atol=1e-12)
    H_N, traces = stack(H, backend=backend, trace=True)
    assert len(traces) == 3 and np.array_equal(traces[-1].H_out, H_N)
    norms = stack.residual_norms(H, backend=backend)
    assert norms[0] == np.linalg.norm(H) and norms[-1] == pytest.approx(np.linalg.norm(by_hand), rel=1e-12)


def test_stack_init_scales_branches_by_one_over_sqrt_2N():
    n = 4
    scaled = tblock.Stack.init(CFG, n, seed=7, scale_branches=True, dtype=np.float64)
    plain = tblock.Stack.init(CFG, n, seed=7, scale_branches=False, dtype=np.float64)
    for s, p in zip(scaled.blocks, plain.blocks):
        np.testing.assert_allclose(s.weights.w_o, p.weights.w_o / np.sqrt(2 * n), rtol=1e-15)
        np.testing.assert_allclose(s.weights.w_ff2, p.weights.w_ff2 / np.sqrt(2 * n), rtol=1e-15)
        np.testing.assert_array_equal(s.weights.w_q, p.weights.w_q)
        np.testing.assert_array_equal(s.weights.w_ff1, p.weights.w_ff1)
    # every block draws its own weights
    assert not np.array_equal(plain.blocks[0].weights.w_q, plain.blocks[1].weights.w_q)


def test_init_weights_statistics():
    cfg = tblock.BlockConfig(d_model=256, n_heads=4)
    w = tblock.init_weights(cfg, seed=0, dtype=np.float64, branch_scale=0.5)
    # std 1/sqrt(d) for attention, He sqrt(2/fan_in) for the FFN; 65k draws each -> ~0.3% noise
    assert w.w_q.std() == pytest.approx(1 / 16, rel=0.02)
    assert w.w_o.std() == pytest.approx(0.5 / 16, rel=0.02)
    assert w.w_ff1.std() == pytest.approx(np.sqrt(2 / 256), rel=0.02)
    assert w.w_ff2.std() == pytest.approx(0.5 * np.sqrt(2 / 1024), rel=0.02)


def test_init_weights_is_seeded_and_dtype_consistent():
    a = tblock.init_weights(CFG, seed=3, dtype=np.float64)
    b = tblock.init_weights(CFG, seed=3, dtype=np.float32)
    assert b.dtype == np.float32 and a.dtype == np.float64
    np.testing.assert_array_equal(b.w_ff2, a.w_ff2.astype(np.float32))
    assert not np.array_equal(tblock.init_weights(CFG, seed=4, dtype=np.float64).w_q, a.w_q)


@pytest.mark.parametrize("d_model, d_ff", [(20, 80), (64, 5000)])   # 5000: several row blocks
def test_init_weights_draws_the_lesson_order_from_one_stream(d_model, d_ff):
    # written out independently: whole-matrix float64 draws in the lesson's order, scaled
    # one factor at a time; init_weights draws block by block to save memory and must
    # give exactly these values
    cfg = tblock.BlockConfig(d_model=d_model, n_heads=4, d_ff=d_ff)
    rng = np.random.default_rng(11)
    a, d, f = 1 / np.sqrt(d_model), d_model, d_ff
    expect = dict(w_q=rng.standard_normal((d, d)) * a, w_k=rng.standard_normal((d, d)) * a,
                  w_v=rng.standard_normal((d, d)) * a, w_o=rng.standard_normal((d, d)) * a * 0.3,
                  w_ff1=rng.standard_normal((d, f)) * np.sqrt(2 / d),
                  w_ff2=rng.standard_normal((f, d)) * np.sqrt(2 / f) * 0.3)
    for dtype in (np.float64, np.float32):
        w = tblock.init_weights(cfg, seed=11, dtype=dtype, branch_scale=0.3)
        for name, value in expect.items():
            np.testing.assert_array_equal(getattr(w, name), value.astype(dtype), err_msg=name)


def test_init_weights_options():
    cfg = tblock.BlockConfig(d_model=8, n_heads=2, ffn_bias=True, ln_affine=True)
    w = tblock.init_weights(cfg, seed=0)
    assert np.all(w.b_ff1 == 0) and np.all(w.ln1_gamma == 1) and np.all(w.ln2_beta == 0)
    assert w.b_ff1.shape == (32,) and w.b_ff2.shape == (8,)


def test_mixed_weight_dtypes_promote_to_float64():
    a = tblock.init_weights(CFG, seed=0, dtype=np.float32).arrays()
    a["w_q"] = a["w_q"].astype(np.float64)
    assert tblock.BlockWeights(**a).dtype == np.float64
