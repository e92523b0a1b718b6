"""The lesson's lenses on one block, built on the public API (forward / trace / Stack).

Everything here calls ``tblock.forward`` (or ``Stack``) with ``backend=...`` and reads
the ``Trace``; nothing reaches into a backend. So every analysis runs on every backend.

- perturbation test (the two mixing axes): ``perturb``
- residual stream along depth: ``residual_norms_along_depth`` (with the per-block gain,
  ``token_jacobian``, ``block_gain``, ``stack_trace``, ``systems_table``, in ``depth``)
- attention as a filter bank: ``filter_bank``, ``row_entropies_bits``
- the exercises: ``forward_no_residual`` (Exercise 2), ``cfg.norm="post"`` everywhere
  (Exercise 3), ``perturb(token=0)`` (Exercise 4), ``ln_affine_fraction`` (Exercise 5)

Tokens and channels are 0-based here; the lesson's "channel 1 of token 3" is
``perturb(..., token=2, channel=0)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..api import check_input, forward
from ..config import BlockConfig
from ..counting import param_count
from ..weights import BlockWeights

ATTENTION_MATRICES = ("w_q", "w_k", "w_v", "w_o")


def _check_cfg_weights(weights, cfg):
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    if not isinstance(weights, BlockWeights):
        raise TypeError(f"weights must be a BlockWeights, got {type(weights).__name__}")
    weights.check(cfg)


def _index(name, value, size):
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
    _check_cfg_weights(weights, cfg)
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
# The two mixing axes: perturbation test
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Perturbation:
    token: int          # 0-based row that was bumped
    channel: int        # 0-based column that was bumped
    delta: float        # size of the bump
    dA: np.ndarray      # (T, d_model) attn_sublayer(H_p) - attn_sublayer(H_in)
    dF: np.ndarray      # (T, d_model) ffn_sublayer(H_mid_p) - ffn_sublayer(H_mid)

    @property
    def mha_sums(self) -> np.ndarray:
        """sum |dA| per token: the MHA response of each row."""
        return np.abs(self.dA).sum(axis=1)

    @property
    def ffn_sums(self) -> np.ndarray:
        """sum |dF| per token: the FFN response of each row."""
        return np.abs(self.dF).sum(axis=1)

    @property
    def mha_rows_moved(self) -> np.ndarray:
        """0-based rows whose MHA response is not exactly zero."""
        return np.flatnonzero(self.mha_sums)

    @property
    def ffn_rows_moved(self) -> np.ndarray:
        return np.flatnonzero(self.ffn_sums)

    @property
    def ffn_channels_touched(self) -> int:
        """Channels of the bumped token that the FFN's response touches (the lesson: 8 of 8)."""
        return int(np.count_nonzero(self.dF[self.token]))

    @property
    def mha_max_before(self) -> float:
        """max |dA| over the rows before the bumped token (0 for a causal block)."""
        return float(np.abs(self.dA[:self.token]).max()) if self.token else 0.0


def perturb(H_in, weights: BlockWeights, cfg: BlockConfig, token: int = 2, channel: int = 0,
            delta: float = 1.0, backend: str | None = None) -> Perturbation:
    """Bump entry (token, channel) by ``delta`` at the input of each sublayer and record the
    response of the whole (T, d_model) branch output, as the lesson does:

        dA = attn_sublayer(H_p) - A_out,        H_p = H_in with the bump
        dF = ffn_sublayer(H_mid_p) - F_out,     H_mid_p = H_mid with the bump

    The defaults are the lesson's: channel 1 of token 3 (1-based), +1.0."""
    _check_cfg_weights(weights, cfg)
    H_in = check_input(H_in, cfg, "H_in")
    if H_in.ndim != 2:
        raise ValueError(f"H_in must be one sequence (T, d_model), got shape {H_in.shape}")
    T, d = H_in.shape
    token = _index("token", token, T)
    channel = _index("channel", channel, d)
    _, tr = forward(H_in, weights, cfg, backend=backend, trace=True)
    H_p = H_in.copy()
    H_p[token, channel] += delta                             # bump at the MHA input
    dA = attn_sublayer(H_p, weights, cfg, backend) - attn_sublayer(H_in, weights, cfg, backend)
    H_mid_p = tr.H_mid.copy()
    H_mid_p[token, channel] += delta                         # the same bump at the FFN input
    dF = ffn_sublayer(H_mid_p, weights, cfg, backend) - ffn_sublayer(tr.H_mid, weights, cfg, backend)
    return Perturbation(token=token, channel=channel, delta=float(delta), dA=dA, dF=dF)


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
    _check_cfg_weights(weights, cfg)
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


def row_entropies_bits(A) -> np.ndarray:
    """Entropy in bits of every row of ``A`` (..., T, T); 0 log 0 = 0."""
    A = np.asarray(A, dtype=np.float64)
    safe = np.where(A > 0, A, 1.0)                          # log2(1) = 0 where A = 0
    return 0.0 - (A * np.log2(safe)).sum(axis=-1)           # 0.0 - 0.0 prints as 0, not -0


def entropy_bound_bits(T: int) -> np.ndarray:
    """log2 t for t = 1..T: the entropy of the uniform prefix average, the causal maximum."""
    return np.log2(np.arange(1, T + 1))


@dataclass(frozen=True)
class FilterBank:
    A: np.ndarray               # (n_heads, T, T) tap vectors, row t = query t
    entropies: np.ndarray       # (n_heads, T) row entropies in bits
    bound: np.ndarray           # (T,) log2 t (causal) or log2 T (unmasked)
    row_sums: np.ndarray        # (n_heads, T) DC gain of every tap vector, 1
    min_tap: float              # smallest tap; >= 0, so no row can invert sign
    causal_leak: float          # max |A[h, t, i]| over i > t; exactly 0 for a causal block
    dc_gain_error: float        # max |A_h @ (c * ones) - c|: a constant V passes unchanged

    @property
    def deficits(self) -> np.ndarray:
        """bound - entropy: how far each row has moved from uniform averaging."""
        return self.bound - self.entropies


def filter_bank(H_in, weights: BlockWeights, cfg: BlockConfig, backend: str | None = None,
                constant: float = 0.7) -> FilterBank:
    """The Signals/Information lenses: each head's attention rows as FIR tap vectors."""
    _, tr = forward(H_in, weights, cfg, backend=backend, trace=True)
    A = np.asarray(tr.A, dtype=np.float64)
    if A.ndim != 3:
        raise ValueError(f"H_in must be one sequence (T, d_model), got shape {np.shape(H_in)}")
    n_heads, T, _ = A.shape
    above = ~np.tril(np.ones((T, T), dtype=bool))           # keys i > t
    bound = entropy_bound_bits(T) if cfg.causal else np.full(T, np.log2(T))
    V_const = np.full((T, cfg.d_k), constant)               # (T, d_k) constant value signal
    return FilterBank(
        A=A, entropies=row_entropies_bits(A), bound=bound, row_sums=A.sum(axis=-1),
        min_tap=float(A.min()),
        causal_leak=float(np.abs(A[:, above]).max()) if T > 1 else 0.0,
        dc_gain_error=float(max(np.abs(A[h] @ V_const - constant).max() for h in range(n_heads))))


# ---------------------------------------------------------------------------------------
# Exercise 5: LayerNorm affines in the count
# ---------------------------------------------------------------------------------------

def ln_affine_fraction(d_model: int) -> float:
    """4 d_model / 12 d_model^2 = 1 / (3 d_model): the LN affines against the matrix budget."""
    if isinstance(d_model, bool) or not isinstance(d_model, (int, np.integer)) or d_model < 1:
        raise ValueError(f"d_model must be a positive integer, got {d_model!r}")
    return 4 * d_model / (12 * d_model ** 2)


def ln_affine_negligible_from(threshold: float = 0.01) -> int:
    """Smallest d_model whose LN affines are below ``threshold`` of the 12 d^2 budget."""
    if not 0 < threshold < 1:
        raise ValueError(f"threshold must be in (0, 1), got {threshold!r}")
    d = math.floor(1 / (3 * threshold)) + 1                 # 1/(3d) < threshold <=> d > 1/(3 threshold)
    return d


def ln_affine_delta(cfg: BlockConfig) -> int:
    """How much the per-block count grows with both LayerNorm affines: 4 d_model."""
    return param_count(cfg, ln_affine=True) - param_count(cfg, ln_affine=False)


# The depth lenses live in tblock.lesson.depth (which imports this module's helpers), and
# are this module's names too, loaded on first use.
DEPTH_NAMES = ("GENERATORS", "SCHEMES", "block_gain", "lesson_block_weights", "residual_norms_along_depth",
               "sigma_max", "stack_trace", "StackTrace", "stack_weights", "systems_table", "SystemsRow",
               "token_jacobian")


def __getattr__(name):
    if name in DEPTH_NAMES:
        from . import depth
        return getattr(depth, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(DEPTH_NAMES))
