"""The C reference (backend "c", c_ref/ through cffi) against the NumPy oracle, and its
argument checks reached from Python.

Accuracy is measured per array as max|C - oracle| / max|oracle| (the absolute error where
the oracle array is all zeros) and must stay below 1e-12.

These tests do not skip when the extension is missing: the C reference is part of the
package, so a missing build is a failure (with the BackendUnavailable message saying how
to build it).
"""

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tblock
from tblock.backends import c as cb
from tblock.backends import numpy as oracle
from tblock.api import TRACE_NAMES

from conftest import nonzero, random_weights, rel_err

TOL = 1e-12


def compare_to_oracle(H, weights, cfg):
    """Max relative error of every trace array (and the output) of C against the oracle."""
    got_out, got = tblock.forward(H, weights, cfg, backend="c", trace=True)
    want_out, want = tblock.forward(H, weights, cfg, backend="numpy", trace=True)
    errs = {name: rel_err(getattr(got, name), getattr(want, name)) for name in TRACE_NAMES}
    errs["output"] = rel_err(got_out, want_out)
    assert np.array_equal(got_out, got.H_out)
    return errs


def test_extension_is_built():
    assert "c" in tblock.available_backends(), "the C reference was not built: run `pip install -e .`"
    cb.ensure_available()


# ---------------------------------------------------------------------------------------
# C against the oracle over drawn configurations

@st.composite
def block_cases(draw):
    # about one case in six may be large (T up to 300, d_model up to 256); the rest stay small
    large = draw(st.integers(0, 5)) == 5
    n_heads = draw(st.integers(1, 256 if large else 4))
    d_k = draw(st.integers(1, max(1, 256 // n_heads) if large else 8))
    return dict(
        B=draw(st.integers(1, 3)),
        T=draw(st.integers(1, 300 if large else 12)),
        d_model=n_heads * d_k,
        n_heads=n_heads,
        d_ff=draw(st.integers(1, 1024 if large else 32)),
        norm=draw(st.sampled_from(["pre", "post"])),
        activation=draw(st.sampled_from(["gelu_tanh", "gelu_erf", "relu"])),
        causal=draw(st.booleans()),
        ffn_bias=draw(st.booleans()),
        ln_affine=draw(st.booleans()),
        attn_bias=draw(st.booleans()),
        scale=draw(st.sampled_from([1.0, 1e-3])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def _case(**kw):
    base = dict(B=1, T=1, d_model=1, n_heads=1, d_ff=1, norm="pre", activation="gelu_tanh", causal=True,
                ffn_bias=False, ln_affine=False, attn_bias=False, scale=1.0, seed=0)
    base.update(kw)
    return base


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=block_cases())
@example(case=_case())                                                # everything 1
@example(case=_case(B=3, T=2, d_model=1, n_heads=1, norm="post", ffn_bias=True, ln_affine=True,
                    attn_bias=True))
@example(case=_case(B=1, T=300, d_model=256, n_heads=256, d_ff=64, causal=False,
                    activation="relu", ffn_bias=True, ln_affine=True))  # d_k = 1, T and d at their max
@example(case=_case(B=3, T=64, d_model=256, n_heads=1, d_ff=300, norm="post",
                    activation="gelu_erf", ffn_bias=True, ln_affine=True))  # one head of d_k = 256
def test_c_matches_oracle(case):
    cfg = tblock.BlockConfig(d_model=case["d_model"], n_heads=case["n_heads"], d_ff=case["d_ff"],
                             causal=case["causal"], norm=case["norm"], activation=case["activation"],
                             ffn_bias=case["ffn_bias"], ln_affine=case["ln_affine"],
                             attn_bias=case["attn_bias"])
    rng = np.random.default_rng(case["seed"])
    weights = random_weights(cfg, rng)
    H = rng.standard_normal((case["B"], case["T"], case["d_model"])) * case["scale"]
    errs = compare_to_oracle(H, weights, cfg)
    worst = max(errs, key=errs.get)
    assert errs[worst] < TOL, f"{worst}: relative error {errs[worst]:.3g} ({errs})"


# ---------------------------------------------------------------------------------------
# the lesson's worked example

EX = tblock.load_worked_example()
EXAMPLE_NAMES = ["H_norm1", "Q", "K", "V", "A_1", "A_2", "out_concat", "A_out", "H_mid",
                 "H_norm2", "F_pre", "F_post", "F_out", "H_out"]


@pytest.fixture(scope="module")
def worked_trace():
    return tblock.forward(EX.H_in, EX.weights, EX.cfg, backend="c", trace=True)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_worked_example_every_intermediate(worked_trace, name):
    H_out, tr = worked_trace
    got = tr.A[int(name[-1]) - 1] if name.startswith("A_") and name != "A_out" else getattr(tr, name)
    assert rel_err(got, EX.expected[name]) < TOL
    assert rel_err(H_out, EX.expected["H_out"]) < TOL


# ---------------------------------------------------------------------------------------
# the backend contract: dtypes, strides, shapes, no side effects

@pytest.fixture(scope="module")
def small():
    cfg = tblock.BlockConfig(d_model=12, n_heads=3, d_ff=20, ffn_bias=True, ln_affine=True)
    rng = np.random.default_rng(5)
    return cfg, random_weights(cfg, rng), rng.standard_normal((2, 7, 12))


def test_float32_in_float32_out(small):
    cfg, weights, H = small
    H32 = H.astype(np.float32)
    out, tr = tblock.forward(H32, weights, cfg, backend="c", trace=True)
    assert out.dtype == np.float32 and tr.A.dtype == np.float32
    want = tblock.forward(H32, weights, cfg, backend="numpy")
    assert rel_err(out, want) < 1e-6


def test_float32_weights(small):
    cfg, weights, H = small
    w32 = tblock.BlockWeights(**{k: v.astype(np.float32) for k, v in weights.arrays().items()})
    got = tblock.forward(H, w32, cfg, backend="c")
    want = tblock.forward(H, w32, cfg, backend="numpy")
    assert got.dtype == np.float64 and rel_err(got, want) < TOL


def test_non_contiguous_input(small):
    cfg, weights, H = small
    wide = np.zeros((2, 14, 24))
    wide[:, ::2, ::2] = H
    strided = wide[:, ::2, ::2]
    fortran = np.asfortranarray(H)
    assert not strided.flags.c_contiguous and not fortran.flags.c_contiguous
    want = tblock.forward(np.ascontiguousarray(H), weights, cfg, backend="c")
    assert np.array_equal(tblock.forward(strided, weights, cfg, backend="c"), want)
    assert np.array_equal(tblock.forward(fortran, weights, cfg, backend="c"), want)
    assert rel_err(want, tblock.forward(H, weights, cfg, backend="numpy")) < TOL


def test_inputs_not_modified(small):
    cfg, weights, H = small
    H_before = H.copy()
    w_before = {k: v.copy() for k, v in weights.arrays().items()}
    tblock.forward(H, weights, cfg, backend="c", trace=True)
    assert np.array_equal(H, H_before)
    for k, v in weights.arrays().items():
        assert np.array_equal(v, w_before[k])


def test_2d_input_and_trace_shapes(small):
    cfg, weights, H = small
    out2, tr2 = tblock.forward(H[1], weights, cfg, backend="c", trace=True)
    out3, tr3 = tblock.forward(H, weights, cfg, backend="c", trace=True)
    assert out2.shape == (7, 12) and np.array_equal(out2, out3[1])
    assert tr2.A.shape == (3, 7, 7) and tr3.A.shape == (2, 3, 7, 7)
    assert tr2.F_pre.shape == (7, 20) and tr3.F_post.shape == (2, 7, 20)
    for name in TRACE_NAMES:
        assert np.array_equal(getattr(tr2, name), getattr(tr3, name)[1])


def test_batch_is_sequences_one_by_one(small):
    cfg, weights, H = small
    out = tblock.forward(H, weights, cfg, backend="c")
    for b in range(H.shape[0]):
        assert np.array_equal(out[b], tblock.forward(H[b], weights, cfg, backend="c"))


def test_post_ln_trace_follows_the_oracle():
    cfg = tblock.BlockConfig(d_model=8, n_heads=2, norm="post", causal=False, ln_affine=True)
    rng = np.random.default_rng(9)
    weights = random_weights(cfg, rng)
    _, tr = tblock.forward(rng.standard_normal((5, 8)), weights, cfg, backend="c", trace=True)
    assert np.array_equal(tr.H_norm1, tr.H_mid) and np.array_equal(tr.H_norm2, tr.H_out)


def test_causal_mask_exact_zeros(small):
    cfg, weights, H = small
    _, tr = tblock.forward(H, weights, cfg, backend="c", trace=True)
    upper = np.triu(np.ones((7, 7), dtype=bool), k=1)
    assert np.all(tr.A[..., upper] == 0.0)
    assert np.all(tr.A[..., ~upper] > 0.0)


def test_block_and_stack_with_backend_c():
    cfg = tblock.BlockConfig(d_model=8, n_heads=2)
    stack = tblock.Stack.init(cfg, n_layers=3, seed=1, dtype=np.float64, backend="c")
    H = np.random.default_rng(2).standard_normal((4, 8))
    assert rel_err(stack(H), stack(H, backend="numpy")) < TOL


def test_backend_unavailable_without_the_extension(monkeypatch):
    # a None entry in sys.modules makes `import tblock._cref` fail, as if it was never built
    monkeypatch.setitem(sys.modules, cb.EXTENSION, None)
    if isinstance(getattr(tblock.api, "_LOADED", None), dict):   # api's cache of loaded backends
        monkeypatch.setattr(tblock.api, "_LOADED", {})
    with pytest.raises(tblock.BackendUnavailable, match="not built"):
        cb.ensure_available()
    with pytest.raises(tblock.BackendUnavailable, match=r"pip install -e \.") as e:
        tblock.forward(np.zeros((2, 8)), tblock.init_weights(tblock.BlockConfig(8, 2), 0),
                       tblock.BlockConfig(8, 2), backend="c")
    assert isinstance(e.value, ValueError) and "not built" in str(e.value)
    assert "c" not in tblock.available_backends()
    with pytest.raises(tblock.BackendUnavailable):
        tblock.Block(tblock.BlockConfig(8, 2), tblock.init_weights(tblock.BlockConfig(8, 2), 0), backend="c")


# ---------------------------------------------------------------------------------------
# the flat helpers against the oracle's pieces

def test_layernorm_rows_helper(rng):
    X = rng.standard_normal((5, 7)) * 3 + 1
    gamma, beta = nonzero(rng, 7), nonzero(rng, 7)
    out = np.empty((5, 7))
    cb.layernorm_rows_raw(out, X, 5, 7, eps=1e-5)
    assert rel_err(out, oracle.layernorm(X, eps=1e-5)) < TOL
    cb.layernorm_rows_raw(out, X, 5, 7, gamma, beta, eps=0.3)
    assert rel_err(out, oracle.layernorm(X, gamma, beta, eps=0.3)) < TOL


@pytest.mark.parametrize("causal", [0, 1])
def test_masked_softmax_rows_helper(rng, causal):
    S = rng.standard_normal((6, 6)) * 5
    out = np.empty((6, 6))
    cb.masked_softmax_rows_raw(out, S, 6, 6, causal)
    allowed = oracle.causal_mask(6) if causal else np.ones((6, 6), dtype=bool)
    assert rel_err(out, oracle.softmax_rows(np.where(allowed, S, -np.inf))) < TOL
    assert np.all(out[~allowed] == 0.0)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_head_helper(rng, causal):
    cfg = tblock.BlockConfig(d_model=12, n_heads=3, causal=causal)
    T, d_k = 5, 4
    Q, K, V = (rng.standard_normal((T, 12)) for _ in range(3))
    out = np.full((T, 12), 7.0)
    A, S = np.empty((T, T)), np.empty((T, T))
    cb.attention_head_raw(out, A, S, Q, K, V, T, 1, cb.config_fields(cfg))
    cols = slice(d_k, 2 * d_k)
    want_S = Q[:, cols] @ K[:, cols].T / np.sqrt(d_k)
    allowed = oracle.causal_mask(T) if causal else np.ones((T, T), dtype=bool)
    want_A = oracle.softmax_rows(np.where(allowed, want_S, -np.inf))
    assert rel_err(S, want_S) < TOL and rel_err(A, want_A) < TOL
    assert rel_err(out[:, cols], want_A @ V[:, cols]) < TOL
    assert np.all(out[:, :d_k] == 7.0) and np.all(out[:, 2 * d_k:] == 7.0)   # other heads' columns


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu_erf", "relu"])
def test_ffn_helper(rng, activation):
    cfg = tblock.BlockConfig(d_model=6, n_heads=2, d_ff=9, activation=activation, ffn_bias=True)
    w = random_weights(cfg, rng)
    X = rng.standard_normal((4, 6)) * 4
    F_out, F_pre, F_post = np.empty((4, 6)), np.empty((4, 9)), np.empty((4, 9))
    cb.ffn_raw(F_out, F_pre, F_post, X, 4, cb.config_fields(cfg), cb._float64_weights(w))
    want = {}
    oracle.ffn(X, w.arrays(), cfg, want)
    assert rel_err(F_pre, want["F_pre"]) < TOL
    assert rel_err(F_post, want["F_post"]) < TOL
    assert rel_err(F_out, want["F_out"]) < TOL


def test_activations_at_extreme_inputs():
    x = np.array([-1e200, -40.0, -1.0, -1e-300, 0.0, 1e-300, 1.0, 40.0, 1e200])
    for activation in ("gelu_tanh", "gelu_erf", "relu"):
        cfg = tblock.BlockConfig(d_model=1, n_heads=1, d_ff=1, activation=activation)
        w = {"w_ff1": np.ones((1, 1)), "w_ff2": np.ones((1, 1))}
        F_out, F_pre, F_post = np.empty((9, 1)), np.empty((9, 1)), np.empty((9, 1))
        cb.ffn_raw(F_out, F_pre, F_post, x[:, None].copy(), 9, cb.config_fields(cfg), w)
        with np.errstate(over="ignore"):
            want = oracle.ACTIVATION[activation](x)
        assert np.all(np.isfinite(F_post)), activation
        assert rel_err(F_post[:, 0], want) < TOL, activation


# ---------------------------------------------------------------------------------------
# the error path: every bad argument is a ValueError from C, and nothing is written

SENTINEL = 777.25
B, T = 2, 3


def good_call():
    """Arguments of a valid tb_block_forward call, outputs filled with SENTINEL."""
    cfg = tblock.BlockConfig(d_model=4, n_heads=2, d_ff=6, ffn_bias=True, ln_affine=True, attn_bias=True)
    weights = cb._float64_weights(random_weights(cfg, np.random.default_rng(3)))
    fields = cb.config_fields(cfg)
    trace = {name: np.full(shape, SENTINEL) for name, shape in cb.trace_shapes(B, T, cfg).items()}
    return dict(out=np.full((B, T, 4), SENTINEL), H=np.random.default_rng(4).standard_normal((B, T, 4)),
                B=B, T=T, cfg=fields, weights=weights,
                scratch=np.full(cb.scratch_len(fields, T), SENTINEL), trace=trace)


def _set(path, value):
    """A change to the good call: path "cfg.eps", "weights.w_q", "trace.Q", or a top-level name."""
    def apply(args):
        if "." in path:
            group, name = path.split(".")
            args[group][name] = value
        else:
            args[path] = value
    return apply


def _short(name):
    return lambda args: args.setdefault("lens", {}).update({name: _size(args, name) - 1})


def _size(args, name):
    for group in ("weights", "trace"):
        if name in args[group]:
            return args[group][name].size
    return args[name].size


BAD_CALLS = [
    ("NULL out", _set("out", None), "TB_ERR_NULL_ARG"),
    ("NULL input", _set("H", None), "TB_ERR_NULL_ARG"),
    ("NULL config", _set("cfg", None), "TB_ERR_NULL_ARG"),
    ("NULL weights", _set("weights", None), "TB_ERR_NULL_ARG"),
    ("NULL scratch struct", _set("scratch_struct", False), "TB_ERR_NULL_ARG"),
    ("NULL scratch data", _set("scratch", None), "TB_ERR_NULL_ARG"),
    *[(f"NULL {n}", _set(f"weights.{n}", None), "TB_ERR_NULL_WEIGHT") for n in cb.WEIGHT_NAMES],
    ("biases without has_ffn_bias", _set("cfg.has_ffn_bias", 0), "TB_ERR_UNEXPECTED_WEIGHT"),
    ("gamma/beta without has_ln_affine", _set("cfg.has_ln_affine", 0), "TB_ERR_UNEXPECTED_WEIGHT"),
    ("attention biases without has_attn_bias", _set("cfg.has_attn_bias", 0), "TB_ERR_UNEXPECTED_WEIGHT"),
    *[(f"NULL trace {n}", _set(f"trace.{n}", None), "TB_ERR_NULL_TRACE") for n in TRACE_NAMES],
    ("B = 0", _set("B", 0), "TB_ERR_DIM"),
    ("T = 0", _set("T", 0), "TB_ERR_DIM"),
    ("T = -1", _set("T", -1), "TB_ERR_DIM"),
    ("d_model = 0", _set("cfg.d_model", 0), "TB_ERR_DIM"),
    ("n_heads = 0", _set("cfg.n_heads", 0), "TB_ERR_DIM"),
    ("n_heads = -2", _set("cfg.n_heads", -2), "TB_ERR_DIM"),
    ("d_ff = 0", _set("cfg.d_ff", 0), "TB_ERR_DIM"),
    ("n_heads does not divide d_model", _set("cfg.n_heads", 3), "TB_ERR_HEADS"),
    ("norm = 2", _set("cfg.norm", 2), "TB_ERR_NORM"),
    ("norm = -1", _set("cfg.norm", -1), "TB_ERR_NORM"),
    ("activation = 4", _set("cfg.activation", 4), "TB_ERR_ACTIVATION"),
    ("causal = 2", _set("cfg.causal", 2), "TB_ERR_FLAG"),
    ("has_ffn_bias = 2", _set("cfg.has_ffn_bias", 2), "TB_ERR_FLAG"),
    ("has_ln_affine = -1", _set("cfg.has_ln_affine", -1), "TB_ERR_FLAG"),
    ("has_attn_bias = 3", _set("cfg.has_attn_bias", 3), "TB_ERR_FLAG"),
    ("eps = 0", _set("cfg.eps", 0.0), "TB_ERR_EPS"),
    ("eps < 0", _set("cfg.eps", -1e-5), "TB_ERR_EPS"),
    ("eps NaN", _set("cfg.eps", float("nan")), "TB_ERR_EPS"),
    ("eps inf", _set("cfg.eps", float("inf")), "TB_ERR_EPS"),
    ("T * T overflows", _set("T", 2**62), "TB_ERR_OVERFLOW"),
    ("B * T * d overflows", _set("B", 2**62), "TB_ERR_OVERFLOW"),
    ("d_ff too large", _set("cfg.d_ff", 2**63 - 1), "TB_ERR_OVERFLOW"),
    ("input too short", _short("H"), "TB_ERR_INPUT_SIZE"),
    ("output too short", _short("out"), "TB_ERR_OUTPUT_SIZE"),
    ("scratch too short", _short("scratch"), "TB_ERR_SCRATCH_SIZE"),
    *[(f"{n} too short", _short(n), "TB_ERR_WEIGHT_SIZE") for n in cb.WEIGHT_NAMES],
    *[(f"trace {n} too short", _short(n), "TB_ERR_TRACE_SIZE") for n in TRACE_NAMES],
]


def _overlap_out_is_input(args):
    args["H"] = args["out"]


def _overlap_trace_is_out(args):
    args["trace"]["Q"] = args["out"]


def _overlap_weight_in_scratch(args):
    args["weights"]["w_q"] = args["scratch"][:16]


BAD_CALLS += [
    ("output is the input", _overlap_out_is_input, "TB_ERR_OVERLAP"),
    ("trace Q is the output", _overlap_trace_is_out, "TB_ERR_OVERLAP"),
    ("w_q inside the scratch", _overlap_weight_in_scratch, "TB_ERR_OVERLAP"),
]


def test_good_call_succeeds():
    args = good_call()
    cb.call_block_forward_raw(**args)
    assert np.all(np.isfinite(args["out"]))
    assert np.array_equal(args["out"], args["trace"]["H_out"])


@pytest.mark.parametrize("change, want", [(c, w) for _, c, w in BAD_CALLS], ids=[d for d, _, _ in BAD_CALLS])
def test_bad_argument_is_a_value_error_and_writes_nothing(change, want):
    args = good_call()
    change(args)
    outputs = [a for a in [args["out"], args["scratch"], *args["trace"].values()] if a is not None]
    saved = [a.copy() for a in outputs]
    sentinel_out = args["out"] is not None and np.all(args["out"] == SENTINEL)
    with pytest.raises(ValueError) as e:
        cb.call_block_forward_raw(**args)
    assert isinstance(e.value, cb.CRefError)
    assert e.value.name == want, str(e.value)
    assert want in str(e.value) and "tb_block_forward" in str(e.value)
    for before, after in zip(saved, outputs):
        assert np.array_equal(before, after, equal_nan=True)
    if sentinel_out:
        assert np.all(args["out"] == SENTINEL)


def test_every_status_has_a_message():
    codes = cb.status_codes()
    assert codes["TB_OK"] == 0 and len(codes) == len(set(codes.values())) >= 19
    for name, code in codes.items():
        if code:
            e = cb.CRefError("f", code, name, "m")
            assert isinstance(e, ValueError) and name in str(e)


def test_helper_errors_are_value_errors():
    X, out = np.ones((2, 3)), np.full((2, 3), SENTINEL)
    cases = [
        (lambda: cb.layernorm_rows_raw(out, X, 2, 3, eps=0.0), "TB_ERR_EPS"),
        (lambda: cb.layernorm_rows_raw(out, X, 2, 3, gamma=np.ones(3)), "TB_ERR_NULL_WEIGHT"),
        (lambda: cb.layernorm_rows_raw(out, X, 2, 3, np.ones(3), np.ones(3), lens={"affine": 2}),
         "TB_ERR_WEIGHT_SIZE"),
        (lambda: cb.layernorm_rows_raw(out, X, 3, 3), "TB_ERR_INPUT_SIZE"),
        (lambda: cb.layernorm_rows_raw(out, out, 2, 3), "TB_ERR_OVERLAP"),
        (lambda: cb.masked_softmax_rows_raw(out, X, 2, 3, 2), "TB_ERR_FLAG"),
        (lambda: cb.masked_softmax_rows_raw(out, X, 2, 0, 1), "TB_ERR_DIM"),
        (lambda: cb.masked_softmax_rows_raw(None, X, 2, 3, 1), "TB_ERR_NULL_ARG"),
        (lambda: cb.masked_softmax_rows_raw(out, X, 2, 3, 1, lens={"out": 5}), "TB_ERR_OUTPUT_SIZE"),
        (lambda: cb.scratch_len(None, 3), "TB_ERR_NULL_ARG"),
        (lambda: cb.scratch_len(dict(cb.config_fields(tblock.BlockConfig(4, 2)), n_heads=3), 3),
         "TB_ERR_HEADS"),
        (lambda: cb.scratch_len(cb.config_fields(tblock.BlockConfig(4, 2)), 0), "TB_ERR_DIM"),
    ]
    for call, want in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert getattr(e.value, "name", None) == want, str(e.value)
        assert np.all(out == SENTINEL)


def test_attention_head_and_ffn_errors_write_nothing():
    cfg = cb.config_fields(tblock.BlockConfig(d_model=4, n_heads=2, d_ff=3))
    Q = np.ones((3, 4))
    out, A, S = np.full((3, 4), SENTINEL), np.full((3, 3), SENTINEL), np.full((3, 3), SENTINEL)
    for head, lens, want in [(2, None, "TB_ERR_HEAD_INDEX"), (-1, None, "TB_ERR_HEAD_INDEX"),
                             (0, {"S": 8}, "TB_ERR_SCRATCH_SIZE"), (0, {"K": 11}, "TB_ERR_INPUT_SIZE")]:
        with pytest.raises(cb.CRefError) as e:
            cb.attention_head_raw(out, A, S, Q, Q, Q, 3, head, cfg, lens=lens)
        assert e.value.name == want
    F_out, F_pre, F_post = np.full((3, 4), SENTINEL), np.full((3, 3), SENTINEL), np.full((3, 3), SENTINEL)
    w = {"w_ff1": np.ones((4, 3)), "w_ff2": np.ones((3, 4)), "b_ff1": np.ones(3)}
    with pytest.raises(cb.CRefError) as e:
        cb.ffn_raw(F_out, F_pre, F_post, Q, 3, cfg, w)
    assert e.value.name == "TB_ERR_UNEXPECTED_WEIGHT"
    with pytest.raises(cb.CRefError) as e:
        cb.ffn_raw(F_out, F_pre, F_post, Q, 3, dict(cfg, activation=9), w)
    assert e.value.name == "TB_ERR_ACTIVATION"
    for a in (out, A, S, F_out, F_pre, F_post):
        assert np.all(a == SENTINEL)


def test_raw_lengths_can_only_shrink():
    args = good_call()
    args["lens"] = {"out": args["out"].size + 1}
    with pytest.raises(ValueError, match="must be between"):
        cb.call_block_forward_raw(**args)
    assert np.all(args["out"] == SENTINEL)


# ---------------------------------------------------------------------------------------
# the KV-cache entry point's error path: a status from C, and nothing written

CACHED = dict(B=2, T_new=2, past=1, max_T=4)


def good_cached_call():
    """Arguments of a valid tb_block_forward_cached call: outputs, caches and scratch SENTINEL."""
    cfg = tblock.BlockConfig(d_model=4, n_heads=2, d_ff=6, ffn_bias=True, ln_affine=True, attn_bias=True)
    fields = cb.config_fields(cfg)
    B, T_new, past, max_T = CACHED.values()
    cache_shape = (B, cfg.n_heads, max_T, cfg.d_k)
    return dict(out=np.full((B, T_new, 4), SENTINEL), H=np.random.default_rng(5).standard_normal((B, T_new, 4)),
                **CACHED, K_cache=np.full(cache_shape, SENTINEL), V_cache=np.full(cache_shape, SENTINEL),
                cfg=fields, weights=cb._float64_weights(random_weights(cfg, np.random.default_rng(6))),
                scratch=np.full(cb.scratch_len_cached(fields, T_new, past), SENTINEL))


def _overlap(target, source, stop=None):
    def apply(args):
        args[target] = args[source].reshape(-1)[:stop] if stop else args[source]
    return apply


def _shorter(name):
    """The length sent with array `name` one double short."""
    return lambda args: args.setdefault("lens", {}).update({name: args[name].size - 1})


CACHED_BAD = [
    ("NULL K_cache", _set("K_cache", None), "TB_ERR_NULL_ARG"),
    ("NULL V_cache", _set("V_cache", None), "TB_ERR_NULL_ARG"),
    ("NULL scratch struct", _set("scratch_struct", False), "TB_ERR_NULL_ARG"),
    ("NULL b_k", _set("weights.b_k", None), "TB_ERR_NULL_WEIGHT"),
    ("not causal", _set("cfg.causal", 0), "TB_ERR_NOT_CAUSAL"),
    ("causal = 2", _set("cfg.causal", 2), "TB_ERR_FLAG"),
    ("max_T = 0", _set("max_T", 0), "TB_ERR_DIM"),
    ("T_new = 0", _set("T_new", 0), "TB_ERR_DIM"),
    ("past = -1", _set("past", -1), "TB_ERR_CACHE_RANGE"),
    ("past + T_new = max_T + 1", _set("past", 3), "TB_ERR_CACHE_RANGE"),
    ("max_T overflows", _set("max_T", 2**62), "TB_ERR_OVERFLOW"),
    ("K_cache too short", _shorter("K_cache"), "TB_ERR_CACHE_SIZE"),
    ("V_cache too short", _shorter("V_cache"), "TB_ERR_CACHE_SIZE"),
    ("caches for a larger max_T", _set("max_T", 5), "TB_ERR_CACHE_SIZE"),
    ("input too short", _shorter("H"), "TB_ERR_INPUT_SIZE"),
    ("scratch too short", _shorter("scratch"), "TB_ERR_SCRATCH_SIZE"),
    ("V_cache is K_cache", _overlap("V_cache", "K_cache"), "TB_ERR_OVERLAP"),
    ("output inside K_cache", _overlap("out", "K_cache", 16), "TB_ERR_OVERLAP"),
    ("input inside V_cache", _overlap("H", "V_cache", 16), "TB_ERR_OVERLAP"),
    ("b_o inside V_cache", lambda args: args["weights"].update(b_o=args["V_cache"].reshape(-1)[-4:]),
     "TB_ERR_OVERLAP"),
]


def test_good_cached_call_writes_only_the_new_rows():
    args = good_cached_call()
    cb.call_block_forward_cached_raw(**args)
    assert np.all(np.isfinite(args["out"]))
    past, new = args["past"], slice(args["past"], args["past"] + args["T_new"])
    for cache in (args["K_cache"], args["V_cache"]):
        assert np.all(np.isfinite(cache[:, :, new]))
        assert np.all(cache[:, :, :past] == SENTINEL) and np.all(cache[:, :, new.stop:] == SENTINEL)


@pytest.mark.parametrize("change, want", [(c, w) for _, c, w in CACHED_BAD], ids=[d for d, _, _ in CACHED_BAD])
def test_bad_cached_argument_is_a_value_error_and_writes_nothing(change, want):
    args = good_cached_call()
    outputs = [args["out"], args["K_cache"], args["V_cache"], args["scratch"]]
    change(args)
    saved = [a.copy() for a in outputs]
    with pytest.raises(cb.CRefError) as e:
        cb.call_block_forward_cached_raw(**args)
    assert e.value.name == want and "tb_block_forward_cached" in str(e.value), str(e.value)
    for before, after in zip(saved, outputs):
        assert np.array_equal(before, after)
    assert all(np.all(a == SENTINEL) for a in outputs)


def test_scratch_len_cached_errors():
    fields = cb.config_fields(tblock.BlockConfig(d_model=4, n_heads=2))
    assert cb.scratch_len_cached(fields, 3, 0) == cb.scratch_len(fields, 3)
    assert cb.scratch_len_cached(fields, 1, 5) > cb.scratch_len_cached(fields, 1, 4)    # S and A grow with the keys
    for cfg, T_new, past, want in [(fields, 1, -1, "TB_ERR_CACHE_RANGE"), (fields, 0, 0, "TB_ERR_DIM"),
                                   (dict(fields, causal=0), 1, 0, "TB_ERR_NOT_CAUSAL"),
                                   (None, 1, 0, "TB_ERR_NULL_ARG")]:
        with pytest.raises(cb.CRefError) as e:
            cb.scratch_len_cached(cfg, T_new, past)
        assert e.value.name == want
