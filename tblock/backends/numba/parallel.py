"""Parallel calls: every compiled parallel region the process runs goes through here.

Numba's own thread count is per Python thread, so ``parallel_call`` sets tblock's count
(tblock.set_num_threads) in the calling thread and puts Numba's back afterwards.  Numba's
"workqueue" layer aborts if two Python threads enter parallel code at once, and the
OpenMP/TBB layers would run both regions on the same cores, oversubscribed: a lock makes
concurrent callers take turns, each still using every core.  Serial builds take no lock.
"""

from __future__ import annotations

import threading

import numba

from ... import _runtime

_PARALLEL_LOCK = threading.Lock()

# Below this many FLOPs a call runs its serial build: waking the pool for a parallel
# region costs more than it saves.
PARALLEL_MIN_FLOPS = 2_000_000


def is_serial(flops: int) -> bool:
    """Whether a call of ``flops`` FLOPs runs a serial build: below PARALLEL_MIN_FLOPS, or
    where no parallel call may run (tblock._runtime)."""
    return flops < PARALLEL_MIN_FLOPS or not _runtime.parallel_allowed()


def parallel_call(fn, *args, pass_threads=False):
    """``fn(*args)`` (``fn(*args, nthr)`` with pass_threads) on tblock's thread count, one
    caller at a time.  Numba's chunk size is left alone: a block's prange runs one
    iteration per thread, each claiming tasks (kernels.block), so it has nothing to split."""
    if _runtime.serial_only():
        raise RuntimeError("parallel code cannot run in a child forked after this process used "
                           "Numba's OpenMP pool; start children with spawn or forkserver")
    n = _runtime.get_num_threads()
    with _PARALLEL_LOCK:
        old_n = numba.get_num_threads()
        if old_n != n:
            numba.set_num_threads(n)
        try:
            return fn(*args, n) if pass_threads else fn(*args)
        finally:
            if old_n != n:
                numba.set_num_threads(old_n)
