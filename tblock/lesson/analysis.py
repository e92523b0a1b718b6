"""The lesson's lenses on one block, built on the public API (forward / trace).

Everything here calls ``tblock.forward`` with ``backend=...`` and reads the ``Trace``;
nothing reaches into a backend. So every analysis runs on every backend.

- perturbation test (the two mixing axes): ``perturb``
- attention as a filter bank: ``filter_bank``, ``row_entropies_bits``
- the exercises: ``cfg.norm="post"`` everywhere (Exercise 3), ``perturb(token=0)``
  (Exercise 4), ``ln_affine_fraction`` (Exercise 5)

The sublayer maps and Exercise 2 (``forward_no_residual``) are in ``sublayers``; the residual
stream along depth (``residual_norms_along_depth``, ``block_gain``, ``stack_trace``,
``systems_table``) in ``depth``.

Tokens and channels are 0-based here; the lesson's "channel 1 of token 3" is
``perturb(..., token=2, channel=0)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..api import check_input, forward
from ..config import BlockConfig
from ..counting import param_count
from ..weights import BlockWeights
from .sublayers import attn_sublayer, check_cfg_weights, check_index, ffn_sublayer

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
    check_cfg_weights(weights, cfg)
    H_in = check_input(H_in, cfg, "H_in")
    if H_in.ndim != 2:
        raise ValueError(f"H_in must be one sequence (T, d_model), got shape {H_in.shape}")
    T, d = H_in.shape
    token = check_index("token", token, T)
    channel = check_index("channel", channel, d)
    _, tr = forward(H_in, weights, cfg, backend=backend, trace=True)
    H_p = H_in.copy()
    H_p[token, channel] += delta                             # bump at the MHA input
    dA = attn_sublayer(H_p, weights, cfg, backend) - attn_sublayer(H_in, weights, cfg, backend)
    H_mid_p = tr.H_mid.copy()
    H_mid_p[token, channel] += delta                         # the same bump at the FFN input
    dF = ffn_sublayer(H_mid_p, weights, cfg, backend) - ffn_sublayer(tr.H_mid, weights, cfg, backend)
    return Perturbation(token=token, channel=channel, delta=float(delta), dA=dA, dF=dF)


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
