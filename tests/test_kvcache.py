"""KV-cache decoding (issue #17) on every backend of tblock.available_backends().

A causal block's row t depends on rows 0..t only, so feeding a sequence through a KVCache in
chunks (a prefill, then one token at a time, or any mix) must give the rows a forward over
the whole sequence gives: the expected values are that full forward, on the same backend,
which never touches a cache. Accuracy is max|cached - full| / max|full| per sequence
schedule: <= 1e-12 in float64, <= 1e-5 in float32. The cache's keys and values are checked
against the NumPy oracle's trace of the full sequence, K and V.

Errors: a bad call raises a ValueError or TypeError naming what is wrong, and leaves every
cache as it was (length and contents), so decoding can go on.
"""

import dataclasses
import types

import numpy as np
import pytest

import tblock
from tblock import api
from tblock.backends import numpy as oracle
from tblock.backends import torch as torch_backend

from conftest import random_weights as shared_random_weights
from conftest import rel_err

pytestmark = pytest.mark.isa

BACKENDS = tblock.available_backends()
DTYPES = [np.float64, np.float32]
TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}

# small blocks over the flags: d_model not a multiple of 8, d_k = 1, one head, Pre-/Post-LN,
# random attention/FFN biases and LayerNorm affines (all drawn away from 0, see nonzero)
CASES = {
    "pre-all-biases-dk2": tblock.BlockConfig(d_model=6, n_heads=3, d_ff=10, norm="pre", ffn_bias=True,
                                             ln_affine=True, attn_bias=True),
    "post-dk1": tblock.BlockConfig(d_model=5, n_heads=5, d_ff=7, norm="post", activation="relu",
                                   ln_affine=True, attn_bias=True),
    "post-one-head": tblock.BlockConfig(d_model=7, n_heads=1, d_ff=9, norm="post", activation="gelu_erf",
                                        ffn_bias=True, attn_bias=True),
    "pre-lesson-flags": tblock.BlockConfig(d_model=16, n_heads=2, d_ff=24),
}
N = 9   # tokens per sequence in the CASES tests


def random_weights(cfg, seed, dtype=np.float64) -> tblock.BlockWeights:
    return shared_random_weights(cfg, np.random.default_rng(seed), dtype)


def sequences(cfg, B, T, dtype, seed=7):
    return np.random.default_rng(seed).standard_normal((B, T, cfg.d_model)).astype(dtype)


def schedules(T):
    """Chunk sizes that add up to T: every prefill length 1..T followed by one token at a
    time (T alone is the whole sequence in one call), and mixed chunks."""
    for p in range(1, T + 1):
        yield [p] + [1] * (T - p)
    yield [3, 1, 2, 3][:T]
    yield [2, 4, 1, 2]
    yield [1, T - 1]


def decode(run, H, cache, schedule):
    """Feed H (B, T, d_model), the tokens after the cache's, through ``run(H_chunk, cache)``
    chunk by chunk; the rows, joined."""
    outs, at, past = [], 0, cache.length
    for n in schedule:
        outs.append(run(H[:, at:at + n], cache))
        at += n
        assert cache.length == past + at
    return np.concatenate(outs, axis=1)                     # (B, T, d_model)


def forward_with(w, cfg, backend):
    return lambda H, cache: tblock.forward(H, w, cfg, backend=backend, cache=cache)


def snapshot(cache):
    return cache.length, cache.K.copy(), cache.V.copy()


def assert_unchanged(cache, snap):
    length, K, V = snap
    assert cache.length == length
    assert np.array_equal(cache.K, K, equal_nan=True) and np.array_equal(cache.V, V, equal_nan=True)


# ---------------------------------------------------------------------------------------
# cached decoding equals full recomputation

@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_decoding_equals_full_forward(backend, dtype, case, B):
    cfg = CASES[case]
    w = random_weights(cfg, seed=len(case), dtype=dtype)
    H = sequences(cfg, B, N, dtype)
    full = tblock.forward(H, w, cfg, backend=backend)
    _, want = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy", trace=True)
    tol = TOL[np.dtype(dtype)]
    for schedule in schedules(N):
        cache = tblock.KVCache(cfg, max_T=N + 2, batch=B, dtype=dtype)     # room to spare
        got = decode(forward_with(w, cfg, backend), H, cache, schedule)
        assert got.dtype == np.dtype(dtype)
        assert rel_err(got, full) <= tol, schedule
        # the cache holds the sequence's keys and values, in its dtype, as the oracle computes them
        assert cache.K.dtype == np.dtype(dtype)
        assert rel_err(cache.keys(), want.K) <= tol and rel_err(cache.values(), want.V) <= tol, schedule
        # the spare rows: still zero (tokens N, N+1 of every head)
        spare_K, spare_V = zip(*(cache.head_rows(b, N + 2) for b in range(B)))
        assert not np.stack(spare_K)[:, :, N:].any() and not np.stack(spare_V)[:, :, N:].any()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_prefill(backend, dtype):
    """Prefills on both sides of T*T*d_k = 8192 (T = 32 at d_k = 8), where the numba
    backend's first chunk goes from the direct attention to the packed one; a selection of
    prefill lengths, since every one of 1..48 would take long on the oracle."""
    cfg = tblock.BlockConfig(d_model=16, n_heads=2, d_ff=40, norm="pre", ffn_bias=True, ln_affine=True,
                             attn_bias=True)
    T, B = 48, 2
    w = random_weights(cfg, seed=5, dtype=dtype)
    H = sequences(cfg, B, T, dtype)
    full = tblock.forward(H, w, cfg, backend=backend)
    for p in (1, 32, 33, 40, 47, 48):
        cache = tblock.KVCache(cfg, max_T=T, batch=B, dtype=dtype)
        got = decode(forward_with(w, cfg, backend), H, cache, [p] + [1] * (T - p))
        assert rel_err(got, full) <= TOL[np.dtype(dtype)], p


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_chunks_after_a_prefix(backend, dtype):
    """Chunks longer than the numba backend's query tile (BQ = 384) after cached tokens: the
    new keys and values are stored in a stage of their own before the query tiles attend,
    where a chunk of one tile appends and attends in the same task."""
    from tblock.kernels.tiles import BQ
    cfg = tblock.BlockConfig(d_model=24, n_heads=3, d_ff=32, norm="pre", ffn_bias=True, ln_affine=True,
                             attn_bias=True)
    T, B = 2 * BQ + 40, 2
    w = random_weights(cfg, seed=9, dtype=dtype)
    H = sequences(cfg, B, T, dtype)
    full = tblock.forward(H, w, cfg, backend=backend)
    cache = tblock.KVCache(cfg, max_T=T, batch=B, dtype=dtype)
    got = decode(forward_with(w, cfg, backend), H, cache, [10, BQ + 5, 1, T - BQ - 16])
    assert rel_err(got, full) <= TOL[np.dtype(dtype)]


def key_counts(nr):
    """Cached keys at which a one-token step's attention meets an edge of its loops: one
    key; a K^T panel of nr keys less one, whole, one more; an odd count of panels (the
    numba kernel takes two at a time); a key tile of BK less one, whole, one more; three
    tiles, the last part-filled with an odd panel count and an odd key count."""
    from tblock.kernels.tiles import BK
    return sorted({1, nr - 1, nr, nr + 1, 3 * nr - 5, BK - 1, BK, BK + 1, 2 * BK + nr + 3})


@pytest.mark.parametrize("peaked", [False, True], ids=["plain", "peaked"])
@pytest.mark.parametrize("case", ["pre-dk16", "post-dk1"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_token_steps_over_many_keys(backend, dtype, case, peaked):
    """One-token steps after every count of key_counts, each against the row of the NumPy
    oracle's full forward (float64).  peaked: W_q times 40, so that scores reach the
    hundreds and a tile's running max moves from tile to tile (the online softmax's
    rescale), where plain scores stay near 1."""
    cfg = {"pre-dk16": tblock.BlockConfig(d_model=48, n_heads=3, d_ff=40, norm="pre", ffn_bias=True,
                                          ln_affine=True, attn_bias=True),
           "post-dk1": tblock.BlockConfig(d_model=5, n_heads=5, d_ff=7, norm="post", ln_affine=True,
                                          attn_bias=True)}[case]
    w, w_d = (random_weights(cfg, seed=21, dtype=dt) for dt in (np.float64, dtype))     # the same draws
    if peaked:
        w, w_d = (dataclasses.replace(x, w_q=x.w_q * 40) for x in (w, w_d))
    nr = tblock.KVCache(cfg, 1, dtype=dtype).nr
    counts = key_counts(nr)
    T = counts[-1] + 1
    H = sequences(cfg, 1, T, np.float64, seed=3)
    want = tblock.forward(H, w, cfg, backend="numpy")
    cache = tblock.KVCache(cfg, max_T=T, dtype=dtype)
    tblock.forward(H[:, :T - 1].astype(dtype), w_d, cfg, backend=backend, cache=cache)
    for past in counts:
        cache.length = past             # the keys of tokens 0..past-1, cached above
        got = tblock.forward(H[:, past:past + 1].astype(dtype), w_d, cfg, backend=backend, cache=cache)
        assert rel_err(got, want[:, past:past + 1]) <= TOL[np.dtype(dtype)], past


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_wide_batch(backend, dtype, monkeypatch):
    """8 sequences at d_model=128: even one-token steps are over the numba backend's
    PARALLEL_MIN_FLOPS, so its parallel build runs the cached path (with more than one thread)."""
    cfg = tblock.BlockConfig(d_model=128, n_heads=4, d_ff=512, norm="pre", ffn_bias=True, ln_affine=True,
                             attn_bias=True)
    T, B = 10, 8
    w = random_weights(cfg, seed=12, dtype=dtype)
    H = sequences(cfg, B, T, dtype)
    full = tblock.forward(H, w, cfg, backend=backend)
    parallel = []
    if backend == "numba":
        from tblock.backends.numba import cached
        run_parallel = cached.parallel_call
        monkeypatch.setattr(cached, "parallel_call", lambda *a, **k: parallel.append(1) or run_parallel(*a, **k))
    cache = tblock.KVCache(cfg, max_T=T, batch=B, dtype=dtype)
    got = decode(forward_with(w, cfg, backend), H, cache, [4, 1, 1, 3, 1])
    assert rel_err(got, full) <= TOL[np.dtype(dtype)]
    if backend == "numba" and tblock.get_num_threads() > 1:
        assert len(parallel) == 5


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_dimensional_input(backend, dtype):
    cfg = CASES["pre-all-biases-dk2"]
    w = random_weights(cfg, seed=2, dtype=dtype)
    H = sequences(cfg, 1, N, dtype)[0]                      # (T, d_model)
    full = tblock.forward(H, w, cfg, backend=backend)
    cache = tblock.KVCache(cfg, max_T=N, dtype=dtype)
    got = [tblock.forward(H[:4], w, cfg, backend=backend, cache=cache)]
    got += [tblock.forward(H[t:t + 1], w, cfg, backend=backend, cache=cache) for t in range(4, N)]
    assert all(g.ndim == 2 for g in got)
    assert rel_err(np.concatenate(got), full) <= TOL[np.dtype(dtype)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("second", BACKENDS)
@pytest.mark.parametrize("first", BACKENDS)
def test_backends_share_a_cache(first, second, dtype):
    """A cache one backend filled, another goes on with: they agree on its layout."""
    cfg = CASES["post-dk1"]
    w = random_weights(cfg, seed=3, dtype=dtype)
    H = sequences(cfg, 2, N, dtype)
    p = 4
    cache = tblock.KVCache(cfg, max_T=N, batch=2, dtype=dtype)
    head = tblock.forward(H[:, :p], w, cfg, backend=first, cache=cache)
    tail = decode(forward_with(w, cfg, second), H[:, p:], cache, [1, 3, 1])
    tol = TOL[np.dtype(dtype)]
    assert rel_err(head, tblock.forward(H[:, :p], w, cfg, backend=first)) <= tol
    assert rel_err(tail, tblock.forward(H, w, cfg, backend=second)[:, p:]) <= tol


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_starts_over(backend):
    cfg = CASES["pre-lesson-flags"]
    w = random_weights(cfg, seed=4)
    H, other = sequences(cfg, 2, 5, np.float64, seed=1), sequences(cfg, 2, 5, np.float64, seed=2)
    cache = tblock.KVCache(cfg, max_T=5, batch=2, dtype=np.float64)
    decode(forward_with(w, cfg, backend), other, cache, [5])
    cache.reset()
    assert cache.length == 0 and cache.keys().shape == (2, 0, cfg.d_model)
    got = decode(forward_with(w, cfg, backend), H, cache, [2, 1, 2])
    assert rel_err(got, tblock.forward(H, w, cfg, backend=backend)) <= TOL[np.dtype(np.float64)]


# ---------------------------------------------------------------------------------------
# Block and Stack

@pytest.mark.parametrize("backend", BACKENDS)
def test_block_make_cache(backend):
    cfg = CASES["post-one-head"]
    block = tblock.Block(cfg, random_weights(cfg, seed=6), backend=backend)
    cache = block.make_cache(max_T=N, batch=2, dtype=np.float64)
    assert isinstance(cache, tblock.KVCache)
    assert (cache.cfg, cache.max_T, cache.batch, cache.dtype, cache.length) == (cfg, N, 2, np.dtype(np.float64), 0)
    # the numba kernels' layout: K^T in panels of NR keys, V in rows of d_k rounded up to NR
    NR = cache.nr
    assert cache.K.shape == (2, cfg.n_heads, -(-N // NR) * NR * cfg.d_k)
    assert cache.V.shape == (2, cfg.n_heads, N, -(-cfg.d_k // NR) * NR)
    assert cache.nbytes == 8 * (cache.K.size + cache.V.size) >= 2 * 2 * N * cfg.d_model * 8
    assert block.make_cache(3).dtype == np.dtype(np.float32) and block.make_cache(3).batch == 1
    H = sequences(cfg, 2, N, np.float64)
    got = decode(lambda X, c: block(X, cache=c), H, cache, [3, 1, 1, 4])
    assert rel_err(got, block(H)) <= TOL[np.dtype(np.float64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_stack_with_caches_equals_full_stack(backend, dtype):
    cfg = CASES["pre-all-biases-dk2"]
    stack = tblock.Stack(cfg, [random_weights(cfg, seed=10 + l, dtype=dtype) for l in range(3)], backend=backend)
    caches = stack.make_cache(max_T=N, batch=2, dtype=dtype)
    assert len(caches) == 3 and len({id(c) for c in caches}) == 3
    assert all(c.cfg == cfg and c.dtype == np.dtype(dtype) for c in caches)
    H = sequences(cfg, 2, N, dtype)
    full = stack(H)
    for schedule in ([N], [1] * N, [4, 1, 3, 1]):
        for c in caches:
            c.reset()
        outs, at = [], 0
        for n in schedule:
            outs.append(stack(H[:, at:at + n], cache=caches))
            at += n
            assert [c.length for c in caches] == [at] * 3
        assert rel_err(np.concatenate(outs, axis=1), full) <= TOL[np.dtype(dtype)], schedule


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_endian_input_through_cached_block_and_stack(backend):
    # data read from a file may be big-endian: forward converts it, and the cache checks
    # the dtype, not the byte order
    cfg = CASES["pre-all-biases-dk2"]
    stack = tblock.Stack(cfg, [random_weights(cfg, seed=20 + l, dtype=np.float64) for l in range(2)],
                         backend=backend)
    H = sequences(cfg, 1, 5, np.float64)
    caches = stack.make_cache(max_T=5, dtype=np.float64)
    got = np.concatenate([stack(H[:, :3].astype(">f8"), cache=caches),
                          stack(H[:, 3:].astype(">f8"), cache=caches)], axis=1)
    assert rel_err(got, stack(H)) <= TOL[np.dtype(np.float64)]


# ---------------------------------------------------------------------------------------
# errors: clear messages, and no cache changed

def test_cache_needs_a_causal_block():
    cfg = tblock.BlockConfig(d_model=4, n_heads=2, causal=False)
    with pytest.raises(ValueError, match="causal"):
        tblock.KVCache(cfg, max_T=4)
    with pytest.raises(ValueError, match="causal"):
        tblock.Block(cfg, random_weights(cfg, seed=0)).make_cache(4)
    with pytest.raises(ValueError, match="causal"):
        tblock.Stack(cfg, [random_weights(cfg, seed=0)]).make_cache(4)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(cfg="cfg"), TypeError, "cfg must be a BlockConfig"),
    (dict(max_T=0), ValueError, "max_T must be >= 1, got 0"),
    (dict(max_T=2.5), TypeError, "max_T must be an integer"),
    (dict(max_T=True), TypeError, "max_T must be an integer"),
    (dict(batch=0), ValueError, "batch must be >= 1, got 0"),
    (dict(batch="2"), TypeError, "batch must be an integer"),
    (dict(dtype=np.float16), TypeError, "dtype must be float32 or float64, got float16"),
])
def test_cache_constructor_arguments(kwargs, error, match):
    args = dict(cfg=tblock.BlockConfig(d_model=4, n_heads=2), max_T=4)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        tblock.KVCache(**args)


def _prefilled(backend, dtype=np.float64, max_T=6, p=3, B=2):
    """A cache holding the first p tokens of H, with the weights and config that made it."""
    cfg = CASES["pre-all-biases-dk2"]
    w = random_weights(cfg, seed=8, dtype=dtype)
    H = sequences(cfg, B, max_T, dtype)
    cache = tblock.KVCache(cfg, max_T=max_T, batch=B, dtype=dtype)
    tblock.forward(H[:, :p], w, cfg, backend=backend, cache=cache)
    return cfg, w, H, cache


def _bad_calls(cfg, w, H):
    """(what, call(cache), error, match): each must fail before the cache changes."""
    other_cfg = tblock.BlockConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, d_ff=cfg.d_ff, norm="post",
                                   ffn_bias=True, ln_affine=True, attn_bias=True)
    other_w = random_weights(other_cfg, seed=9)
    nan, inf = H[:, 3:4].copy(), H[:, 3:5].copy()
    nan[1, 0, 2] = np.nan
    inf[0, 1, 0] = -np.inf
    return [
        ("a cache made for another config", lambda be, c: tblock.forward(H[:, 3:4], other_w, other_cfg,
                                                                        backend=be, cache=c),
         ValueError, "cache was made for"),
        ("float32 input to a float64 cache", lambda be, c: tblock.forward(H[:, 3:4].astype(np.float32), w, cfg,
                                                                          backend=be, cache=c),
         TypeError, "cache holds float64, got H of dtype float32"),
        ("a batch of 3 for a cache of 2", lambda be, c: tblock.forward(np.concatenate([H, H[:1]])[:, 3:4], w, cfg,
                                                                       backend=be, cache=c),
         ValueError, "cache holds 2 sequence"),
        ("a 2-D input for a cache of 2 sequences", lambda be, c: tblock.forward(H[0, 3:4], w, cfg,
                                                                                backend=be, cache=c),
         ValueError, "cache holds 2 sequence"),
        ("4 tokens where 3 fit", lambda be, c: tblock.forward(np.concatenate([H, H], axis=1)[:, 3:7], w, cfg,
                                                              backend=be, cache=c),
         ValueError, "cache holds 3 of max_T=6 tokens, got 4 more"),
        ("a NaN in the input", lambda be, c: tblock.forward(nan, w, cfg, backend=be, cache=c),
         ValueError, "H must be finite, found nan at index \\(1, 0, 2\\)"),
        ("an Inf in the input", lambda be, c: tblock.forward(inf, w, cfg, backend=be, cache=c),
         ValueError, "H must be finite, found -inf at index \\(0, 1, 0\\)"),
        ("trace=True", lambda be, c: tblock.forward(H[:, 3:4], w, cfg, backend=be, cache=c, trace=True),
         ValueError, "trace=True cannot be combined with a cache"),
        ("the wrong width", lambda be, c: tblock.forward(H[:, 3:4, :-1], w, cfg, backend=be, cache=c),
         ValueError, "d_model=6"),
        ("no tokens", lambda be, c: tblock.forward(H[:, 3:3], w, cfg, backend=be, cache=c),
         ValueError, "at least one token"),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_calls_leave_the_cache_unchanged(backend):
    cfg, w, H, cache = _prefilled(backend)
    for what, call, error, match in _bad_calls(cfg, w, H):
        before = snapshot(cache)
        with pytest.raises(error, match=match):
            call(backend, cache)
        assert_unchanged(cache, before)
    # the cache still works: the other 3 tokens give the full forward's rows
    got = decode(forward_with(w, cfg, backend), H[:, 3:], cache, [1, 2])
    assert rel_err(got, tblock.forward(H, w, cfg, backend=backend)[:, 3:]) <= TOL[np.dtype(np.float64)]


@pytest.mark.parametrize("value, error, match", [
    (-1, ValueError, "length must be between 0 and max_T=4, got -1"),
    (5, ValueError, "length must be between 0 and max_T=4, got 5"),
    (2.0, TypeError, "length must be an integer, got float 2.0"),
    (True, TypeError, "length must be an integer, got bool"),
])
def test_cache_length_setter(value, error, match):
    """length may be set back or on within 0..max_T (a compiled step indexes by it), nothing else."""
    cache = tblock.KVCache(tblock.BlockConfig(d_model=4, n_heads=2), max_T=4)
    cache.length = np.int64(4)
    assert cache.length == 4 and type(cache.length) is int
    with pytest.raises(error, match=match):
        cache.length = value
    assert cache.length == 4


@pytest.mark.parametrize("name", ["K", "V", "work", "max_T", "batch", "dtype", "cfg"])
def test_cache_arrays_and_sizes_are_fixed(name):
    """Compiled steps hold the arrays' addresses (tblock.backends.numba.DecodeStep)."""
    cache = tblock.KVCache(tblock.BlockConfig(d_model=4, n_heads=2), max_T=4)
    before = getattr(cache, name)
    with pytest.raises(AttributeError):
        setattr(cache, name, before)
    assert getattr(cache, name) is before


def test_cache_must_be_a_kvcache():
    cfg, w, H, _ = _prefilled("numpy")
    with pytest.raises(TypeError, match="cache must be a tblock.KVCache, got dict"):
        tblock.forward(H[:, 3:4], w, cfg, cache={"K": None})


def test_backend_without_a_cached_path(monkeypatch):
    """A backend module with forward_batch but no forward_cached is refused by name, before
    anything is checked or written. The stand-in is registered as "torch", whose module
    has no cached path but needs torch installed to load."""
    cfg, w, H, cache = _prefilled("numpy")
    assert not hasattr(torch_backend, "forward_cached")
    no_cache = types.SimpleNamespace(CHECKS_FINITE=False, forward_batch=oracle.forward_batch)
    monkeypatch.setitem(api._LOADED, "torch", no_cache)
    before = snapshot(cache)
    with pytest.raises(ValueError, match="backend 'torch' has no KV-cache path"):
        tblock.forward(H[:, 3:4], w, cfg, backend="torch", cache=cache)
    assert_unchanged(cache, before)
    assert np.array_equal(tblock.forward(H, w, cfg, backend="torch"), tblock.forward(H, w, cfg, backend="numpy"))


@pytest.mark.skipif(torch_backend.status() != "", reason="torch is an optional peer and does not import here: "
                                                          "test_backend_without_a_cached_path covers the refusal")
def test_torch_backend_has_no_cached_path():
    cfg, w, H, cache = _prefilled("numpy")
    before = snapshot(cache)
    with pytest.raises(ValueError, match="backend 'torch' has no KV-cache path"):
        tblock.forward(H[:, 3:4], w, cfg, backend="torch", cache=cache)
    assert_unchanged(cache, before)


# ---------------------------------------------------------------------------------------
# a Stack checks every block's cache before the first is written

def _stack_and_caches(dtype=np.float64, n_layers=3, max_T=6, p=3):
    cfg = CASES["pre-all-biases-dk2"]
    stack = tblock.Stack(cfg, [random_weights(cfg, seed=20 + l, dtype=dtype) for l in range(n_layers)],
                         backend="numpy")
    H = sequences(cfg, 2, max_T, dtype)
    caches = stack.make_cache(max_T=max_T, batch=2, dtype=dtype)
    stack(H[:, :p], cache=caches)
    return cfg, stack, H, caches


def _replace(i, make):
    """A change to the good list of caches: entry i replaced by make(cfg, caches)."""
    def change(cfg, caches):
        bad = list(caches)
        bad[i] = make(cfg, caches)
        return bad
    return change


def _short_cache(cfg, caches):
    """A cache with the others' tokens but room for only one more."""
    c = tblock.KVCache(cfg, max_T=caches[0].length + 1, batch=2, dtype=np.float64)
    for b in range(2):
        c.store(b, 0, *caches[0].head_rows(b, caches[0].length))
    c.length = caches[0].length
    return c


def _other_cfg_cache(cfg, caches):
    return tblock.KVCache(tblock.BlockConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, d_ff=cfg.d_ff, norm="post",
                                             ffn_bias=True, ln_affine=True, attn_bias=True), max_T=6, batch=2,
                          dtype=np.float64)


STACK_BAD = [
    ("one cache too few", lambda cfg, cs: cs[:2], ValueError, "one KVCache per block \\(3\\), got 2"),
    ("one cache too many", lambda cfg, cs: cs + [tblock.KVCache(cfg, 6, 2, np.float64)], ValueError,
     "one KVCache per block \\(3\\), got 4"),
    ("a single cache", lambda cfg, cs: cs[0], TypeError, "list of one KVCache per block"),
    ("not a cache", _replace(1, lambda cfg, cs: "cache"), TypeError, "cache\\[1\\] must be a KVCache"),
    ("last cache for another config", _replace(2, _other_cfg_cache), ValueError, "cache was made for"),
    ("last cache float32", _replace(2, lambda cfg, cs: tblock.KVCache(cfg, 6, 2, np.float32)), TypeError,
     "cache holds float32"),
    ("middle cache for one sequence", _replace(1, lambda cfg, cs: tblock.KVCache(cfg, 6, 1, np.float64)),
     ValueError, "cache holds 1 sequence"),
    ("last cache nearly full", _replace(2, _short_cache), ValueError, "max_T=4 tokens, got 2 more"),
    ("last cache empty", _replace(2, lambda cfg, cs: tblock.KVCache(cfg, 6, 2, np.float64)), ValueError,
     "different lengths \\[3, 3, 0\\]"),
]


@pytest.mark.parametrize("change, error, match", [s[1:] for s in STACK_BAD], ids=[s[0] for s in STACK_BAD])
def test_stack_with_a_bad_cache_list_changes_no_cache(change, error, match):
    cfg, stack, H, caches = _stack_and_caches()
    bad = change(cfg, caches)
    every = [c for c in (bad if isinstance(bad, list) else [bad]) + caches if isinstance(c, tblock.KVCache)]
    before = [snapshot(c) for c in every]
    with pytest.raises(error, match=match):
        stack(H[:, 3:5], cache=bad)
    for c, snap in zip(every, before):
        assert_unchanged(c, snap)


def test_stack_trace_with_caches_is_refused():
    cfg = CASES["pre-all-biases-dk2"]
    stack = tblock.Stack(cfg, [random_weights(cfg, seed=30 + l) for l in range(2)])
    caches = stack.make_cache(max_T=4, dtype=np.float64)
    with pytest.raises(ValueError, match="trace=True cannot be combined with a cache"):
        stack(sequences(cfg, 1, 2, np.float64)[0], trace=True, cache=caches)
    assert [c.length for c in caches] == [0, 0]


def test_stack_nan_input_changes_no_cache():
    cfg, stack, H, caches = _stack_and_caches()
    before = [snapshot(c) for c in caches]
    X = H[:, 3:5].copy()
    X[0, 1, 1] = np.nan
    with pytest.raises(ValueError, match="H must be finite, found nan"):
        stack(X, cache=caches)
    for c, snap in zip(caches, before):
        assert_unchanged(c, snap)
    assert rel_err(stack(H[:, 3:], cache=caches), stack(H)[:, 3:]) <= TOL[np.dtype(np.float64)]


# ---------------------------------------------------------------------------------------
# the numba backend runs a Stack with caches in one compiled call

def _calls(monkeypatch, module, *names):
    """Count the calls of module.<name> for each name (the originals still run)."""
    counts = dict.fromkeys(names, 0)
    for name in names:
        def spy(*args, _name=name, _f=getattr(module, name)):
            counts[_name] += 1
            return _f(*args)
        monkeypatch.setattr(module, name, spy)
    return counts


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("d_model, n_heads, T", [(6, 3, 9), (48, 4, 40)], ids=["serial", "parallel-prefill"])
def test_numba_stack_in_one_call_equals_block_by_block(d_model, n_heads, T, dtype, monkeypatch):
    """A numba Stack with caches of one max_T runs every block in one compiled call
    (kernels.block's table of addresses); it must compute exactly what the blocks called
    one by one compute, outputs and caches alike.  Caches of different max_T go block by
    block, with the same result."""
    from tblock.backends import numba as nb
    cfg = tblock.BlockConfig(d_model=d_model, n_heads=n_heads, d_ff=3 * d_model + 1, ffn_bias=True,
                             ln_affine=True, attn_bias=True)
    stack = tblock.Stack(cfg, [random_weights(cfg, seed=40 + l, dtype=dtype) for l in range(3)], backend="numba")
    H = sequences(cfg, 2, T, dtype)
    one, by_block = stack.make_cache(T, 2, dtype), stack.make_cache(T, 2, dtype)
    mixed = [tblock.KVCache(cfg, T + l, 2, dtype) for l in range(3)]
    calls = _calls(monkeypatch, nb.cached, "cached_serial", "cached_parallel")
    at = 0
    for n in (T - 3, 1, 2):
        X = H[:, at:at + n]
        before = dict(calls)
        got = stack(X, cache=one)
        assert sum(calls.values()) - sum(before.values()) == 1
        want = X
        for block, c in zip(stack.blocks, by_block):
            want = tblock.forward(want, block.weights, cfg, backend="numba", cache=c)
        assert np.array_equal(got, want)
        assert np.array_equal(stack(X, cache=mixed), want)
        at += n
    for a, b in zip(one, by_block):
        assert a.length == b.length == T
        assert np.array_equal(a.K, b.K) and np.array_equal(a.V, b.V)
    assert rel_err(np.concatenate([stack(H[:, :T - 3]), want], axis=1)[:, -2:], stack(H)[:, -2:]) <= \
        TOL[np.dtype(dtype)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_overflow_inside_a_cached_stack_moves_no_cache(backend):
    """Block 0's output overflows float32 (its b_o and b_ff2 at the largest float32): the
    stack stops at block 1's input with an error naming block 0, and no cache moves, so
    decoding can go on with good weights."""
    cfg = CASES["pre-all-biases-dk2"]
    weights = [random_weights(cfg, seed=50 + l, dtype=np.float32) for l in range(3)]
    huge = weights[0].arrays()
    huge["b_o"] = huge["b_ff2"] = np.full(cfg.d_model, np.finfo(np.float32).max, np.float32)
    stack = tblock.Stack(cfg, [tblock.BlockWeights(**huge)] + weights[1:], backend=backend)
    caches = stack.make_cache(6, 2, np.float32)
    H = sequences(cfg, 2, 6, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        with pytest.raises(ValueError, match="output of block 0 holds a NaN or an Inf .*no block's cache has moved"):
            stack(H[:, :3], cache=caches)
    assert [c.length for c in caches] == [0, 0, 0]
    good = tblock.Stack(cfg, weights, backend=backend)
    assert rel_err(good(H, cache=caches), good(H)) <= TOL[np.dtype(np.float32)]


def test_decode_step_results_are_new_arrays():
    """A numba decode step takes its scratch from the cache's work buffer, its output among
    it; what a Block or a Stack returns is the caller's to keep: the next step must not
    change it."""
    cfg = CASES["pre-lesson-flags"]
    stack = tblock.Stack(cfg, [random_weights(cfg, seed=60 + l) for l in range(2)], backend="numba")
    H = sequences(cfg, 1, 6, np.float64)
    caches = stack.make_cache(6, dtype=np.float64)
    block_cache = stack.blocks[0].make_cache(6, dtype=np.float64)
    stack(H[:, :3], cache=caches)
    stack.blocks[0](H[:, :3], cache=block_cache)
    kept = [(stack(H[:, t:t + 1], cache=caches), stack.blocks[0](H[:, t:t + 1], cache=block_cache))
            for t in (3, 4, 5)]
    full, first = stack(H), stack.blocks[0](H)
    for t, (a, b) in zip((3, 4, 5), kept):
        assert not np.may_share_memory(a, caches[0].work) and not np.may_share_memory(b, block_cache.work)
        assert rel_err(a, full[:, t:t + 1]) <= TOL[np.dtype(np.float64)]
        assert rel_err(b, first[:, t:t + 1]) <= TOL[np.dtype(np.float64)]
