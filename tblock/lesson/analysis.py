"""The lesson's lenses on one block, built on the public API (forward / trace / Stack).

Everything here calls ``tblock.forward`` (or ``Stack``) with ``backend=...`` and reads
the ``Trace``; nothing reaches into a backend. So every analysis runs on every backend.

- perturbation test (the two mixing axes): ``perturb``
- residual stream along depth: ``residual_norms_along_depth``
- per-block gain: ``token_jacobian``, ``block_gain``, ``stack_trace``, ``systems_table``
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

from ..api import Stack, check_input, forward
from ..config import BlockConfig
from ..counting import param_count
from ..weights import BlockWeights, init_weights

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


def _block_fn(weights, cfg, backend, residual):
    if residual:
        return lambda H: forward(H, weights, cfg, backend=backend)
    return lambda H: forward_no_residual(H, weights, cfg, backend=backend)


# ---------------------------------------------------------------------------------------
# Per-block gain: the finite-difference Jacobian of token T's output
# ---------------------------------------------------------------------------------------

SCHEMES = ("forward", "central")


def token_jacobian(block, H, token: int = -1, step: float = 1e-5, scheme: str = "forward"):
    """J[i, j] = d block(H)[token, i] / d H[token, j] by finite differences, (d_model, d_model).

    ``block`` maps a (B, T, d_model) batch to a (B, T, d_model) batch (one block forward).
    ``scheme="forward"`` is the lesson's (f(H + step e_j) - f(H)) / step, error O(step);
    ``"central"`` is (f(H + step e_j) - f(H - step e_j)) / (2 step), error O(step^2).
    All the perturbed copies of H go through ``block`` as one batch."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if not (isinstance(step, (int, float)) and not isinstance(step, bool) and 0 < step < np.inf):
        raise ValueError(f"step must be a positive finite number, got {step!r}")
    H = np.asarray(H, dtype=np.float64)
    T, d = H.shape
    token = _index("token", token, T)
    bumps = np.zeros((d, T, d))                             # (d, T, d_model): bump j in copy j
    bumps[np.arange(d), token, np.arange(d)] = step
    if scheme == "forward":
        batch = np.concatenate([H[None], H[None] + bumps])  # (1 + d, T, d_model): base, then bumps
        out = block(batch)[:, token, :]                     # (1 + d, d_model)
        J_T = (out[1:] - out[0]) / step                     # row j = d out / d H[token, j]
    else:
        batch = np.concatenate([H[None] + bumps, H[None] - bumps])   # (2d, T, d_model)
        out = block(batch)[:, token, :]                     # (2d, d_model)
        J_T = (out[:d] - out[d:]) / (2 * step)
    return J_T.T                                            # (d_model, d_model): J[i, j]


def sigma_max(J) -> float:
    """Largest singular value: the one-step gain of a (non-normal) Jacobian."""
    return float(np.linalg.svd(J, compute_uv=False)[0])


def block_gain(H, weights: BlockWeights, cfg: BlockConfig, token: int = -1, step: float = 1e-5,
               scheme: str = "forward", backend: str | None = None, residual: bool = True) -> float:
    """sigma_max of the Jacobian of token ``token``'s block output w.r.t. its own input
    (default the last token, T, as in the lesson's Systems lens)."""
    _check_cfg_weights(weights, cfg)
    H = check_input(H, cfg)
    return sigma_max(token_jacobian(_block_fn(weights, cfg, backend, residual), H, token, step, scheme))


# ---------------------------------------------------------------------------------------
# Residual stream along depth and the Systems-lens table
# ---------------------------------------------------------------------------------------

def residual_norms_along_depth(H0, cfg: BlockConfig, n_layers: int, seed=1300,
                               backend: str | None = None) -> dict[str, np.ndarray]:
    """|H_0|, ..., |H_N| through ``Stack.init(cfg, n_layers, seed)`` as initialised
    ("unscaled") and with the 1/sqrt(2N) branch scaling ("scaled"); same draws in both."""
    out = {}
    for key, scale in (("unscaled", False), ("scaled", True)):
        stack = Stack.init(cfg, n_layers, seed, scale_branches=scale, dtype=np.float64, backend=backend)
        out[key] = stack.residual_norms(H0)
    return out


def stack_weights(cfg: BlockConfig, n_layers: int, seed=1300) -> list[BlockWeights]:
    """Unscaled float64 weights for ``n_layers`` blocks, drawn as ``Stack.init`` draws them
    (block l from the l-th child of SeedSequence(seed)), so a deeper stack starts with the
    same blocks, like the lesson's one seed(1300) stream."""
    return [init_weights(cfg, s, dtype=np.float64) for s in np.random.SeedSequence(seed).spawn(n_layers)]


@dataclass(frozen=True)
class StackTrace:
    branch_scale: float         # factor on every block's w_o and w_ff2
    norms: np.ndarray           # (N + 1,) |H_0|, ..., |H_N|
    gains: np.ndarray           # (N,) sigma_max(J_l), forward difference, at block l's input
    gains_central: np.ndarray   # (N,) the same from a central difference

    @property
    def norm_ratio(self) -> float:
        """|H_N| / |H_0|."""
        return float(self.norms[-1] / self.norms[0])

    @property
    def max_gain(self) -> float:
        return float(self.gains.max())


def stack_trace(H0, N: int, branch_scale: float, weights=None, cfg: BlockConfig | None = None,
                seed=1300, backend: str | None = None, step: float = 1e-5, token: int = -1,
                residual: bool = True) -> StackTrace:
    """The lesson's ``stack_trace``: run H0 through N blocks whose w_o and w_ff2 are scaled by
    ``branch_scale``; record |H_l| and, at every block's input, sigma_max of the
    finite-difference Jacobian of token T's output w.r.t. its own input.

    ``weights``: a list of at least N unscaled BlockWeights (the first N are used), or None
    for ``stack_weights(cfg, N, seed)``. ``cfg`` defaults to the lesson's (d_model from H0,
    2 heads). ``residual=False`` runs Exercise 2's blocks without the identity paths."""
    H0 = np.asarray(H0, dtype=np.float64)
    if cfg is None:
        cfg = BlockConfig(d_model=H0.shape[-1], n_heads=2)
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
        raise ValueError(f"N must be a positive integer, got {N!r}")
    if weights is None:
        weights = stack_weights(cfg, N, seed)
    if len(weights) < N:
        raise ValueError(f"weights must hold at least N={N} blocks, got {len(weights)}")
    blocks = [w.scaled(branch_scale) for w in weights[:N]]
    Stack(cfg, blocks, backend=backend)                     # checks every block against cfg
    H = check_input(H0, cfg, "H0")
    norms, gains, gains_c = [np.linalg.norm(H)], [], []
    for w in blocks:
        f = _block_fn(w, cfg, backend, residual)
        gains.append(sigma_max(token_jacobian(f, H, token, step, "forward")))
        gains_c.append(sigma_max(token_jacobian(f, H, token, step, "central")))
        H = f(H)                                            # (T, d_model): next block's input
        norms.append(np.linalg.norm(H))
    return StackTrace(branch_scale=float(branch_scale), norms=np.array(norms),
                      gains=np.array(gains), gains_central=np.array(gains_c))


@dataclass(frozen=True)
class SystemsRow:
    N: int
    unscaled: StackTrace        # branch scale 1
    scaled: StackTrace          # branch scale 1/sqrt(2N)


def systems_table(H0, Ns=(2, 4, 8), weights=None, cfg: BlockConfig | None = None, seed=1300,
                  backend: str | None = None, residual: bool = True) -> list[SystemsRow]:
    """The Systems lens: for each N, the same first N blocks unscaled and scaled by 1/sqrt(2N)."""
    H0 = np.asarray(H0, dtype=np.float64)
    if cfg is None:
        cfg = BlockConfig(d_model=H0.shape[-1], n_heads=2)
    if weights is None:
        weights = stack_weights(cfg, max(Ns), seed)
    return [SystemsRow(N=N,
                       unscaled=stack_trace(H0, N, 1.0, weights, cfg, backend=backend, residual=residual),
                       scaled=stack_trace(H0, N, 1.0 / math.sqrt(2 * N), weights, cfg, backend=backend,
                                          residual=residual))
            for N in Ns]


# ---------------------------------------------------------------------------------------
# Attention as a filter bank
# ---------------------------------------------------------------------------------------

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
