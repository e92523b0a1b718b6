"""The NumPy oracle: Lesson 13's equations, written plainly, in float64.

This is the reference every other backend is checked against, so it favours
clarity over speed: a per-head loop, the full T x T score matrix, an explicit
causal mask and a max-subtracted softmax, exactly as the lesson writes them.
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf

from ..config import BlockConfig
from ..formats import flush_subnormals, round_inputs
from ..weights import BlockWeights


def layernorm(X, gamma=None, beta=None, eps=1e-5):
    """Standardise each row (token): population variance, eps inside the square root."""
    mu = X.mean(axis=1, keepdims=True)                      # (T, 1)
    var = ((X - mu) ** 2).mean(axis=1, keepdims=True)       # (T, 1), divides by d_model
    Y = (X - mu) / np.sqrt(var + eps)
    if gamma is not None:
        Y = Y * gamma + beta
    return Y


def rmsnorm(X, gamma=None, eps=1e-5):
    """Scale each row to unit root mean square (no mean taken out), then the gain gamma."""
    Y = X / np.sqrt((X ** 2).mean(axis=1, keepdims=True) + eps)     # (T, d_model)
    return Y if gamma is None else Y * gamma


def norm(cfg, w, i):
    """The block's norm number i (1 or 2) as a function of X: LayerNorm or RMSNorm, its affine."""
    gamma, beta = w.get(f"ln{i}_gamma"), w.get(f"ln{i}_beta")
    if cfg.norm_type == "rmsnorm":
        return lambda X: rmsnorm(X, gamma, eps=cfg.eps)
    return lambda X: layernorm(X, gamma, beta, eps=cfg.eps)


def causal_mask(T):
    """True where query t may look at key i, i.e. i <= t (lower triangle with diagonal)."""
    return np.tril(np.ones((T, T), dtype=bool))


def softmax_rows(S):
    """Row-wise softmax; subtracting the row max keeps exp() from overflowing."""
    S = S - S.max(axis=1, keepdims=True)
    E = np.exp(S)
    return E / E.sum(axis=1, keepdims=True)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def relu(x):
    return np.maximum(x, 0.0)


def silu(x):
    return x / (1.0 + np.exp(-x))


ACTIVATION = {"gelu_tanh": gelu_tanh, "gelu_erf": gelu_erf, "relu": relu, "silu": silu}


def rotary(X, positions, cfg):
    """Hugging Face's rotate-half rotary embedding of X's heads (T, n * d_k): in each head the
    pair (x_j, x_{j + d_k/2}) at position t turns by t / rope_scale * rope_theta^(-2j/d_k)."""
    half = cfg.d_k // 2
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(half) * 2.0 / cfg.d_k)          # (d_k/2,)
    angle = np.asarray(positions, np.float64)[:, None] / cfg.rope_scale * inv_freq  # (T, d_k/2)
    c, s = np.cos(angle), np.sin(angle)
    Y = np.empty_like(X)
    for h in range(X.shape[1] // cfg.d_k):
        x1, x2 = X[:, h * cfg.d_k:h * cfg.d_k + half], X[:, h * cfg.d_k + half:(h + 1) * cfg.d_k]
        Y[:, h * cfg.d_k:h * cfg.d_k + half] = x1 * c - x2 * s
        Y[:, h * cfg.d_k + half:(h + 1) * cfg.d_k] = x2 * c + x1 * s
    return Y


def head_probs(Q, K, n_heads, probs, dtype=np.float64):
    """A[h] = probs(Q_h K_g^T) for each head h, where Q_h is its d_k columns and K_g those of
    the K head it reads (g = h // group: grouped-query attention, K with fewer heads); every
    attention in the package (self, cross, with dropout, the trace paths) starts here."""
    d_k = Q.shape[1] // n_heads
    group = Q.shape[1] // K.shape[1]                        # query heads per K/V head
    A = np.empty((n_heads, Q.shape[0], K.shape[0]), dtype=dtype)
    for h in range(n_heads):
        g = h // group
        A[h] = probs(Q[:, h * d_k:(h + 1) * d_k] @ K[:, g * d_k:(g + 1) * d_k].T)   # (T_q, T_k)
    return A


def head_mix(A, V, dtype, d_k=None):
    """out_concat: head h's A[h] @ V_g written into its own d_k columns, where V_g is the V
    head it reads (g = h // group; d_k defaults to V's width over the heads: no grouping)."""
    n_heads, T, _ = A.shape
    d_k = V.shape[1] // n_heads if d_k is None else d_k
    group = n_heads * d_k // V.shape[1]
    out = np.empty((T, n_heads * d_k), dtype=dtype)
    for h in range(n_heads):
        g = h // group
        out[:, h * d_k:(h + 1) * d_k] = A[h] @ V[:, g * d_k:(g + 1) * d_k]   # (T, d_k) into its slice
    return out


def allowed(cfg, T):
    """Which keys each query may look at: the causal triangle, or every key."""
    return causal_mask(T) if cfg.causal else np.ones((T, T), dtype=bool)


def masked_softmax(cfg, T):
    """The lesson's probabilities for raw (T, T) scores: scale, mask, row softmax."""
    scale, keep = 1.0 / np.sqrt(cfg.d_k), allowed(cfg, T)
    return lambda S: softmax_rows(np.where(keep, S * scale, -np.inf))   # masked keys: exp(-inf) = 0


def attention_core(Q, K, V, cfg):
    """Per head: score -> mask -> softmax -> weighted sum; returns out_concat and A."""
    A = head_probs(Q, K, cfg.n_heads, masked_softmax(cfg, Q.shape[0]))
    return head_mix(A, V, Q.dtype, cfg.d_k), A


class RoundingMatrix:
    """A stored matrix W whose products X @ W first round X's rows as its dot says
    (tblock.formats.round_inputs), so the equations below read as the lesson writes them."""
    __array_ufunc__ = None          # numpy then hands X @ self to __rmatmul__

    def __init__(self, W: np.ndarray, dot: str):
        self.W, self.dot = W, dot

    def __rmatmul__(self, X):
        return round_inputs(X, self.dot) @ self.W


def weight_arrays(weights: BlockWeights) -> dict:
    """The weights as float64 arrays, stored matrices dequantized exactly; where their dot
    rounds the inputs, the matrices as RoundingMatrix (dot "bf16": their subnormals as
    zeros, tblock.formats)."""
    w = weights.float_arrays(np.float64)
    if weights.dot == "bf16":
        w.update({n: flush_subnormals(w[n]) for n in weights.matrix_names})
    if weights.dot != "fp32":
        w.update({n: RoundingMatrix(w[n], weights.dot) for n in weights.matrix_names})
    return w


def projections(X, w, cfg, past=0):
    """Q (T, d_model), K and V (T, d_kv) of the rows of X, plus their biases with
    cfg.attn_bias; with rotary positions Q and K turned for positions past .. past + T - 1."""
    Q, K, V = X @ w["w_q"], X @ w["w_k"], X @ w["w_v"]
    if cfg.qkv_bias:
        Q, K, V = Q + w["b_q"], K + w["b_k"], V + w["b_v"]
    if cfg.positions == "rotary":
        t = past + np.arange(X.shape[0])
        Q, K = rotary(Q, t, cfg), rotary(K, t, cfg)
    return Q, K, V


def output_projection(out_concat, w, cfg):
    """A_out = out_concat W_O (+ b_O)."""
    A_out = out_concat @ w["w_o"]
    return A_out + w["b_o"] if cfg.out_bias else A_out


def attention(X, w, cfg, trace):
    """MHA(X): the per-head core on X's projections, concatenated, then W_O."""
    Q, K, V = projections(X, w, cfg)
    out_concat, A = attention_core(Q, K, V, cfg)
    A_out = output_projection(out_concat, w, cfg)
    trace.update(Q=Q, K=K, V=V, A=A, out_concat=out_concat, A_out=A_out)
    return A_out


def cached_attention(cache, b):
    """MHA for the next rows of sequence b of a KVCache: their K and V are appended after
    the cache's first ``cache.length`` rows, and query i (token past + i) attends to keys
    0 .. past + i, the causal mask of the whole sequence."""
    def attend(X, w, cfg, trace):
        past, T_new = cache.length, X.shape[0]
        Q, K, V = projections(X, w, cfg, past)
        heads = lambda M: M.reshape(T_new, cfg.kv_heads, cfg.d_k).transpose(1, 0, 2)  # (T, d_kv) -> (h, T, d_k)
        cache.store(b, past, heads(K), heads(V))
        rows = lambda C: C.transpose(1, 0, 2).reshape(past + T_new, -1)    # (h, T, d_k) -> (T, d_kv)
        K_all, V_all = (rows(C).astype(np.float64) for C in cache.head_rows(b, past + T_new))
        keep = np.tril(np.ones((T_new, past + T_new), dtype=bool), k=past)
        scale = 1.0 / np.sqrt(cfg.d_k)
        A = head_probs(Q, K_all, cfg.n_heads, lambda S: softmax_rows(np.where(keep, S * scale, -np.inf)))
        A_out = output_projection(head_mix(A, V_all, np.float64, cfg.d_k), w, cfg)
        trace.update(Q=Q, K=K, V=V, A=A, A_out=A_out)
        return A_out
    return attend


def ffn(X, w, cfg, trace):
    """FFN(X) = act(X W1 + b1) W2 + b2, row by row; the gated FFN (SwiGLU with silu) multiplies
    X W1 + b1 by act(X W_gate + b_gate) instead of taking act of it."""
    F_pre = X @ w["w_ff1"]                                  # (T, d_ff)
    if cfg.ffn_bias:
        F_pre = F_pre + w["b_ff1"]
    if cfg.ffn == "gated":
        F_gate = X @ w["w_gate"] + (w["b_gate"] if cfg.ffn_bias else 0.0)   # (T, d_ff)
        F_post = ACTIVATION[cfg.activation](F_gate) * F_pre
        trace.update(F_gate=F_gate)
    else:
        F_post = ACTIVATION[cfg.activation](F_pre)
    F_out = F_post @ w["w_ff2"]                             # (T, d_model)
    if cfg.ffn_bias:
        F_out = F_out + w["b_ff2"]
    trace.update(F_pre=F_pre, F_post=F_post, F_out=F_out)
    return F_out


def block_forward_one(H_in, w, cfg, attention=attention):
    """One sequence (T, d_model) through the block; returns H_out and the trace dict.
    ``attention(X, w, cfg, trace)`` is the MHA sublayer (cached_attention with a cache)."""
    tr = {}
    ln1, ln2 = norm(cfg, w, 1), norm(cfg, w, 2)            # LayerNorm (the lesson's) or RMSNorm
    if cfg.norm == "pre":
        # H_mid = H_in + MHA(LN1(H_in));  H_out = H_mid + FFN(LN2(H_mid))
        tr["H_norm1"] = ln1(H_in)
        tr["H_mid"] = H_in + attention(tr["H_norm1"], w, cfg, tr)
        tr["H_norm2"] = ln2(tr["H_mid"])
        tr["H_out"] = tr["H_mid"] + ffn(tr["H_norm2"], w, cfg, tr)
    else:
        # H_mid = LN1(H_in + MHA(H_in));  H_out = LN2(H_mid + FFN(H_mid))
        # (the LN outputs are the stream itself: H_norm1 is H_mid, H_norm2 is H_out)
        tr["H_norm1"] = tr["H_mid"] = ln1(H_in + attention(H_in, w, cfg, tr))
        tr["H_norm2"] = tr["H_out"] = ln2(tr["H_mid"] + ffn(tr["H_mid"], w, cfg, tr))
    return tr["H_out"], tr


# tblock.api checks H for NaN/Inf before calling forward_batch
CHECKS_FINITE = False


def forward_batch(H: np.ndarray, weights: BlockWeights, cfg: BlockConfig, trace: bool):
    """Backend entry point: H is (B, T, d_model); returns float64 H_out and, if asked,
    the trace as a dict of arrays with a leading batch axis."""
    w = weight_arrays(weights)
    H = H.astype(np.float64)
    outs, traces = [], []
    for b in range(H.shape[0]):
        H_out, tr = block_forward_one(H[b], w, cfg)
        outs.append(H_out)
        traces.append(tr)
    H_out = np.stack(outs)                                  # (B, T, d_model)
    if not trace:
        return H_out, None
    return H_out, {k: np.stack([tr[k] for tr in traces]) for k in traces[0]}


def forward_cached(H: np.ndarray, weights: BlockWeights, cfg: BlockConfig, cache):
    """The KV-cache entry point: H (B, T_new, d_model) holds the rows after the cache's
    first cache.length; returns their float64 H_out, having written their K and V into
    the cache (in its dtype) past cache.length (tblock.api then moves cache.length)."""
    w = weight_arrays(weights)
    H = H.astype(np.float64)
    return np.stack([block_forward_one(H[b], w, cfg, cached_attention(cache, b))[0]
                     for b in range(H.shape[0])])                     # (B, T_new, d_model)


def components(cfg, weights, dtype):
    """The oracle's own functions as timed components, in float64 as forward_batch runs them."""
    from .components import ComponentSet, block_fn

    cs = ComponentSet("numpy", cfg, dtype, np.dtype(np.float64))
    cs.notes.append("the numpy oracle computes in float64 whatever the input dtype, "
                    "and always fills the full T x T score square")
    w = weight_arrays(weights)
    ln1 = norm(cfg, w, 1)

    def layernorm_(X):
        return ln1(X.astype(np.float64))

    def softmax(S):
        # the oracle's per-head step on scores that already carry the 1/sqrt(d_k) scale
        keep = allowed(cfg, S.shape[-1])
        return np.stack([softmax_rows(np.where(keep, s, -np.inf)) for s in S.astype(np.float64)])

    def attention_core_(Q, K, V):
        return attention_core(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64), cfg)[0]

    cs.fns.update(layernorm=layernorm_, softmax=softmax, attention_core=attention_core_,
                  attention=lambda X: attention(X.astype(np.float64), w, cfg, {}),
                  ffn=lambda X: ffn(X.astype(np.float64), w, cfg, {}), block=block_fn("numpy", cfg, weights))
    return cs
