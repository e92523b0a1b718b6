"""The numba backend's block variants (issue #33) against the numpy oracle in float64.

The variants are RMSNorm, the gated FFN (with every activation: SwiGLU is gated + silu,
GeGLU gated + gelu_tanh), rotary positions (Hugging Face's rotate-half), grouped-query
attention (n_kv_heads dividing n_heads: 1 is multi-query, n_heads the lesson's) and Q/K/V
biases without b_o, alone and together, beside the lesson's options (Pre/Post-LN, causal or
not, biases, affines).  Every path is held to the oracle: the full forward (serial and
parallel builds, the untiled and the packed attention, 2-D, batched and strided inputs),
the cached path (chunks, one-token steps, every KV format) against the full forward, a
stack's prepared decode step (with an RMSNorm LN_f and no learned positions) against the
oracle's stack and head, and the stored weight formats with w_gate.

Bounds, max |numba - oracle| / max |oracle| (tests/conftest.rel_err):

    float64               F64 = 1e-12    (measured: 7.5e-15 at most over 300 draws of these
                                         shapes, a LayerNorm of d_model 2; most below 1e-15)
    float32               F32 = 2e-5     (measured: 8.9e-7 at most over the same draws, avx512)
    stored weights        F32 as well: the oracle multiplies by the same stored values
    stored KV (bf16/int8) LOOSE = 1e-2 against the oracle on the same cache format: a
                          key or value next to a rounding boundary may round one step the
                          other way (tests/test_kv_formats.py says why), most agree to F32

Weights are drawn here with every bias and affine bounded away from 0 and 1, so each one
matters.  The tests that hold the kernels to the oracle are marked isa: `make test-isa`
runs them on every vector path.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tblock
from tblock import BlockConfig, BlockWeights, KVCache
from tblock.backends import numba as nb
from tblock.backends import numpy as oracle
from tblock.backends import reference_lm_head
from tblock.kernels.tiles import BK
from tblock.weights import expected_shape, weight_names

from conftest import rel_err

F64, F32, LOOSE = 1e-12, 2e-5, 1e-2
ACTS = ("gelu_tanh", "gelu_erf", "relu", "silu")


def variant_weights(cfg: BlockConfig, rng, dtype=np.float64) -> BlockWeights:
    """Weights of cfg: matrices at the lesson's scales, every vector it has bounded away from
    0 (biases) or 1 (gains), so that a kernel that dropped one would fail."""
    w = {}
    for n in weight_names(cfg):
        shape = expected_shape(n, cfg)
        if n.startswith("w_"):
            w[n] = rng.standard_normal(shape) / np.sqrt(shape[0])
        elif n.endswith("gamma"):
            w[n] = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
        else:
            w[n] = rng.uniform(0.1, 0.6, shape) * rng.choice([-1.0, 1.0], shape)
    return BlockWeights(**{k: v.astype(dtype) for k, v in w.items()})


@st.composite
def configs(draw, max_heads=4, causal=None):
    """A BlockConfig with any mix of the variants and the lesson's options."""
    n_heads = draw(st.integers(1, max_heads))
    kv = draw(st.sampled_from([k for k in range(1, n_heads + 1) if n_heads % k == 0]))
    d_k = draw(st.sampled_from([2, 4, 6, 8, 16]))
    return BlockConfig(
        d_model=n_heads * d_k, n_heads=n_heads, n_kv_heads=kv if draw(st.booleans()) or kv < n_heads else None,
        d_ff=draw(st.sampled_from([1, 7, 16, 24, 48, 50])),
        causal=draw(st.booleans()) if causal is None else causal, norm=draw(st.sampled_from(["pre", "post"])),
        activation=draw(st.sampled_from(ACTS)), ffn_bias=draw(st.booleans()), ln_affine=draw(st.booleans()),
        attn_bias=draw(st.sampled_from([False, True, "qkv"])), norm_type=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        ffn=draw(st.sampled_from(["mlp", "gated"])), positions=draw(st.sampled_from(["none", "rotary"])),
        rope_theta=draw(st.sampled_from([10000.0, 500000.0, 7.5])), rope_scale=draw(st.sampled_from([1.0, 4.0])))


def together(**over) -> BlockConfig:
    """SmolLM2/Qwen2's block, reduced: every variant at once."""
    kw = dict(d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, norm_type="rmsnorm", ffn="gated", activation="silu",
              positions="rotary", attn_bias="qkv", ln_affine=True)
    return BlockConfig(**{**kw, **over})


def inputs(cfg, rng, B, T, dtype):
    return rng.standard_normal((B, T, cfg.d_model)).astype(dtype)


def oracle_of(H, w, cfg):
    """The oracle's float64 forward of the float weights and input the backend was given."""
    return tblock.forward(np.asarray(H, np.float64), w, cfg, backend="numpy")


# ----------------------------------------------------------------------------- forward


@pytest.mark.isa
@settings(max_examples=60, deadline=None)
@given(cfg=configs(), B=st.integers(1, 3), T=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_forward_float64_matches_the_oracle(cfg, B, T, seed):
    rng = np.random.default_rng(seed)
    w = variant_weights(cfg, rng)
    H = inputs(cfg, rng, B, T, np.float64)
    want = oracle_of(H, w, cfg)
    assert rel_err(tblock.forward(H, w, cfg), want) < F64
    assert rel_err(tblock.forward(H[0], w, cfg), want[0]) < F64               # 2-D, then the kept plain call
    assert rel_err(tblock.forward(H[0], w, cfg), want[0]) < F64
    assert rel_err(tblock.forward(H[:, ::-1], w, cfg), oracle_of(H[:, ::-1], w, cfg)) < F64    # strided


@pytest.mark.isa
@settings(max_examples=40, deadline=None)
@given(cfg=configs(), B=st.integers(1, 3), T=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_forward_float32_matches_the_oracle(cfg, B, T, seed):
    rng = np.random.default_rng(seed)
    w = variant_weights(cfg, rng, np.float32)
    H = inputs(cfg, rng, B, T, np.float32)
    assert rel_err(tblock.forward(H, w, cfg), oracle_of(H, w, cfg)) < F32


# edges: the packed attention (T*T*d_k above DIRECT_MAX), query tiles of BQ = 384, FFN
# chunks of 256 hidden columns, panels of 16 (d_kv below one), the parallel build, one row
EDGES = [
    (together(), 2, 70), (together(n_kv_heads=1), 1, 65), (together(n_kv_heads=4, norm="post"), 2, 33),
    (together(d_model=32, n_heads=2, n_kv_heads=1, d_ff=257), 1, 390), (together(d_ff=513, causal=False), 3, 7),
    (together(ffn="mlp", activation="relu", attn_bias=True), 2, 64), (together(activation="gelu_erf"), 1, 1),
    (together(d_model=24, n_heads=3, n_kv_heads=1, d_ff=40, norm_type="layernorm"), 1, 1),
    (together(d_model=128, n_heads=8, n_kv_heads=2, d_ff=344, ffn_bias=True), 2, 6),
]


@pytest.mark.isa
@pytest.mark.parametrize("cfg, B, T", EDGES)
@pytest.mark.parametrize("dtype, bound", [(np.float64, F64), (np.float32, F32)])
def test_edges_match_the_oracle(cfg, B, T, dtype, bound):
    rng = np.random.default_rng(B * 1000 + T)
    w = variant_weights(cfg, rng, dtype)
    H = inputs(cfg, rng, B, T, dtype)
    assert rel_err(tblock.forward(H, w, cfg), oracle_of(H, w, cfg)) < bound


@pytest.mark.parametrize("cfg", [together(), together(ffn="mlp", norm="post", n_kv_heads=1, activation="gelu_erf")])
def test_trace_matches_the_oracle_trace(cfg):
    rng = np.random.default_rng(3)
    w = variant_weights(cfg, rng)
    H = inputs(cfg, rng, 2, 11, np.float64)
    _, got = tblock.forward(H, w, cfg, trace=True)
    _, want = tblock.forward(H, w, cfg, backend="numpy", trace=True)
    for f in dataclasses.fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert (a is None) == (b is None), f.name
        if b is not None:
            assert rel_err(a, b) < F64, f.name


# ----------------------------------------------------------------------------- KV caches


def chunked(H, w, cfg, cache, sizes):
    """H's tokens through the cache in chunks of ``sizes``, outputs joined."""
    outs, at = [], 0
    for n in sizes:
        outs.append(tblock.forward(H[:, at:at + n], w, cfg, cache=cache))
        at += n
    return np.concatenate(outs, axis=1)


@pytest.mark.isa
@settings(max_examples=30, deadline=None)
@given(cfg=configs(causal=True), B=st.integers(1, 2), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
       dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**32 - 1))
def test_cached_chunks_equal_the_full_forward(cfg, B, sizes, dtype, seed):
    rng = np.random.default_rng(seed)
    w = variant_weights(cfg, rng, dtype)
    T = sum(sizes)
    H = inputs(cfg, rng, B, T, dtype)
    cache = KVCache(cfg, T + 3, B, dtype)
    got = chunked(H, w, cfg, cache, sizes)
    assert cache.length == T
    bound = F64 if dtype == np.float64 else F32
    assert rel_err(got, oracle_of(H, w, cfg)) < bound
    assert rel_err(got, tblock.forward(H, w, cfg)) < bound
    # the cache holds the K/V heads only, keys turned, as the oracle's own cached calls do
    assert cache.K.shape[1] == cfg.kv_heads
    if dtype == np.float64:
        ref, at = KVCache(cfg, T + 3, B, dtype), 0
        for n in sizes:
            tblock.forward(H[:, at:at + n], w, cfg, backend="numpy", cache=ref)
            at += n
        assert rel_err(cache.keys(), ref.keys()) < F64 and rel_err(cache.values(), ref.values()) < F64


@pytest.mark.isa
@pytest.mark.parametrize("heads, kv", [(6, 2), (6, 3), (7, 1), (14, 2)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decode_steps_of_grouped_heads_match_the_oracle(heads, kv, dtype):
    """A decode step attends each K/V head's group of query heads as the rows of one tile
    (kernels.stages.cached_attention_task): groups of 2, 3, 7 (past one micro-tile of MR
    rows) and 7 again with two K/V heads, two sequences, after a prompt past one key tile."""
    cfg = together(d_model=8 * heads, n_heads=heads, n_kv_heads=kv)
    rng = np.random.default_rng(heads * 10 + kv)
    w = variant_weights(cfg, rng, dtype)
    sizes = (BK + 5, 1, 1, 1)
    H = inputs(cfg, rng, 2, sum(sizes), dtype)
    got = chunked(H, w, cfg, KVCache(cfg, sum(sizes), 2, dtype), sizes)
    bound = F64 if dtype == np.float64 else F32
    assert rel_err(got[:, -3:], oracle_of(H, w, cfg)[:, -3:]) < bound


@pytest.mark.isa
@pytest.mark.parametrize("cfg", [together(), together(n_kv_heads=1, d_model=32, n_heads=2, d_ff=40),
                                 together(n_kv_heads=4, positions="none")])
@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_stored_kv_formats_match_the_oracle(cfg, fmt):
    rng = np.random.default_rng(11)
    w = variant_weights(cfg, rng, np.float32)
    H = inputs(cfg, rng, 2, 12, np.float32)
    sizes = (5, 1, 1, 5)
    got = chunked(H, w, cfg, KVCache(cfg, 14, 2, np.float32, fmt), sizes)
    ref_cache, outs, at = KVCache(cfg, 14, 2, np.float32, fmt), [], 0
    for n in sizes:
        outs.append(tblock.forward(H[:, at:at + n], w, cfg, backend="numpy", cache=ref_cache))
        at += n
    want = np.concatenate(outs, axis=1)
    assert rel_err(got, want) < LOOSE
    assert np.median(np.abs(got - want)) < F32 * np.abs(want).max()


@pytest.mark.isa
@pytest.mark.parametrize("T", [1, 70])
def test_long_prefill_then_steps(T):
    """A packed first chunk (its keys turned in the K^T panels, copied to the cache) or one
    token, then steps over it."""
    cfg = together()
    rng = np.random.default_rng(T)
    w = variant_weights(cfg, rng)
    H = inputs(cfg, rng, 2, T + 4, np.float64)
    got = chunked(H, w, cfg, KVCache(cfg, T + 4, 2, np.float64), (T, 1, 1, 2))
    assert rel_err(got, oracle_of(H, w, cfg)) < F64


@pytest.mark.isa
@pytest.mark.parametrize("dtype, bound", [(np.float64, F64), (np.float32, F32)])
def test_rotary_positions_are_absolute_far_into_a_cache(dtype, bound):
    """Tokens at positions 2000.. (the cache's length moved on over zero keys and values):
    turned by their absolute positions, as the oracle's cached call turns them."""
    cfg = together(d_model=32, n_heads=2, n_kv_heads=1, d_ff=40, rope_scale=2.0)
    rng = np.random.default_rng(4)
    w = variant_weights(cfg, rng, dtype)
    H = inputs(cfg, rng, 1, 4, dtype)
    got, want = KVCache(cfg, 2010, 1, dtype), KVCache(cfg, 2010, 1, np.float64)
    for c in (got, want):
        c.length = 2000
    out = np.concatenate([tblock.forward(H[:, :3], w, cfg, cache=got), tblock.forward(H[:, 3:], w, cfg, cache=got)], 1)
    ref = np.concatenate([tblock.forward(H[:, :3].astype(np.float64), w, cfg, backend="numpy", cache=want),
                          tblock.forward(H[:, 3:].astype(np.float64), w, cfg, backend="numpy", cache=want)], 1)
    assert rel_err(out, ref) < bound
    assert rel_err(got.keys()[:, 2000:], want.keys()[:, 2000:]) < bound


# ----------------------------------------------------------------------------- a stack's decode step


def oracle_logits(blocks, cfg, H, ln_f, eps, E, rms):
    """The oracle's stack on H's rows, then LN_f (RMSNorm with rms) and the tied head."""
    X = H.astype(np.float64)
    for w in blocks:
        X = tblock.forward(X, w, cfg, backend="numpy")
    out = np.empty(X.shape[:-1] + (E.shape[0],))
    return reference_lm_head(X, ln_f, eps, E, out, rms=rms)


@pytest.mark.isa
@pytest.mark.parametrize("dtype, bound", [(np.float64, F64), (np.float32, F32)])
@pytest.mark.parametrize("learned", [False, True])
def test_prepared_decode_step_matches_the_oracle(dtype, bound, learned):
    cfg = together()
    rng = np.random.default_rng(5)
    d, vocab, n, B = cfg.d_model, 37, 3, 2
    blocks = [variant_weights(cfg, rng, dtype) for _ in range(n)]
    E = rng.standard_normal((vocab, d)).astype(dtype)
    P = rng.standard_normal((20, d)).astype(dtype) if learned else None
    ln_f = np.concatenate([rng.uniform(0.5, 1.5, d), np.zeros(d)]).astype(dtype)
    ids = rng.integers(0, vocab, (B, 9))
    H = E[ids] + (P[:9] if learned else 0)
    stack = tblock.Stack(cfg, blocks)
    caches = stack.make_cache(16, B, dtype)
    stack(H[:, :6], cache=caches)                       # the prompt, through the checked path
    step = nb.prepare_decode(blocks, cfg, caches, E, P, ln_f, 1e-5, nb.prepare_head(E, dtype), rms=True)
    got = [step(ids[:, t:t + 1], caches).copy() for t in range(6, 9)]
    assert caches[0].length == 9
    want = oracle_logits(blocks, cfg, H, ln_f, 1e-5, E, True)
    assert rel_err(np.stack(got, axis=1), want[:, 6:9]) < bound


@pytest.mark.parametrize("rms", [False, True])
def test_lm_head_rmsnorm(rms):
    rng = np.random.default_rng(2)
    d, vocab = 48, 70
    H = rng.standard_normal((2, 3, d))
    E = rng.standard_normal((vocab, d))
    ln_f = np.concatenate([rng.uniform(0.5, 1.5, d), np.zeros(d) if rms else rng.standard_normal(d)])
    got = nb.lm_head(H, ln_f, 1e-5, nb.prepare_head(E, np.float64), np.empty((2, 3, vocab)), rms=rms)
    assert rel_err(got, reference_lm_head(H, ln_f, 1e-5, E, np.empty((2, 3, vocab)), rms=rms)) < F64


# ----------------------------------------------------------------------------- stored weights


STORED_CASES = [("bf16", "fp32"), ("bf16", "bf16"), ("int8", "fp32"), ("int8", "int8"), ("int4", "fp32"),
                ("int4", "int8")]


@pytest.mark.isa
@pytest.mark.parametrize("fmt, dot", STORED_CASES)
def test_stored_weights_with_the_gate_match_the_oracle(fmt, dot):
    """w_gate stored as w_ff1 is (tblock.quantize), its [gate | up] pairs read as stored; the
    oracle multiplies by the same stored values, with the dot's rounding of the inputs."""
    cfg = together(ffn_bias=True, d_ff=80 if fmt == "bf16" else 96)     # GGUF's blocks: d_in a multiple of 32
    rng = np.random.default_rng(7)
    w = tblock.quantize(variant_weights(cfg, rng, np.float32), fmt, dot)
    H = inputs(cfg, rng, 2, 9, np.float32)
    want = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy")
    got = tblock.forward(H, w, cfg)
    # with a rounding dot an input next to a tie may round one step the other way
    # (tests/test_bf16_dot.py, test_int8_dot.py): most outputs agree to F32
    assert rel_err(got, want) < (F32 if dot == "fp32" else LOOSE)
    assert np.median(np.abs(got - want)) < F32 * np.abs(want).max()
    cached = chunked(H, w, cfg, KVCache(cfg, 9, 2, np.float32), (4, 1, 4))
    assert rel_err(cached, got) < F32


# ----------------------------------------------------------------------------- components


def test_components_match_the_oracle_pieces():
    """The report's components of a variant block: attention and FFN sublayers, the norm."""
    from tblock.backends import components
    cfg = together()
    rng = np.random.default_rng(9)
    w = variant_weights(cfg, rng)
    cs = components.prepare("numba", cfg, w, np.float64)
    X = rng.standard_normal((40, cfg.d_model))
    arrays = oracle.weight_arrays(w)
    assert rel_err(cs.fns["attention"](X), oracle.attention(X, arrays, cfg, {})) < F64
    assert rel_err(cs.fns["ffn"](X), oracle.ffn(X, arrays, cfg, {})) < F64
    assert rel_err(cs.fns["layernorm"](X), oracle.norm(cfg, arrays, 1)(X)) < F64
