"""Sidebar: encoder-decoder. tblock.lesson.encdec against a plain NumPy rendering of the same
equations written here, causality of the decoder, and the decoder's reach into the source."""

import math

import numpy as np
import pytest

import tblock
from tblock.lesson import encdec

BACKENDS = tblock.available_backends()
CFG = tblock.BlockConfig(d_model=8, n_heads=2, d_ff=24)
T_ENC, T_DEC = 5, 3                                   # the two lengths differ on purpose


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


# ---- a plain rendering, independent of tblock's code -----------------------------------

def ln(X, g=None, b=None, eps=1e-5):
    Y = (X - X.mean(-1, keepdims=True)) / np.sqrt(X.var(-1, keepdims=True) + eps)
    return Y if g is None else Y * g + b


def mha(Xq, Xkv, wq, wk, wv, wo, n_heads, causal):
    Q, K, V = Xq @ wq, Xkv @ wk, Xkv @ wv
    dk = Q.shape[1] // n_heads
    outs = []
    for h in range(n_heads):
        c = slice(h * dk, (h + 1) * dk)
        S = Q[:, c] @ K[:, c].T / math.sqrt(dk)
        if causal:
            S = S + np.triu(np.full(S.shape, -1e30), 1)
        E = np.exp(S - S.max(1, keepdims=True))
        outs.append(E / E.sum(1, keepdims=True) @ V[:, c])
    return np.concatenate(outs, axis=1) @ wo


def ffn(X, w):
    Z = X @ w.w_ff1
    return 0.5 * Z * (1 + np.tanh(math.sqrt(2 / math.pi) * (Z + 0.044715 * Z ** 3))) @ w.w_ff2


def ref_encoder_block(X, w):
    X = X + mha(ln(X), ln(X), w.w_q, w.w_k, w.w_v, w.w_o, CFG.n_heads, causal=False)
    return X + ffn(ln(X), w)


def ref_decoder_block(Y, E, dw):
    w, c = dw.block, dw.cross
    Y = Y + mha(ln(Y), ln(Y), w.w_q, w.w_k, w.w_v, w.w_o, CFG.n_heads, causal=True)
    Y = Y + mha(ln(Y), E, c.w_q, c.w_k, c.w_v, c.w_o, CFG.n_heads, causal=False)
    return Y + ffn(ln(Y), w)


def ref_model(src, tgt, model):
    E = src
    for w in model.encoder.weights:
        E = ref_encoder_block(E, w)
    E = ln(E)                                         # the encoder stack's final LayerNorm
    Y = tgt
    for dw in model.decoder.weights:
        Y = ref_decoder_block(Y, E, dw)
    return ln(Y)


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(13)
    model = encdec.EncoderDecoder.init(CFG, n_encoder=2, n_decoder=2, seed=7)
    return model, rng.standard_normal((T_ENC, 8)), rng.standard_normal((T_DEC, 8))


def test_encoder_block_is_unmasked_self_attention(backend, case):
    model, src, _ = case
    w = model.encoder.weights[0]
    np.testing.assert_allclose(encdec.encoder_block(src, w, CFG, backend), ref_encoder_block(src, w),
                               rtol=1e-10, atol=1e-12)


def test_decoder_block_matches_the_equations(backend, case):
    model, src, tgt = case
    E = ln(src)
    dw = model.decoder.weights[0]
    got, tr = encdec.decoder_block(tgt, E, dw, CFG, backend, trace=True)
    np.testing.assert_allclose(got, ref_decoder_block(tgt, E, dw), rtol=1e-10, atol=1e-12)
    assert tr.A_cross.shape == (CFG.n_heads, T_DEC, T_ENC)
    np.testing.assert_allclose(tr.A_cross.sum(-1), 1.0, atol=1e-12)
    assert np.all(tr.A_cross > 0)                      # no mask on the encoder side
    assert np.all(tr.A_self[:, np.triu_indices(T_DEC, 1)[0], np.triu_indices(T_DEC, 1)[1]] == 0)


def test_stacks_match_the_equations(backend, case):
    model, src, tgt = case
    m = encdec.EncoderDecoder(encdec.EncoderStack(CFG, model.encoder.weights, backend),
                              encdec.DecoderStack(CFG, model.decoder.weights, backend))
    np.testing.assert_allclose(m(src, tgt), ref_model(src, tgt, model), rtol=1e-10, atol=1e-12)
    assert m(src, tgt).shape == (T_DEC, 8)


def test_cross_layernorm_affine_is_used(case):
    cfg = tblock.BlockConfig(d_model=8, n_heads=2, d_ff=24, ln_affine=True)
    dw = encdec.init_decoder_weights(cfg, seed=3)
    rng = np.random.default_rng(0)
    g, b = 1 + 0.5 * rng.standard_normal(8), 0.5 * rng.standard_normal(8)
    cross = encdec.CrossWeights(dw.cross.w_q, dw.cross.w_k, dw.cross.w_v, dw.cross.w_o, g, b)
    Y, E = rng.standard_normal((T_DEC, 8)), ln(rng.standard_normal((T_ENC, 8)))
    _, tr = encdec.decoder_block(Y, E, encdec.DecoderWeights(dw.block, cross), cfg, trace=True)
    want = tr.Y_1 + mha(ln(tr.Y_1, g, b), E, cross.w_q, cross.w_k, cross.w_v, cross.w_o, 2, causal=False)
    np.testing.assert_allclose(tr.Y_2, want, rtol=1e-12, atol=1e-12)


def test_decoder_self_attention_is_causal(backend, case):
    model, src, tgt = case
    m = encdec.EncoderDecoder(encdec.EncoderStack(CFG, model.encoder.weights, backend),
                              encdec.DecoderStack(CFG, model.decoder.weights, backend))
    base = m(src, tgt)
    for t in range(T_DEC):
        bumped = tgt.copy()
        bumped[t, t % 8] += 1.0
        out = m(src, bumped)
        np.testing.assert_array_equal(out[:t], base[:t])          # earlier decoder rows never move
        assert np.all(np.abs(out[t:] - base[t:]).sum(1) > 0)


def test_every_encoder_row_reaches_every_decoder_row(backend, case):
    model, src, tgt = case
    m = encdec.EncoderDecoder(encdec.EncoderStack(CFG, model.encoder.weights, backend),
                              encdec.DecoderStack(CFG, model.decoder.weights, backend))
    base = m(src, tgt)
    for r in range(T_ENC):
        bumped = src.copy()
        bumped[r, 0] += 1.0
        moved = np.abs(m(bumped, tgt) - base).sum(axis=1)
        assert np.all(moved > 1e-9), f"encoder row {r} did not reach decoder rows {np.flatnonzero(moved <= 1e-9)}"


def test_encoder_is_unmasked(backend, case):
    model, src, _ = case
    base = model.encoder(src)
    bumped = src.copy()
    bumped[-1, 0] += 1.0
    assert np.abs(encdec.EncoderStack(CFG, model.encoder.weights, backend)(bumped)[0] - base[0]).sum() > 1e-9


def test_errors(case):
    model, src, tgt = case
    post = tblock.BlockConfig(d_model=8, n_heads=2, d_ff=24, norm="post")
    with pytest.raises(ValueError, match="norm must be 'pre'"):
        encdec.decoder_block(tgt, src, model.decoder.weights[0], post)
    with pytest.raises(ValueError, match="norm must be 'pre'"):
        encdec.encoder_block(src, model.encoder.weights[0], post)
    with pytest.raises(TypeError, match="DecoderWeights"):
        encdec.decoder_block(tgt, src, model.encoder.weights[0], CFG)
    with pytest.raises(ValueError, match="E must have d_model=8"):
        encdec.decoder_block(tgt, src[:, :4], model.decoder.weights[0], CFG)
    with pytest.raises(ValueError, match="must have shape"):
        encdec.CrossWeights(*(np.zeros((4, 4)) for _ in range(4))).check(CFG)
    with pytest.raises(ValueError, match="non-empty"):
        encdec.EncoderStack(CFG, [])
