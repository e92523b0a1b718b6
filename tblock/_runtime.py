"""How tblock runs inside a process: Numba's threading layer and tblock's thread count.

Fork safety.  Left to itself, Numba picks the GNU OpenMP layer wherever libgomp is found,
and a child forked after a parallel call then dies ("fork() called from a process already
using GNU OpenMP") while its parent waits forever.  tblock therefore asks for the
"workqueue" layer, which survives fork, before Numba starts its thread pool, unless the
user chose a layer (NUMBA_THREADING_LAYER or NUMBA_THREADING_LAYER_PRIORITY).  Workqueue
cannot run two parallel regions at once; the numba backend's lock already makes parallel
calls take turns.

Threads.  One count for the whole process (``set_num_threads``), applied by the backend
to every parallel call, from whichever Python thread it comes: Numba's own setting is
per thread.  At start it is NUMBA_NUM_THREADS, else OMP_NUM_THREADS, else every CPU
Numba sees.  Nothing here starts Numba's pool (tblock.peers.import_early needs that).
"""

from __future__ import annotations

import contextlib
import numbers
import os
import warnings


def choose_threading_layer() -> None:
    """Select the fork-safe "workqueue" layer unless the user chose one or the pool runs."""
    try:
        from numba.core import config
        from numba.np.ufunc import parallel
    except ImportError:
        return                          # no Numba: the numba backend says why when asked
    user_chose = {"NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY"} & set(os.environ)
    if user_chose or config.THREADING_LAYER != "default" or parallel._is_initialized:
        return                          # a .numba_config.yaml choice counts too; a running pool is too late
    config.THREADING_LAYER = "workqueue"


def pool_size() -> int:
    """The most threads a call can use: the size of Numba's pool (NUMBA_NUM_THREADS)."""
    try:
        from numba.core import config
        return config.NUMBA_NUM_THREADS
    except ImportError:
        return os.cpu_count() or 1


def _check(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    top = pool_size()
    if not 1 <= n <= top:
        raise ValueError(f"{name} must be between 1 and {top} (the size of Numba's thread pool, "
                         f"NUMBA_NUM_THREADS), got {n}")
    return int(n)


def _initial() -> int:
    top = pool_size()
    omp = os.environ.get("OMP_NUM_THREADS")
    if "NUMBA_NUM_THREADS" in os.environ or not omp:
        return top                      # NUMBA_NUM_THREADS already sized the pool
    try:
        n = int(omp.split(",")[0])      # OpenMP's nested form "4,2": the outer level
        if n < 1:
            raise ValueError
    except ValueError:
        warnings.warn(f"tblock: OMP_NUM_THREADS={omp!r} is not a positive integer; using {top} threads",
                      RuntimeWarning, stacklevel=3)
        return top
    return min(n, top)


_threads = _initial()


def set_num_threads(n: int) -> None:
    """Run the numba backend's parallel calls on ``n`` threads, from every Python thread,
    until changed (1 <= n <= NUMBA_NUM_THREADS)."""
    global _threads
    _threads = _check("n", n)


def get_num_threads() -> int:
    """The thread count the numba backend's parallel calls use (see set_num_threads)."""
    return _threads


@contextlib.contextmanager
def threads(n: int):
    """``with tblock.threads(n):`` set_num_threads(n) for the body, then the count before.
    The setting is process-wide, like set_num_threads: other Python threads see it too."""
    global _threads
    old = _threads
    _threads = _check("n", n)
    try:
        yield n
    finally:
        _threads = old
