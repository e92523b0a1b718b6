"""The block taken apart, for the lesson's lenses: each sublayer's branch as a map on the
whole matrix, the block without its residual connections (Exercise 2), and the argument
checks the lenses share. ``analysis`` and ``depth`` both build on this module, on the public
API only, so every map runs on every backend."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..api import check_input, forward
from ..config import BlockConfig
from ..weights import BlockWeights

ATTENTION_MATRICES = ("w_q", "w_k", "w_v", "w_o")


def check_cfg_weights(weights, cfg):
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    if not isinstance(weights, BlockWeights):
        raise TypeError(f"weights must be a BlockWeights, got {type(weights).__name__}")
    weights.check(cfg)


def check_index(name, value, size):
    """A 0-based index into ``size`` things; negative counts from the end, like Python."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if not -size <= value < size:
        raise ValueError(f"{name} must be in [{-size}, {size}) (0-based), got {value}")
    return int(value) % size


# ---------------------------------------------------------------------------------------
# The two sublayers as maps on the whole matrix
# ---------------------------------------------------------------------------------------

def without_attention(weights: BlockWeights) -> BlockWeights:
    """The same block with W_Q, W_K, W_V, W_O set to zero: its MHA branch outputs 0."""
    a = weights.arrays()
    for name in ATTENTION_MATRICES:
        a[name] = np.zeros_like(a[name])
    return BlockWeights(**a)


def attn_sublayer(H, weights: BlockWeights, cfg: BlockConfig, backend: str | None = None):
    """The attention sublayer's branch on ``H``: MHA(LN1(H)) for Pre-LN, MHA(H) for Post-LN.

    Either way it is ``trace.A_out`` of ``forward(H)``: the trace's A_out is the branch
    before the residual add (and, for Post-LN, before the LayerNorm)."""
    _, tr = forward(H, weights, cfg, backend=backend, trace=True)
    return tr.A_out


def _identity_ln_affine(x, eps):
    """gamma, beta that make LayerNorm the identity on the single row ``x`` (d_model,):
    LN(x) = (x - mu) / sqrt(var + eps), so gamma = sqrt(var + eps), beta = mu undo it."""
    mu = x.mean()
    sigma = np.sqrt(((x - mu) ** 2).mean() + eps)
    return np.full_like(x, sigma), np.full_like(x, mu)


def ffn_sublayer(X, weights: BlockWeights, cfg: BlockConfig, backend: str | None = None):
    """The FFN sublayer's branch on ``X``: FFN(LN2(X)) for Pre-LN, FFN(X) for Post-LN.

    Pre-LN: run the block with the attention matrices zeroed. Its MHA branch is then 0,
    so H_mid = X + 0 = X exactly and ``trace.F_out`` = FFN(LN2(X)).

    Post-LN: the FFN reads H_mid = LN1(X + MHA(X)) = LN1(X) when attention is zeroed, and a
    LayerNorm without affine is not the identity. Because the FFN acts on each row alone,
    we run one row at a time with LN1's affine set to gamma = sqrt(var + eps), beta = mean
    of that row, which undoes the standardisation: H_mid = X_t (to rounding), and
    ``trace.F_out`` = FFN(X_t). That is T calls of one token each; the LN2 affine (which
    acts after F_out) is left as it was."""
    check_cfg_weights(weights, cfg)
    X = check_input(X, cfg, "X")
    ffn_only = without_attention(weights)
    if cfg.norm == "pre":
        _, tr = forward(X, ffn_only, cfg, backend=backend, trace=True)
        return tr.F_out
    cfg_affine = replace(cfg, ln_affine=True)
    a = ffn_only.arrays()
    d = cfg.d_model
    a.setdefault("ln2_gamma", np.ones(d, dtype=weights.dtype))
    a.setdefault("ln2_beta", np.zeros(d, dtype=weights.dtype))
    rows = X.reshape(-1, d)                                  # (B*T, d_model): one token per call
    F_out = np.empty_like(rows)
    for r, x in enumerate(rows):
        gamma, beta = _identity_ln_affine(x.astype(np.float64), cfg.eps)
        a["ln1_gamma"], a["ln1_beta"] = gamma, beta
        _, tr = forward(x[None, :], BlockWeights(**a), cfg_affine, backend=backend, trace=True)
        F_out[r] = tr.F_out[0]
    return F_out.reshape(X.shape)                            # (T, d_model) or (B, T, d_model)


# ---------------------------------------------------------------------------------------
# Exercise 2: the block without its residual connections
# ---------------------------------------------------------------------------------------

def forward_no_residual(H_in, weights: BlockWeights, cfg: BlockConfig, backend: str | None = None):
    """Exercise 2: the block with both ``+`` removed, built from traces.

    Pre-LN:  H_mid = MHA(LN1(H_in)) = A_out,   H_out = FFN(LN2(H_mid)) = F_out.
    Post-LN: H_mid = LN1(MHA(H_in)),           H_out = LN2(FFN(H_mid)).

    A_out is ``trace.A_out`` of ``forward(H_in)``. The FFN step is a forward with the
    attention zeroed (so its H_mid is LN1(X) for Post-LN, X itself for Pre-LN); for Post-LN
    the final LN2 is a third such call, whose H_mid is the LayerNorm of its input."""
    check_cfg_weights(weights, cfg)
    _, tr = forward(H_in, weights, cfg, backend=backend, trace=True)
    A_out = tr.A_out
    ffn_only = without_attention(weights)
    _, tr2 = forward(A_out, ffn_only, cfg, backend=backend, trace=True)
    if cfg.norm == "pre":
        return tr2.F_out                                    # FFN(LN2(A_out))
    # Post-LN: tr2.H_mid = LN1(A_out), tr2.F_out = FFN(LN1(A_out)); LN2 of that is one more
    # zero-attention call with LN2's affine in LN1's place (the first LN is what we read)
    a = ffn_only.arrays()
    if cfg.ln_affine:
        a["ln1_gamma"], a["ln1_beta"] = a["ln2_gamma"], a["ln2_beta"]
    _, tr3 = forward(tr2.F_out, BlockWeights(**a), cfg, backend=backend, trace=True)
    return tr3.H_mid                                         # LN2(FFN(LN1(MHA(H_in))))
