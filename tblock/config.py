"""BlockConfig: the hyper-parameters of one transformer block (Lesson 13)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

NORMS = ("pre", "post")
NORM_TYPES = ("layernorm", "rmsnorm")
FFNS = ("mlp", "gated")
POSITIONS = ("none", "rotary")
ACTIVATIONS = ("gelu_tanh", "gelu_erf", "relu", "silu")


def check_int(name: str, value, minimum: int) -> int:
    """value as an int >= minimum; TypeError/ValueError naming ``name`` otherwise."""
    # bool is an int subclass; "n_heads=True" is a bug, not a 1
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if not (0.0 < float(value) < float("inf")):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")


def check_bool(name: str, value) -> None:
    """TypeError naming ``name`` unless value is a bool."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class BlockConfig:
    d_model: int                # width of the residual stream (columns of H)
    n_heads: int                # number of attention heads; each reads d_model // n_heads columns
    d_ff: int | None = None     # hidden width of the FFN; None means the lesson's 4 * d_model
    causal: bool = True         # mask scores above the diagonal so token t only sees tokens <= t
    norm: str = "pre"           # "pre": H + f(LN(H)) (the lesson); "post": LN(H + f(H)) (Exercise 3)
    activation: str = "gelu_tanh"  # FFN nonlinearity: "gelu_tanh" (GPT-2), "gelu_erf" (exact), "relu",
                                   # "silu" (x * sigmoid(x): SwiGLU's, with ffn="gated")
    eps: float = 1e-5           # the norms' epsilon, added to the variance (mean square) inside the sqrt
    ffn_bias: bool = False      # the FFN carries b_ff1, b_ff2 (and b_gate) (the lesson's code omits them)
    ln_affine: bool = False     # the norms carry gamma (and LayerNorm's beta) (the lesson: gamma=1, beta=0)
    attn_bias: bool | str = False  # True: the Q, K, V and O projections carry b_q, b_k, b_v, b_o (GPT-2,
                                   # BERT); "qkv": b_q, b_k, b_v without b_o (Qwen2)
    norm_type: str = "layernorm"   # "layernorm" (the lesson) or "rmsnorm": x / sqrt(mean(x^2) + eps) * gamma
    ffn: str = "mlp"            # "mlp": act(X W1) W2 (the lesson); "gated": (act(X W_gate) * (X W1)) W2,
                                # SwiGLU with silu (Llama, Qwen2)
    positions: str = "none"     # "none" (positions come with the input) or "rotary" on Q and K
    rope_theta: float = 10000.0    # rotary base: pair j turns by angle t / rope_scale * theta^(-2j/d_k)
    rope_scale: float = 1.0        # linear rope scaling: positions divided by this factor
    n_kv_heads: int | None = None  # heads of K and V, dividing n_heads (1: multi-query); None: n_heads
                                   # (kept as given, so dataclasses.replace(n_heads=...) keeps MHA)

    def __post_init__(self):
        d_model = check_int("d_model", self.d_model, 1)
        n_heads = check_int("n_heads", self.n_heads, 1)
        if d_model % n_heads:
            raise ValueError(
                f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
        d_ff = 4 * d_model if self.d_ff is None else check_int("d_ff", self.d_ff, 1)
        check_bool("causal", self.causal)
        _check_choice("norm", self.norm, NORMS)
        _check_positive("eps", self.eps)
        check_bool("ffn_bias", self.ffn_bias)
        check_bool("ln_affine", self.ln_affine)
        if not (isinstance(self.attn_bias, bool) or self.attn_bias == "qkv"):
            raise (ValueError if isinstance(self.attn_bias, str) else TypeError)(
                f"attn_bias must be True, False or 'qkv', got {type(self.attn_bias).__name__} {self.attn_bias!r:.100}")
        _check_choice("activation", self.activation, ACTIVATIONS)
        _check_choice("norm_type", self.norm_type, NORM_TYPES)
        _check_choice("ffn", self.ffn, FFNS)
        _check_choice("positions", self.positions, POSITIONS)
        for name in ("rope_theta", "rope_scale"):
            _check_positive(name, getattr(self, name))
        n_kv_heads = n_heads if self.n_kv_heads is None else check_int("n_kv_heads", self.n_kv_heads, 1)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads must divide n_heads, got n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        if self.positions == "rotary" and (d_model // n_heads) % 2:
            raise ValueError(f"rotary positions turn pairs of a head's columns: d_model // n_heads must be even, "
                             f"got {d_model // n_heads}")
        # frozen dataclass: normalise the stored values through object.__setattr__
        object.__setattr__(self, "d_model", d_model)
        object.__setattr__(self, "n_heads", n_heads)
        object.__setattr__(self, "d_ff", d_ff)
        object.__setattr__(self, "eps", float(self.eps))
        if self.n_kv_heads is not None:
            object.__setattr__(self, "n_kv_heads", n_kv_heads)
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        object.__setattr__(self, "rope_scale", float(self.rope_scale))

    @property
    def d_k(self) -> int:
        """Width of one head's slice of Q, K and V."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Heads of K and V: n_kv_heads, or n_heads when it is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_kv(self) -> int:
        """Columns of K and V: kv_heads heads of d_k (d_model without grouped-query attention)."""
        return self.kv_heads * self.d_k

    @property
    def group(self) -> int:
        """Query heads per K/V head: query head h reads K/V head h // group."""
        return self.n_heads // self.kv_heads

    @property
    def qkv_bias(self) -> bool:
        """Q, K and V carry biases (attn_bias True or "qkv")."""
        return self.attn_bias is not False

    @property
    def out_bias(self) -> bool:
        """W_O carries b_o (attn_bias True)."""
        return self.attn_bias is True

    @property
    def lesson_block(self) -> bool:
        """The lesson's block and its Exercise options only: none of the variants of the blocks
        in use today (RMSNorm, the gated FFN, rotary positions, grouped K/V, Q/K/V bias without b_o)."""
        return (self.norm_type == "layernorm" and self.ffn == "mlp" and self.positions == "none"
                and self.kv_heads == self.n_heads and self.attn_bias != "qkv" and self.activation != "silu")
