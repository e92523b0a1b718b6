"""A model's (or a stack's) list of KV caches must be one cache a block (issue 31).

The same KVCache object twice in the list made both blocks write their keys and values
into one cache: accepted, and wrong logits.  A list that repeats an object is refused,
naming both positions, on every backend and whichever path the call would take, and
nothing moves; caches of another config, dtype or batch are refused as before.
"""

import numpy as np
import pytest

import tblock
from tblock import GPT2

SHAPE = dict(vocab_size=101, n_positions=32, n_embd=32, n_layer=3, n_head=4)


@pytest.fixture(scope="module")
def model():
    return GPT2.from_config(seed=2, **SHAPE)


def test_one_cache_twice_is_refused(model, backend):
    ids = np.arange(6)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        cache = model.make_cache(16)
        cache[j] = cache[i]
        with pytest.raises(ValueError, match=fr"cache\[{i}\] and cache\[{j}\] are the same KVCache"):
            model(ids, cache=cache, backend=backend)
        with pytest.raises(ValueError, match=fr"cache\[{i}\] and cache\[{j}\] are the same KVCache"):
            model.next_logits(ids, tuple(cache), backend=backend)
        assert [c.length for c in cache] == [0, 0, 0]
    with pytest.raises(ValueError, match="same KVCache"):
        model(ids, cache=[cache[0]] * 3, backend=backend)


def test_a_list_changed_after_its_step_was_prepared_is_refused(model):
    ids = np.arange(10)
    cache = model.make_cache(16)
    model.next_logits(ids[:4], cache)
    model.next_logits(ids[4:5], cache)          # prepares the one-call step for this list
    assert model.prepared_step is not None
    cache[2] = cache[1]
    with pytest.raises(ValueError, match=r"cache\[1\] and cache\[2\] are the same KVCache"):
        model.next_logits(ids[5:6], cache)
    assert [c.length for c in cache] == [5, 5, 5]


def test_a_stack_refuses_one_cache_twice(backend):
    cfg = tblock.BlockConfig(d_model=16, n_heads=2)
    stack = tblock.Stack.init(cfg, 2, seed=0)
    cache = stack.make_cache(8)
    H = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    with pytest.raises(ValueError, match=r"cache\[0\] and cache\[1\] are the same KVCache"):
        stack(H, backend=backend, cache=[cache[0], cache[0]])
    assert cache[0].length == 0


def test_caches_of_another_kind_are_refused(model):
    ids = np.arange(4)
    other = GPT2.from_config(seed=2, **{**SHAPE, "n_embd": 16})
    for swap, error, match in [(other.make_cache(16)[1], ValueError, "cache was made for"),
                               (model.stack.make_cache(16, dtype=np.float64)[1], TypeError, "cache holds float64"),
                               (model.make_cache(16, batch=2)[1], ValueError, "cache holds 2 sequence")]:
        cache = model.make_cache(16)
        cache[1] = swap
        with pytest.raises(error, match=match):
            model(ids, cache=cache)
        assert [c.length for c in cache] == [0, 0, 0]


def test_distinct_caches_still_decode(model):
    """The check refuses only what is wrong: a list of three caches gives the full forward's rows."""
    ids = np.random.default_rng(1).integers(0, 101, 12)
    cache = model.make_cache(12)
    got = np.concatenate([model(ids[:7], cache=cache), model(ids[7:], cache=cache)])
    np.testing.assert_allclose(got, model(ids), rtol=1e-5, atol=1e-5)


def test_advance_counts_tokens_within_max_T():
    cache = tblock.KVCache(tblock.BlockConfig(d_model=8, n_heads=2), max_T=5)
    cache.advance(3)
    cache.advance()
    assert cache.length == 4
    for n, error in [(2, ValueError), (-1, ValueError), (1.0, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="n must be an integer|cannot advance by"):
            cache.advance(n)
        assert cache.length == 4
    cache.advance(1)
    assert cache.length == 5
