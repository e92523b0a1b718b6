"""The trace path: every intermediate of a block materialised, in H's dtype.

The matmuls are NumPy's (on rows rounded as the weights' dot says, tblock.formats);
the norms (LayerNorm, RMSNorm), the masked softmax, bias + activation and the rotary
table are the kernels' own, so a trace shows what the fused block computes piece by piece.
"""

from __future__ import annotations

import numpy as np

from ...formats import flush_subnormals, round_inputs
from ...kernels.activations import ACTIVATION_CODES, bias_act_rows
from ...kernels.layernorm import layernorm_rows
from ...kernels.records import Rows
from ...kernels.rotary import rope_table
from ...kernels.softmax import masked_softmax_rows
from ..numpy import head_mix, head_probs


def trace_weights(weights, dtype):
    """The weights as plain arrays of ``dtype`` for the materialising trace path."""
    def build(w):
        a = {k: np.ascontiguousarray(v) for k, v in w.float_arrays(dtype).items()}
        d, dff = w.w_ff1.shape
        dkv = w.w_k.shape[1]
        for name, n in (("b_ff1", dff), ("b_gate", dff), ("b_ff2", d), ("b_q", d), ("b_k", dkv), ("b_v", dkv),
                        ("b_o", d)):
            a.setdefault(name, np.zeros(n, dtype))
        a["ln1"] = np.concatenate([a.get("ln1_gamma", np.ones(d, dtype)), a.get("ln1_beta", np.zeros(d, dtype))])
        a["ln2"] = np.concatenate([a.get("ln2_gamma", np.ones(d, dtype)), a.get("ln2_beta", np.zeros(d, dtype))])
        a["zeros_ff"] = np.zeros(dff, dtype)
        return a
    return weights.prepared(("numba-trace", np.dtype(dtype).char), build)


def layernorm(X, P, eps, rms=False):
    """Row LayerNorm of a (..., d) array, P = [gamma, beta]; rms: RMSNorm, gamma only."""
    d = X.shape[-1]
    Y = np.empty_like(X)
    layernorm_rows(X.reshape(-1), Rows(0, d), Y.reshape(-1), Rows(0, d), X.size // d, d, P, 0, -1 if rms else d, eps)
    return Y


def rotary(X, cfg, table):
    """X (B, T, n * d_k) with each head turned by the rotary table of its T rows (kernels.rotary)."""
    dk, half = cfg.d_k, cfg.d_k // 2
    c, s = table[:, :half], table[:, half:]                 # (T, d_k/2) each, in X's dtype
    Y = X.reshape(X.shape[0], X.shape[1], -1, dk)
    x1, x2 = Y[..., :half], Y[..., half:]
    out = np.concatenate([x1 * c[:, None] - x2 * s[:, None], x2 * c[:, None] + x1 * s[:, None]], axis=-1)
    return out.reshape(X.shape)


def forward_trace(H, weights, cfg):
    """(H_out, trace) for H (B, T, d): every intermediate, with the kernels' non-matmul parts."""
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
        if cfg.positions == "rotary":
            T = X.shape[1]
            table = np.empty(T * cfg.d_k, dt)
            rope_table(table, T, cfg.d_k, 0, cfg.rope_theta, cfg.rope_scale)
            Q, K = rotary(Q, cfg, table.reshape(T, cfg.d_k)), rotary(K, cfg, table.reshape(T, cfg.d_k))
        A = np.stack([head_probs(Q[b], K[b], nh, probs, dt) for b in range(B)])
        oc = np.stack([head_mix(A[b], V[b], dt, cfg.d_k) for b in range(B)])
        A_out = times(oc, "w_o") + w["b_o"]
        tr.update(Q=Q, K=K, V=V, A=A, out_concat=oc, A_out=A_out)
        return A_out

    def act(F):
        F = F.copy()
        dff = F.shape[-1]
        bias_act_rows(F.reshape(-1), 0, dff, F.size // dff, dff, w["zeros_ff"], 0, ACTIVATION_CODES[cfg.activation])
        return F

    def ffn(X):
        F_pre = times(X, "w_ff1") + w["b_ff1"]
        if cfg.ffn == "gated":          # F_pre is the up projection, F_gate the gate's (the oracle's names)
            F_gate = times(X, "w_gate") + w["b_gate"]
            F_post = act(F_gate) * F_pre
            tr.update(F_gate=F_gate)
        else:
            F_post = act(F_pre)
        F_out = times(F_post, "w_ff2") + w["b_ff2"]
        tr.update(F_pre=F_pre, F_post=F_post, F_out=F_out)
        return F_out

    rms = cfg.norm_type == "rmsnorm"
    if cfg.norm == "pre":
        tr["H_norm1"] = layernorm(H, w["ln1"], cfg.eps, rms)
        tr["H_mid"] = H + attention(tr["H_norm1"])
        tr["H_norm2"] = layernorm(tr["H_mid"], w["ln2"], cfg.eps, rms)
        tr["H_out"] = tr["H_mid"] + ffn(tr["H_norm2"])
    else:
        tr["H_norm1"] = tr["H_mid"] = layernorm(H + attention(H), w["ln1"], cfg.eps, rms)
        tr["H_norm2"] = tr["H_out"] = layernorm(tr["H_mid"] + ffn(tr["H_mid"]), w["ln2"], cfg.eps, rms)
    return tr["H_out"], tr
