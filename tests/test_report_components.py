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
