"""The trace path: every intermediate of a block materialised, in H's dtype.

The matmuls are NumPy's (on rows rounded as the weights' dot says, tblock.formats);
LayerNorm, the masked softmax and bias + activation are the kernels' own, so a trace shows
what the fused block computes piece by piece.
"""

from __future__ import annotations

import numpy as np

from ...formats import flush_subnormals, round_inputs
from ...kernels.activations import ACTIVATION_CODES, bias_act_rows
from ...kernels.layernorm import layernorm_rows
from ...kernels.records import Rows
from ...kernels.softmax import masked_softmax_rows
from ..numpy import head_mix, head_probs
from .packing import refuse_unsupported


def trace_weights(weights, dtype):
    """The weights as plain arrays of ``dtype`` for the materialising trace path."""
    def build(w):
        a = {k: np.ascontiguousarray(v) for k, v in w.float_arrays(dtype).items()}
        d, dff = w.w_ff1.shape
        a.setdefault("b_ff1", np.zeros(dff, dtype))
        a.setdefault("b_ff2", np.zeros(d, dtype))
        for name in ("b_q", "b_k", "b_v", "b_o"):
            a.setdefault(name, np.zeros(d, dtype))
        a["ln1"] = np.concatenate([a.get("ln1_gamma", np.ones(d, dtype)), a.get("ln1_beta", np.zeros(d, dtype))])
        a["ln2"] = np.concatenate([a.get("ln2_gamma", np.ones(d, dtype)), a.get("ln2_beta", np.zeros(d, dtype))])
        a["zeros_ff"] = np.zeros(dff, dtype)
        return a
    return weights.prepared(("numba-trace", np.dtype(dtype).char), build)


def layernorm(X, P, eps):
    """Row LayerNorm of a (..., d) array; P = [gamma, beta]."""
    d = X.shape[-1]
    Y = np.empty_like(X)
    layernorm_rows(X.reshape(-1), Rows(0, d), Y.reshape(-1), Rows(0, d), X.size // d, d, P, 0, d, eps)
    return Y


def forward_trace(H, weights, cfg):
    """(H_out, trace) for H (B, T, d): every intermediate, with the kernels' non-matmul parts."""
    refuse_unsupported(cfg)
    dt = H.dtype
    w = trace_weights(weights, dt)
    B = H.shape[0]
    nh = cfg.n_heads
    scale = 1.0 / np.sqrt(cfg.d_k)
    tr = {}

    def times(X, name):
        W = flush_subnormals(w[name]) if weights.dot == "bf16" else w[name]
        return round_inputs(X, weights.dot) @ W

    def probs(S):
        A = np.empty_like(S)
        masked_softmax_rows(np.ascontiguousarray(S), scale, cfg.causal, A)
        return A

    def attention(X):
        Q, K, V = times(X, "w_q") + w["b_q"], times(X, "w_k") + w["b_k"], times(X, "w_v") + w["b_v"]
        A = np.stack([head_probs(Q[b], K[b], nh, probs, dt) for b in range(B)])
        oc = np.stack([head_mix(A[b], V[b], dt) for b in range(B)])
        A_out = times(oc, "w_o") + w["b_o"]
        tr.update(Q=Q, K=K, V=V, A=A, out_concat=oc, A_out=A_out)
        return A_out

    def ffn(X):
        F_pre = times(X, "w_ff1") + w["b_ff1"]
        F_post = F_pre.copy()
        dff = F_post.shape[-1]
        bias_act_rows(F_post.reshape(-1), 0, dff, F_post.size // dff, dff, w["zeros_ff"], 0,
                      ACTIVATION_CODES[cfg.activation])
        F_out = times(F_post, "w_ff2") + w["b_ff2"]
        tr.update(F_pre=F_pre, F_post=F_post, F_out=F_out)
        return F_out

    if cfg.norm == "pre":
        tr["H_norm1"] = layernorm(H, w["ln1"], cfg.eps)
        tr["H_mid"] = H + attention(tr["H_norm1"])
        tr["H_norm2"] = layernorm(tr["H_mid"], w["ln2"], cfg.eps)
        tr["H_out"] = tr["H_mid"] + ffn(tr["H_norm2"])
    else:
        tr["H_norm1"] = tr["H_mid"] = layernorm(H + attention(H), w["ln1"], cfg.eps)
        tr["H_norm2"] = tr["H_out"] = layernorm(tr["H_mid"] + ffn(tr["H_mid"]), w["ln2"], cfg.eps)
    return tr["H_out"], tr
