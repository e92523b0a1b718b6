"""The lesson's depth lenses: each block's gain (the largest singular value of its token
Jacobian) and the residual stream through a stack of blocks, with and without the
1/sqrt(2N) branch scaling.  On the public API, like ``analysis``.

The stacks are drawn by NumPy (``generator="numpy"``) or by the lesson's own generator
(``generator="rustlab"``, ``tblock.rustlab``), which reproduces the lesson's weights exactly."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..api import Stack, check_input, forward
from ..config import BlockConfig
from ..rustlab import Rng
from ..weights import BlockWeights, init_weights
from .sublayers import check_cfg_weights, check_index, forward_no_residual


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
    token = check_index("token", token, T)
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
    check_cfg_weights(weights, cfg)
    H = check_input(H, cfg)
    return sigma_max(token_jacobian(_block_fn(weights, cfg, backend, residual), H, token, step, scheme))


# ---------------------------------------------------------------------------------------
# Residual stream along depth and the Systems-lens table
# ---------------------------------------------------------------------------------------

GENERATORS = ("numpy", "rustlab")


def residual_norms_along_depth(H0, cfg: BlockConfig, n_layers: int, seed=1300,
                               backend: str | None = None, generator: str = "numpy") -> dict[str, np.ndarray]:
    """|H_0|, ..., |H_N| through ``n_layers`` blocks as initialised ("unscaled") and with the
    1/sqrt(2N) branch scaling ("scaled"); same draws in both. ``generator="numpy"`` is
    ``Stack.init(cfg, n_layers, seed)``; ``"rustlab"`` the lesson's own stack
    (``stack_weights(..., generator="rustlab")``)."""
    _check_generator(generator)
    out = {}
    for key, scale in (("unscaled", False), ("scaled", True)):
        if generator == "numpy":
            stack = Stack.init(cfg, n_layers, seed, scale_branches=scale, dtype=np.float64, backend=backend)
        else:
            branch = 1.0 / math.sqrt(2 * n_layers) if scale else 1.0
            stack = Stack(cfg, [w.scaled(branch) for w in stack_weights(cfg, n_layers, seed, generator)],
                          backend=backend)
        out[key] = stack.residual_norms(H0)
    return out


def lesson_block_weights(cfg: BlockConfig, rng: Rng) -> BlockWeights:
    """One block drawn from rustlab's generator as the lesson draws it: W_Q, W_K, W_V, W_O
    = randn(d, d) * (1 / sqrt(d)), then W_ff1 = randn(d, d_ff) * sqrt(2 / d) and W_ff2 =
    randn(d_ff, d) * sqrt(2 / d_ff), in that order from ``rng`` (a ``tblock.rustlab.Rng``),
    each product rounded once as rustlab rounds it. The worked example's block (after H_in),
    its block 2 (seed(14)) and every block of ``stack_trace`` (seed(1300)) are drawn so."""
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    if not isinstance(rng, Rng):
        raise TypeError(f"rng must be a tblock.rustlab.Rng, got {type(rng).__name__}")
    d, f = cfg.d_model, cfg.d_ff
    attention = [rng.randn(d, d) * (1.0 / math.sqrt(d)) for _ in range(4)]   # W_Q, W_K, W_V, W_O
    w_ff1 = rng.randn(d, f) * math.sqrt(2.0 / d)
    w_ff2 = rng.randn(f, d) * math.sqrt(2.0 / f)
    return BlockWeights(w_q=attention[0], w_k=attention[1], w_v=attention[2], w_o=attention[3],
                        w_ff1=w_ff1, w_ff2=w_ff2)


def stack_weights(cfg: BlockConfig, n_layers: int, seed=1300, generator: str = "numpy") -> list[BlockWeights]:
    """Unscaled float64 weights for ``n_layers`` blocks; a deeper stack starts with the same blocks.

    ``generator="numpy"``: drawn as ``Stack.init`` draws them, block l from the l-th child of
    SeedSequence(seed). ``"rustlab"``: the lesson's own, ``seed(seed)`` then block after block
    from that one stream (``lesson_block_weights``), as its ``stack_trace`` draws them; with
    seed 1300 these are the weights behind the lesson's Systems-lens table."""
    _check_generator(generator)
    if isinstance(n_layers, bool) or not isinstance(n_layers, (int, np.integer)) or n_layers < 0:
        raise ValueError(f"n_layers must be a non-negative integer, got {n_layers!r}")
    if generator == "rustlab":
        rng = Rng(seed)
        return [lesson_block_weights(cfg, rng) for _ in range(n_layers)]
    return [init_weights(cfg, s, dtype=np.float64) for s in np.random.SeedSequence(seed).spawn(n_layers)]


def _check_generator(generator):
    if generator not in GENERATORS:
        raise ValueError(f"generator must be one of {GENERATORS}, got {generator!r}")


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
                residual: bool = True, generator: str = "numpy") -> StackTrace:
    """The lesson's ``stack_trace``: run H0 through N blocks whose w_o and w_ff2 are scaled by
    ``branch_scale``; record |H_l| and, at every block's input, sigma_max of the
    finite-difference Jacobian of token T's output w.r.t. its own input.

    ``weights``: a list of at least N unscaled BlockWeights (the first N are used), or None
    for ``stack_weights(cfg, N, seed, generator)`` (``generator="rustlab"``, seed 1300: the
    lesson's own blocks). ``cfg`` defaults to the lesson's (d_model from H0, 2 heads).
    ``residual=False`` runs Exercise 2's blocks without the identity paths."""
    H0 = np.asarray(H0, dtype=np.float64)
    if cfg is None:
        cfg = BlockConfig(d_model=H0.shape[-1], n_heads=2)
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
        raise ValueError(f"N must be a positive integer, got {N!r}")
    if weights is None:
        weights = stack_weights(cfg, N, seed, generator)
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
                  backend: str | None = None, residual: bool = True, generator: str = "numpy") -> list[SystemsRow]:
    """The Systems lens: for each N, the same first N blocks unscaled and scaled by 1/sqrt(2N).
    ``generator="rustlab"`` with seed 1300 (and the lesson's H_in) is the lesson's own table:
    its ``seed(1300)`` before each ``stack_trace`` restarts one stream, whose first N blocks
    are the first N of the deepest stack's."""
    H0 = np.asarray(H0, dtype=np.float64)
    if cfg is None:
        cfg = BlockConfig(d_model=H0.shape[-1], n_heads=2)
    if weights is None:
        weights = stack_weights(cfg, max(Ns), seed, generator)
    return [SystemsRow(N=N,
                       unscaled=stack_trace(H0, N, 1.0, weights, cfg, backend=backend, residual=residual),
                       scaled=stack_trace(H0, N, 1.0 / math.sqrt(2 * N), weights, cfg, backend=backend,
                                          residual=residual))
            for N in Ns]


# ---------------------------------------------------------------------------------------
# Attention as a filter bank
# ---------------------------------------------------------------------------------------
