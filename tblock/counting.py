"""Parameter and FLOP counts for one block, with the lesson's conventions."""

from __future__ import annotations

from dataclasses import dataclass

from .config import BlockConfig

# Per-element costs of the non-matmul work (a transcendental counts as one FLOP).
SOFTMAX_FLOPS_PER_SCORE = 6     # scale, running max, subtract, exp, sum, divide
LAYERNORM_FLOPS_PER_ELEMENT = 5  # add to the mean, subtract it, square, add to the variance, scale by 1/std
LAYERNORM_AFFINE_FLOPS = 2       # * gamma, + beta
ACTIVATION_FLOPS = {
    "relu": 1,                   # max(x, 0)
    "gelu_erf": 5,               # x/sqrt2, erf, +1, *x, *0.5
    "gelu_tanh": 9,              # x*x*x (2), *0.044715, +x, *sqrt(2/pi), tanh, +1, *x, *0.5
}
COMPONENTS = ("layernorm", "qkv", "scores", "softmax", "av", "out_proj",
              "ffn_up", "activation", "ffn_down", "residual")


def _check_cfg(cfg):
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")


def param_breakdown(cfg: BlockConfig) -> dict[str, int]:
    """The lesson's per-block counts: attention matrices, FFN matrices, FFN biases, LN affines,
    and the attention-projection biases (counted in param_count only with cfg.attn_bias)."""
    _check_cfg(cfg)
    d, f = cfg.d_model, cfg.d_ff
    return {
        "attention": 4 * d * d,        # W_Q, W_K, W_V, W_O
        "ffn": 2 * d * f,              # W_ff1, W_ff2
        "ffn_bias": f + d,             # b_ff1, b_ff2 (counted even when the code omits them)
        "ln_affine": 4 * d,            # gamma, beta of LN1 and LN2
        "attn_bias": 4 * d,            # b_Q, b_K, b_V, b_O (GPT-2; the lesson has none)
    }


def param_count(cfg: BlockConfig, ln_affine: bool | None = None) -> int:
    """Parameters of one block in the lesson's convention (Lessons 13 and 14).

    Every weight matrix and the two FFN biases are counted; the two LayerNorm affines
    (+4 d_model) are added when ``ln_affine`` (default: ``cfg.ln_affine``) is true. For
    d_model=8, d_ff=32 that is 808, or 840 with the affines. The attention-projection
    biases (+4 d_model: one vector per Q, K, V and O projection) are added with
    ``cfg.attn_bias``: a GPT-2-small block (d_model=768, ln_affine, attn_bias) has
    7,087,872 parameters.
    """
    parts = param_breakdown(cfg)
    with_ln = cfg.ln_affine if ln_affine is None else bool(ln_affine)
    return (parts["attention"] + parts["ffn"] + parts["ffn_bias"] + (parts["ln_affine"] if with_ln else 0)
            + (parts["attn_bias"] if cfg.attn_bias else 0))


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one block forward on one sequence of T tokens (2 per multiply-add).

    ``full`` counts every entry of the T x T score square; ``causal`` counts only the
    T(T+1)/2 entries on or below the diagonal, the work a causal kernel that skips
    masked tiles must do. Only scores, softmax and AV differ between the two.
    """
    T: int
    full: dict       # component -> FLOPs, full T x T square
    causal: dict     # component -> FLOPs, lower triangle only
    crossover_full: float    # T where scores+AV = FFN matmuls, full square: d_ff (= 4 d_model)
    crossover_causal: float  # the same with causal counts: 2 d_ff - 1 (about 8 d_model)
    ffn_matmul_flops: int    # the FFN's two matmuls without biases: 4 T d_model d_ff

    def total(self, causal: bool = False) -> int:
        return sum((self.causal if causal else self.full).values())

    def attention_core(self, causal: bool = False) -> int:
        """scores + AV: the T^2 matmul work."""
        c = self.causal if causal else self.full
        return c["scores"] + c["av"]


def crossover_T(cfg: BlockConfig, causal: bool = False) -> float:
    """T at which attention's scores+AV FLOPs equal the FFN's two matmuls.

    Full square: 4 T^2 d = 4 T d d_ff  ->  T = d_ff (= 4 d_model).
    Causal (T(T+1)/2 entries): 2 d T (T+1) = 4 T d d_ff  ->  T = 2 d_ff - 1 (about 8 d_model).
    """
    _check_cfg(cfg)
    return float(2 * cfg.d_ff - 1) if causal else float(cfg.d_ff)


def flops(cfg: BlockConfig, T: int) -> FlopCount:
    """FLOPs per component for one block on T tokens; multiply by B for a batch."""
    _check_cfg(cfg)
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be a positive integer, got {T!r}")
    d, f, H = cfg.d_model, cfg.d_ff, cfg.n_heads
    ln_per = LAYERNORM_FLOPS_PER_ELEMENT + (LAYERNORM_AFFINE_FLOPS if cfg.ln_affine else 0)
    common = {
        "layernorm": 2 * T * d * ln_per,                    # LN1 and LN2
        "qkv": 3 * 2 * T * d * d + (3 * T * d if cfg.attn_bias else 0),   # H_norm1 @ [W_Q W_K W_V]
        "out_proj": 2 * T * d * d + (T * d if cfg.attn_bias else 0),      # out_concat @ W_O
        "ffn_up": 2 * T * d * f + (T * f if cfg.ffn_bias else 0),
        "activation": ACTIVATION_FLOPS[cfg.activation] * T * f,
        "ffn_down": 2 * T * f * d + (T * d if cfg.ffn_bias else 0),
        "residual": 2 * T * d,                              # the two residual adds
    }

    def attention_part(n_scores):
        # n_scores entries per head; each entry is a d_k-long dot product for the
        # score and a d_k-long axpy for AV: summed over heads, d_model each
        return {"scores": 2 * d * n_scores, "softmax": SOFTMAX_FLOPS_PER_SCORE * H * n_scores,
                "av": 2 * d * n_scores}

    full = {**common, **attention_part(T * T)}
    causal = {**common, **attention_part(T * (T + 1) // 2)}
    order = lambda c: {k: c[k] for k in COMPONENTS}
    return FlopCount(T=T, full=order(full), causal=order(causal),
                     crossover_full=crossover_T(cfg, False), crossover_causal=crossover_T(cfg, True),
                     ffn_matmul_flops=4 * T * d * f)


def matmul_flops(cfg: BlockConfig, T: int, causal: bool = True) -> int:
    """The block's matrix-product FLOPs on T tokens (projections, FFN, scores, AV; no
    biases or elementwise work): what a kernel's GFLOP/s are quoted against. With
    d_ff = 4 d_model and causal: 24 T d^2 + 2 T (T + 1) d."""
    fc = flops(cfg, T)
    c = fc.causal if causal else fc.full
    return c["qkv"] + c["out_proj"] + fc.ffn_matmul_flops + c["scores"] + c["av"]
