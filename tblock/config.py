"""BlockConfig: the hyper-parameters of one transformer block (Lesson 13)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

NORMS = ("pre", "post")
ACTIVATIONS = ("gelu_tanh", "gelu_erf", "relu")


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
    activation: str = "gelu_tanh"  # FFN nonlinearity: "gelu_tanh" (GPT-2), "gelu_erf" (exact), "relu"
    eps: float = 1e-5           # LayerNorm's epsilon, added to the population variance inside the sqrt
    ffn_bias: bool = False      # the FFN carries b_ff1, b_ff2 (the lesson's code omits them)
    ln_affine: bool = False     # LayerNorms carry gamma, beta (the lesson runs gamma=1, beta=0)
    attn_bias: bool = False     # the Q, K, V and O projections carry b_q, b_k, b_v, b_o (GPT-2, BERT)

    def __post_init__(self):
        d_model = check_int("d_model", self.d_model, 1)
        n_heads = check_int("n_heads", self.n_heads, 1)
        if d_model % n_heads:
            raise ValueError(
                f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
        d_ff = 4 * d_model if self.d_ff is None else check_int("d_ff", self.d_ff, 1)
        check_bool("causal", self.causal)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("activation", self.activation, ACTIVATIONS)
        if isinstance(self.eps, bool) or not isinstance(self.eps, numbers.Real):
            raise TypeError(f"eps must be a real number, got {type(self.eps).__name__} {self.eps!r}")
        if not (0.0 < float(self.eps) < float("inf")):
            raise ValueError(f"eps must be positive and finite, got {self.eps!r}")
        check_bool("ffn_bias", self.ffn_bias)
        check_bool("ln_affine", self.ln_affine)
        check_bool("attn_bias", self.attn_bias)
        # frozen dataclass: normalise the stored values through object.__setattr__
        object.__setattr__(self, "d_model", d_model)
        object.__setattr__(self, "n_heads", n_heads)
        object.__setattr__(self, "d_ff", d_ff)
        object.__setattr__(self, "eps", float(self.eps))

    @property
    def d_k(self) -> int:
        """Width of one head's slice of Q, K and V."""
        return self.d_model // self.n_heads
