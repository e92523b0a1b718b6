"""Properties of the block over random configurations (hypothesis), on every backend."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tblock

pytestmark = pytest.mark.isa

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def configs(draw, causal=None, norm=None):
    d_k = draw(st.integers(1, 6))
    n_heads = draw(st.integers(1, 4))
    return tblock.BlockConfig(
        d_model=d_k * n_heads, n_heads=n_heads, d_ff=draw(st.integers(1, 24)),
        causal=draw(st.booleans()) if causal is None else causal,
        norm=draw(st.sampled_from(["pre", "post"])) if norm is None else norm,
        activation=draw(st.sampled_from(["gelu_tanh", "gelu_erf", "relu"])),
        ffn_bias=draw(st.booleans()), ln_affine=draw(st.booleans()), attn_bias=draw(st.booleans()))


def random_weights(cfg, seed, dtype=np.float64):
    """init_weights plus random (non-trivial) biases and LayerNorm affines."""
    rng = np.random.default_rng(seed)
    a = tblock.init_weights(cfg, seed=seed, dtype=dtype).arrays()
    for k in ("b_ff1", "b_ff2", "ln1_beta", "ln2_beta", "b_q", "b_k", "b_v", "b_o"):
        if k in a:
            a[k] = (0.3 * rng.standard_normal(a[k].shape)).astype(dtype)
    for k in ("ln1_gamma", "ln2_gamma"):
        if k in a:
            a[k] = (1.0 + 0.3 * rng.standard_normal(a[k].shape)).astype(dtype)
    return tblock.BlockWeights(**a)


def case(data, **cfg_kw):
    cfg = data.draw(configs(**cfg_kw), label="cfg")
    T = data.draw(st.integers(1, 12), label="T")
    seed = data.draw(st.integers(0, 2**31), label="seed")
    H = np.random.default_rng(seed).standard_normal((T, cfg.d_model))
    return cfg, random_weights(cfg, seed), H


@SETTINGS
@given(data=st.data())
def test_causal_rows_sum_to_one_and_are_zero_above_diagonal(backend, data):
    cfg, w, H = case(data, causal=True)
    _, tr = tblock.forward(H, w, cfg, backend=backend, trace=True)
    T = H.shape[0]
    np.testing.assert_allclose(tr.A.sum(axis=-1), 1.0, atol=1e-12)
    assert np.all(tr.A >= 0)
    assert np.all(tr.A[:, ~np.tril(np.ones((T, T), bool))] == 0.0)


@SETTINGS
@given(data=st.data())
def test_constant_V_passes_unchanged(backend, data):
    # gamma = 0 makes every row of LN1's output equal beta, so V (and Q, K) are constant
    # down the time axis; whatever the taps, a convex combination of equal rows is that row
    cfg, w, H = case(data, norm="pre")
    if not cfg.ln_affine:
        cfg = tblock.BlockConfig(**{**cfg.__dict__, "ln_affine": True})
    a = random_weights(cfg, 7).arrays()
    a["ln1_gamma"] = np.zeros_like(a["ln1_gamma"])
    _, tr = tblock.forward(H, tblock.BlockWeights(**a), cfg, backend=backend, trace=True)
    V_row = a["ln1_beta"] @ a["w_v"] + a.get("b_v", 0.0)
    np.testing.assert_allclose(tr.out_concat, np.broadcast_to(V_row, tr.out_concat.shape),
                               rtol=1e-12, atol=1e-12 * max(1.0, np.abs(V_row).max()))


@SETTINGS
@given(data=st.data())
def test_bumping_token_t_never_changes_earlier_rows(backend, data):
    cfg, w, H = case(data, causal=True)
    t = data.draw(st.integers(0, H.shape[0] - 1), label="t")
    H_p = H.copy()
    H_p[t] += data.draw(st.floats(0.1, 3.0), label="bump")
    out, out_p = tblock.forward(H, w, cfg, backend=backend), tblock.forward(H_p, w, cfg, backend=backend)
    np.testing.assert_array_equal(out[:t], out_p[:t])          # exactly, not approximately
    if cfg.norm == "pre":       # the residual carries the bump itself into row t
        assert not np.array_equal(out[t], out_p[t])


@SETTINGS
@given(data=st.data())
def test_layernorm_and_ffn_are_row_wise(backend, data):
    # with the attention weights zeroed the block is H + FFN(LN2(H)) (Pre-LN) or
    # LN2(LN1(H) + FFN(LN1(H))) (Post-LN): nothing left mixes rows, so a bump stays in its row
    cfg, w, H = case(data)
    a = w.arrays()
    for k in ("w_q", "w_k", "w_v", "w_o"):
        a[k] = np.zeros_like(a[k])
    w0 = tblock.BlockWeights(**a)
    t = data.draw(st.integers(0, H.shape[0] - 1), label="t")
    H_p = H.copy()
    H_p[t, data.draw(st.integers(0, cfg.d_model - 1), label="channel")] += 1.0
    out, tr = tblock.forward(H, w0, cfg, backend=backend, trace=True)
    out_p, tr_p = tblock.forward(H_p, w0, cfg, backend=backend, trace=True)
    others = np.arange(H.shape[0]) != t
    np.testing.assert_array_equal(out[others], out_p[others])
    np.testing.assert_array_equal(tr.H_norm1[others], tr_p.H_norm1[others])
    np.testing.assert_array_equal(tr.F_out[others], tr_p.F_out[others])


@SETTINGS
@given(data=st.data())
def test_unmasked_attention_is_permutation_equivariant(backend, data):
    cfg, w, H = case(data, causal=False)
    perm = np.random.default_rng(data.draw(st.integers(0, 1000))).permutation(H.shape[0])
    out = tblock.forward(H, w, cfg, backend=backend)
    out_perm = tblock.forward(H[perm], w, cfg, backend=backend)
    np.testing.assert_allclose(out_perm, out[perm], rtol=1e-12, atol=1e-12 * np.abs(out).max())


@SETTINGS
@given(data=st.data())
def test_batch_equals_sequences_one_by_one(backend, data):
    cfg, w, H = case(data)
    B = data.draw(st.integers(1, 4), label="B")
    Hb = np.random.default_rng(B).standard_normal((B,) + H.shape)
    out_b, tr_b = tblock.forward(Hb, w, cfg, backend=backend, trace=True)
    for b in range(B):
        out, tr = tblock.forward(Hb[b], w, cfg, backend=backend, trace=True)
        np.testing.assert_allclose(out_b[b], out, rtol=1e-12, atol=1e-12 * np.abs(out).max())
        np.testing.assert_allclose(tr_b.A[b], tr.A, rtol=1e-12, atol=1e-13)


@SETTINGS
@given(data=st.data())
def test_float32_stays_float32_and_is_close(backend, data):
    cfg, w, H = case(data)
    H32 = H.astype(np.float32)
    out32, tr32 = tblock.forward(H32, w, cfg, backend=backend, trace=True)
    assert out32.dtype == np.float32
    assert all(getattr(tr32, k).dtype == np.float32 for k in tblock.api.TRACE_NAMES)
    ref = tblock.forward(H32.astype(np.float64), w, cfg, backend="numpy")
    # float32 rounding through a few dozen operations on O(1) values
    np.testing.assert_allclose(out32, ref, rtol=0, atol=1e-4 * max(1.0, np.abs(ref).max()))


@SETTINGS
@given(data=st.data())
def test_any_strides_give_the_contiguous_answer(backend, data):
    cfg, w, H = case(data)
    big = np.zeros((H.shape[0] * 2, H.shape[1] * 3))
    big[::2, ::3] = H
    view = big[::2, ::3]                                 # strided in both axes
    assert view.strides == (2 * big.strides[0], 3 * big.strides[1])
    np.testing.assert_array_equal(tblock.forward(view, w, cfg, backend=backend),
                                  tblock.forward(H, w, cfg, backend=backend))
    fortran = np.asfortranarray(H)
    np.testing.assert_array_equal(tblock.forward(fortran, w, cfg, backend=backend),
                                  tblock.forward(H, w, cfg, backend=backend))


@SETTINGS
@given(data=st.data())
def test_the_numba_lane_gives_the_checked_paths_bits(data):
    """A plain call on weights checked before takes the numba backend's lane (H handed to
    the serial block as it came: 2-D or 3-D, writeable or read-only); the first call with
    fresh weights takes the checked path.  Same bits, any config, dtype and layout."""
    cfg = data.draw(configs(), label="cfg")
    T = data.draw(st.integers(1, 12), label="T")
    B = data.draw(st.sampled_from([None, 1, 3]), label="B")
    dtype = data.draw(st.sampled_from([np.float32, np.float64]), label="dtype")
    seed = data.draw(st.integers(0, 2**31), label="seed")
    H = np.random.default_rng(seed).standard_normal((T, cfg.d_model) if B is None else (B, T, cfg.d_model))
    H = H.astype(dtype)
    H.flags.writeable = data.draw(st.booleans(), label="writeable")
    w = random_weights(cfg, seed, dtype)
    checked = tblock.forward(H, w, cfg, backend="numba")         # fresh weights: the checked path
    assert w.prepared_calls["numba"][1](H) is not None            # the prepared call takes the next one
    np.testing.assert_array_equal(tblock.forward(H, w, cfg, backend="numba"), checked)
