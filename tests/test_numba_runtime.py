"""The numba backend's runtime behaviour: threads, compilation, caching."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import proc

import tblock
from tblock.backends import numba as nb

pytestmark = pytest.mark.isa


def test_four_threads_give_the_serial_results():
    """Concurrent callers (parallel and serial sizes mixed) get exactly what one caller gets."""
    cases = []
    for i, (d, h, T) in enumerate([(64, 4, 600), (8, 2, 4), (96, 3, 257), (32, 1, 900)]):
        cfg = tblock.BlockConfig(d_model=d, n_heads=h, causal=bool(i % 2))
        w = tblock.init_weights(cfg, i)
        H = np.random.default_rng(i).standard_normal((2, T, d)).astype(np.float32)
        cases.append((cfg, w, H))
    assert nb.packing.block_flops(2, 600, 64, 256, False) >= nb.parallel.PARALLEL_MIN_FLOPS      # really parallel
    assert nb.packing.block_flops(2, 4, 8, 32, True) < nb.parallel.PARALLEL_MIN_FLOPS            # really serial
    serial = [tblock.forward(H, w, cfg, backend="numba") for cfg, w, H in cases]

    results, errors = {}, []
    start = threading.Barrier(4)

    def worker(k):
        try:
            start.wait()
            for rep in range(6):
                j = (k + rep) % len(cases)
                cfg, w, H = cases[j]
                results[(k, rep)] = (j, tblock.forward(H, w, cfg, backend="numba"))
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 24
    for j, out in results.values():
        np.testing.assert_array_equal(out, serial[j])


def test_prepared_weights_are_cached_per_dtype():
    cfg = tblock.BlockConfig(d_model=16, n_heads=2)
    w = tblock.init_weights(cfg, 0)
    H = np.zeros((3, 16), np.float32)
    tblock.forward(H, w, cfg, backend="numba")
    flat = w.prepared_state[(nb.packing.PACKED, "f")]
    tblock.forward(H, w, cfg, backend="numba")
    assert w.prepared_state[(nb.packing.PACKED, "f")] is flat and not flat.flags.writeable
    tblock.forward(H.astype(np.float64), w, cfg, backend="numba")
    assert w.prepared_state[(nb.packing.PACKED, "d")].dtype == np.float64


def _run_child(*name_and_args):
    p = subprocess.run(proc(*name_and_args), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.subprocess
def test_import_loads_numba_but_compiles_nothing():
    """`import tblock` brings the default backend's runtime (Numba) but no compiled code:
    compiling (or loading it from the cache) waits for first use or warmup()."""
    out = _run_child("import_check", "nothing_compiled")
    assert out.split() == ["True", "0", "0"]


@pytest.mark.subprocess
def test_a_cached_block_calls_its_standalone_kernels_in_a_fresh_process(tmp_path):
    """The parallel block calls its body (one_block_parallel), and the body its stage
    tasks, through their addresses (kernels.options, standalone=True): their machine code
    declares them and carries no copy of the tasks.
    A process that loads the block from Numba's cache must publish those addresses before
    it links the block (reload_init), or LLVM would abort on the unresolved symbol: the
    second process loads both blocks and gets the oracle's answer."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "NUMBA_NUM_THREADS": "2"}
    runs = []
    for _ in range(2):
        p = subprocess.run(proc("cached_block"), env=env, capture_output=True, text=True,
                           timeout=900)
        assert p.returncode == 0, p.stderr
        runs.append(p.stdout.split())
    (hits0, by_address, linked, err0), (hits1, _, _, err1) = runs
    assert (hits0, by_address, linked) == ("0", "True", "False")
    assert hits1 == "2"
    assert float(err0) < 1e-5 and float(err1) < 1e-5


def test_a_borrowed_view_is_the_array_without_its_reference_count():
    """kernels.options.borrowed: the same memory, shape and strides as its owner, which
    keep_alive holds; writes through the view reach the owner."""
    from numba import njit

    from tblock.kernels.options import borrowed, keep_alive

    @njit
    def through_a_view(a):
        b = borrowed(a[:, 1])
        b[2] = -1.0
        keep_alive(a)
        return b.shape[0], b.strides[0], b[0]

    a = np.arange(12.0).reshape(4, 3)
    assert through_a_view(a) == (4, 24, 1.0)
    assert a[2, 1] == -1.0


def test_a_view_at_an_address_is_the_array_there():
    """kernels.options.borrowed_at: n elements of the like array's dtype from an address
    Python took from an array, read-only when like is; writes through a writable view
    reach the array."""
    from numba import njit

    from tblock.kernels.options import borrowed_at

    @njit
    def views(like, table, n):
        a = borrowed_at(like, table[0], n)
        b = borrowed_at(like, table[1], n)
        b[n - 1] = a[0] + a[n - 1]
        return a.sum(), b.shape[0], b.strides[0]

    x, y = np.arange(7.0), np.zeros(7)
    table = np.array([x.ctypes.data, y.ctypes.data], dtype=np.intp)
    assert views(np.empty(0), table, 7) == (21.0, 7, 8)
    assert y[6] == 6.0 and x.sum() == 21.0
    ro = np.empty(0)
    ro.flags.writeable = False

    @njit
    def readonly(like, addr):
        return borrowed_at(like, addr, 3)

    assert not readonly(ro, x.ctypes.data).flags.writeable


def test_claimed_tasks_are_each_run_exactly_once():
    """kernels.options.claim under a parallel loop of more workers than threads: every
    task index 0..n-1 is handed out once, whichever thread asks; on one thread (no
    atomics) the same."""
    from numba import prange

    from tblock.kernels.options import claim, kernel

    @kernel(parallel=True)
    def run(n, workers, nthr):
        plan = np.zeros((2, 3), dtype=np.intp)
        ran = np.zeros(n, dtype=np.intp)
        for _ in prange(workers):
            t = claim(plan, 1, 2, nthr)
            while t < n:
                ran[t] += 1
                t = claim(plan, 1, 2, nthr)
        return ran, plan[1, 2], plan[0, 2]

    for n, workers, nthr in ((1, 1, 1), (1000, 2, 2), (5000, 7, 2), (300, 1, 1)):
        ran, last, other = run(n, workers, nthr)
        assert (ran == 1).all() and last == n + workers and other == 0


def test_next_task_hands_out_each_task_once_by_halves():
    """kernels.block.next_task: with two halves, each task 0..n-1 once (odd n, n of 1, more
    workers than tasks or than threads), and a worker alone takes its own half in order
    before the other's: worker 1 of 10 tasks, alone, runs 5..9 then 0..4."""
    from numba import prange

    from tblock.kernels.block import PLAN_COLS, next_task
    from tblock.kernels.options import kernel

    @kernel(parallel=True)
    def run(n, workers, halves, nthr):
        plan = np.zeros((3, PLAN_COLS), dtype=np.intp)
        plan[1, 1] = n
        ran = np.zeros(n, dtype=np.intp)
        for w in prange(workers):
            t = next_task(plan, 1, w, halves, nthr)
            while t < n:
                ran[t] += 1
                t = next_task(plan, 1, w, halves, nthr)
        return ran

    for n, workers, halves, nthr in ((1, 1, 2, 2), (1, 2, 2, 2), (7, 2, 2, 2), (1000, 2, 2, 2), (999, 5, 2, 2),
                                     (300, 1, 1, 1), (300, 2, 1, 2)):
        assert (run(n, workers, halves, nthr) == 1).all(), (n, workers, halves)

    @kernel
    def order(n, w):
        plan = np.zeros((1, PLAN_COLS), dtype=np.intp)
        plan[0, 1] = n
        seen = []
        t = next_task(plan, 0, w, 2, 1)
        while t < n:
            seen.append(t)
            t = next_task(plan, 0, w, 2, 1)
        return seen

    assert list(order(10, 1)) == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    assert list(order(9, 0)) == list(range(9))


@pytest.mark.subprocess
def test_stages_of_one_region_wait_for_tasks_not_threads():
    """kernels.options.finished / wait_for, the barrier between the stages of a decode
    step's one parallel region: every task of a stage sees every write of the stage
    before, with more iterations than threads, and with a pool of one thread running the
    iterations in turn (it claims every task itself, so waiting for tasks cannot
    deadlock); and the block's decode step gives the same output on such a pool."""
    p = subprocess.run(proc("stages_in_one_region"), capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NUMBA_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["[True,"] + ["True,"] * 4 + ["True]"]


@pytest.mark.subprocess
def test_every_block_path_stays_in_bounds(tmp_path):
    """The block's buffers and indices under Numba's bounds checking (NUMBA_BOUNDSCHECK=1
    overrides the kernels' setting; a separate cache folder keeps the checked code apart):
    the serial and the parallel block, Pre-LN and Post-LN, the untiled, tiled and cached
    attention, the FFN by row tiles and split by columns, both dtypes.  Without the check an
    index past a buffer's end reads or writes the heap silently (the stage plan of a
    Post-LN block with the split FFN needs five rows: four passed every other test)."""
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_NUM_THREADS": "2", "NUMBA_CACHE_DIR": str(tmp_path)}
    p = subprocess.run(proc("bounds_checked"), env=env, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stderr
    assert float(p.stdout) < 1e-5


def test_an_internal_kernel_refuses_a_call_from_python():
    """Internal kernels have no wrapper for Python's objects: a call from Python raises
    instead of jumping into a missing wrapper."""
    from tblock.kernels.stages import qkv_task
    with pytest.raises(TypeError, match="qkv_task is an internal kernel"):
        qkv_task(np.zeros(4), np.zeros(4))


@pytest.mark.subprocess
def test_forward_memory_is_the_packed_weights_and_o_T_d_buffers():
    """d_model=768, T=4096, float32, after warm-up: one forward needs the packed weights
    (28.3 MiB), Q (12 MiB), packed K and V (24 MiB), then the output (12 MiB) once K and V
    are freed: ~66 MiB measured.  Bounded at 80: the (T, 3d) projection buffer beside
    packed K and V (the design before) is 88, a (T, d_ff) hidden layer 48 more, one head's
    T x T scores 64 more."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/status (Linux only)")
    out = _run_child("forward_memory").split()
    if out == ["no-reset"]:
        pytest.skip("this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)")
    assert out[1] == "True"
    assert float(out[0]) < 80, f"one forward took {float(out[0]):.1f} MiB above the RSS before it"
