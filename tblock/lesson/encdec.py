"""Sidebar: the encoder-decoder transformer and cross-attention, Pre-LN like the lesson.

Encoder block (self-attention unmasked), the lesson's block with ``causal=False``:

    X_mid = X + MHA(LN1(X)),                       X_out = X_mid + FFN(LN2(X_mid))

Decoder block, three sublayers, each LN -> sublayer -> residual:

    Y_1 = Y   + MHA_causal(LN1(Y))                 masked self-attention over decoder tokens
    Y_2 = Y_1 + CrossAttn(LNc(Y_1), E)             Q from the decoder, K and V from the encoder, unmasked
    Y_3 = Y_2 + FFN(LN2(Y_2))

E is the encoder stack's output (T_enc, d_model); T_enc and T_dec may differ. As in Pre-LN
encoder-decoder models (T5, Xiong et al. 2020, torch's norm_first with a final norm), each
stack ends with a final LayerNorm, so the decoder reads a normalised memory E and the
cross sublayer's own LNc normalises only the decoder side.

The self-attention and FFN sublayers run through ``tblock.forward`` (any backend):
Y_1 is ``trace.H_mid`` of the block on Y, Y_3 is ``trace.H_out`` of the block with its
attention zeroed (then H_mid = Y_2 exactly). Cross-attention reads two sequences, which the
block API cannot express, so it is written here in NumPy with the oracle's softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..api import check_input, forward
from ..backends.numpy import head_mix, head_probs, layernorm, softmax_rows
from ..config import BlockConfig
from ..weights import BlockWeights, as_float_array, check_finite, init_weights
from .sublayers import without_attention

CROSS_MATRICES = ("w_q", "w_k", "w_v", "w_o")


@dataclass(frozen=True, eq=False)
class CrossWeights:
    w_q: np.ndarray                     # (d_model, d_model) queries from the decoder stream
    w_k: np.ndarray                     # (d_model, d_model) keys from the encoder output
    w_v: np.ndarray                     # (d_model, d_model) values from the encoder output
    w_o: np.ndarray                     # (d_model, d_model) output projection after the head concat
    ln_gamma: np.ndarray | None = None  # (d_model,) LNc gain, with cfg.ln_affine
    ln_beta: np.ndarray | None = None   # (d_model,) LNc shift

    def __post_init__(self):
        for name in CROSS_MATRICES + ("ln_gamma", "ln_beta"):
            value = getattr(self, name)
            if value is None and name in CROSS_MATRICES:
                raise TypeError(f"{name} is required, got None")
            if value is not None:
                a = as_float_array(name, value, 2 if name in CROSS_MATRICES else 1)
                check_finite(name, a)
                object.__setattr__(self, name, np.array(a, dtype=np.float64))   # private copy
        if (self.ln_gamma is None) != (self.ln_beta is None):
            raise ValueError("ln_gamma and ln_beta must be given together, got only one of them")

    def check(self, cfg: BlockConfig, name: str = "cross") -> "CrossWeights":
        d = cfg.d_model
        for field in CROSS_MATRICES:
            if getattr(self, field).shape != (d, d):
                raise ValueError(f"{name}.{field} must have shape {(d, d)}, got {getattr(self, field).shape}")
        if cfg.ln_affine != (self.ln_gamma is not None):
            raise ValueError(f"{name}: cfg.ln_affine={cfg.ln_affine} but the cross weights "
                             f"{'have' if self.ln_gamma is not None else 'lack'} ln_gamma/ln_beta")
        if self.ln_gamma is not None and (self.ln_gamma.shape, self.ln_beta.shape) != ((d,), (d,)):
            raise ValueError(f"{name}.ln_gamma and ln_beta must have shape {(d,)}")
        return self


@dataclass(frozen=True, eq=False)
class DecoderWeights:
    block: BlockWeights                 # masked self-attention, FFN, LN1, LN2: the lesson's block
    cross: CrossWeights                 # the cross-attention sublayer and its LNc


def init_cross_weights(cfg: BlockConfig, seed) -> CrossWeights:
    """N(0, 1) / sqrt(d_model) for all four matrices, like the lesson's attention; LNc at 1, 0."""
    rng = np.random.default_rng(seed)
    d = cfg.d_model
    w = {name: rng.standard_normal((d, d)) / np.sqrt(d) for name in CROSS_MATRICES}
    if cfg.ln_affine:
        w.update(ln_gamma=np.ones(d), ln_beta=np.zeros(d))
    return CrossWeights(**w)


def init_decoder_weights(cfg: BlockConfig, seed) -> DecoderWeights:
    """Block weights from the first child of SeedSequence(seed), cross weights from the second."""
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    s_block, s_cross = ss.spawn(2)
    return DecoderWeights(block=init_weights(cfg, s_block, dtype=np.float64),
                          cross=init_cross_weights(cfg, s_cross))


def _pre_ln(cfg: BlockConfig):
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    if cfg.norm != "pre":
        raise ValueError(f"the encoder-decoder blocks here are Pre-LN, like the lesson: cfg.norm must be "
                         f"'pre', got {cfg.norm!r}")


def encoder_block(X, weights: BlockWeights, cfg: BlockConfig, backend: str | None = None):
    """One encoder block: the lesson's block with unmasked self-attention."""
    _pre_ln(cfg)
    return forward(X, weights, replace(cfg, causal=False), backend=backend)


def cross_attention(Y, E, cross: CrossWeights, cfg: BlockConfig):
    """CrossAttn(Y, E): per head, softmax(Q_h K_h^T / sqrt(d_k)) V_h with Q = Y W_Q from the
    decoder (T_dec, d_model) and K = E W_K, V = E W_V from the encoder (T_enc, d_model);
    no mask: every decoder token may read the whole source. Returns (T_dec, d_model) and the
    attention (n_heads, T_dec, T_enc)."""
    Q = Y @ cross.w_q                                       # (T_dec, d_model)
    K, V = E @ cross.w_k, E @ cross.w_v                     # (T_enc, d_model) each
    scale = 1.0 / np.sqrt(cfg.d_k)
    A = head_probs(Q, K, cfg.n_heads, lambda S: softmax_rows(S * scale))    # (n_heads, T_dec, T_enc)
    out_concat = head_mix(A, V, Q.dtype)                    # (T_dec, d_model)
    return out_concat @ cross.w_o, A


@dataclass(frozen=True)
class DecoderTrace:
    Y_1: np.ndarray             # (T_dec, d_model) after masked self-attention
    Y_2: np.ndarray             # (T_dec, d_model) after cross-attention
    Y_3: np.ndarray             # (T_dec, d_model) after the FFN: the block output
    A_self: np.ndarray          # (n_heads, T_dec, T_dec) masked self-attention
    A_cross: np.ndarray         # (n_heads, T_dec, T_enc) cross-attention


def decoder_block(Y, E, weights: DecoderWeights, cfg: BlockConfig, backend: str | None = None,
                  trace: bool = False):
    """One decoder block on decoder stream Y (T_dec, d_model) reading encoder output E
    (T_enc, d_model). The self-attention is causal whatever cfg.causal says."""
    _pre_ln(cfg)
    if not isinstance(weights, DecoderWeights):
        raise TypeError(f"weights must be a DecoderWeights, got {type(weights).__name__}")
    cfg = replace(cfg, causal=True)
    weights.cross.check(cfg)
    Y = check_input(Y, cfg, "Y")
    E = check_input(E, cfg, "E")
    if Y.ndim != 2 or E.ndim != 2:
        raise ValueError(f"Y and E must be single sequences (T, d_model), got {Y.shape} and {E.shape}")
    _, tr = forward(Y, weights.block, cfg, backend=backend, trace=True)
    Y_1 = tr.H_mid.astype(np.float64)                       # Y + MHA_causal(LN1(Y))
    c = weights.cross
    C, A_cross = cross_attention(layernorm(Y_1, c.ln_gamma, c.ln_beta, eps=cfg.eps), E.astype(np.float64), c, cfg)
    Y_2 = Y_1 + C
    _, tr3 = forward(Y_2, without_attention(weights.block), cfg, backend=backend, trace=True)
    Y_3 = tr3.H_out                                         # Y_2 + FFN(LN2(Y_2)), since H_mid = Y_2
    if not trace:
        return Y_3
    return Y_3, DecoderTrace(Y_1=Y_1, Y_2=Y_2, Y_3=Y_3, A_self=tr.A, A_cross=A_cross)


class EncoderStack:
    """N encoder blocks, then a final LayerNorm (plain, or with ``final_gamma``/``final_beta``)."""

    def __init__(self, cfg: BlockConfig, weights, backend: str | None = None, final_norm: bool = True):
        _pre_ln(cfg)
        if isinstance(weights, BlockWeights) or len(weights) == 0:
            raise ValueError("weights must be a non-empty list of BlockWeights")
        self.cfg = replace(cfg, causal=False)
        for i, w in enumerate(weights):
            if not isinstance(w, BlockWeights):
                raise TypeError(f"weights[{i}] must be a BlockWeights, got {type(w).__name__}")
            w.check(self.cfg, name=f"weights[{i}]")
        self.weights, self.backend, self.final_norm = list(weights), backend, final_norm

    def __len__(self):
        return len(self.weights)

    def __call__(self, X):
        X = check_input(X, self.cfg, "X").astype(np.float64)
        for w in self.weights:
            X = encoder_block(X, w, self.cfg, self.backend)
        return layernorm(X, eps=self.cfg.eps) if self.final_norm else X


class DecoderStack:
    """N decoder blocks reading one encoder output, then a final LayerNorm."""

    def __init__(self, cfg: BlockConfig, weights, backend: str | None = None, final_norm: bool = True):
        _pre_ln(cfg)
        if isinstance(weights, DecoderWeights) or len(weights) == 0:
            raise ValueError("weights must be a non-empty list of DecoderWeights")
        self.cfg = replace(cfg, causal=True)
        for i, w in enumerate(weights):
            if not isinstance(w, DecoderWeights):
                raise TypeError(f"weights[{i}] must be a DecoderWeights, got {type(w).__name__}")
            w.block.check(self.cfg, name=f"weights[{i}].block")
            w.cross.check(self.cfg, name=f"weights[{i}].cross")
        self.weights, self.backend, self.final_norm = list(weights), backend, final_norm

    def __len__(self):
        return len(self.weights)

    def __call__(self, Y, E):
        Y = check_input(Y, self.cfg, "Y").astype(np.float64)
        for w in self.weights:
            Y = decoder_block(Y, E, w, self.cfg, self.backend)
        return layernorm(Y, eps=self.cfg.eps) if self.final_norm else Y


class EncoderDecoder:
    """``model(src, tgt)``: the decoder stack on ``tgt`` reading the encoder stack's ``src``."""

    def __init__(self, encoder: EncoderStack, decoder: DecoderStack):
        if encoder.cfg.d_model != decoder.cfg.d_model:
            raise ValueError(f"encoder and decoder must share d_model, got {encoder.cfg.d_model} "
                             f"and {decoder.cfg.d_model}")
        self.encoder, self.decoder = encoder, decoder

    @classmethod
    def init(cls, cfg: BlockConfig, n_encoder: int, n_decoder: int, seed=0,
             backend: str | None = None) -> "EncoderDecoder":
        """Fresh float64 weights; the encoder from the first child of SeedSequence(seed)."""
        s_enc, s_dec = np.random.SeedSequence(seed).spawn(2)
        enc = [init_weights(cfg, s, dtype=np.float64) for s in s_enc.spawn(n_encoder)]
        dec = [init_decoder_weights(cfg, s) for s in s_dec.spawn(n_decoder)]
        return cls(EncoderStack(cfg, enc, backend), DecoderStack(cfg, dec, backend))

    def __call__(self, src, tgt):
        return self.decoder(tgt, self.encoder(src))
