"""Bad input gets a clear ValueError/TypeError naming the argument, and changes nothing."""

import numpy as np
import pytest

import tblock

CFG = tblock.BlockConfig(d_model=8, n_heads=2)


@pytest.fixture
def good(rng):
    return rng.standard_normal((4, 8)), tblock.init_weights(CFG, seed=0, dtype=np.float64)


def weights_with(**replace):
    a = {k: v.copy() for k, v in tblock.init_weights(CFG, seed=0, dtype=np.float64).arrays().items()}
    a.update(replace)
    return a


# ---- BlockConfig ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(d_model=8, n_heads=3), ValueError, "d_model must be divisible by n_heads"),
    (dict(d_model=0, n_heads=1), ValueError, "d_model must be >= 1, got 0"),
    (dict(d_model=8, n_heads=0), ValueError, "n_heads must be >= 1"),
    (dict(d_model=8.0, n_heads=2), TypeError, "d_model must be an integer, got float"),
    (dict(d_model=8, n_heads=True), TypeError, "n_heads must be an integer, got bool"),
    (dict(d_model=8, n_heads=2, d_ff=0), ValueError, "d_ff must be >= 1"),
    (dict(d_model=8, n_heads=2, norm="mid"), ValueError, "norm must be one of"),
    (dict(d_model=8, n_heads=2, activation="swish"), ValueError, "activation must be one of"),
    (dict(d_model=8, n_heads=2, causal=1), TypeError, "causal must be a bool"),
    (dict(d_model=8, n_heads=2, eps=0.0), ValueError, "eps must be positive and finite"),
    (dict(d_model=8, n_heads=2, eps=float("nan")), ValueError, "eps must be positive"),
    (dict(d_model=8, n_heads=2, eps="1e-5"), TypeError, "eps must be a real number"),
    (dict(d_model=8, n_heads=2, ffn_bias="yes"), TypeError, "ffn_bias must be a bool"),
    (dict(d_model=8, n_heads=2, ln_affine=None), TypeError, "ln_affine must be a bool"),
])
def test_bad_config(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        tblock.BlockConfig(**kwargs)


def test_config_is_frozen_and_resolves_d_ff():
    assert CFG.d_ff == 32 and CFG.d_k == 4
    with pytest.raises(AttributeError):
        CFG.d_model = 16


# ---- input H -------------------------------------------------------------------------------

@pytest.mark.parametrize("H, exc, words", [
    (np.zeros(8), ValueError, r"H must be \(T, d_model\) or \(B, T, d_model\), got shape \(8,\)"),
    (np.zeros((1, 2, 4, 8)), ValueError, "H must be .* got shape"),
    (np.zeros((4, 7)), ValueError, r"H must have d_model=8 columns, got shape \(4, 7\)"),
    (np.zeros((0, 8)), ValueError, r"at least one token \(T >= 1\)"),
    (np.zeros((2, 0, 8)), ValueError, r"T >= 1"),
    (np.zeros((0, 4, 8)), ValueError, r"B >= 1"),
    (np.zeros((4, 8), dtype=np.int64), TypeError, "H must have dtype float32 or float64, got int64"),
    (np.zeros((4, 8), dtype=np.complex128), TypeError, "got complex128"),
    (np.zeros((4, 8), dtype=object), TypeError, "got object"),
    (np.zeros((4, 8), dtype=np.float16), TypeError, "got float16"),
    ("not an array", TypeError, "H must be a numpy array, got str"),
])
def test_bad_input_array(good, backend, H, exc, words):
    _, w = good
    with pytest.raises(exc, match=words):
        tblock.forward(H, w, CFG, backend=backend)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")        # np.matrix's own
@pytest.mark.parametrize("make", [np.asmatrix, lambda H: np.ma.masked_array(H, mask=H > 1)],
                         ids=["matrix", "masked"])
@pytest.mark.parametrize("trace", [False, True])
def test_matrix_and_masked_input_are_refused(good, backend, make, trace):
    """Issue #31: an np.matrix made the numpy backend compute something else (``*`` is a
    matrix product there and reductions keep two dimensions), and a masked array's mask was
    ignored; both are refused naming H, by every backend, the input left as it was."""
    H, w = good
    X = make(H)
    before = np.array(X)
    with pytest.raises(TypeError, match=r"H must be a plain numpy array, got numpy\.(matrix|ma\.MaskedArray)"):
        tblock.forward(X, w, CFG, backend=backend, trace=trace)
    np.testing.assert_array_equal(np.array(X), before)


def test_a_memory_mapped_input_still_works(good, backend, tmp_path):
    """np.memmap is an ndarray subclass too, and an ordinary one: it is not refused."""
    H, w = good
    M = np.memmap(tmp_path / "H.bin", dtype=H.dtype, mode="w+", shape=H.shape)
    M[...] = H
    np.testing.assert_array_equal(tblock.forward(M, w, CFG, backend=backend), tblock.forward(H, w, CFG, backend=backend))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input(good, backend, bad):
    H, w = good
    H[2, 5] = bad
    before = H.copy()
    with pytest.raises(ValueError, match=r"H must be finite, found .* at index \(2, 5\)"):
        tblock.forward(H, w, CFG, backend=backend)
    np.testing.assert_array_equal(H, before)


@pytest.mark.parametrize("trace", [False, True])
@pytest.mark.parametrize("where", [(0, 0, 0), (1, 299, 63), (0, 150, 17)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_finite_input_found_by_the_compiled_block(where, dtype, trace):
    """The numba backend looks for NaN/Inf inside its compiled call (CHECKS_FINITE): at a
    size that runs in parallel, batched, the first and the last element included, for
    a C-contiguous and a strided input, the error and the untouched input are the same."""
    cfg = tblock.BlockConfig(d_model=64, n_heads=4)
    w = tblock.init_weights(cfg, seed=0, dtype=dtype)
    H = np.random.default_rng(0).standard_normal((2, 300, 64)).astype(dtype)
    H[where] = np.nan
    strided = np.repeat(H, 2, axis=2)[:, :, ::2]
    for X in (H, strided):
        before = X.copy()
        with pytest.raises(ValueError, match=r"H must be finite, found nan at index \(%d, %d, %d\)" % where):
            tblock.forward(X, w, cfg, backend="numba", trace=trace)
        np.testing.assert_array_equal(X, before)


# ---- weights --------------------------------------------------------------------------------

@pytest.mark.parametrize("replace, exc, words", [
    (dict(w_q=np.zeros((8, 7))), ValueError, r"w_q must have shape \(8, 8\) .* got \(8, 7\)"),
    (dict(w_ff1=np.zeros((8, 16))), ValueError, r"w_ff1 must have shape \(8, 32\)"),
    (dict(w_ff2=np.zeros((8, 32))), ValueError, r"w_ff2 must have shape \(32, 8\)"),
])
def test_weights_that_do_not_match_the_config(good, replace, exc, words):
    H, _ = good
    w = tblock.BlockWeights(**weights_with(**replace))
    with pytest.raises(exc, match=words):
        tblock.forward(H, w, CFG)


@pytest.mark.parametrize("replace, exc, words", [
    (dict(w_q=np.zeros(8)), ValueError, "w_q must be 2-D, got shape"),
    (dict(w_k=np.zeros((8, 8), dtype=np.int32)), TypeError, "w_k must have dtype float32 or float64, got int32"),
    (dict(w_v=np.zeros((8, 8), dtype=complex)), TypeError, "w_v must have dtype .* got complex128"),
    (dict(w_o=None), TypeError, "w_o is required"),
    (dict(w_ff1=np.full((8, 32), np.nan)), ValueError, r"w_ff1 must be finite, found nan at index \(0, 0\)"),
    (dict(w_ff2=np.full((32, 8), np.inf)), ValueError, "w_ff2 must be finite"),
    (dict(b_ff1=np.zeros(32)), ValueError, "b_ff1 and b_ff2 must be given together"),
    (dict(ln1_gamma=np.ones(8)), ValueError, "must be given together"),
    (dict(w_q=[[1, 2]]), TypeError, "w_q must have dtype float32 or float64, got int64"),
])
def test_bad_weights_are_rejected_at_construction(replace, exc, words):
    with pytest.raises(exc, match=words):
        tblock.BlockWeights(**weights_with(**replace))


def test_weights_flags_must_match_config(good):
    H, w = good
    with pytest.raises(ValueError, match="cfg.ffn_bias=True but the weights lack b_ff1/b_ff2"):
        tblock.forward(H, w, tblock.BlockConfig(d_model=8, n_heads=2, ffn_bias=True))
    with pytest.raises(ValueError, match="cfg.ln_affine=True but the weights lack"):
        tblock.forward(H, w, tblock.BlockConfig(d_model=8, n_heads=2, ln_affine=True))
    wb = tblock.init_weights(tblock.BlockConfig(d_model=8, n_heads=2, ffn_bias=True), seed=0)
    with pytest.raises(ValueError, match="cfg.ffn_bias=False but the weights have b_ff1/b_ff2"):
        tblock.forward(H, wb, CFG)


def test_bias_shapes_checked(good):
    H, _ = good
    cfg = tblock.BlockConfig(d_model=8, n_heads=2, ffn_bias=True)
    w = tblock.BlockWeights(**weights_with(b_ff1=np.zeros(31), b_ff2=np.zeros(8)))
    with pytest.raises(ValueError, match=r"b_ff1 must have shape \(32,\)"):
        tblock.forward(H, w, cfg)


def test_weights_are_private_copies():
    a = weights_with()
    w = tblock.BlockWeights(**a)
    a["w_q"][0, 0] = 1e6                       # the caller edits its array afterwards
    assert w.w_q[0, 0] != 1e6
    with pytest.raises(ValueError):
        w.w_q[0, 0] = 1.0                      # and the copy is read-only


# ---- other arguments ------------------------------------------------------------------------

def test_unknown_backend(good):
    H, w = good
    with pytest.raises(ValueError, match=r"backend must be one of \('numpy', 'numba', 'c'\), got 'cuda'"):
        tblock.forward(H, w, CFG, backend="cuda")
    with pytest.raises(TypeError, match="backend must be a str"):
        tblock.forward(H, w, CFG, backend=3)


def test_unknown_option(good):
    H, w = good
    with pytest.raises(TypeError, match="unexpected keyword argument 'causal'"):
        tblock.forward(H, w, CFG, causal=False)
    with pytest.raises(TypeError, match="trace must be a bool, got str"):
        tblock.forward(H, w, CFG, trace="yes")


def test_wrong_argument_types(good):
    H, w = good
    with pytest.raises(TypeError, match="cfg must be a BlockConfig, got dict"):
        tblock.forward(H, w, {"d_model": 8})
    with pytest.raises(TypeError, match="weights must be a BlockWeights, got dict"):
        tblock.forward(H, w.arrays(), CFG)


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(dtype=np.int32), TypeError, "dtype must be float32 or float64, got int32"),
    (dict(branch_scale=np.nan), ValueError, "branch_scale must be finite"),
])
def test_bad_init_weights(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        tblock.init_weights(CFG, seed=0, **kwargs)


def test_bad_stack_arguments():
    w = tblock.init_weights(CFG, seed=0)
    with pytest.raises(ValueError, match="at least one block"):
        tblock.Stack(CFG, [])
    with pytest.raises(TypeError, match="must be a list of BlockWeights"):
        tblock.Stack(CFG, w)
    with pytest.raises(TypeError, match=r"weights\[1\] must be a BlockWeights, got str"):
        tblock.Stack(CFG, [w, "w"])
    other = tblock.init_weights(tblock.BlockConfig(d_model=8, n_heads=2, d_ff=16), seed=0)
    with pytest.raises(ValueError, match=r"weights\[1\].w_ff1 must have shape"):
        tblock.Stack(CFG, [w, other])
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        tblock.Stack.init(CFG, 0, seed=0)


def test_forward_never_modifies_its_inputs(good, backend):
    H, w = good
    H_before, w_before = H.copy(), {k: v.copy() for k, v in w.arrays().items()}
    tblock.forward(H, w, CFG, backend=backend, trace=True)
    tblock.forward(H[None], w, CFG, backend=backend)
    np.testing.assert_array_equal(H, H_before)
    for k, v in w.arrays().items():
        np.testing.assert_array_equal(v, w_before[k])


def test_output_does_not_alias_input(good, backend):
    H, w = good
    out = tblock.forward(H, w, CFG, backend=backend)
    assert not np.shares_memory(out, H)


def test_big_endian_input_and_weights_work(good, backend):
    H, w = good
    want = tblock.forward(H, w, CFG, backend=backend)
    H_be = H.astype(">f8")
    got = tblock.forward(H_be, w, CFG, backend=backend)
    np.testing.assert_array_equal(got, want)
    w_be = tblock.BlockWeights(**{k: v.astype(">f8") for k, v in w.arrays().items()})
    assert w_be.dtype.isnative
    np.testing.assert_array_equal(tblock.forward(H, w_be, CFG, backend=backend), want)


# ---- a repeat plain call (tblock.api.forward: the numba backend's prepare_call) -----------

@pytest.fixture
def armed(monkeypatch):
    """float32 weights that have been through one checked call, so that later plain calls
    can take the numba backend's lane, and the list of calls the checked path gets."""
    import tblock.backends.numba as nb
    w = tblock.init_weights(CFG, seed=0, dtype=np.float32)
    H = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    first = tblock.forward(H, w, CFG, backend="numba")
    checked, forward_batch = [], nb.forward_batch

    def spy(*args):
        checked.append(args[0].shape)
        return forward_batch(*args)
    monkeypatch.setattr(nb, "forward_batch", spy)
    return w, H, first, checked


def _unaligned(a):
    """A copy of ``a`` whose data starts one byte past an element boundary."""
    raw = np.zeros(a.nbytes + 1, dtype=np.uint8)
    out = np.frombuffer(raw.data, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


class _Sub(np.ndarray):
    pass


def test_the_lane_runs_a_plain_call(armed):
    """The lane gives the checked path's bits, for 2-D and batched input, and leaves the
    input's values and flags alone."""
    w, H, first, checked = armed
    got = tblock.forward(H, w, CFG)
    np.testing.assert_array_equal(got, first)
    assert got.shape == H.shape and got.dtype == H.dtype and H.flags.writeable
    assert not np.shares_memory(got, H)
    H2 = np.stack([H, H[::-1].copy()])
    got2 = tblock.forward(H2, w, CFG, backend="numba")
    np.testing.assert_array_equal(tblock.forward(H[None], w, CFG), first[None])
    ro = H.copy()
    ro.flags.writeable = False
    np.testing.assert_array_equal(tblock.forward(ro, w, CFG), first)
    np.testing.assert_array_equal(tblock.forward(ro[None], w, CFG), first[None])
    assert checked == []                # no call took the checked path
    np.testing.assert_array_equal(got2[0], first)
    np.testing.assert_array_equal(got2[1], tblock.forward(H[::-1].copy(), w, CFG))
    want = tblock.forward(H.astype(np.float64), w, CFG, backend="numpy")
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("make", [
    lambda H: H.astype(">f4"),                                  # big-endian
    lambda H: np.repeat(H, 2, axis=1)[:, ::2],                  # strided
    lambda H: np.asfortranarray(H),
    _unaligned,
    lambda H: H.view(_Sub),                                     # an ndarray subclass
    lambda H: H.astype(np.float64),                             # another dtype: its own plan
], ids=["big-endian", "strided", "fortran", "unaligned", "subclass", "float64"])
def test_the_lane_hands_unusual_input_to_the_checked_path(armed, make):
    w, H, first, checked = armed
    X = make(H)
    before = X.copy()
    got = tblock.forward(X, w, CFG)
    assert checked, "the checked path did not run"
    np.testing.assert_allclose(got, first, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(X, before)


@pytest.mark.parametrize("H, exc, words", [
    (np.zeros(8, np.float32), ValueError, r"got shape \(8,\)"),
    (np.zeros((1, 2, 4, 8), np.float32), ValueError, "H must be .* got shape"),
    (np.zeros((4, 7), np.float32), ValueError, r"H must have d_model=8 columns, got shape \(4, 7\)"),
    (np.zeros((0, 8), np.float32), ValueError, r"T >= 1"),
    (np.zeros((2, 0, 8), np.float32), ValueError, r"T >= 1"),
    (np.zeros((0, 4, 8), np.float32), ValueError, r"B >= 1"),
    (np.zeros((4, 8), np.float16), TypeError, "got float16"),
    (np.zeros((4, 8), np.int32), TypeError, "got int32"),
])
def test_the_lane_leaves_errors_to_the_checked_path(armed, H, exc, words):
    w, _, _, _ = armed
    with pytest.raises(exc, match=words):
        tblock.forward(H, w, CFG)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_the_lane_reports_a_non_finite_input_as_the_checked_path_does(armed, bad):
    w, H, _, checked = armed
    H = H.copy()
    H[2, 5] = bad
    before = H.copy()
    with pytest.raises(ValueError, match=r"H must be finite, found .* at index \(2, 5\)"):
        tblock.forward(H, w, CFG)
    assert checked
    np.testing.assert_array_equal(H, before)
    assert H.flags.writeable


def test_the_lane_checks_the_other_arguments_as_the_checked_path_does(armed):
    w, H, first, checked = armed
    with pytest.raises(TypeError, match="backend must be a str"):
        tblock.forward(H, w, CFG, backend=["numba"])
    with pytest.raises(TypeError, match="trace must be a bool, got int"):
        tblock.forward(H, w, CFG, trace=0)
    other = tblock.BlockConfig(d_model=8, n_heads=2, d_ff=16)
    with pytest.raises(ValueError, match=r"w_ff1 must have shape \(8, 16\)"):
        tblock.forward(H, w, other)
    # weights checked against another config object that is equal: the checked path
    np.testing.assert_array_equal(tblock.forward(H, w, tblock.BlockConfig(d_model=8, n_heads=2)), first)
    # the other backends never take the numba backend's lane
    got = tblock.forward(H, w, CFG, backend="numpy")
    assert np.abs(got - first).max() < 1e-5 * np.abs(got).max()


def test_the_lane_runs_a_parallel_size_block(monkeypatch):
    """A repeat plain call of a block the parallel build runs takes the lane: the checked
    path's bits, 2-D and batched, the input's flags untouched, a NaN still refused."""
    import tblock.backends.numba as nb
    cfg = tblock.BlockConfig(d_model=384, n_heads=6)
    w = tblock.init_weights(cfg, seed=0)
    H = np.random.default_rng(2).standard_normal((64, 384)).astype(np.float32)
    first = tblock.forward(H, w, cfg)
    checked, forward_batch = [], nb.forward_batch
    monkeypatch.setattr(nb, "forward_batch", lambda *a: checked.append(a[0].shape) or forward_batch(*a))
    np.testing.assert_array_equal(tblock.forward(H, w, cfg), first)
    np.testing.assert_array_equal(tblock.forward(H[None], w, cfg), first[None])
    assert checked == [] and H.flags.writeable
    bad = H.copy()
    bad[3, 5] = np.nan
    with pytest.raises(ValueError, match=r"\(3, 5\)"):
        tblock.forward(bad, w, cfg)
    want = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy")
    assert np.abs(first - want).max() < 1e-4 * np.abs(want).max()
