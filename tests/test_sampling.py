"""Sampling at the edges of float64 (issue 31): exact or refused at every temperature.

logits / temperature overflows for a small enough temperature (or large enough logits);
computed naively the softmax is then inf - inf = NaN, and the draw silently emits token 0.
The limit is known exactly: as the temperature goes to 0 the distribution goes to the
argmax (shared evenly among exactly tied maxima), and that is what must come out.
"""

import numpy as np
import pytest
from test_generate import SHAPE, VOCAB

from tblock import GPT2
from tblock.models.sampling import draw, next_token_probs

TINY = [1e-300, 5e-324, 1e-200, 1e-30]


def one_hot(n, i):
    p = np.zeros(n)
    p[i] = 1.0
    return p


@pytest.mark.parametrize("temperature", TINY)
def test_a_tiny_temperature_gives_the_argmax_exactly(temperature):
    logits = np.random.default_rng(1).standard_normal((3, 500)).astype(np.float32) * 5
    p = next_token_probs(logits, temperature)
    for row, want in zip(p, logits.argmax(axis=-1)):
        assert np.array_equal(row, one_hot(500, want))
    toks = draw(p, np.random.default_rng(0))
    assert np.array_equal(toks, logits.argmax(axis=-1))


@pytest.mark.parametrize("temperature", TINY)
def test_exact_ties_share_the_limit_evenly(temperature):
    logits = np.array([1.0, 3.0, -2.0, 3.0, 2.999])
    assert np.array_equal(next_token_probs(logits, temperature), [0.0, 0.5, 0.0, 0.5, 0.0])


@pytest.mark.parametrize("logits, temperature", [
    ([1e300, -1e300, 0.0], 1e-10),          # the logits' spread overflows at any small temperature
    ([1.7e308, 1.6e308, -1.7e308], 1.0),     # x - max overflows float64 itself
    ([3e38, -3e38, 1.0], 1e-290),            # float32's range, a tiny temperature
])
def test_logits_over_temperature_past_float64(logits, temperature):
    p = next_token_probs(np.array(logits), temperature)
    assert np.array_equal(p, one_hot(3, 0))


def test_filters_at_a_tiny_temperature():
    logits = np.random.default_rng(2).standard_normal(1000)
    want = one_hot(1000, int(logits.argmax()))
    for kw in (dict(top_k=5), dict(top_p=0.9), dict(top_k=50, top_p=0.5), dict(top_k=1000)):
        assert np.array_equal(next_token_probs(logits, 1e-300, **kw), want), kw


def test_a_huge_temperature_is_uniform():
    logits = np.random.default_rng(3).standard_normal(64) * 10
    np.testing.assert_allclose(next_token_probs(logits, 1e300), np.full(64, 1 / 64), rtol=1e-15)


def test_ordinary_temperatures_match_the_definition():
    """Away from the edges the result is softmax(logits / T) to float64 rounding."""
    logits = np.random.default_rng(4).standard_normal((2, 300)) * 3
    for t in (0.05, 0.7, 1.0, 3.3):
        z = logits / t
        want = np.exp(z - z.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        np.testing.assert_allclose(next_token_probs(logits, t), want, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("bad, match", [([0.0, np.nan, 1.0], r"found nan at index \(1,\)"),
                                        ([np.inf, 1.0], r"found inf at index \(0,\)"),
                                        ([[0.0, 1.0], [-np.inf, -np.inf]], "only -inf .* in row 1")])
def test_logits_that_cannot_be_a_distribution_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        next_token_probs(np.array(bad), 1.0)


def test_minus_infinity_is_a_token_never_drawn():
    p = next_token_probs(np.array([0.0, -np.inf, 0.0]), 1e-300)
    assert np.array_equal(p, [0.5, 0.0, 0.5])


@pytest.fixture(scope="module")
def model():
    return GPT2.from_config(seed=8, **SHAPE)


@pytest.mark.parametrize("temperature", [1e-300, 5e-324])
def test_generate_at_a_tiny_temperature_is_greedy(model, temperature):
    """Not token 0 every step: the continuation is the greedy one."""
    ids = np.array([[3, 1, 4], [1, 5, 9]])
    greedy = model.generate(ids, 20, temperature=0)
    assert len(set(greedy[:, 3:].ravel().tolist())) > 1 and VOCAB > 1
    np.testing.assert_array_equal(model.generate(ids, 20, temperature=temperature, seed=1), greedy)
    np.testing.assert_array_equal(model.generate(ids, 20, temperature=temperature, top_k=3, top_p=0.5, seed=2),
                                  greedy)
