"""The barrier between the stages of one parallel region (tests/test_numba_runtime.py), run
with NUMBA_NUM_THREADS=2: python stages_in_one_region.py.

Prints a list of six booleans: five runs of a three-stage region (more iterations than
threads, a pool of one thread) against the sums computed directly, and whether a decode
step's block gives the same output on pools of two threads and of one."""

import numba
import numpy as np
from numba import prange

import tblock
from tblock.kernels.block import PLAN_COLS, next_task
from tblock.kernels.options import finished, kernel, wait_for


@kernel(parallel=True, cache=False)     # cache=False: a test's kernel, nothing written beside the tests
def run(n, workers, nthr):
    # three stages in one region; each task of a stage reads everything the stage before wrote
    plan = np.zeros((3, PLAN_COLS), dtype=np.intp)
    plan[:, 1] = n
    a = np.zeros((4, n), dtype=np.intp)
    a[0] = 1
    for w in prange(workers):
        for s in range(3):
            t = next_task(plan, s, w, 2, nthr)
            while t < n:
                a[s + 1, t] = a[s].sum() + t
                finished(plan, s, 4, nthr)
                t = next_task(plan, s, w, 2, nthr)
            wait_for(plan, s, 4, n)
    return a[3]


def want(n):
    a = np.ones(n, dtype=np.intp)
    for _ in range(3):
        a = a.sum() + np.arange(n)
    return a


def decode_step_outputs():
    """A decode step's block (one region, kernels.block) on pools of two threads and of one."""
    from tblock.backends import numba as nb
    from tblock.kernels.block import cached_parallel
    cfg = tblock.BlockConfig(d_model=64, n_heads=4, causal=True)
    w = tblock.init_weights(cfg, 0)
    outs = []
    for threads in (2, 1):
        cache = tblock.KVCache(cfg, 8)
        H = np.random.default_rng(1).standard_normal((1, 5, 64)).astype(np.float32)
        tblock.forward(H, w, cfg, cache=cache)
        H1 = np.random.default_rng(2).standard_normal((1, 1, 64)).astype(np.float32)
        H1.flags.writeable = False
        numba.set_num_threads(threads)
        args = (H1, nb.packing.packed(w, np.float32), nb.packing.make_plan(w, cfg, np.float32)[2],
                nb.cached.cache_args(cache, nb.cached.ONE_BLOCK))
        outs.append(cached_parallel(*args, 2)[0].copy())
    return outs


ok = []
for threads, n, workers in ((2, 1000, 2), (2, 7, 2), (2, 3, 5), (1, 50, 2), (1, 1, 3)):
    numba.set_num_threads(threads)      # 1: one thread runs every iteration in turn
    ok.append(bool((run(n, workers, 2) == want(n)).all()))
outs = decode_step_outputs()
ok.append(bool(np.array_equal(outs[0], outs[1])))
print(ok)
