"""tblock.backends.components: every backend's separately timed pieces compute what the oracle does,
so the report times the right work; and a component a backend lacks is n/a, not an error."""

import numpy as np
import pytest

import tblock
from tblock.backends import components as C
from tblock.backends import numpy as oracle

BACKENDS = C.available_backends()
CONFIGS = [
    dict(d_model=16, n_heads=2),
    dict(d_model=16, n_heads=4, causal=False),
    dict(d_model=24, n_heads=3, norm="post", activation="gelu_erf", ffn_bias=True, ln_affine=True),
]


def oracle_outputs(cfg, w, inputs):
    """Each component computed straight from the oracle (tblock.backends.numpy) in float64."""
    w64 = {k: a.astype(np.float64) for k, a in w.arrays().items()}
    X = inputs["block"][0].astype(np.float64)
    S = inputs["softmax"][0].astype(np.float64)
    T = X.shape[0]
    keep = oracle.causal_mask(T) if cfg.causal else np.ones((T, T), dtype=bool)
    Q, K, V = (a.astype(np.float64) for a in inputs["attention_core"])
    core = np.zeros_like(Q)
    for h in range(cfg.n_heads):
        cols = slice(h * cfg.d_k, (h + 1) * cfg.d_k)
        A = oracle.softmax_rows(np.where(keep, Q[:, cols] @ K[:, cols].T / np.sqrt(cfg.d_k), -np.inf))
        core[:, cols] = A @ V[:, cols]
    return {
        "layernorm": oracle.layernorm(X, w64.get("ln1_gamma"), w64.get("ln1_beta"), eps=cfg.eps),
        "softmax": np.stack([oracle.softmax_rows(np.where(keep, S[h], -np.inf)) for h in range(cfg.n_heads)]),
        "attention_core": core,
        "attention": oracle.attention(X, w64, cfg, {}),
        "ffn": oracle.ffn(X, w64, cfg, {}),
        "block": oracle.block_forward_one(X, w64, cfg)[0],
    }


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_components_match_the_oracle(backend, kw, dtype):
    cfg = tblock.BlockConfig(**kw)
    w = tblock.init_weights(cfg, seed=3, dtype=np.float64)
    cs = C.prepare(backend, cfg, w, dtype)
    inputs = C.make_inputs(cfg, 12, dtype, seed=5)
    want = oracle_outputs(cfg, tblock.init_weights(cfg, seed=3, dtype=dtype), inputs)
    assert set(cs.fns) | set(cs.missing) == set(C.COMPONENTS)
    assert not set(cs.fns) & set(cs.missing)
    assert "block" in cs.fns
    for name, fn in cs.fns.items():
        out = np.asarray(fn(*inputs[name]))
        # float64 results (the oracle, the C reference) agree to rounding; float32 ones to float32
        tol = 1e-9 if out.dtype == np.float64 else 2e-4
        got = out.astype(np.float64)
        np.testing.assert_allclose(got, want[name], rtol=tol, atol=tol, err_msg=f"{backend} {name}")
        # a second call (the timed ones) gives the same answer: prepared state is reused, not consumed
        np.testing.assert_allclose(np.asarray(fn(*inputs[name]), dtype=np.float64), got, rtol=0, atol=0)


def test_inputs_are_what_the_callables_take():
    cfg = tblock.BlockConfig(d_model=16, n_heads=4)
    inputs = C.make_inputs(cfg, 10, "float32")
    assert inputs["softmax"][0].shape == (4, 10, 10)
    assert [a.shape for a in inputs["attention_core"]] == [(10, 16)] * 3
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for v in inputs.values() for a in v)
    assert set(C.make_inputs(cfg, 10, components=["ffn"])) == {"ffn"}
    with pytest.raises(ValueError, match="component"):
        C.make_inputs(cfg, 10, components=["mlp"])


def test_unknown_and_unavailable_backends():
    with pytest.raises(ValueError, match="backend"):
        C.backend_status("fortran")
    for b in C.BACKENDS:
        ok, why = C.backend_status(b)
        assert ok == (b in BACKENDS) and (ok or why)
    cfg = tblock.BlockConfig(d_model=8, n_heads=2)
    for b in set(C.BACKENDS) - set(BACKENDS):
        with pytest.raises(tblock.BackendUnavailable):
            C.prepare(b, cfg, tblock.init_weights(cfg, 0))


# ---------------------------------------------------------------------------------------
# the blocks in use today: RMSNorm, SwiGLU, rotary, grouped-query attention

LLAMA = dict(d_model=24, n_heads=6, n_kv_heads=2, d_ff=40, norm_type="rmsnorm", ln_affine=True, ffn="gated",
             activation="silu", positions="rotary")


def llama_weights(cfg, dtype):
    """init_weights with gammas away from 1, so a norm that ignored them would show."""
    a = tblock.init_weights(cfg, seed=3, dtype=np.float64).arrays()
    rng = np.random.default_rng(4)
    a.update(ln1_gamma=rng.uniform(0.5, 1.5, cfg.d_model), ln2_gamma=rng.uniform(0.5, 1.5, cfg.d_model))
    return tblock.BlockWeights(**{k: v.astype(dtype) for k, v in a.items()})


def llama_by_hand(cfg, w, inputs):
    """Each component of the Llama-family block written out here, independently of the oracle:
    RMSNorm x / sqrt(mean x^2 + eps) * gamma; query head h reads K/V head h // group;
    Hugging Face's rotate-half rotary; (silu(X W_gate) * X W_up) W_down."""
    w = {k: a.astype(np.float64) for k, a in w.arrays().items()}
    X = inputs["block"][0].astype(np.float64)
    T, dk, group = X.shape[0], cfg.d_k, cfg.n_heads // cfg.kv_heads
    keep = np.tril(np.ones((T, T), dtype=bool))

    def rms(Z, g):
        return Z / np.sqrt((Z * Z).mean(axis=1, keepdims=True) + cfg.eps) * g

    def core(Q, K, V):
        out = np.empty_like(Q)
        for h in range(cfg.n_heads):
            q, g = slice(h * dk, (h + 1) * dk), slice((h // group) * dk, (h // group + 1) * dk)
            S = np.where(keep, Q[:, q] @ K[:, g].T / np.sqrt(dk), -np.inf)
            P = np.exp(S - S.max(axis=1, keepdims=True))
            out[:, q] = (P / P.sum(axis=1, keepdims=True)) @ V[:, g]
        return out

    def rotate(M):
        t = np.arange(T)[:, None]
        out = M.copy()
        for h in range(M.shape[1] // dk):
            for j in range(dk // 2):
                a = t[:, 0] * cfg.rope_theta ** (-2 * j / dk)
                x1, x2 = M[:, h * dk + j], M[:, h * dk + j + dk // 2]
                out[:, h * dk + j] = x1 * np.cos(a) - x2 * np.sin(a)
                out[:, h * dk + j + dk // 2] = x2 * np.cos(a) + x1 * np.sin(a)
        return out

    def attention(Z):
        return core(rotate(Z @ w["w_q"]), rotate(Z @ w["w_k"]), Z @ w["w_v"]) @ w["w_o"]

    def ffn(Z):
        G = Z @ w["w_gate"]
        return (G / (1 + np.exp(-G)) * (Z @ w["w_ff1"])) @ w["w_ff2"]

    H = X + attention(rms(X, w["ln1_gamma"]))
    S = inputs["softmax"][0].astype(np.float64)
    E = np.exp(np.where(keep, S, -np.inf) - np.where(keep, S, -np.inf).max(axis=2, keepdims=True))
    return {"layernorm": rms(X, w["ln1_gamma"]), "softmax": E / E.sum(axis=2, keepdims=True),
            "attention_core": core(*(a.astype(np.float64) for a in inputs["attention_core"])),
            "attention": attention(X), "ffn": ffn(X), "block": H + ffn(rms(H, w["ln2_gamma"]))}


def test_variant_inputs_give_k_and_v_the_kv_heads_columns():
    cfg = tblock.BlockConfig(**LLAMA)
    assert [a.shape for a in C.make_inputs(cfg, 10, "float32")["attention_core"]] == [(10, 24), (10, 8), (10, 8)]


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("numpy", "c")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_llama_components_match_the_block_written_out(backend, dtype):
    """The oracle and the C reference time the Llama-family block's own components (C has no
    projection entry point: its attention is n/a, as for the lesson's block)."""
    cfg = tblock.BlockConfig(**LLAMA)
    w = llama_weights(cfg, dtype)
    cs = C.prepare(backend, cfg, w, dtype)
    inputs = C.make_inputs(cfg, 12, dtype, seed=5)
    want = llama_by_hand(cfg, w, inputs)
    assert set(cs.fns) | set(cs.missing) == set(C.COMPONENTS)
    assert set(cs.fns) == set(C.COMPONENTS) - ({"attention"} if backend == "c" else set())
    for name, fn in cs.fns.items():
        out = np.asarray(fn(*inputs[name]))
        tol = 1e-9 if out.dtype == np.float64 else 2e-4     # the whole block answers in the input's dtype
        np.testing.assert_allclose(out.astype(np.float64), want[name], rtol=tol, atol=tol, err_msg=f"{backend} {name}")


@pytest.mark.skipif("torch" not in BACKENDS, reason="torch is not installed here")
def test_torch_is_na_for_the_llama_block_with_the_reason():
    cfg = tblock.BlockConfig(**LLAMA)
    cs = C.prepare("torch", cfg, llama_weights(cfg, "float32"), "float32")
    assert cs.fns == {} and set(cs.missing) == set(C.COMPONENTS)
    assert all("lesson's block only" in why for why in cs.missing.values())


class FakeBackend:
    """A backend module whose components() is given by the test."""
    def __init__(self, components):
        self.components = components


def test_a_backend_refusing_the_variant_is_na_not_an_error(monkeypatch):
    """numba refuses, by name, the variants it does not compute yet: every component n/a, with that reason."""
    cfg = tblock.BlockConfig(**LLAMA)
    real = C.api.get_backend

    def refuse(*a):
        raise ValueError("backend 'c' does not compute norm_type='rmsnorm' yet")
    monkeypatch.setattr(C.api, "get_backend", lambda b: FakeBackend(refuse) if b == "c" else real(b))
    cs = C.prepare("c", cfg, llama_weights(cfg, "float32"), "float32")
    assert cs.fns == {} and set(cs.missing) == set(C.COMPONENTS)
    assert all("ValueError: backend 'c' does not compute norm_type='rmsnorm' yet" in why for why in cs.missing.values())


def test_a_component_computing_the_wrong_block_is_na_not_timed(monkeypatch):
    """A backend whose components run for the variant but compute something else (the lesson's
    LayerNorm, a wrong shape, an exception) has those components n/a after the oracle check."""
    cfg = tblock.BlockConfig(**LLAMA)
    real = C.api.get_backend

    def components(cfg, weights, dtype):
        cs = real("numpy").components(cfg, weights, dtype)
        cs.backend, cs.compute_dtype = "c", np.dtype(dtype)
        cs.fns["layernorm"] = lambda X: oracle.layernorm(X.astype(np.float64))      # not RMSNorm with gamma
        cs.fns["softmax"] = lambda S: S[:1]
        cs.fns["ffn"] = lambda X: 1 / 0
        return cs
    monkeypatch.setattr(C.api, "get_backend", lambda b: FakeBackend(components) if b == "c" else real(b))
    cs = C.prepare("c", cfg, llama_weights(cfg, "float32"), "float32")
    assert set(cs.fns) == {"attention_core", "attention", "block"}
    assert "differs from the numpy oracle" in cs.missing["layernorm"]
    assert "shape" in cs.missing["softmax"]
    assert "ZeroDivisionError" in cs.missing["ffn"]
