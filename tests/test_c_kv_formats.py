"""The C reference with bf16 and int8 KV caches, against the oracle on the same caches.

A cached call attends to the new tokens' keys and values as the cache will hold them
(rounded), the earlier ones as the cache holds them.  The oracle stores first and reads the
cache back (KVCache.store / head_rows); C rounds the new rows itself, in its own code
(tb_config.kv: round_bf16, round_q8), and hands the exact rows back for the cache to store.
Both compute in float64; fed the same float32 inputs they agree to 1e-12 relative, chunk
after chunk (a prefill then decode steps), so neither can attend to an unrounded key.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tblock
from tblock.backends import c as cb
from tblock.backends import numpy as oracle
from tblock.kvcache import KVCache

from conftest import random_weights, rel_err

TOL = 1e-12


def float32_weights(cfg, rng):
    w = random_weights(cfg, rng)
    return tblock.BlockWeights(**{k: v.astype(np.float32) for k, v in w.arrays().items()})


def run(module, H, w, cfg, cache, chunks):
    """H's rows through ``module``'s cached entry point, chunk by chunk: float64 outputs."""
    outs, t = [], 0
    for n in chunks:
        outs.append(module.forward_cached(H[:, t:t + n], w, cfg, cache))
        cache.advance(n)
        t += n
    return np.concatenate(outs, axis=1)


@st.composite
def cases(draw):
    d_model = draw(st.sampled_from([8, 32, 48, 64]))
    n_heads = draw(st.sampled_from([h for h in (1, 2, 4, 8) if d_model % h == 0]))
    chunks = draw(st.lists(st.integers(1, 9), min_size=1, max_size=5))
    return dict(fmt=draw(st.sampled_from(["bf16", "int8"])), B=draw(st.integers(1, 3)), d_model=d_model,
                n_heads=n_heads, chunks=chunks, norm=draw(st.sampled_from(["pre", "post"])),
                biases=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
@example(case=dict(fmt="int8", B=1, d_model=8, n_heads=8, chunks=[1, 1, 1], norm="pre", biases=False, seed=0))
@example(case=dict(fmt="bf16", B=2, d_model=64, n_heads=2, chunks=[7, 1, 1, 5], norm="post", biases=True, seed=1))
def test_c_on_stored_caches_matches_oracle(case):
    b = case["biases"]
    cfg = tblock.BlockConfig(case["d_model"], case["n_heads"], d_ff=2 * case["d_model"], norm=case["norm"],
                             ffn_bias=b, ln_affine=b, attn_bias=b)
    rng = np.random.default_rng(case["seed"])
    w = float32_weights(cfg, rng)
    T = sum(case["chunks"])
    H = rng.standard_normal((case["B"], T, cfg.d_model)).astype(np.float32)
    caches = [KVCache(cfg, T + 3, case["B"], np.float32, format=case["fmt"]) for _ in range(2)]
    want = run(oracle, H, w, cfg, caches[0], case["chunks"])
    got = run(cb, H, w, cfg, caches[1], case["chunks"])
    assert rel_err(got, want) < TOL
    for b_ in range(case["B"]):          # and the caches hold the same values
        for got_rows, want_rows in zip(caches[1].head_rows(b_, T), caches[0].head_rows(b_, T)):
            assert rel_err(got_rows, want_rows) < TOL


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_a_stored_cache_changes_the_first_chunk_too(fmt):
    """The prefill into an empty cache already attends over rounded keys: its output differs
    from the uncached block's, by about the format's rounding."""
    cfg = tblock.BlockConfig(32, 2, d_ff=64)
    rng = np.random.default_rng(4)
    w = float32_weights(cfg, rng)
    H = rng.standard_normal((1, 6, 32)).astype(np.float32)
    plain = oracle.forward_batch(H, w, cfg, False)[0]
    cached = run(cb, H, w, cfg, KVCache(cfg, 8, 1, np.float32, format=fmt), [6])
    assert 1e-6 < rel_err(cached, plain) < 3e-2


def test_c_refuses_an_unknown_kv():
    fields = cb.config_fields(tblock.BlockConfig(32, 2))
    with pytest.raises(cb.CRefError) as e:
        cb.scratch_len(dict(fields, kv=3), 2)
    assert e.value.name == "TB_ERR_KV"
