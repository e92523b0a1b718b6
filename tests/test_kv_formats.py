"""KV cache formats bf16 and int8 (tblock.kvcache): the rounding, every backend on them, and
what they cost against the fp32 cache.

The rounding is checked against this file's own computation: bf16 by picking the nearer of
the two bf16 neighbours in float64 (ties to the even one), int8 with Python's round (half to
even) on float32 products, value by value.  Backends are held to the numpy oracle on the
same cache format: the numba block within TIGHT (float32 sums) where both stored the same
bytes; its float32 K and V differ from the oracle's float64 ones in their last bits, so a
value next to a rounding boundary may round one step the other way (a bf16 ulp, one q),
and then within LOOSE, with at most a few such values.  The rounded caches against the
fp32 cache: within AGAINST_FP32 (about twice the largest seen over these draws).  The
numba tests are marked isa (make test-isa runs them on every vector path).
"""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tblock
from tblock import GPT2
from tblock.kvcache import KV_FORMATS, KVCache, kv_bytes_per_token
from tblock.models.gpt2 import GPT2Config

from conftest import cli_run, random_weights, rel_err

STORED = ("bf16", "int8")
# measured (2026-12-05, avx512) over 1,000 hypothesis draws of these tests' shapes: numba
# vs the oracle with the same stored bytes at most 6.7e-6 (bf16; an fp32 cache: 6.6e-6) and
# 2.7e-5 (int8: its float32 scales differ in their last bits), with a value or two a step
# apart 1.5e-3; over some 2,700 draws with d_k >= 8, a rounded cache against the fp32 one
# at most 3.3e-3 (bf16) and 1.4e-2 (int8)
TIGHT = {"bf16": 1.5e-5, "int8": 6e-5}     # numba (float32) vs the oracle, the same stored bytes
LOOSE = 1e-2            # a few values a rounding step apart (an int8 step is 1/127 of its row's max)
AGAINST_FP32 = {"bf16": 8e-3, "int8": 3e-2}     # the oracle, rounded cache vs fp32 cache


# ----------------------------------------------------------------------------- references


def bf16_nearest(x: np.ndarray) -> np.ndarray:
    """The bf16 bits (uint16) nearest each float32 of x, ties to even: the lower
    neighbour is x's bits with the low 16 cleared, the upper one a bf16 ulp above it."""
    x = np.asarray(x, np.float32)
    lo = (x.view(np.uint32) >> 16).astype(np.uint32)
    out = np.empty(x.shape, np.uint16)
    for i, (xi, li) in enumerate(zip(x.ravel(), lo.ravel())):
        below = float(np.uint32(li << 16).view(np.float32))
        above = float(np.uint32((li + 1) << 16).view(np.float32))
        dl, du = abs(float(xi) - below), abs(above - float(xi))
        out.flat[i] = li if dl < du or (dl == du and li % 2 == 0) else li + 1
    return out


def int8_row(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """(q, d) of one float32 row by the rule, one value at a time."""
    amax = np.float32(max(abs(float(v)) for v in x))
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(127) / amax
    if not np.isfinite(inv):
        return np.zeros(len(x), np.int8), np.float32(0)
    q = [round(float(np.float32(np.float32(v) * inv))) for v in x]     # Python's round: half to even
    return np.array(q, np.int8), np.float32(amax / np.float32(127))


def stored_rows(cache, b):
    """The raw stored K and V of sequence b, (n_heads, length, d_k) each, and int8's scales."""
    h, dk, L = cache.cfg.n_heads, cache.cfg.d_k, cache.length
    rows = dk + (4 if cache.format == "int8" else 0)        # int8: a panel's scales after its d_k rows
    K = cache.K[b].reshape(h, cache.panels, rows, cache.nr)[:, :, :dk]
    K = K.transpose(0, 1, 3, 2).reshape(h, -1, dk)[:, :L]
    V = cache.V[b, :, :L, :dk]
    if cache.format != "int8":
        return K, V, None, None
    return K, V, cache.K_scales[b, :, :L], cache.V_scales[b, :, :L]


def steps_apart(c1, c2) -> int:
    """How many stored values of two caches differ (bf16 bits, int8 q); each must be at
    most one rounding step of its row apart (bf16: 2^-7 of the row's largest magnitude, an
    ulp at most, as a value whose float32 sum cancelled may round several of its own ulps
    away; int8: d)
    and float32's error, else AssertionError."""
    n = 0
    for b in range(c1.batch):
        for raw1, raw2, x, y in zip(stored_rows(c1, b)[:2], stored_rows(c2, b)[:2], c1.head_rows(b, c1.length),
                                    c2.head_rows(b, c2.length)):
            step = np.abs(y).max(axis=-1, keepdims=True) * (2.0 ** -7 if c1.format == "bf16" else 1 / 127)
            # plus float32's rounding of the projection, against the largest value about
            noise = 2e-6 * np.abs(y).max(initial=0)
            assert (np.abs(x.astype(np.float64) - y) <= step * (1 + 1e-5) + noise).all()
            n += int((raw1 != raw2).sum())
    return n


# ----------------------------------------------------------------------------- rounding


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(STORED), heads=st.integers(1, 3), dk=st.integers(1, 20), n=st.integers(1, 6),
       pos=st.integers(0, 3), seed=st.integers(0, 2**31), spread=st.sampled_from([1e-3, 1.0, 1e4]))
def test_store_rounds_and_head_rows_gives_the_exact_values(fmt, heads, dk, n, pos, seed, spread):
    cfg = tblock.BlockConfig(d_model=heads * dk, n_heads=heads, d_ff=4)
    cache = KVCache(cfg, max_T=pos + n + 1, batch=2, format=fmt)
    rng = np.random.default_rng(seed)
    K, V = (rng.standard_normal((heads, n, dk)) * spread for _ in range(2))      # float64, as the oracle's
    cache.store(1, pos, K, V)
    cache.length = pos + n
    rawK, rawV, sK, sV = stored_rows(cache, 1)
    gotK, gotV = cache.head_rows(1, pos + n)
    for X, raw, scales, got in ((K, rawK, sK, gotK), (V, rawV, sV, gotV)):
        x32 = X.astype(np.float32)                  # the cache rounds the float32 value
        if fmt == "bf16":
            want = bf16_nearest(x32)
            assert np.array_equal(raw[:, pos:], want)
            want_vals = (want.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            rows = [int8_row(r) for r in x32.reshape(-1, dk)]
            q = np.stack([r[0] for r in rows]).reshape(x32.shape)
            d = np.array([r[1] for r in rows], np.float32).reshape(heads, n)
            assert np.array_equal(raw[:, pos:], q) and np.array_equal(scales[:, pos:], d)
            want_vals = q.astype(np.float64) * d[..., None].astype(np.float64)
        assert np.array_equal(got[:, pos:].astype(np.float64), want_vals)     # exact
        assert not got[:, :pos].any()                                         # untouched rows: zeros
    # sequence 0 untouched
    assert not any(a.any() for a in stored_rows(cache, 0)[:2] if a is not None)


def test_rounding_ties_zeros_and_tiny_rows():
    cfg = tblock.BlockConfig(d_model=5, n_heads=1, d_ff=4)
    one = np.float32(1.0)
    tie_even = float(one + np.float32(2.0 ** -8))           # halfway 1 .. 1 + 2^-7: to 1 (even)
    tie_odd = float(one + np.float32(3 * 2.0 ** -8))        # halfway 1 + 2^-7 .. 1 + 2^-6: up
    bf = KVCache(cfg, 2, format="bf16")
    bf.store(0, 0, np.array([[[tie_even, tie_odd, -tie_even, 0.0, 3.0]]]), np.zeros((1, 1, 5)))
    assert bf.head_rows(0, 1)[0][0, 0].tolist() == [1.0, 1 + 2 ** -6, -1.0, 0.0, 3.0]
    i8 = KVCache(cfg, 3, format="int8")
    row = np.array([[[127.0, 0.5, 1.5, 2.5, -0.5]]])          # 127 / amax = 1: x * 1 is a tie
    i8.store(0, 0, row, np.zeros((1, 1, 5)))
    i8.store(0, 1, np.full((1, 1, 5), 1e-38), np.array([[[0.0, -2e-38, 0.0, 0.0, 0.0]]]))
    i8.length = 2
    K, V, sK, sV = stored_rows(i8, 0)
    assert K[0, 0].tolist() == [127, 0, 2, 2, 0] and sK[0, 0] == 1.0
    # an all-zero row, and rows below 127 / FLT_MAX (where 127 / amax overflows): zeros
    assert not K[0, 1].any() and not V[0].any() and not sK[0, 1] and not sV[0].any()


# ----------------------------------------------------------------------------- backends


def run(w, cfg, H, cache, backend, schedule):
    outs, at = [], 0
    for n in schedule:
        outs.append(tblock.forward(H[:, at:at + n], w, cfg, backend=backend, cache=cache))
        at += n
    return np.concatenate(outs, axis=1)


@st.composite
def cases(draw, dks=(1, 3, 8, 16, 24)):
    heads = draw(st.integers(1, 4))
    dk = draw(st.sampled_from(dks))
    T = draw(st.integers(1, 12))
    schedule, left = [], T
    while left:
        n = draw(st.integers(1, left))
        schedule.append(n)
        left -= n
    max_T = T + draw(st.integers(0, 3))
    return heads, dk, draw(st.integers(1, 3)), schedule, max_T, draw(st.sampled_from(["pre", "post"]))


def block_case(heads, dk, norm, seed, d_ff=None):
    cfg = tblock.BlockConfig(d_model=heads * dk, n_heads=heads, d_ff=d_ff or 2 * heads * dk + 1, norm=norm,
                             attn_bias=True, ffn_bias=True, ln_affine=True)
    return cfg, random_weights(cfg, np.random.default_rng(seed), np.float32)


@pytest.mark.isa          # the numba kernels, which differ per vector path
@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(STORED), case=cases(), seed=st.integers(0, 2**31))
def test_numba_equals_the_oracle_on_the_same_format(fmt, case, seed):
    heads, dk, B, schedule, max_T, norm = case
    cfg, w = block_case(heads, dk, norm, seed)
    H = np.random.default_rng(seed + 1).standard_normal((B, sum(schedule), cfg.d_model)).astype(np.float32)
    mine, ref = (KVCache(cfg, max_T, B, np.float32, fmt) for _ in range(2))
    got = run(w, cfg, H, mine, "numba", schedule)
    want = run(w, cfg, H, ref, "numpy", schedule)
    apart = steps_apart(mine, ref)
    assert apart <= max(2, mine.length * B * cfg.d_model // 100), apart
    assert rel_err(got, want) <= (TIGHT[fmt] if apart == 0 else LOOSE), (apart, rel_err(got, want))


@pytest.mark.isa          # the numba kernels, which differ per vector path
@pytest.mark.parametrize("fmt", STORED)
def test_long_prefill_over_key_tiles(fmt):
    """T = 400 > BQ queries and > BK keys: several query tiles (the new rows stored by a
    stage of their own first) and key tiles, then decode steps; batch 2, d_k = 64, the
    parallel build (a decode step's one parallel region too)."""
    cfg, w = block_case(4, 64, "pre", 11)
    H = np.random.default_rng(3).standard_normal((2, 403, cfg.d_model)).astype(np.float32)
    mine, ref = (KVCache(cfg, 403, 2, np.float32, fmt) for _ in range(2))
    got = run(w, cfg, H, mine, "numba", [400, 1, 2])
    want = run(w, cfg, H, ref, "numpy", [400, 1, 2])
    apart = steps_apart(mine, ref)
    assert rel_err(got, want) <= (TIGHT[fmt] if apart == 0 else LOOSE), (apart, rel_err(got, want))


@pytest.mark.isa          # the numba kernels, which differ per vector path
@pytest.mark.parametrize("weights, dot", [("int8", "fp32"), ("int4", "int8"), ("bf16", "fp32")])
@pytest.mark.parametrize("fmt", STORED)
def test_stored_weights_through_a_stored_cache(fmt, weights, dot):
    """Weights in a stored format (and llama.cpp's int8 products) with a rounded cache:
    numba against the oracle on the same weights and cache format."""
    cfg, w = block_case(2, 32, "pre", 8, d_ff=96)     # int8, int4: inputs in blocks of 32
    q = tblock.quantize(w, weights, dot=dot)
    H = np.random.default_rng(8).standard_normal((2, 9, cfg.d_model)).astype(np.float32)
    mine, ref = (KVCache(cfg, 9, 2, np.float32, fmt) for _ in range(2))
    got = run(q, cfg, H, mine, "numba", [5, 1, 3])
    want = run(q, cfg, H, ref, "numpy", [5, 1, 3])
    apart = steps_apart(mine, ref)
    # int8 products round each input row to int8 blocks: a row a last bit apart may round
    # one of its inputs a step the other way (the dot option's own bound allows it)
    bound = LOOSE if apart or dot == "int8" else TIGHT[fmt]
    assert rel_err(got, want) <= bound, (apart, rel_err(got, want))


@pytest.mark.skipif("c" not in tblock.available_backends(), reason="the C reference is not built here")
@pytest.mark.parametrize("fmt", STORED)
def test_the_c_reference_equals_the_oracle(fmt):
    """C rounds the new rows itself, in float64 as the oracle does: the same outputs within
    1e-12 and the same stored bytes."""
    cfg, w = block_case(2, 8, "pre", 5)
    H = np.random.default_rng(4).standard_normal((2, 7, cfg.d_model)).astype(np.float32)
    mine, ref = (KVCache(cfg, 7, 2, np.float32, fmt) for _ in range(2))
    got = run(w, cfg, H, mine, "c", [3, 1, 3])
    want = run(w, cfg, H, ref, "numpy", [3, 1, 3])
    assert rel_err(got, want) <= 1e-12
    assert steps_apart(mine, ref) == 0
    for b in range(2):
        for x, y in zip(mine.head_rows(b, 7), ref.head_rows(b, 7)):
            assert np.array_equal(x, y)


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(STORED), case=cases(dks=(8, 16, 24, 64)), seed=st.integers(0, 2**31))
def test_a_rounded_cache_against_the_fp32_cache(fmt, case, seed):
    """The oracle through a rounded cache against it through an fp32 one (AGAINST_FP32),
    for heads of d_k >= 8 (with a value or three a head, a score is a product of a few
    rounded values, and bf16 moved an output by 1.4e-2 at d_k = 1)."""
    heads, dk, B, schedule, max_T, norm = case
    cfg, w = block_case(heads, dk, norm, seed)
    H = np.random.default_rng(seed + 1).standard_normal((B, sum(schedule), cfg.d_model)).astype(np.float32)
    got = run(w, cfg, H, KVCache(cfg, max_T, B, np.float32, fmt), "numpy", schedule)
    want = run(w, cfg, H, KVCache(cfg, max_T, B, np.float32), "numpy", schedule)
    assert rel_err(got, want) <= AGAINST_FP32[fmt]


@pytest.mark.isa          # the numba kernels, which differ per vector path
def test_the_fp32_cache_is_the_default_and_unchanged():
    """format="fp32" is the default cache, bit for bit, on numba; no scales."""
    cfg, w = block_case(3, 8, "pre", 2)
    H = np.random.default_rng(2).standard_normal((2, 9, cfg.d_model)).astype(np.float32)
    a, b = KVCache(cfg, 9, 2), KVCache(cfg, 9, 2, np.float32, "fp32")
    assert a.format == b.format == "fp32" and a.K_scales.size == a.V_scales.size == 0 and a.K.dtype == np.float32
    assert np.array_equal(run(w, cfg, H, a, "numba", [4, 1, 4]), run(w, cfg, H, b, "numba", [4, 1, 4]))
    assert np.array_equal(a.K, b.K) and np.array_equal(a.V, b.V)
    assert KVCache(cfg, 9, 1, np.float64).format == "fp64"


# ----------------------------------------------------------------------------- the model


SMALL = dict(vocab_size=50, n_positions=24, n_embd=32, n_layer=2, n_head=4)


@pytest.mark.isa          # the numba kernels, which differ per vector path
@pytest.mark.parametrize("fmt", STORED)
def test_the_model_decodes_through_a_rounded_cache(fmt):
    """next_logits on numba (its prepared one-call step after the first) against the oracle,
    each over caches of the format; generate takes cache_format."""
    model = GPT2.from_config(**SMALL, seed=3)
    ids = np.array([[5, 7, 11, 13, 2], [1, 2, 3, 4, 5]])
    mine, ref = model.make_cache(12, 2, format=fmt), model.make_cache(12, 2, format=fmt)
    assert all(c.format == fmt for c in mine)
    chunks, got = [ids], []
    for step in range(5):               # numba first: from the second step on, its prepared step
        got.append(model.next_logits(chunks[-1], mine, backend="numba").copy())
        chunks.append(got[-1].argmax(-1)[:, None])
    assert model.prepared_step is not None
    want = [model.next_logits(c, ref, backend="numpy") for c in chunks[:-1]]
    apart = sum(steps_apart(a, b) for a, b in zip(mine, ref))
    assert rel_err(np.stack(got), np.stack(want)) <= (TIGHT[fmt] if apart == 0 else LOOSE), apart
    out = model.generate(ids[0], 4, temperature=0, cache_format=fmt)
    assert out.shape == (9,) and np.array_equal(out[:5], ids[0])


def test_cli_generate_cache(capsys):
    """tblock generate --cache: the ids are the Python API's with that cache format; a bad
    choice is argparse's refusal."""
    ckpt = Path(__file__).resolve().parent / "data" / "tiny_gpt2"
    for fmt in STORED:
        code, out, err = cli_run(capsys, "generate", ckpt, "--ids", 100, 101, 102, "-n", 8, "--temperature", 0,
                                 "--cache", fmt)
        assert code == 0, err
        expected = GPT2.from_pretrained(ckpt).generate([100, 101, 102], 8, temperature=0, cache_format=fmt)
        assert out.split() == [str(i) for i in expected] and f"cache {fmt}" in err
    from tblock.cli import main
    with pytest.raises(SystemExit):
        main(["generate", str(ckpt), "--ids", "1", "--cache", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_bytes_per_token_counts_the_cache_format():
    model = GPT2.from_config(**SMALL, seed=1)
    cfg = model.stack.cfg
    base = model.bytes_per_token(0)
    d, h, n = 32, 4, 2
    assert model.bytes_per_token(10) - base == n * 10 * 2 * d * 4
    assert model.bytes_per_token(10, "bf16") - base == n * 10 * 2 * d * 2
    assert model.bytes_per_token(10, "int8") - base == n * 10 * 2 * (d + 4 * h)
    for fmt in KV_FORMATS:
        c = KVCache(cfg, 10, 3, np.float32, fmt)
        assert c.bytes_per_token == 3 * kv_bytes_per_token(cfg, fmt)
        assert c.nbytes == c.K.nbytes + c.V.nbytes
    assert KVCache(cfg, 10, 1, np.float32, "int8").nbytes < KVCache(cfg, 10, 1, np.float32, "bf16").nbytes


# ----------------------------------------------------------------------------- bad input


def test_bad_formats_are_refused():
    cfg = tblock.BlockConfig(d_model=8, n_heads=2, d_ff=4)
    with pytest.raises(ValueError, match=r"format must be one of \('fp32', 'bf16', 'int8'\), got 'int4'"):
        KVCache(cfg, 4, format="int4")
    with pytest.raises(TypeError, match="format must be a str, one of .*, got NoneType"):
        KVCache(cfg, 4, format=None)
    with pytest.raises(ValueError, match="a KV cache in bf16 computes in float32: dtype must be float32, got float64"):
        KVCache(cfg, 4, 1, np.float64, "bf16")
    with pytest.raises(ValueError, match="format='fp64' is a float64 cache: dtype must be float64, got float32"):
        KVCache(cfg, 4, 1, np.float32, "fp64")
    w = random_weights(cfg, np.random.default_rng(0), np.float32)
    cache = KVCache(cfg, 4, 1, np.float32, "int8")
    with pytest.raises(TypeError, match="a KV cache in int8 computes in float32: H must be float32, got float64"):
        tblock.forward(np.zeros((1, 8)), w, cfg, cache=cache)
    assert cache.length == 0
    stack = tblock.Stack(cfg, [w, w])
    caches = [KVCache(cfg, 4, 1, np.float32, "int8"), KVCache(cfg, 4, 1, np.float32, "bf16")]
    with pytest.raises(ValueError, match=r"caches hold different formats \['int8', 'bf16'\]"):
        stack(np.zeros((1, 8), np.float32), cache=caches)
    model = GPT2.from_config(**SMALL, seed=1)
    with pytest.raises(ValueError, match="cache_format must be one of .*, got 'q8'"):
        model.generate([1, 2], 2, cache_format="q8")
    with pytest.raises(ValueError, match="cache_format must be one of .*, got 'q8'"):
        model.bytes_per_token(4, "q8")
    with pytest.raises(ValueError, match="format must be one of"):
        model.make_cache(4, format="q8")
    m64 = GPT2.from_config(**SMALL, seed=1, dtype=np.float64)
    with pytest.raises(ValueError, match="a KV cache in int8 computes in float32: dtype must be float32"):
        m64.generate([1, 2], 2, cache_format="int8")
