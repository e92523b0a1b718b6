"""Parameter and FLOP counts for one block, with the lesson's conventions."""

from __future__ import annotations

from dataclasses import dataclass

from .config import BlockConfig

# Per-element costs of the non-matmul work (a transcendental counts as one FLOP).
SOFTMAX_FLOPS_PER_SCORE = 6     # scale, running max, subtract, exp, sum, divide
LAYERNORM_FLOPS_PER_ELEMENT = 5  # add to the mean, subtract it, square, add to the variance, scale by 1/std
LAYERNORM_AFFINE_FLOPS = 2       # * gamma, + beta
RMSNORM_FLOPS_PER_ELEMENT = 3    # square, add to the mean square, scale by 1/rms
RMSNORM_AFFINE_FLOPS = 1         # * gamma
ROTARY_FLOPS_PER_ELEMENT = 3     # a pair turned: 4 multiplies and 2 adds (cos, sin are a table)
ACTIVATION_FLOPS = {
    "relu": 1,                   # max(x, 0)
    "gelu_erf": 5,               # x/sqrt2, erf, +1, *x, *0.5
    "gelu_tanh": 9,              # x*x*x (2), *0.044715, +x, *sqrt(2/pi), tanh, +1, *x, *0.5
    "silu": 4,                   # -x, exp, +1, x / that
}
COMPONENTS = ("layernorm", "qkv", "scores", "softmax", "av", "out_proj",
              "ffn_up", "activation", "ffn_down", "residual")


def _check_cfg(cfg):
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")


def param_breakdown(cfg: BlockConfig) -> dict[str, int]:
    """The lesson's per-block counts: attention matrices, FFN matrices, FFN biases, LN affines,
    and the attention-projection biases (counted in param_count only with cfg.attn_bias).
    Grouped-query attention's W_K, W_V have d_kv columns, the gated FFN a third matrix (and
    bias), RMSNorm a gamma only."""
    _check_cfg(cfg)
    d, f, kv = cfg.d_model, cfg.d_ff, cfg.d_kv
    n_ffn = 3 if cfg.ffn == "gated" else 2
    return {
        "attention": 2 * d * d + 2 * d * kv,    # W_Q, W_O (d x d); W_K, W_V (d x d_kv)
        "ffn": n_ffn * d * f,                   # W_ff1, W_ff2 (and W_gate)
        "ffn_bias": (n_ffn - 1) * f + d,        # b_ff1, b_ff2 (and b_gate) (counted even when the code omits them)
        "ln_affine": (4 if cfg.norm_type == "layernorm" else 2) * d,   # gamma (and beta) of both norms
        "attn_bias": d + 2 * kv + (d if cfg.out_bias or not cfg.qkv_bias else 0),   # b_Q, b_K, b_V (and b_O)
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
            + (parts["attn_bias"] if cfg.qkv_bias else 0))


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
    ffn_matmul_flops: int    # the FFN's matmuls without biases: 4 T d_model d_ff (gated: 6 T d_model d_ff)

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
    The gated FFN's three matmuls (6 T d d_ff) move them to 1.5 d_ff and 3 d_ff - 1; grouped-query
    attention does not move them (every query head still scores and mixes d_k columns).
    """
    _check_cfg(cfg)
    n_ffn = 3 if cfg.ffn == "gated" else 2
    return float(n_ffn * cfg.d_ff - 1) if causal else n_ffn * cfg.d_ff / 2


def flops(cfg: BlockConfig, T: int) -> FlopCount:
    """FLOPs per component for one block on T tokens; multiply by B for a batch."""
    _check_cfg(cfg)
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be a positive integer, got {T!r}")
    d, f, H, kv = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.d_kv
    n_up = 2 if cfg.ffn == "gated" else 1                   # the gate and the up projection
    if cfg.norm_type == "rmsnorm":
        ln_per = RMSNORM_FLOPS_PER_ELEMENT + (RMSNORM_AFFINE_FLOPS if cfg.ln_affine else 0)
    else:
        ln_per = LAYERNORM_FLOPS_PER_ELEMENT + (LAYERNORM_AFFINE_FLOPS if cfg.ln_affine else 0)
    rotary = ROTARY_FLOPS_PER_ELEMENT * T * (d + kv) if cfg.positions == "rotary" else 0
    common = {
        "layernorm": 2 * T * d * ln_per,                    # LN1 and LN2
        # H_norm1 @ [W_Q W_K W_V] (K, V: d_kv columns), their biases, and rotary's turn of Q and K
        "qkv": 2 * T * d * (d + 2 * kv) + (T * (d + 2 * kv) if cfg.qkv_bias else 0) + rotary,
        "out_proj": 2 * T * d * d + (T * d if cfg.out_bias else 0),       # out_concat @ W_O
        "ffn_up": n_up * (2 * T * d * f + (T * f if cfg.ffn_bias else 0)),
        "activation": (ACTIVATION_FLOPS[cfg.activation] + n_up - 1) * T * f,   # (and the gate's product)
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
                     ffn_matmul_flops=2 * (n_up + 1) * T * d * f)


def matmul_flops(cfg: BlockConfig, T: int, causal: bool = True) -> int:
    """The block's matrix-product FLOPs on T tokens (projections, FFN, scores, AV; no
    biases or elementwise work): what a kernel's GFLOP/s are quoted against. With
    d_ff = 4 d_model and causal: 24 T d^2 + 2 T (T + 1) d."""
    fc = flops(cfg, T)
    c = fc.causal if causal else fc.full
    return c["qkv"] + c["out_proj"] + fc.ffn_matmul_flops + c["scores"] + c["av"]
