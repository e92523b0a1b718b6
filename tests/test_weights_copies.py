"""Weights that cannot go stale (issue #13): replace, copy, deepcopy and pickle give
BlockWeights with their own (empty) cache and read-only arrays, and the numba backend
computes with the new weights, never with what it packed for the old ones."""

import copy
import dataclasses
import pickle
import re

import numpy as np
import pytest

import tblock

CFG = tblock.BlockConfig(d_model=16, n_heads=2, ffn_bias=True, ln_affine=True)
T = 5


@pytest.fixture
def used():
    """Weights the numba backend has already packed (its cache is full)."""
    w = tblock.init_weights(CFG, seed=1)
    H = np.random.default_rng(1).standard_normal((T, 16)).astype(np.float32)
    tblock.forward(H, w, CFG)
    tblock.forward(H, w, CFG, trace=True)
    assert w._cache
    return w, H


def assert_numba_matches_numpy(w, H):
    ref = tblock.forward(H, w, CFG, backend="numpy")
    np.testing.assert_allclose(tblock.forward(H, w, CFG), ref, rtol=2e-5, atol=2e-5)
    _, tr = tblock.forward(H, w, CFG, trace=True)
    np.testing.assert_allclose(tr.H_out, ref, rtol=2e-5, atol=2e-5)


def assert_fresh(new, old):
    assert new is not old and new._cache is not old._cache
    for name, a in new.arrays().items():
        assert not a.flags.writeable, name
        assert not np.shares_memory(a, old.arrays()[name]), name
        with pytest.raises(ValueError, match="read-only"):
            a[(0,) * a.ndim] = 1.0


def test_replace_computes_with_the_new_weights(used):
    w, H = used
    other = tblock.init_weights(CFG, seed=2)
    new = dataclasses.replace(w, w_q=other.w_q, b_ff1=other.b_ff1 + 0.5, ln2_gamma=other.ln2_gamma * 2)
    assert not new._cache
    assert_fresh(new, w)
    assert_numba_matches_numpy(new, H)
    assert not np.allclose(tblock.forward(H, new, CFG), tblock.forward(H, w, CFG))


def test_replace_cannot_pass_a_cache(used):
    w, _ = used
    with pytest.raises(ValueError, match="_cache"):
        dataclasses.replace(w, _cache=w._cache)


@pytest.mark.parametrize("name,shape,want", [
    ("w_q", (16, 17), (16, 16)), ("w_ff1", (16, 32), (16, 64)), ("w_ff2", (64, 8), (64, 16)),
    ("b_ff1", (63,), (64,)), ("ln1_beta", (8,), (16,)),
])
def test_a_wrong_shape_replacement_fails_the_check(used, name, shape, want):
    w, H = used
    new = dataclasses.replace(w, **{name: np.zeros(shape, np.float32)})
    message = f"weights.{name} must have shape {want} for d_model=16, d_ff=64, got {shape}"
    with pytest.raises(ValueError, match=re.escape(message)):
        new.check(CFG)
    with pytest.raises(ValueError, match=f"{name} must have shape"):
        tblock.forward(H, new, CFG)


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_copies_have_their_own_cache_and_read_only_arrays(used, how):
    w, H = used
    new = {"copy": copy.copy, "deepcopy": copy.deepcopy,
           "pickle": lambda x: pickle.loads(pickle.dumps(x))}[how](w)
    assert type(new) is tblock.BlockWeights and not new._cache
    assert_fresh(new, w)
    for name, a in w.arrays().items():
        np.testing.assert_array_equal(getattr(new, name), a)
    assert_numba_matches_numpy(new, H)
    np.testing.assert_array_equal(tblock.forward(H, new, CFG), tblock.forward(H, w, CFG))


def test_a_pickle_keeps_no_derived_data(used):
    w, _ = used
    fresh = tblock.init_weights(CFG, seed=1)        # the same weights, never used
    assert len(pickle.dumps(w)) == len(pickle.dumps(fresh))
