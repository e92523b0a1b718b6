"""Sidebar: dropout in a transformer block.

Training mode zeros each activation with probability p and scales the survivors by
1 / (1 - p) ("inverted" dropout, so the expectation of every dropped quantity is unchanged)
at the four points the lesson names, in the order a forward pass meets them:

    "embed"     the embedded input, before the block   (GPT-2's embd_pdrop; first block only)
    "attn"      the attention probabilities after the softmax   (attn_pdrop; nanoGPT's attn_dropout)
    "attn_out"  the attention branch after W_O   (resid_pdrop; nanoGPT's resid_dropout)
    "ffn_out"   the FFN branch after W_ff2   (resid_pdrop; nanoGPT's MLP dropout)

Evaluation mode (the default) is the plain block: it dispatches to ``tblock.forward`` on any
backend and never touches a random generator. Training mode is a plain NumPy rendering of
the block (float64) built from the oracle's helpers; it is a teaching tool, not a fast path.

Masks come from one ``numpy.random.Generator``, drawn in forward order for each sequence:
embed (T, d_model), attn (n_heads, T, T), attn_out (T, d_model), ffn_out (T, d_model), each
only if its point is enabled; ``keep = rng.random(shape) >= p``. The same seed therefore gives
the same output.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..api import TRACE_NAMES, Stack, Trace, check_input, forward
from ..backends.numpy import ffn, head_mix, head_probs, layernorm, masked_softmax
from ..config import BlockConfig
from ..weights import BlockWeights

POINTS = ("embed", "attn", "attn_out", "ffn_out")


def check_p(p) -> float:
    """p must be a real number in [0, 1); p = 1 would drop everything and divide by zero."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"p must be a real number in [0, 1), got {type(p).__name__} {p!r}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"p must be in [0, 1) (the probability of dropping an activation), got {p!r}")
    return float(p)


def check_points(points) -> tuple[str, ...]:
    if isinstance(points, str):
        points = (points,)
    points = tuple(points)
    for point in points:
        if point not in POINTS:
            raise ValueError(f"points must be drawn from {POINTS}, got {point!r}")
    return points


def as_generator(rng) -> np.random.Generator:
    """A Generator, an integer seed, or None (fresh OS entropy: not reproducible)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, numbers.Integral) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be a numpy Generator, an integer seed or None, got {type(rng).__name__}")


def dropout(X, p: float, rng: np.random.Generator) -> np.ndarray:
    """Zero each entry with probability p, scale the survivors by 1 / (1 - p)."""
    keep = rng.random(X.shape) >= p                         # same shape as X, True w.p. 1 - p
    return np.where(keep, X / (1.0 - p), 0.0)


def _attention_train(X, w, cfg, p, rng, points, tr):
    """MHA(X) with dropout on the probabilities ("attn") and on the W_O output ("attn_out")."""
    Q, K, V = X @ w["w_q"], X @ w["w_k"], X @ w["w_v"]      # (T, d_model) each
    A = head_probs(Q, K, cfg.n_heads, masked_softmax(cfg, X.shape[0]))
    if "attn" in points:
        A = dropout(A, p, rng)                              # (n_heads, T, T), one mask for all heads
    out_concat = head_mix(A, V, Q.dtype)
    A_out = out_concat @ w["w_o"]
    if "attn_out" in points:
        A_out = dropout(A_out, p, rng)
    tr.update(Q=Q, K=K, V=V, A=A, out_concat=out_concat, A_out=A_out)
    return A_out


def _ffn_train(X, w, cfg, p, rng, points, tr):
    """FFN(X) with dropout on its output ("ffn_out"): the oracle's FFN, then the mask."""
    F_out = ffn(X, w, cfg, tr)                              # (T, d_model); fills F_pre, F_post
    if "ffn_out" in points:
        F_out = tr["F_out"] = dropout(F_out, p, rng)
    return F_out


def block_forward_train(H_in, w: dict, cfg: BlockConfig, p: float, rng, points=POINTS):
    """One sequence (T, d_model) through the block in training mode; returns H_out, trace dict
    (the trace holds the values after dropout, and "H_in" after the embed dropout)."""
    tr = {}
    if "embed" in points:
        H_in = dropout(H_in, p, rng)
    tr["H_in"] = H_in
    ln1 = (w.get("ln1_gamma"), w.get("ln1_beta"))
    ln2 = (w.get("ln2_gamma"), w.get("ln2_beta"))
    if cfg.norm == "pre":
        tr["H_norm1"] = layernorm(H_in, *ln1, eps=cfg.eps)
        tr["H_mid"] = H_in + _attention_train(tr["H_norm1"], w, cfg, p, rng, points, tr)
        tr["H_norm2"] = layernorm(tr["H_mid"], *ln2, eps=cfg.eps)
        tr["H_out"] = tr["H_mid"] + _ffn_train(tr["H_norm2"], w, cfg, p, rng, points, tr)
    else:
        A_out = _attention_train(H_in, w, cfg, p, rng, points, tr)
        tr["H_norm1"] = tr["H_mid"] = layernorm(H_in + A_out, *ln1, eps=cfg.eps)
        F_out = _ffn_train(tr["H_mid"], w, cfg, p, rng, points, tr)
        tr["H_norm2"] = tr["H_out"] = layernorm(tr["H_mid"] + F_out, *ln2, eps=cfg.eps)
    return tr["H_out"], tr


def forward_dropout(H, weights: BlockWeights, cfg: BlockConfig, p: float = 0.0, training: bool = False,
                    rng=None, points=POINTS, backend: str | None = None, trace: bool = False):
    """The block with dropout. ``training=False`` (default): exactly ``tblock.forward`` on
    ``backend``. ``training=True``: dropout with probability ``p`` at ``points``, masks from
    ``rng`` (Generator or seed). Returns H_out (input's shape and dtype) or (H_out, Trace);
    in training mode the Trace holds the dropped A, A_out and F_out."""
    p = check_p(p)
    points = check_points(points)
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {type(training).__name__}")
    if not training:
        return forward(H, weights, cfg, backend=backend, trace=trace)
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    if not isinstance(weights, BlockWeights):
        raise TypeError(f"weights must be a BlockWeights, got {type(weights).__name__}")
    weights.check(cfg)
    H = check_input(H, cfg)
    rng = as_generator(rng)
    w = {name: a.astype(np.float64) for name, a in weights.arrays().items()}
    H3 = H.astype(np.float64).reshape((-1,) + H.shape[-2:])  # (B, T, d_model)
    outs, traces = [], []
    for b in range(H3.shape[0]):
        H_out, tr = block_forward_train(H3[b], w, cfg, p, rng, points)
        outs.append(H_out)
        traces.append(tr)
    H_out = np.stack(outs).astype(H.dtype).reshape(H.shape)  # back to the input's shape
    if not trace:
        return H_out
    fields = {k: np.stack([tr[k] for tr in traces]).astype(H.dtype) for k in TRACE_NAMES}
    if H.ndim == 2:
        fields = {k: v[0] for k, v in fields.items()}       # drop the batch axis of 1
    return H_out, Trace(**fields)


class DropoutBlock:
    """A block with dropout and a train/eval switch, like a torch module: ``eval()`` is the
    default. ``block.train(); block(H, rng=0)`` draws masks; ``block.eval(); block(H)`` is
    ``tblock.forward``."""

    def __init__(self, cfg: BlockConfig, weights: BlockWeights, p: float = 0.1, points=POINTS,
                 backend: str | None = None):
        self.p = check_p(p)
        self.points = check_points(points)
        weights.check(cfg)
        self.cfg, self.weights, self.backend = cfg, weights, backend
        self.training = False

    def train(self, mode: bool = True) -> "DropoutBlock":
        if not isinstance(mode, bool):
            raise TypeError(f"mode must be a bool, got {type(mode).__name__}")
        self.training = mode
        return self

    def eval(self) -> "DropoutBlock":
        return self.train(False)

    def __call__(self, H, rng=None, trace: bool = False):
        return forward_dropout(H, self.weights, self.cfg, self.p, self.training, rng, self.points,
                               self.backend, trace)


def stack_forward_dropout(H, stack: Stack, p: float = 0.0, training: bool = False, rng=None,
                          backend: str | None = None):
    """A Stack with dropout: the embedded input is dropped once, before the first block;
    every block drops at its attention probabilities, attention output and FFN output."""
    if not isinstance(stack, Stack):
        raise TypeError(f"stack must be a tblock.Stack, got {type(stack).__name__}")
    if not training:
        check_p(p)
        return stack(H, backend=backend)
    rng = as_generator(rng)
    for l, block in enumerate(stack.blocks):
        points = POINTS if l == 0 else POINTS[1:]
        H = forward_dropout(H, block.weights, stack.cfg, p, True, rng, points)
    return H
