"""The C reference (backend "c") on the block variants of issue #33: RMSNorm, the gated FFN
(SwiGLU, GeGLU), silu, rotary positions, grouped-query attention and Q/K/V-only biases.

Two kinds of evidence:
  * against the NumPy oracle over drawn configurations, every trace array and the output:
    float64 weights and input to TOL = 1e-12 relative (max |C - oracle| / max |oracle|).
    Fed float32 weights and input, both still compute in float64 (1e-12 on the float64
    results of the backends' entry points); through tblock.forward the results come back
    rounded to float32, and the two roundings of values that agree to 1e-12 differ by at
    most one float32 ulp of the element: TOL32 = 2**-23 of the array's largest value;
  * checks that do not go through the oracle: rotary at position 0 is the identity and its
    pairing is transformers' rotate_half; grouped K/V heads equal multi-head attention on
    K/V columns repeated per group; a zero gate gives F_out = b_ff2; the gated FFN with a
    constant up projection is the two-matrix FFN on the gate's weights; RMSNorm of a
    centred row is LayerNorm; "qkv" biases are True's with b_o = 0; the cache holds the
    K/V heads only, keys after rotary; chunks then one-token steps give the full forward's
    very doubles.
The C argument checks of the new fields close the file.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tblock
from tblock.backends import c as cb
from tblock.backends import numpy as oracle
from tblock.weights import expected_shape, weight_names

from conftest import nonzero, rel_err

TOL = 1e-12
TOL32 = 2.0 ** -23
TRACE = ("H_norm1", "Q", "K", "V", "A", "out_concat", "A_out", "H_mid", "H_norm2", "F_pre", "F_post",
         "F_out", "H_out")


def variant_weights(cfg, rng, dtype=np.float64) -> tblock.BlockWeights:
    """Every weight ``cfg`` needs, drawn from ``rng``: matrices N(0, 1/fan_in), biases and gains
    bounded away from 0 so that each one matters (conftest.random_weights knows the lesson's only)."""
    w = {}
    for name in weight_names(cfg):
        shape = expected_shape(name, cfg)
        if len(shape) == 2:
            w[name] = rng.standard_normal(shape) * np.sqrt(1.0 / shape[0])
        else:
            w[name] = nonzero(rng, shape)
    return tblock.BlockWeights(**{k: v.astype(dtype) for k, v in w.items()})


def make_cfg(**kw) -> tblock.BlockConfig:
    return tblock.BlockConfig(**kw)


def trace_errors(got, want, cfg):
    names = TRACE + (("F_gate",) if cfg.ffn == "gated" else ())
    return {name: rel_err(got[name], want[name]) for name in names}


# ---------------------------------------------------------------------------------------
# C against the oracle over drawn configurations

@st.composite
def variant_cases(draw):
    rotary = draw(st.booleans())
    n_heads = draw(st.sampled_from([1, 2, 3, 4, 6]))
    d_k = 2 * draw(st.integers(1, 4)) if rotary else draw(st.integers(1, 8))
    return dict(
        B=draw(st.integers(1, 3)), T=draw(st.sampled_from([1, 2, 3, 5, 9, 16])),
        d_model=n_heads * d_k, n_heads=n_heads,
        n_kv_heads=draw(st.sampled_from([None] + [g for g in range(1, n_heads + 1) if n_heads % g == 0])),
        d_ff=draw(st.integers(1, 40)), causal=draw(st.booleans()), norm=draw(st.sampled_from(["pre", "post"])),
        norm_type=draw(st.sampled_from(["layernorm", "rmsnorm"])), ffn=draw(st.sampled_from(["mlp", "gated"])),
        activation=draw(st.sampled_from(["gelu_tanh", "gelu_erf", "relu", "silu"])),
        positions="rotary" if rotary else "none",
        rope_theta=draw(st.sampled_from([10000.0, 500000.0, 100.0, 2.5])),
        rope_scale=draw(st.sampled_from([1.0, 2.0, 0.25, 8.0])),
        attn_bias=draw(st.sampled_from([False, True, "qkv"])), ffn_bias=draw(st.booleans()),
        ln_affine=draw(st.booleans()), eps=draw(st.sampled_from([1e-5, 1e-6, 0.5])),
        scale=draw(st.sampled_from([1.0, 1e-3, 30.0])), seed=draw(st.integers(0, 2**32 - 1)))


def _case(**kw):
    base = dict(B=1, T=1, d_model=2, n_heads=1, n_kv_heads=None, d_ff=1, causal=True, norm="pre",
                norm_type="rmsnorm", ffn="gated", activation="silu", positions="rotary", rope_theta=10000.0,
                rope_scale=1.0, attn_bias=False, ffn_bias=False, ln_affine=False, eps=1e-5, scale=1.0, seed=0)
    base.update(kw)
    return base


def case_block(case, dtype):
    keys = ("d_model", "n_heads", "n_kv_heads", "d_ff", "causal", "norm", "norm_type", "ffn", "activation",
            "positions", "rope_theta", "rope_scale", "attn_bias", "ffn_bias", "ln_affine", "eps")
    cfg = make_cfg(**{k: case[k] for k in keys})
    rng = np.random.default_rng(case["seed"])
    w = variant_weights(cfg, rng, dtype)
    H = (rng.standard_normal((case["B"], case["T"], cfg.d_model)) * case["scale"]).astype(dtype)
    return cfg, w, H


VARIANT_EXAMPLES = [
    _case(),                                                                    # everything 1 (d_k = 2)
    _case(B=2, T=16, d_model=48, n_heads=6, n_kv_heads=2, d_ff=40, attn_bias="qkv", ffn_bias=True,
          ln_affine=True, rope_theta=1e6),                                      # Qwen2-like
    _case(B=3, T=9, d_model=24, n_heads=3, n_kv_heads=1, d_ff=17, norm="post", causal=False,
          activation="gelu_tanh", rope_scale=8.0, ln_affine=True),              # GeGLU, multi-query
    _case(T=5, d_model=7, n_heads=1, ffn="mlp", positions="none", activation="relu", norm_type="layernorm",
          attn_bias="qkv", ln_affine=True, ffn_bias=True),                      # odd d_k, no rotary
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=variant_cases())
@example(case=VARIANT_EXAMPLES[0])
@example(case=VARIANT_EXAMPLES[1])
@example(case=VARIANT_EXAMPLES[2])
@example(case=VARIANT_EXAMPLES[3])
def test_c_variants_match_oracle_float64(case):
    cfg, w, H = case_block(case, np.float64)
    got_out, got = cb.forward_batch(H, w, cfg, trace=True)
    want_out, want = oracle.forward_batch(H, w, cfg, trace=True)
    errs = trace_errors(got, want, cfg)
    errs["output"] = rel_err(got_out, want_out)
    worst = max(errs, key=errs.get)
    assert errs[worst] < TOL, f"{worst}: relative error {errs[worst]:.3g} ({errs})"
    assert np.array_equal(got_out, got["H_out"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=variant_cases())
@example(case=VARIANT_EXAMPLES[1])
def test_c_variants_match_oracle_float32(case):
    """float32 weights and input: the backends' float64 results to TOL; through tblock.forward
    (results rounded to float32) to TOL32."""
    cfg, w, H = case_block(case, np.float32)
    got_out, got = cb.forward_batch(H, w, cfg, trace=True)
    want_out, want = oracle.forward_batch(H, w, cfg, trace=True)
    errs = trace_errors(got, want, cfg)
    errs["output"] = rel_err(got_out, want_out)
    worst = max(errs, key=errs.get)
    assert errs[worst] < TOL, f"{worst}: relative error {errs[worst]:.3g} ({errs})"
    out32, tr32 = tblock.forward(H, w, cfg, backend="c", trace=True)
    ref32, ref_tr32 = tblock.forward(H, w, cfg, backend="numpy", trace=True)
    assert out32.dtype == np.float32 and tr32.K.shape[-1] == cfg.d_kv
    assert rel_err(out32, ref32) <= TOL32
    for name in TRACE + (("F_gate",) if cfg.ffn == "gated" else ()):
        assert rel_err(getattr(tr32, name), getattr(ref_tr32, name)) <= TOL32, name


# ---------------------------------------------------------------------------------------
# the cached path: chunks of several sizes, then one-token steps

@st.composite
def cached_cases(draw):
    case = draw(variant_cases())
    chunks = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    case.update(causal=True, chunks=chunks, steps=draw(st.integers(0, 4)))
    case["T"] = sum(chunks) + case["steps"]
    return case


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cached_cases())
@example(case=dict(VARIANT_EXAMPLES[1], chunks=[5, 3], steps=4, T=12))
@example(case=dict(VARIANT_EXAMPLES[0], chunks=[1], steps=3, T=4))
def test_cached_path_gives_the_full_forwards_doubles(case):
    """float64 cache: every chunk and step gives the full forward's rows bit for bit (the keys
    of earlier positions come back from the cache exactly), and the cache ends up holding the
    full forward's K (after rotary) and V for the K/V heads only."""
    cfg, w, H = case_block(case, np.float64)
    full, tr = tblock.forward(H, w, cfg, backend="c", trace=True)
    cache = tblock.KVCache(cfg, max_T=case["T"] + 2, batch=case["B"], dtype=np.float64)
    outs, t = [], 0
    for n in case["chunks"] + [1] * case["steps"]:
        outs.append(tblock.forward(H[:, t:t + n], w, cfg, backend="c", cache=cache))
        t += n
    assert np.array_equal(np.concatenate(outs, axis=1), full)
    assert rel_err(full, tblock.forward(H, w, cfg, backend="numpy")) < TOL
    K, V = cache.keys(), cache.values()                 # (B, length, d_kv) rows
    assert K.shape == (case["B"], case["T"], cfg.d_kv)
    assert np.array_equal(K, tr.K) and np.array_equal(V, tr.V)


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8"])
def test_cached_path_float32_and_stored_caches_match_oracle(fmt):
    """float32 weights and input, caches in float32, bf16 and int8: C against the oracle on
    the same cache, chunk after chunk (GQA 3:1, rotary, SwiGLU, RMSNorm, Q/K/V biases)."""
    cfg = make_cfg(d_model=48, n_heads=6, n_kv_heads=2, d_ff=64, norm_type="rmsnorm", ffn="gated",
                   activation="silu", positions="rotary", attn_bias="qkv", ln_affine=True)
    rng = np.random.default_rng(21)
    w = variant_weights(cfg, rng, np.float32)
    H = rng.standard_normal((2, 11, 48)).astype(np.float32)
    chunks = [4, 3, 1, 1, 1, 1]
    got, want = [], []
    for module, outs in ((cb, got), (oracle, want)):
        cache = tblock.KVCache(cfg, max_T=11, batch=2, dtype=np.float32, format=fmt)
        t = 0
        for n in chunks:
            outs.append(module.forward_cached(H[:, t:t + n], w, cfg, cache))
            cache.advance(n)
            t += n
    got, want = np.concatenate(got, axis=1), np.concatenate(want, axis=1)
    if fmt == "fp32":
        # C attends to a chunk's own keys unrounded, the oracle to them stored in float32 first:
        # float32 rounding of K and V moves the output by about 3e-8 relative (20 seeds)
        assert rel_err(got, want) < 1e-6
    else:
        assert rel_err(got, want) < TOL


# ---------------------------------------------------------------------------------------
# stored weight formats with the gated FFN (w_gate stored like the six)

@st.composite
def stored_cases(draw):
    fmt = draw(st.sampled_from(["bf16", "int8", "int4"]))
    dots = {"bf16": ["fp32", "bf16"], "int8": ["fp32", "int8"], "int4": ["fp32", "int8"]}[fmt]
    n_heads = draw(st.sampled_from([1, 2, 4]))
    return dict(fmt=fmt, dot=draw(st.sampled_from(dots)), B=draw(st.integers(1, 2)),
                T=draw(st.sampled_from([1, 3, 8])), d_model=32 * draw(st.integers(1, 2)), n_heads=n_heads,
                n_kv_heads=draw(st.sampled_from([g for g in (1, 2, 4) if n_heads % g == 0])),
                d_ff=32 * draw(st.integers(1, 3)), norm=draw(st.sampled_from(["pre", "post"])),
                activation=draw(st.sampled_from(["silu", "gelu_tanh"])), biases=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=stored_cases())
@example(case=dict(fmt="int4", dot="int8", B=2, T=8, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, norm="pre",
                   activation="silu", biases=True, seed=1))
@example(case=dict(fmt="bf16", dot="bf16", B=1, T=3, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, norm="post",
                   activation="gelu_tanh", biases=False, seed=2))
def test_stored_formats_with_the_gated_ffn_match_oracle(case):
    b = case["biases"]
    cfg = make_cfg(d_model=case["d_model"], n_heads=case["n_heads"], n_kv_heads=case["n_kv_heads"],
                   d_ff=case["d_ff"], norm=case["norm"], norm_type="rmsnorm", ffn="gated",
                   activation=case["activation"], positions="rotary", attn_bias="qkv" if b else False,
                   ffn_bias=b, ln_affine=b)
    rng = np.random.default_rng(case["seed"])
    w = tblock.quantize(variant_weights(cfg, rng), case["fmt"], dot=case["dot"])
    assert w.quantized and w.w_gate.format == case["fmt"]
    H = rng.standard_normal((case["B"], case["T"], cfg.d_model))
    got_out, got = tblock.forward(H, w, cfg, backend="c", trace=True)
    want_out, want = tblock.forward(H, w, cfg, backend="numpy", trace=True)
    assert rel_err(got_out, want_out) < TOL
    for name in ("Q", "K", "A_out", "F_pre", "F_gate", "F_post", "F_out"):
        assert rel_err(getattr(got, name), getattr(want, name)) < TOL, name


def test_stored_w_gate_is_read_by_c_from_its_bytes():
    """C's w_gate is tb_dequantize's reading of the stored bytes, equal to tblock.formats'."""
    cfg = make_cfg(d_model=32, n_heads=2, d_ff=64, ffn="gated", activation="silu")
    w = tblock.quantize(variant_weights(cfg, np.random.default_rng(3)), "int4")
    w64 = cb._float64_weights(w)
    assert np.array_equal(w64["w_gate"], w.w_gate.dequantize(np.float64))
    assert not np.array_equal(w64["w_gate"], w64["w_ff1"])


# ---------------------------------------------------------------------------------------
# independent checks (no oracle)

def test_rotary_at_position_zero_is_the_identity():
    """One token, at position 0: cos 1, sin 0, so the rotary block is the block without it,
    to the bit; tb_rotary_rows at first = 0 returns its input."""
    base = dict(d_model=24, n_heads=4, n_kv_heads=2, d_ff=40, norm_type="rmsnorm", ffn="gated",
                activation="silu", attn_bias="qkv", ln_affine=True, ffn_bias=True)
    rot, plain = make_cfg(positions="rotary", **base), make_cfg(**base)
    rng = np.random.default_rng(0)
    w = variant_weights(plain, rng)
    H = rng.standard_normal((3, 1, 24))
    assert np.array_equal(tblock.forward(H, w, rot, backend="c"), tblock.forward(H, w, plain, backend="c"))
    X = rng.standard_normal((1, 24))
    out = np.full_like(X, np.nan)
    cb.rotary_rows_raw(out, X, 1, 24, 0, cb.config_fields(rot))
    assert np.array_equal(out, X)


def _c_rotary(X, first, theta, scale, d_k):
    cfg = make_cfg(d_model=X.shape[1], n_heads=X.shape[1] // d_k, positions="rotary", rope_theta=theta,
                   rope_scale=scale)
    out = np.full_like(X, np.nan)
    cb.rotary_rows_raw(out, X, X.shape[0], X.shape[1], first, cb.config_fields(cfg))
    return out


def test_rotary_is_hugging_faces_rotate_half_form():
    """tb_rotary_rows against Hugging Face's formulation written out here, whole-vector:
    x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1], cos and sin of the
    frequencies twice over (the C turns pair by pair)."""
    theta, scale, d_k, heads, T, first = 500000.0, 4.0, 8, 3, 6, 5
    X = np.random.default_rng(1).standard_normal((T, heads * d_k))
    inv_freq = 1.0 / theta ** (np.arange(0, d_k, 2) / d_k)
    emb = np.concatenate([np.outer(np.arange(first, first + T) / scale, inv_freq)] * 2, axis=1)   # (T, d_k)
    x = X.reshape(T, heads, d_k)
    rotate_half = np.concatenate([-x[..., d_k // 2:], x[..., :d_k // 2]], axis=-1)
    want = (x * np.cos(emb)[:, None] + rotate_half * np.sin(emb)[:, None]).reshape(T, -1)
    assert rel_err(_c_rotary(X, first, theta, scale, d_k), want) < TOL


PEER_ROTARY = """
import sys, numpy as np, torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
X = np.load(sys.argv[1])
first, theta, scale, d_k = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
T, heads = X.shape[0], X.shape[1] // d_k
inv_freq = 1.0 / theta ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
emb = torch.cat([torch.outer(torch.arange(first, first + T, dtype=torch.float64) / scale, inv_freq)] * 2, dim=-1)
x = torch.from_numpy(X).reshape(T, heads, d_k).transpose(0, 1)[None]
q, _ = apply_rotary_pos_emb(x, x, emb.cos()[None], emb.sin()[None])
np.save(sys.argv[2], q[0].transpose(0, 1).reshape(T, heads * d_k).numpy())
"""


@pytest.mark.subprocess
def test_rotary_pairing_is_transformers_apply_rotary_pos_emb(tmp_path):
    """tb_rotary_rows against transformers' own apply_rotary_pos_emb (Llama's), float64, with
    linear scaling. The peer runs in a child started outside the checkout: inside it, the
    checkout's kernels/ shadows the `kernels` package transformers probes for."""
    import importlib.util
    import os
    import subprocess
    import sys
    for peer in ("torch", "transformers"):
        if importlib.util.find_spec(peer) is None:
            pytest.skip(f"{peer} is not installed: it is the peer for the rotary pairing")
    theta, scale, d_k, first = 500000.0, 4.0, 8, 5
    X = np.random.default_rng(1).standard_normal((6, 3 * d_k))
    np.save(tmp_path / "x.npy", X)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = ["x.npy", "want.npy", str(first), repr(theta), repr(scale), str(d_k)]
    ran = subprocess.run([sys.executable, "-c", PEER_ROTARY, *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert rel_err(_c_rotary(X, first, theta, scale, d_k), np.load(tmp_path / "want.npy")) < TOL


def test_rotary_by_hand():
    """d_k = 4, theta = 16: pair 0 turns by t, pair 1 by t / 4; position 3, scale 1.5."""
    cfg = make_cfg(d_model=4, n_heads=1, positions="rotary", rope_theta=16.0, rope_scale=1.5)
    X = np.array([[1.0, 2.0, 3.0, 4.0]])
    out = np.full_like(X, np.nan)
    cb.rotary_rows_raw(out, X, 1, 4, 3, cb.config_fields(cfg))
    a0, a1 = 3 / 1.5, 3 / 1.5 / 4.0
    want = [1 * np.cos(a0) - 3 * np.sin(a0), 2 * np.cos(a1) - 4 * np.sin(a1),
            3 * np.cos(a0) + 1 * np.sin(a0), 4 * np.cos(a1) + 2 * np.sin(a1)]
    assert rel_err(out[0], want) < 1e-15


def test_rotary_scores_depend_on_the_offset_only():
    """q at t + p against k at s + p scores as q at t against k at s: a relative position."""
    cfg = make_cfg(d_model=12, n_heads=2, positions="rotary", rope_theta=50.0)
    rng = np.random.default_rng(2)
    Q, K = rng.standard_normal((5, 12)), rng.standard_normal((5, 12))
    rotated = {}
    for p in (0, 37):
        for name, X in (("Q", Q), ("K", K)):
            out = np.empty_like(X)
            cb.rotary_rows_raw(out, X, 5, 12, p, cb.config_fields(cfg))
            rotated[name, p] = out
    for h in range(2):
        c = slice(6 * h, 6 * h + 6)
        S0 = rotated["Q", 0][:, c] @ rotated["K", 0][:, c].T
        S1 = rotated["Q", 37][:, c] @ rotated["K", 37][:, c].T
        assert rel_err(S1, S0) < 1e-13
        assert rel_err(np.diag(S0), np.sum(Q[:, c] * K[:, c], axis=1)) < 1e-13   # t = s: no turn


@pytest.mark.parametrize("n_kv_heads", [1, 2, 3])
@pytest.mark.parametrize("rotary", [False, True])
def test_grouped_kv_heads_equal_mha_on_repeated_columns(n_kv_heads, rotary):
    """GQA equals multi-head attention whose K/V weights repeat each K/V head's columns for
    its group of query heads (transformers' repeat_kv), to the bit; n_kv_heads = n_heads is
    MHA itself."""
    n_heads, d_k = 6, 4
    base = dict(d_model=n_heads * d_k, n_heads=n_heads, d_ff=20, attn_bias="qkv", ffn_bias=True,
                positions="rotary" if rotary else "none")
    gqa, mha = make_cfg(n_kv_heads=n_kv_heads, **base), make_cfg(**base)
    rng = np.random.default_rng(n_kv_heads)
    w = variant_weights(gqa, rng)
    group = n_heads // n_kv_heads

    def repeat(a):      # (..., kv * d_k) -> (..., n_heads * d_k), head g's columns for heads g*group ..
        heads = a.reshape(*a.shape[:-1], n_kv_heads, 1, d_k)
        return np.broadcast_to(heads, (*a.shape[:-1], n_kv_heads, group, d_k)).reshape(*a.shape[:-1], -1)

    repeated = {n: repeat(getattr(w, n)) for n in ("w_k", "w_v", "b_k", "b_v")}
    w_mha = tblock.BlockWeights(**{**w.arrays(), **repeated})
    H = rng.standard_normal((2, 7, 24))
    got, got_tr = tblock.forward(H, w, gqa, backend="c", trace=True)
    want, want_tr = tblock.forward(H, w_mha, mha, backend="c", trace=True)
    assert np.array_equal(got, want) and np.array_equal(got_tr.A, want_tr.A)
    assert np.array_equal(repeat(got_tr.K), want_tr.K)
    same = make_cfg(n_kv_heads=n_heads, **base)
    assert np.array_equal(tblock.forward(H, w_mha, same, backend="c"), want)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu_erf", "relu"])
def test_zero_gate_gives_the_output_bias(activation):
    """w_gate = 0, b_gate = 0: act(0) = 0 for every activation, so F_post = 0 and F_out = b_ff2."""
    cfg = make_cfg(d_model=8, n_heads=2, d_ff=12, ffn="gated", activation=activation, ffn_bias=True)
    rng = np.random.default_rng(4)
    w = variant_weights(cfg, rng).arrays()
    w.update(w_gate=np.zeros((8, 12)), b_gate=np.zeros(12))
    w = tblock.BlockWeights(**w)
    _, tr = tblock.forward(rng.standard_normal((3, 8)), w, cfg, backend="c", trace=True)
    assert np.all(tr.F_gate == 0) and np.all(tr.F_post == 0)
    assert np.array_equal(tr.F_out, np.broadcast_to(w.b_ff2, (3, 8)))


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu"])
def test_gated_ffn_with_unit_up_projection_is_the_mlp_on_the_gate(activation):
    """w_ff1 = 0, b_ff1 = 1 make F_pre = 1, so the gated FFN is act(X W_gate + b_gate) W_ff2 +
    b_ff2: the two-matrix FFN with the gate's weights in w_ff1, b_ff1, to the bit."""
    kw = dict(d_model=8, n_heads=2, d_ff=12, activation=activation, ffn_bias=True, norm_type="rmsnorm",
              ln_affine=True)
    gated, mlp = make_cfg(ffn="gated", **kw), make_cfg(**kw)
    rng = np.random.default_rng(5)
    w = variant_weights(gated, rng).arrays()
    w_mlp = {k: v for k, v in w.items() if k not in ("w_gate", "b_gate")}
    w_mlp.update(w_ff1=w["w_gate"], b_ff1=w["b_gate"])
    w.update(w_ff1=np.zeros((8, 12)), b_ff1=np.ones(12))
    H = rng.standard_normal((2, 4, 8))
    got, tr = tblock.forward(H, tblock.BlockWeights(**w), gated, backend="c", trace=True)
    want, want_tr = tblock.forward(H, tblock.BlockWeights(**w_mlp), mlp, backend="c", trace=True)
    assert np.all(tr.F_pre == 1.0)
    assert np.array_equal(tr.F_gate, want_tr.F_pre) and np.array_equal(got, want)


def test_silu_by_hand():
    """silu through tb_gated_ffn on one unit (w_gate = x, F_pre = 1, w_ff2 = 1): F_post = x / (1 + e^-x),
    and a very negative x gives -0, not NaN."""
    cfg = make_cfg(d_model=1, n_heads=1, d_ff=1, ffn="gated", activation="silu")
    fields = cb.config_fields(cfg)
    for x, want in [(0.0, 0.0), (1.0, 1.0 / (1.0 + np.exp(-1.0))), (-2.0, -2.0 / (1.0 + np.exp(2.0))),
                    (-800.0, 0.0), (800.0, 800.0)]:
        w = dict(w_gate=np.array([[x]]), w_ff1=np.ones((1, 1)), w_ff2=np.ones((1, 1)))
        F = [np.full((1, 1), np.nan) for _ in range(4)]
        cb.gated_ffn_raw(*F, np.ones((1, 1)), 1, fields, w)
        F_out, F_pre, F_gate, F_post = (a[0, 0] for a in F)
        assert F_pre == 1.0 and F_gate == x and F_out == F_post and not np.isnan(F_post), x
        assert abs(F_post - want) <= 1e-15 * abs(want), x


def test_rmsnorm_of_a_centred_row_is_layernorm():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((5, 9)) * 3.0 + 2.0
    Xc = X - X.mean(axis=1, keepdims=True)
    gamma = nonzero(rng, 9)
    rms, ln = np.empty_like(X), np.empty_like(X)
    cb.rmsnorm_rows_raw(rms, Xc, 5, 9, gamma, eps=1e-3)
    cb.layernorm_rows_raw(ln, X, 5, 9, gamma, np.zeros(9), eps=1e-3)
    assert rel_err(rms, ln) < 1e-14
    one = np.empty((1, 2))
    cb.rmsnorm_rows_raw(one, np.array([[3.0, 4.0]]), 1, 2, eps=0.5)      # mean square 12.5, + eps = 13
    assert rel_err(one, np.array([[3.0, 4.0]]) / np.sqrt(13.0)) < 1e-16


def test_qkv_biases_are_true_biases_with_a_zero_output_bias():
    kw = dict(d_model=12, n_heads=3, n_kv_heads=1, d_ff=16, positions="rotary")
    qkv, full = make_cfg(attn_bias="qkv", **kw), make_cfg(attn_bias=True, **kw)
    rng = np.random.default_rng(7)
    w = variant_weights(qkv, rng)
    w_full = tblock.BlockWeights(**w.arrays(), b_o=np.zeros(12))
    H = rng.standard_normal((2, 5, 12))
    assert np.array_equal(tblock.forward(H, w, qkv, backend="c"), tblock.forward(H, w_full, full, backend="c"))


def test_raw_cache_holds_the_kv_heads_only_keys_rotated():
    """tb_block_forward_cached on (B, n_kv_heads, max_T, d_k) caches: the keys written are
    the trace's rotated K, head by head; a cache one double short of that is refused."""
    cfg = make_cfg(d_model=16, n_heads=4, n_kv_heads=2, d_ff=8, positions="rotary", rope_theta=30.0)
    rng = np.random.default_rng(8)
    w = cb._float64_weights(variant_weights(cfg, rng))
    H = rng.standard_normal((1, 5, 16))
    _, tr = tblock.forward(H, tblock.BlockWeights(**w), cfg, backend="c", trace=True)
    fields = cb.config_fields(cfg)
    K = np.full((1, 2, 5, 4), np.nan)
    V = np.full_like(K, np.nan)
    out = np.full((1, 5, 16), np.nan)
    scratch = np.full(cb.scratch_len_cached(fields, 5, 0), np.nan)
    cb.call_block_forward_cached_raw(out, H, 1, 5, 0, 5, K, V, fields, w, scratch)
    assert np.array_equal(K[0].transpose(1, 0, 2).reshape(5, 8), tr.K[0])
    assert np.array_equal(V[0].transpose(1, 0, 2).reshape(5, 8), tr.V[0])
    with pytest.raises(cb.CRefError, match="TB_ERR_CACHE_SIZE"):
        cb.call_block_forward_cached_raw(out, H, 1, 5, 0, 5, K, V, fields, w, scratch,
                                         lens={"K_cache": K.size - 1})


# ---------------------------------------------------------------------------------------
# the new fields' C argument checks: each bad value its status, nothing written

SENTINEL = 777.25


def good_variant_call():
    cfg = make_cfg(d_model=8, n_heads=4, n_kv_heads=2, d_ff=6, norm_type="rmsnorm", ffn="gated",
                   activation="silu", positions="rotary", attn_bias="qkv", ffn_bias=True, ln_affine=True)
    weights = cb._float64_weights(variant_weights(cfg, np.random.default_rng(9)))
    fields = cb.config_fields(cfg)
    trace = {name: np.full(shape, SENTINEL) for name, shape in cb.trace_shapes(2, 3, cfg).items()}
    return dict(out=np.full((2, 3, 8), SENTINEL), H=np.random.default_rng(10).standard_normal((2, 3, 8)),
                B=2, T=3, cfg=fields, weights=weights, scratch=np.full(cb.scratch_len(fields, 3), SENTINEL),
                trace=trace)


def _set(group, name, value):
    def apply(args):
        args[group][name] = value
    return apply


BAD_VARIANT_CALLS = [
    ("norm_type = 2", _set("cfg", "norm_type", 2), "TB_ERR_NORM_TYPE"),
    ("ffn = -1", _set("cfg", "ffn", -1), "TB_ERR_FFN"),
    ("positions = 2", _set("cfg", "positions", 2), "TB_ERR_POSITIONS"),
    ("rope_theta = 0", _set("cfg", "rope_theta", 0.0), "TB_ERR_ROPE"),
    ("rope_theta NaN", _set("cfg", "rope_theta", float("nan")), "TB_ERR_ROPE"),
    ("rope_scale = -1", _set("cfg", "rope_scale", -1.0), "TB_ERR_ROPE"),
    ("rope_scale inf", _set("cfg", "rope_scale", float("inf")), "TB_ERR_ROPE"),
    ("odd d_k with rotary", lambda a: a["cfg"].update(d_model=12, n_heads=4), "TB_ERR_ROPE"),
    ("n_kv_heads = 3", _set("cfg", "n_kv_heads", 3), "TB_ERR_KV_HEADS"),
    ("n_kv_heads = -1", _set("cfg", "n_kv_heads", -1), "TB_ERR_KV_HEADS"),
    ("activation = 4", _set("cfg", "activation", 4), "TB_ERR_ACTIVATION"),
    ("has_attn_bias = 3", _set("cfg", "has_attn_bias", 3), "TB_ERR_FLAG"),
    ("NULL w_gate", _set("weights", "w_gate", None), "TB_ERR_NULL_WEIGHT"),
    ("NULL b_gate", _set("weights", "b_gate", None), "TB_ERR_NULL_WEIGHT"),
    ("w_gate short", lambda a: a.setdefault("lens", {}).update(w_gate=47), "TB_ERR_WEIGHT_SIZE"),
    ("b_k short", lambda a: a.setdefault("lens", {}).update(b_k=3), "TB_ERR_WEIGHT_SIZE"),
    ("w_k short of (d, d_kv)", lambda a: a.setdefault("lens", {}).update(w_k=31), "TB_ERR_WEIGHT_SIZE"),
    ("b_o with Q/K/V-only biases", _set("weights", "b_o", np.ones(8)), "TB_ERR_UNEXPECTED_WEIGHT"),
    ("a beta with RMSNorm", _set("weights", "ln1_beta", np.ones(8)), "TB_ERR_UNEXPECTED_WEIGHT"),
    ("w_gate with the MLP", _set("cfg", "ffn", 0), "TB_ERR_UNEXPECTED_WEIGHT"),
    ("NULL trace F_gate", _set("trace", "F_gate", None), "TB_ERR_NULL_TRACE"),
    ("trace K short of (B, T, d_kv)", lambda a: a.setdefault("lens", {}).update(K=23), "TB_ERR_TRACE_SIZE"),
    ("trace F_gate inside the scratch", lambda a: a["trace"].update(F_gate=a["scratch"][:36].reshape(2, 3, 6)),
     "TB_ERR_OVERLAP"),
]


def test_good_variant_call_succeeds():
    args = good_variant_call()
    cb.call_block_forward_raw(**args)
    assert np.all(np.isfinite(args["out"])) and np.all(np.isfinite(args["trace"]["F_gate"]))
    assert np.array_equal(args["out"], args["trace"]["H_out"])


@pytest.mark.parametrize("change, want", [(c, w) for _, c, w in BAD_VARIANT_CALLS],
                         ids=[d for d, _, _ in BAD_VARIANT_CALLS])
def test_bad_variant_argument_is_refused_and_writes_nothing(change, want):
    args = good_variant_call()
    change(args)
    outputs = [args["out"], args["scratch"], *(a for a in args["trace"].values() if a is not None)]
    saved = [a.copy() for a in outputs]
    with pytest.raises(cb.CRefError) as e:
        cb.call_block_forward_raw(**args)
    assert e.value.name == want, str(e.value)
    for before, after in zip(saved, outputs):
        assert np.array_equal(before, after, equal_nan=True)


def test_entry_points_refuse_the_other_ffn_and_positions():
    gated = cb.config_fields(make_cfg(d_model=4, n_heads=1, d_ff=3, ffn="gated"))
    mlp = cb.config_fields(make_cfg(d_model=4, n_heads=1, d_ff=3))
    w = dict(w_ff1=np.ones((4, 3)), w_ff2=np.ones((3, 4)))
    F = [np.full(s, SENTINEL) for s in ((2, 4), (2, 3), (2, 3), (2, 3))]
    X = np.ones((2, 4))
    with pytest.raises(cb.CRefError, match="TB_ERR_FFN"):
        cb.ffn_raw(F[0], F[1], F[3], X, 2, gated, dict(w, w_gate=np.ones((4, 3))))
    with pytest.raises(cb.CRefError, match="TB_ERR_FFN"):
        cb.gated_ffn_raw(*F, X, 2, mlp, w)
    with pytest.raises(cb.CRefError, match="TB_ERR_POSITIONS"):
        cb.rotary_rows_raw(F[0], X, 2, 4, 0, mlp)
    rot = cb.config_fields(make_cfg(d_model=4, n_heads=2, positions="rotary"))
    with pytest.raises(cb.CRefError, match="TB_ERR_HEADS"):
        cb.rotary_rows_raw(np.empty((2, 3)), np.ones((2, 3)), 2, 3, 0, rot)       # 3 columns: not heads of 2
    with pytest.raises(cb.CRefError, match="TB_ERR_CACHE_RANGE"):
        cb.rotary_rows_raw(F[0], X, 2, 4, -1, rot)
    assert all(np.all(a == SENTINEL) for a in F)


def test_python_side_refuses_an_unknown_option_by_name():
    """A config value the binding does not map is a ValueError naming the option, never a
    silent default (BlockConfig itself refuses these; the binding must too, for configs
    built around its checks)."""
    cfg = make_cfg(d_model=4, n_heads=2)
    object.__setattr__(cfg, "positions", "alibi")
    with pytest.raises(ValueError, match="positions='alibi'"):
        cb.config_fields(cfg)


def test_components_follow_the_variants():
    """The timed components: the block's norm (RMSNorm), the gated FFN and the core on grouped
    K/V heads, against the oracle's components."""
    cfg = make_cfg(d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, norm_type="rmsnorm", ffn="gated",
                   activation="silu", positions="rotary", ln_affine=True, ffn_bias=True, attn_bias="qkv")
    rng = np.random.default_rng(11)
    w = variant_weights(cfg, rng)
    ours, theirs = cb.components(cfg, w, np.float64), oracle.components(cfg, w, np.float64)
    X, Q, K, V = (rng.standard_normal(s) for s in ((5, 16), (5, 16), (5, 8), (5, 8)))
    for name in ("layernorm", "ffn"):
        assert rel_err(ours.fns[name](X), theirs.fns[name](X)) < TOL, name
    assert rel_err(ours.fns["attention_core"](Q, K, V), theirs.fns["attention_core"](Q, K, V)) < TOL
