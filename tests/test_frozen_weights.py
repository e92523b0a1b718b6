"""Weights nobody can edit behind a backend's back (issue #31): BlockWeights' arrays were
read-only copies that owned their memory, so ``flags.writeable = True`` succeeded, and an
edit left the numba backend computing with what it had packed before.  Now the copies'
memory is an immutable bytes object: numpy refuses to make them (or any view of them)
writeable, and the backends' packed copies stay true to the weights."""

import copy
import dataclasses
import pickle

import numpy as np
import pytest

import tblock

CFG = tblock.BlockConfig(d_model=16, n_heads=2, ffn_bias=True, ln_affine=True, attn_bias=True)


def _bases(a):
    """``a`` and every array it is a view of, down to the object that owns the memory."""
    out = [a]
    while isinstance(out[-1], np.ndarray) and out[-1].base is not None:
        out.append(out[-1].base)
    return out


def assert_frozen(w):
    for name, a in w.arrays().items():
        chain = _bases(a)
        assert isinstance(chain[-1], bytes), (name, type(chain[-1]))      # immutable memory
        for arr in chain[:-1]:
            with pytest.raises(ValueError, match="WRITEABLE"):
                arr.flags.writeable = True
            with pytest.raises(ValueError, match="WRITEABLE"):
                arr.setflags(write=True)
        view = a.view()
        with pytest.raises(ValueError):
            view.flags.writeable = True
        strided = np.lib.stride_tricks.as_strided(a, writeable=True)
        assert not strided.flags.writeable, name
        with pytest.raises(ValueError, match="read-only"):
            a[(0,) * a.ndim] = 1.0


def _writeable(rng, dtype):
    """A full set of weights as plain, writeable caller arrays."""
    w = tblock.init_weights(CFG, seed=3, dtype=dtype)
    return {k: np.array(v) + rng.uniform(0.1, 0.2, v.shape).astype(dtype) for k, v in w.arrays().items()}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_way_of_making_weights_gives_frozen_arrays(rng, dtype):
    w = tblock.BlockWeights(**_writeable(rng, dtype))
    for made in (w, tblock.init_weights(CFG, seed=1, dtype=dtype), dataclasses.replace(w, w_q=np.eye(16, dtype=dtype)),
                 w.scaled(0.5), copy.copy(w), copy.deepcopy(w), pickle.loads(pickle.dumps(w)),
                 tblock.BlockWeights(**{k: v.astype(v.dtype.newbyteorder(">")) for k, v in w.arrays().items()})):
        assert_frozen(made)
        for name, a in made.arrays().items():
            assert a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.flags.aligned, name
            np.testing.assert_array_equal(a, made.arrays()[name])


def test_the_copies_hold_the_callers_values(rng):
    given = _writeable(rng, np.float64)
    w = tblock.BlockWeights(**given)
    for name, a in w.arrays().items():
        np.testing.assert_array_equal(a, given[name])
        assert not np.shares_memory(a, given[name])
    given["w_q"][0, 0] = 1e6                # the caller's own array stays its own
    assert w.w_q[0, 0] != 1e6


def test_the_edit_of_issue_31_is_refused_and_the_backend_stays_right():
    """The probe: forward (the numba backend packs the weights), turn the flag back on,
    edit, forward again; the flag cannot be turned on, so both calls compute with the same
    weights as the numpy oracle."""
    w = tblock.init_weights(CFG, seed=2)
    H = np.random.default_rng(2).standard_normal((6, 16)).astype(np.float32)
    first = tblock.forward(H, w, CFG)
    for name in ("w_q", "w_ff1", "b_ff2", "ln1_gamma", "b_o"):
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
            getattr(w, name).flags.writeable = True
    np.testing.assert_array_equal(tblock.forward(H, w, CFG), first)
    want = tblock.forward(H, w, CFG, backend="numpy")
    assert np.abs(first - want).max() < 2e-5 * np.abs(want).max()
