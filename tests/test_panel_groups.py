"""Runs of column panels a task (layout.panel_groups): with every task of a stage holding all
the rows, a decode step's one row too, a task takes about tiles.TASK_PANELS panels (on
stored weights preparing its rows once for all of them).  Every panel must be some task's,
once; the block must give the oracle's results at panel counts that do not divide, thread
counts of 2 to 5 and row counts on both sides of the micro-tile."""

import numpy as np
import pytest
from numba import njit
from conftest import near_an_int8_tie, near_the_rounded_oracle, random_weights, rel_err, rows_near_an_int8_tie
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tblock
from tblock.backends import numba as nb
from tblock.kernels.block import block_parallel, block_serial
from tblock.kernels.layout import panel_groups
from tblock.kernels.tiles import TASK_PANELS

pytestmark = pytest.mark.isa


@njit(cache=False)
def groups_of(npanels, nthr, per):
    return panel_groups(npanels, nthr, per)         # an internal kernel: called from compiled code


FORMATS = (("float", "fp32"), ("bf16", "fp32"), ("bf16", "bf16"), ("int8", "fp32"), ("int8", "int8"), ("int4", "int8"))


@settings(deadline=None)
@given(npanels=st.integers(1, 80), nthr=st.integers(1, 8), per=st.integers(1, 4))
def test_groups_cover_every_panel_once(npanels, nthr, per):
    g = groups_of(npanels, nthr, per)
    runs = [(t * npanels // g, (t + 1) * npanels // g) for t in range(g)]     # as tasks.py takes them
    assert [p for p0, p1 in runs for p in range(p0, p1)] == list(range(npanels))
    assert all(p1 > p0 for p0, p1 in runs)
    if per == 1:
        assert g == npanels
    else:
        assert max(p1 - p0 for p0, p1 in runs) <= per + 1
        assert g == npanels or g % nthr == 0


def near(got, want, dot, tie, rows):
    """The oracle's bound for the dot: float32's (2e-6 of the largest output) where the
    products are exact, else conftest.near_the_rounded_oracle's (tie: one of the rows the
    QKV projection reads lies at an int8 rounding tie; rows: those whose later inputs do)."""
    if dot == "fp32":
        return rel_err(got, want) < 2e-6
    return near_the_rounded_oracle(got, want, tie, rows)


@settings(max_examples=16, deadline=None)
@given(fd=st.sampled_from(FORMATS), T=st.sampled_from([5, 7, 40, 100]), B=st.integers(1, 2), nthr=st.integers(2, 5),
       ff=st.sampled_from([5, 7]), llama=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(fd=("int8", "int8"), T=40, B=1, nthr=2, ff=5, llama=True, seed=2612)    # LN1 of row 7 at a tie
def test_block_on_runs_of_panels_matches_the_oracle(fd, T, B, nthr, ff, llama, seed):
    fmt, dot = fd
    rng = np.random.default_rng(seed)
    # d_model 192: W_q, W_k, W_v of 3 panels each on avx512 (12 on avx2); d_ff 64 x 5 or 7:
    # panel counts that TASK_PANELS and the thread counts do not divide.  llama: the gated
    # FFN's [gate | up] panel pairs, grouped-query attention, rotary positions, RMSNorm
    if llama:
        cfg = tblock.BlockConfig(d_model=192, n_heads=6, n_kv_heads=2, d_ff=64 * ff, norm_type="rmsnorm",
                                 ffn="gated", activation="silu", positions="rotary", attn_bias="qkv")
    else:
        cfg = tblock.BlockConfig(d_model=192, n_heads=3, d_ff=64 * ff, ffn_bias=True, attn_bias=True,
                                 ln_affine=True)
    w = tblock.init_weights(cfg, seed=int(rng.integers(2**31))) if llama else random_weights(cfg, rng)
    if fmt != "float":
        w = tblock.quantize(w, fmt, dot=dot)
    H = rng.standard_normal((B, T, cfg.d_model)).astype(np.float32)
    want, trace = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy", trace=True)
    tie = dot == "int8" and near_an_int8_tie(trace.H_norm1)        # Pre-LN: QKV reads LN1's rows
    rows = rows_near_an_int8_tie(trace, True) if dot == "int8" else None
    _, flat, scalars, *_ = nb.packing.make_plan(w, cfg, H.dtype)
    got, bad = block_parallel(H, flat, scalars, True, nthr)
    serial = np.empty_like(H)
    assert bad == -1 and block_serial(H, flat, serial, scalars, 1) == -1
    assert near(got, want, dot, tie, rows) and near(serial, want, dot, tie, rows)


def test_task_panels_is_a_run():
    assert TASK_PANELS > 1        # else the runs above are single panels and test nothing new
