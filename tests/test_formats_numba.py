"""The numba backend on stored weights (bf16, int8, int4) against the NumPy oracle on the
same stored weights, which it dequantizes itself (tblock.formats.dequantize, float64).

The kernels read the stored bytes with their own code (kernels.widen, kernels.qgemv) and
sum in float32, so the bound is float32's: 2e-6 of the output's largest magnitude (the
largest error seen over these shapes is about 5e-7 on the avx512 path).  The C reference
unpacks the bytes with its own code too (tests/test_c_formats.py).
"""

import numpy as np
import pytest
from conftest import random_weights, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st

import tblock
from tblock.formats import quantize_matrix
from tblock.kernels.qgemv import gemv_rows_parallel, gemv_rows_serial, stored_view

pytestmark = pytest.mark.isa

BOUND = 2e-6
STORED = ("bf16", "int8", "int4")


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(STORED), d_in=st.sampled_from([32, 64, 96, 160]), d_out=st.integers(1, 70),
       seed=st.integers(0, 2**32 - 1), serial=st.booleans())
def test_gemv_rows_match_float64(fmt, d_in, d_out, seed, serial):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d_in, d_out)).astype(np.float32)
    q = quantize_matrix(W, fmt)
    x = rng.standard_normal(d_in).astype(np.float32)
    bias = rng.standard_normal(d_out).astype(np.float32)
    y = rng.standard_normal(d_out).astype(np.float32)
    want = y + bias + x.astype(np.float64) @ q.dequantize(np.float64)
    (gemv_rows_serial if serial else gemv_rows_parallel)(x, stored_view(q), bias, y, True, 3)
    scale = np.abs(x) @ np.abs(q.dequantize(np.float64)) + np.abs(bias) + 1
    assert (np.abs(y - want) <= 1e-6 * scale).all()


def test_bf16_rows_of_any_length():
    """bf16 needs no blocks: row lengths off the vector width take the scalar tail."""
    rng = np.random.default_rng(1)
    for d_in in (1, 7, 17, 33, 47):
        W = rng.standard_normal((d_in, 5)).astype(np.float32)
        q = quantize_matrix(W, "bf16")
        x = rng.standard_normal(d_in).astype(np.float32)
        y = np.empty(5, np.float32)
        gemv_rows_serial(x, stored_view(q), np.zeros(0, np.float32), y, False, 1)
        assert rel_err(y, x.astype(np.float64) @ q.dequantize(np.float64)) < 1e-6


@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(STORED), d=st.sampled_from([32, 64, 96]), heads=st.sampled_from([1, 2, 4]),
       ff=st.sampled_from([1, 2, 4]), B=st.integers(1, 3), T=st.sampled_from([1, 2, 7, 33, 70]),
       causal=st.booleans(), pre=st.booleans(), biases=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_block_matches_the_oracle(fmt, d, heads, ff, B, T, causal, pre, biases, seed):
    if d % heads:
        return
    rng = np.random.default_rng(seed)
    cfg = tblock.BlockConfig(d_model=d, n_heads=heads, d_ff=32 * ff, causal=causal, norm="pre" if pre else "post",
                             ffn_bias=biases, attn_bias=biases, ln_affine=biases)
    w = tblock.quantize(random_weights(cfg, rng), fmt)
    H = rng.standard_normal((B, T, d)).astype(np.float32)
    want = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy")
    assert rel_err(tblock.forward(H, w, cfg), want) < BOUND
    assert rel_err(tblock.forward(H[0], w, cfg), want[0]) < BOUND          # 2-D, the prepared call
    Hs = np.asfortranarray(H[0])                                          # any strides in
    assert rel_err(tblock.forward(Hs, w, cfg), want[0]) < BOUND


@pytest.mark.parametrize("fmt", STORED)
def test_cached_steps_and_stack_match_the_oracle(fmt, rng):
    cfg = tblock.BlockConfig(d_model=64, n_heads=2, d_ff=128, ffn_bias=True, attn_bias=True, ln_affine=True)
    stack = tblock.Stack(cfg, [tblock.quantize(random_weights(cfg, rng), fmt) for _ in range(3)])
    H = rng.standard_normal((2, 12, 64)).astype(np.float32)
    want = stack(H.astype(np.float64), backend="numpy")
    caches = stack.make_cache(16, batch=2)
    outs = [stack(H[:, :5], cache=caches)] + [stack(H[:, t:t + 1], cache=caches) for t in range(5, 12)]
    assert rel_err(np.concatenate(outs, axis=1), want) < BOUND
    assert rel_err(stack(H), want) < BOUND


def test_float64_input_runs_in_float32_and_comes_back_float64(rng):
    cfg = tblock.BlockConfig(d_model=32, n_heads=2, d_ff=64)
    w = tblock.quantize(random_weights(cfg, rng), "int8")
    H = rng.standard_normal((5, 32))
    out = tblock.forward(H, w, cfg)
    assert out.dtype == np.float64
    assert rel_err(out, tblock.forward(H, w, cfg, backend="numpy")) < BOUND
    with pytest.raises(ValueError, match="float32"):
        tblock.forward(H, w, cfg, cache=tblock.KVCache(cfg, 8, 1, np.float64))


@pytest.mark.parametrize("fmt", STORED)
def test_backend_keeps_no_float_copy_of_stored_matrices(fmt, rng):
    cfg = tblock.BlockConfig(d_model=128, n_heads=2, d_ff=512)
    w = tblock.quantize(random_weights(cfg, rng), fmt)
    H = rng.standard_normal((3, 128)).astype(np.float32)
    tblock.forward(H, w, cfg)
    tblock.forward(H[:1], w, cfg, cache=tblock.KVCache(cfg, 4, 1, np.float32))
    held = 0
    for v in w.prepared_state.values():
        for a in (v if isinstance(v, tuple) else (v,)):
            held += a.nbytes if isinstance(a, np.ndarray) else 0
    assert held < 1.1 * w.nbytes + 64 * 1024, (held, w.nbytes)


@pytest.mark.parametrize("fmt", STORED)
def test_stored_head_matches_the_reference(fmt, rng):
    """The tied head over E's stored rows (one a token) against the registry's float64 head
    on the same stored E: one row (a decode step's GEMV) and many (unpacked panels)."""
    from tblock.backends import reference_lm_head
    from tblock.backends.numba import lm_head, prepare_head

    vocab, d = 300, 64
    E = quantize_matrix(rng.standard_normal((vocab, d)).astype(np.float32).T, fmt)   # E^T: rows = tokens
    ln_f = rng.standard_normal(2 * d).astype(np.float32)
    for B, T in ((1, 1), (2, 3), (1, 40)):
        H = rng.standard_normal((B, T, d)).astype(np.float32)
        got = lm_head(H, ln_f, 1e-5, prepare_head(E, np.float32), np.empty((B, T, vocab), np.float32))
        want = reference_lm_head(H, ln_f, 1e-5, E, np.empty((B, T, vocab)))
        assert rel_err(got, want) < BOUND


@pytest.mark.parametrize("fmt", ("fp32",) + STORED)
def test_parallel_head_of_one_row_matches_the_reference(fmt, rng):
    """A head large enough for the parallel build over one row (a decode step's), where
    each thread takes its share of the column panels as one task: an odd count of panels
    (1025 of 16 columns, 2049 of 8, 4097 of 4), so the two shares differ, the last ragged."""
    from tblock.backends import reference_lm_head
    from tblock.backends.numba import lm_head, prepare_head
    from tblock.backends.numba.lm import head_is_large

    vocab, d = 8 * 2049 - 5, 64
    assert head_is_large(1, (vocab, d))
    E = rng.standard_normal((vocab, d)).astype(np.float32)
    if fmt != "fp32":
        E = quantize_matrix(E.T, fmt)
    ln_f = rng.standard_normal(2 * d).astype(np.float32)
    H = rng.standard_normal((1, 1, d)).astype(np.float32)
    want = reference_lm_head(H, ln_f, 1e-5, E, np.empty((1, 1, vocab)))
    for n in sorted({1, min(2, tblock._runtime.pool_size())}):
        with tblock.threads(n):
            got = lm_head(H.copy(), ln_f, 1e-5, prepare_head(E, np.float32), np.empty((1, 1, vocab), np.float32))
        assert rel_err(got, want) < (BOUND if fmt != "fp32" else 1e-5), n


@pytest.mark.subprocess
# with dot "fp32" the kernels a format compiles are the same on every vector path
@pytest.mark.parametrize("fmt, dot", [pytest.param(f, "fp32", marks=pytest.mark.any_path) for f in ("fp32",) + STORED]
                         + [("int8", "int8"), ("int4", "int8"), ("bf16", "bf16")])
def test_a_format_compiles_only_its_own_kernels(fmt, dot, tmp_path):
    """A user of one format and dot compiles none of the others' loops (a first call pays
    only for its own), from an empty Numba cache: int8 and int4 with dot "int8" compile the
    integer kernels (kernels.qdot, or where the CPU has VNNI kernels.qgroups on rows in
    groups and kernels.igemm for many rows) and not the widening ones, with dot "fp32" the
    reverse;
    bf16 blocks with dot "bf16" compile bgemm (and not stored_gemm), their head (stored
    rows) the rounding of its rows and the widening row dot; bf16 with dot "fp32", no bgemm."""
    import json
    import os
    import subprocess

    from conftest import proc
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    p = subprocess.run(proc("format_builds", fmt, dot), capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    builds = json.loads(p.stdout.strip().splitlines()[-1])
    from tblock.kernels.wgemm import INTEGER_GEMM
    from tblock.kernels.qgroups import grouped
    row_kernel = "gemv_groups" if grouped("int8") else "gemv_int8"
    if dot == "int8":       # many rows: the integer GEMM where the CPU has VNNI, else widened panels
        own = {row_kernel, "round_blocks"} | ({"stored_igemm", "igemm"} if INTEGER_GEMM else {"rounded_rows"})
        own |= {"group_columns"} if grouped("int8") else set()
    elif dot == "bf16":
        own = {"stored_bgemm", "bgemm_panels", "bgemm_packed", "bf16_rows", "dot_rows", "pack_pairs", "paired_bgemm"}
    else:
        own = {"fp32": set(), "bf16": {"dot_rows"}, "int8": {"dot_q8"}, "int4": {"dot_q4"}}[fmt]
    for name, n in builds.items():
        if name == "stored_gemm":
            assert (n > 0) == (fmt != "fp32" and not (dot == "int8" and INTEGER_GEMM)), builds
        else:
            assert (n > 0) == (name in own), builds
    if dot == "int8":       # one build of the rows of its own format
        assert builds[row_kernel] == 1, builds
