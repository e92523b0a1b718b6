"""The numba backend with dot "bf16" (tblock.formats): every product rounds its inputs to bf16.

The block's matrices are multiplied by kernels.bgemm (vdpbf16ps, or its widening fallback
on avx2 and generic), a bf16 head by its stored rows after bgemm.bf16_rows; both against
the numpy oracle in float64 on the same weights.  The rounding itself is checked bit for
bit against tblock.formats.round_inputs.  Block-level bound: numba's float32 LayerNorm and
attention differ from the oracle's float64 in the last bits, so an input lying at a bf16
rounding tie may round one bf16 step (2^-8 of it) the other way there; most outputs agree
to float32's accuracy (median relative error < 1e-5) and every one within a few such
steps (max < 3e-2 of the output's scale).  The same weights with dot "fp32" are far
outside the median bound (test_the_dot_is_honoured), so a kernel that ignored the dot fails.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import tblock
from tblock.formats import quantize_matrix, round_inputs
from tblock.kernels.bgemm import bf16_rows

pytestmark = pytest.mark.isa

MEDIAN, MAX = 1e-5, 3e-2


def errors(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.abs(got - want) / np.abs(want).max()


def near_the_oracle(got, want):
    err = errors(got, want)
    return np.median(err) < MEDIAN and err.max() < MAX


def weights(cfg, rng, dot="bf16"):
    from conftest import random_weights
    return tblock.quantize(random_weights(cfg, rng), "bf16", dot=dot)


@njit
def _bf16_rows(A, m, k, out):
    bf16_rows(A, 0, k, m, k, out)


def test_the_rounding_is_the_rule_bit_for_bit(rng):
    """bf16_rows against round_inputs: ties both ways, subnormals, zeros, large values."""
    x = (rng.standard_normal(4000) * np.exp(rng.uniform(-85, 85, 4000))).astype(np.float32)
    u = x.view(np.uint32)
    u[:500] = (u[:500] & 0xFFFF0000) | 0x8000                   # exact ties, even and odd
    x[500:600] = (rng.standard_normal(100) * 1e-39).astype(np.float32)     # subnormals
    x[600:610] = [0, -0.0, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38, 1.0, -1.0, 3e38, -3e38]
    out = np.empty_like(x)
    _bf16_rows(x, 40, 100, out)
    want = round_inputs(x, "bf16")
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


@settings(max_examples=25, deadline=None)
@given(d=st.sampled_from([32, 33, 40, 47, 72, 96, 128]), heads=st.sampled_from([1, 2, 4]), B=st.integers(1, 2),
       T=st.sampled_from([1, 2, 7, 33, 70]), pre=st.booleans(), biases=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_block_with_bf16_dot_matches_the_oracle(d, heads, B, T, pre, biases, seed):
    rng = np.random.default_rng(seed)
    cfg = tblock.BlockConfig(d_model=d, n_heads=heads if d % (8 * heads) == 0 else 1, d_ff=3 * d,
                             norm="pre" if pre else "post", ffn_bias=biases, attn_bias=biases, ln_affine=biases)
    w = weights(cfg, rng)
    H = rng.standard_normal((B, T, d)).astype(np.float32)
    want = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy")
    assert near_the_oracle(tblock.forward(H, w, cfg), want)


@pytest.mark.parametrize("name, cfg, B, T", [
    # LN1 in a stage of its own (many column tasks: its rows rounded to pairs once there),
    # and the FFN split by columns (LN2's rows and the hidden layer rounded once)
    ("split", dict(d_model=384, n_heads=6, ffn_bias=True, attn_bias=True, ln_affine=True), 1, 64),
    # more rows than the split stages take: FFN row tiles, each tile's rows rounded once
    ("row-tiles", dict(d_model=96, n_heads=2, d_ff=640, ffn_bias=True), 3, 150),
    ("post-row-tiles", dict(d_model=64, n_heads=4, norm="post", ln_affine=True), 2, 220),
    # the gated FFN ([gate | up] panels), grouped K/V heads, rotary positions
    ("gated", dict(d_model=128, n_heads=4, n_kv_heads=2, norm_type="rmsnorm", ffn="gated", activation="silu",
                   positions="rotary", d_ff=352, ln_affine=True), 1, 70),
    ("gated-row-tiles", dict(d_model=128, n_heads=4, n_kv_heads=2, norm_type="rmsnorm", ffn="gated",
                             activation="silu", positions="rotary", d_ff=352), 2, 300),
])
def test_inputs_rounded_once_for_a_stage_match_the_oracle(name, cfg, B, T, rng):
    """The paths where a stage's (or a row tile's) inputs are rounded to bf16 pairs once
    and read by all of its GEMM tasks (wgemm.pair_rows), against the oracle."""
    cfg = tblock.BlockConfig(**cfg)
    if cfg.ffn == "gated":              # conftest's random_weights draws the lesson's block only
        w = tblock.quantize(tblock.init_weights(cfg, seed=int(rng.integers(2**31))), "bf16", dot="bf16")
    else:
        w = weights(cfg, rng)
    H = rng.standard_normal((B, T, cfg.d_model)).astype(np.float32)
    want = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy")
    assert near_the_oracle(tblock.forward(H, w, cfg), want)


def test_the_dot_is_honoured(rng):
    """The same stored bytes with dot "fp32" and "bf16" give results far apart, each near
    its own oracle: the kernels do not ignore the dot."""
    cfg = tblock.BlockConfig(d_model=64, n_heads=2, d_ff=600)      # d_ff past FF_CHUNK: W_2 in bands
    w16 = weights(cfg, np.random.default_rng(3))
    w32 = weights(cfg, np.random.default_rng(3), "fp32")
    assert w32.dot == "fp32" and np.array_equal(w32.w_ff2.data, w16.w_ff2.data)
    for T in (1, 40):
        H = rng.standard_normal((1, T, 64)).astype(np.float32)
        got16, got32 = tblock.forward(H, w16, cfg), tblock.forward(H, w32, cfg)
        want16 = tblock.forward(H.astype(np.float64), w16, cfg, backend="numpy")
        want32 = tblock.forward(H.astype(np.float64), w32, cfg, backend="numpy")
        assert near_the_oracle(got16, want16) and near_the_oracle(got32, want32)
        assert np.median(errors(got16, want32)) > 10 * MEDIAN
        assert np.median(errors(got32, want16)) > 10 * MEDIAN


@pytest.mark.parametrize("d, dff", [(64, 128), (40, 600)])
def test_cached_chunks_decode_steps_and_stack(d, dff, rng):
    cfg = tblock.BlockConfig(d_model=d, n_heads=2, d_ff=dff, ffn_bias=True, attn_bias=True, ln_affine=True)
    stack = tblock.Stack(cfg, [weights(cfg, rng) for _ in range(3)])
    H = rng.standard_normal((2, 12, d)).astype(np.float32)
    want = stack(H.astype(np.float64), backend="numpy")
    assert near_the_oracle(stack(H), want)
    caches = stack.make_cache(16, batch=2)
    outs = [stack(H[:, :5], cache=caches)] + [stack(H[:, t:t + 1], cache=caches) for t in range(5, 12)]
    assert near_the_oracle(np.concatenate(outs, axis=1), want)


def test_gemv_rows_round_the_row(rng):
    """qgemv's whole-matrix GEMV with a stored_view of dot "bf16" against float64 on the
    rounded row (one row: float32 accuracy, no ties to differ on)."""
    from tblock.kernels.qgemv import gemv_rows_parallel, gemv_rows_serial, stored_view
    W = rng.standard_normal((77, 130)).astype(np.float32)
    x = rng.standard_normal(77).astype(np.float32)
    m = quantize_matrix(W, "bf16", dot="bf16")
    want = round_inputs(x, "bf16").astype(np.float64) @ m.dequantize(np.float64)
    for gemv in (gemv_rows_serial, gemv_rows_parallel):
        y = np.empty(130, np.float32)
        gemv(x, stored_view(m), np.zeros(0, np.float32), y, False, 3)
        assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()
    plain = x.astype(np.float64) @ m.dequantize(np.float64)
    assert np.abs(y - plain).max() > 1e-4 * np.abs(want).max()


def test_head_matches_the_reference(rng):
    from tblock.backends import reference_lm_head
    from tblock.backends.numba import lm_head, prepare_head
    W = rng.standard_normal((300, 72)).astype(np.float32)
    E16, E32 = (quantize_matrix(W.T, "bf16", dot=dot) for dot in ("bf16", "fp32"))
    ln_f = rng.standard_normal(144).astype(np.float32)
    for B, T in ((1, 1), (2, 3), (1, 40)):
        H = rng.standard_normal((B, T, 72)).astype(np.float32)
        got = lm_head(H, ln_f, 1e-5, prepare_head(E16, np.float32), np.empty((B, T, 300), np.float32))
        want = reference_lm_head(H, ln_f, 1e-5, E16, np.empty((B, T, 300)))
        assert near_the_oracle(got, want)
        other = reference_lm_head(H, ln_f, 1e-5, E32, np.empty((B, T, 300)))
        assert np.median(errors(got, other)) > 10 * MEDIAN


@pytest.fixture(scope="module")
def gpt2_ckpt(tmp_path_factory):
    from test_gpt2 import hf_config, random_tensors, write_checkpoint
    root = tmp_path_factory.mktemp("bf16dot") / "ckpt"
    shape = dict(vocab_size=97, n_positions=40, n_embd=48, n_layer=2, n_head=3)
    write_checkpoint(root, random_tensors(np.random.default_rng(5), 97, 40, 48, 2), hf_config(**shape))
    return root


def test_gpt2_logits_and_decode_match_numpy(gpt2_ckpt):
    """A GPT-2 with bf16 blocks and head, dot "bf16": the numba logits of a whole sequence,
    and of decode steps after a prefill, against the numpy backend's."""
    model = tblock.GPT2.from_pretrained(gpt2_ckpt, weights="bf16", dot="bf16")
    ids = np.random.default_rng(6).integers(0, 97, (2, 20))
    want = model(ids, backend="numpy")
    assert near_the_oracle(model(ids, backend="numba"), want)
    cache = model.make_cache(24, batch=2)
    steps = [model.next_logits(ids[:, :8], cache, backend="numba")]
    steps += [model.next_logits(ids[:, t:t + 1], cache, backend="numba") for t in range(8, 20)]
    assert near_the_oracle(np.stack(steps, axis=1), want[:, 7:])
