"""The next token: the sampling distribution, the draw, and the checks of their arguments.

    p = next_token_probs(logits, temperature=0.8, top_k=40, top_p=0.95)   # (B, vocab) float64
    tok = draw(p, rng_of(seed))                                            # (B,) int64

Exact at every temperature the API accepts: the logits are shifted by their maximum
before the division, so (l - max) / temperature is <= 0 and cannot overflow; a temperature
so small that every other token's term underflows gives the argmax (shared among exact
ties) with probability 1, never NaN.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..config import check_int


def next_token_probs(logits, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> np.ndarray:
    """The distribution the next token is drawn from, in float64, for logits (vocab,) or
    (B, vocab), in transformers' order:

      1. temperature: logits / temperature;
      2. top_k: only the k largest logits stay (ties with the k-th stay too);
      3. softmax over what stays;
      4. top_p: only the smallest set of most probable tokens whose probability sums to at
         least top_p stays (a token stays if the tokens more probable than it hold less
         than top_p; the most probable always stays), renormalised.

    A logit of -inf is a token never drawn; NaN, +inf, or a row of -inf only is refused."""
    temperature = check_temperature(temperature)
    if temperature == 0.0:
        raise ValueError("temperature must be > 0 for a distribution (temperature 0 is greedy: the argmax)")
    top_k, top_p = check_filters(top_k, top_p)
    x = _check_logits(logits)
    top = x.max(axis=-1, keepdims=True)                                 # (..., 1)
    with np.errstate(over="ignore"):            # a gap past the float64 range -> -inf: probability 0
        z = (x - top) / temperature                                     # <= 0, 0 at the maximum
    if top_k is not None and top_k < x.shape[-1]:
        # on the logits themselves: dividing by the temperature keeps their order, but its
        # rounding could merge two of them
        kth = np.partition(x, -top_k, axis=-1)[..., -top_k, None]      # (..., 1): the k-th largest
        z = np.where(x < kth, -np.inf, z)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)          # >= 1: the maximum's term is exp(0)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")                 # most probable first
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p               # mass of the more probable ones
        drop = np.empty(p.shape, dtype=bool)
        np.put_along_axis(drop, order, before >= top_p, axis=-1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def _check_logits(logits) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim not in (1, 2) or x.shape[-1] == 0:
        raise ValueError(f"logits must be (vocab,) or (B, vocab) with vocab >= 1, got shape {x.shape}")
    bad = np.isnan(x) | (x == np.inf)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"logits must be finite (or -inf for a token never drawn), found {x[at]} at index {at}")
    empty = np.all(x == -np.inf, axis=-1)
    if empty.any():
        raise ValueError(f"logits hold only -inf (no token can be drawn) in row {int(np.argwhere(empty)[0][0])}")
    return x


def draw(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of p (B, vocab), by inverse CDF with one uniform draw per row:
    the first token whose cumulative probability passes u * total (a token of probability 0
    is never drawn)."""
    c = np.cumsum(p, axis=-1)                               # (B, vocab)
    u = rng.random(p.shape[0]) * c[:, -1]                   # (B,) in [0, total)
    return np.minimum((c <= u[:, None]).sum(axis=-1), p.shape[-1] - 1)


def check_temperature(temperature) -> float:
    """temperature as a float >= 0 and finite (0: greedy)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number, got {type(temperature).__name__} {temperature!r}")
    if not 0.0 <= float(temperature) < math.inf:
        raise ValueError(f"temperature must be >= 0 and finite (0 is greedy), got {temperature!r}")
    return float(temperature)


def check_filters(top_k, top_p) -> tuple[int | None, float | None]:
    """top_k an integer >= 1 or None, top_p in (0, 1] or None."""
    if top_k is not None:
        top_k = check_int("top_k", top_k, 1)
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
            raise TypeError(f"top_p must be a real number in (0, 1], got {type(top_p).__name__} {top_p!r}")
        if not 0.0 < float(top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        top_p = float(top_p)
    return top_k, top_p


def rng_of(seed) -> np.random.Generator:
    """np.random.default_rng(seed) for seed None (fresh entropy) or an integer >= 0; a
    Generator is used as it is (its stream goes on)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None:
        check_int("seed", seed, 0)
    return np.random.default_rng(seed)


def check_token_id(name: str, value, vocab_size: int) -> int:
    """value as a token id in [0, vocab_size) (an eos), or TypeError/ValueError naming ``name``."""
    token = check_int(name, value, 0)
    if token >= vocab_size:
        raise ValueError(f"{name} must be a token id in [0, vocab_size={vocab_size}), got {token}")
    return token
