"""How tblock runs inside a process: Numba's threading layer and tblock's thread count.

Fork safety.  Numba picks the GNU OpenMP layer wherever libgomp is found, and a child
forked after a parallel region cannot use that pool: Numba kills it ("fork() called from
a process already using GNU OpenMP") while its parent waits forever.  tblock keeps the
OpenMP layer, whose threads wait for work spinning and so start a region in about a
microsecond (the "workqueue" layer's sleeping threads made d_model=384, T=64 1.6x and
768/128 1.06-1.4x slower, the TBB layer 1.7x and 1.9x), and instead runs the serial
block in such a child: the same sums on one thread (``serial_only``).  Children made by
spawn or forkserver, or forked before the first parallel call, run in parallel as
usual; a layer chosen by the user (NUMBA_THREADING_LAYER) is left alone.

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


_serial_only = False


def serial_only() -> bool:
    """True in a child forked after this process ran parallel code on the GNU OpenMP
    layer: there, parallel code would kill the child."""
    return _serial_only


def parallel_allowed() -> bool:
    """Whether a parallel call may run now: more than one thread set, and not in a child
    forked after the OpenMP pool ran (serial_only)."""
    return _threads > 1 and not _serial_only


def _after_fork_in_child() -> None:
    global _serial_only
    try:
        import numba
        from numba.np.ufunc import parallel
    except ImportError:
        return
    if parallel._is_initialized and numba.threading_layer() == "omp":
        _serial_only = True


os.register_at_fork(after_in_child=_after_fork_in_child)


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
