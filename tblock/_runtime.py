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

Fork while another thread compiles.  Numba compiles under one process-wide lock; a child
forked while another thread held it would inherit it held by a thread that does not exist
there, and its first compile (or load from the cache) would wait forever.  So a fork
waits for the compile in progress to end (up to FORK_WAIT_S seconds), holding Numba's
compiler lock and LLVM's lock across it, as CPython holds its import lock.  Where the wait
runs out (a compile that long, or one waiting on the forking thread), the fork goes ahead
and the child refuses to compile with a RuntimeError saying why, instead of hanging; what
it already compiled still runs.  This covers every fork of the process, tblock's or not.

Threads.  One count for the whole process, applied by the backend to every parallel call,
from whichever Python thread it comes: Numba's own setting is per thread.  At start it is
NUMBA_NUM_THREADS, else OMP_NUM_THREADS, else every CPU Numba sees.  ``threads(n)``
blocks are process-wide too, and may overlap across Python threads: each open block is an
entry in one list, in the order entered, and the count in force is the newest open
block's, or with none open the count ``set_num_threads`` last set.  Leaving a block removes
its own entry only, so after every block has exited, in any order, the count is the
process's again.  ``set_num_threads`` inside a block changes that block's count (the
caller's innermost open block), as it always did in one thread.  Nothing here starts
Numba's pool (tblock.peers.import_early needs that).
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import os
import sys
import threading
import warnings


_serial_only = False
FORK_WAIT_S = 120.0         # how long a fork waits for another thread's compile to end


def serial_only() -> bool:
    """True in a child forked after this process ran parallel code on the GNU OpenMP
    layer: there, parallel code would kill the child."""
    return _serial_only


def parallel_allowed() -> bool:
    """Whether a parallel call may run now: more than one thread set, and not in a child
    forked after the OpenMP pool ran (serial_only)."""
    return _threads > 1 and not _serial_only


class _CompileRefused:
    """Numba's compiler lock in a child forked while another thread compiled too long to
    wait for: the lock's holder does not exist here, so compiling is refused, not hung."""

    def acquire(self, *args, **kwargs):
        raise RuntimeError("tblock: this process was forked while another thread was compiling with "
                           f"Numba (for longer than tblock._runtime.FORK_WAIT_S = {FORK_WAIT_S:g} s), so "
                           "Numba's compiler lock is held by a thread that does not exist here and nothing "
                           "can be compiled in this process; code compiled before the fork still runs. "
                           "Fork before starting threads that compile, or use the spawn or forkserver "
                           "start method")

    def release(self):
        pass

    def _is_owned(self):
        return False


_held = threading.local()    # the locks the forking thread took before the fork, and missed


def _fork_locks() -> list:
    """Numba's compiler lock and LLVM's, each as the object holding it in ``_lock``, in
    the order a compile takes them; none where Numba was never imported (a fork hook must
    not import it)."""
    compiler = sys.modules.get("numba.core.compiler_lock")
    ffi = sys.modules.get("llvmlite.binding.ffi")
    owners = [compiler.global_compiler_lock] if compiler is not None else []
    if ffi is not None and isinstance(getattr(ffi.lib, "_lock", None), ffi._LLVMLock):
        owners.append(ffi.lib._lock)
    return [o for o in owners if not isinstance(o._lock, _CompileRefused)]    # refused here: stays so


def _before_fork() -> None:
    # waits for another thread's compile to end, so the child inherits free locks
    _held.taken, _held.missed = [], []
    for owner in _fork_locks():
        (_held.taken if owner._lock.acquire(timeout=FORK_WAIT_S) else _held.missed).append(owner)
    _lock.acquire()
    _held.count_lock = _lock


def _after_fork_in_parent() -> None:
    if getattr(_held, "count_lock", None) is not None:
        _held.count_lock.release()
    for owner in reversed(getattr(_held, "taken", [])):
        owner._lock.release()
    _held.taken, _held.missed, _held.count_lock = [], [], None


def _after_fork_in_child() -> None:
    global _serial_only, _lock
    _lock = threading.Lock()
    me = threading.get_ident()      # the forking thread's blocks are the only ones left here
    _open[:] = [b for b in _open if b[1] == me]
    _update()
    for owner in reversed(getattr(_held, "taken", [])):
        owner._lock.release()
    for owner in getattr(_held, "missed", []):      # held by a thread not here: refuse, never hang
        owner._lock = _CompileRefused()
    _held.taken, _held.missed, _held.count_lock = [], [], None
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if parallel is not None and parallel._is_initialized and sys.modules["numba"].threading_layer() == "omp":
        _serial_only = True


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not on Linux
        return os.cpu_count() or 1


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


_base = _initial()          # set_num_threads' count, in force while no threads() block is open
_threads = _base            # the count in force (the backend reads it on every call)
_open = []                  # the open threads() blocks, oldest first: [n, owner thread id]
_lock = threading.Lock()
_innermost = contextvars.ContextVar("tblock_threads_block", default=None)   # the caller's own


def _update() -> None:
    # under _lock: the newest open block's count, else the process's
    global _threads
    _threads = _open[-1][0] if _open else _base


def set_num_threads(n: int) -> None:
    """Run the numba backend's parallel calls on ``n`` threads, from every Python thread,
    until changed (1 <= n <= NUMBA_NUM_THREADS).  Inside a ``threads()`` block of the
    calling thread it changes that block's count, which ends with the block."""
    global _base
    n = _check("n", n)
    with _lock:
        mine = _innermost.get()
        if mine is not None and any(b is mine for b in _open):
            mine[0] = n
        else:
            _base = n
        _update()


def get_num_threads() -> int:
    """The thread count the numba backend's parallel calls use (see set_num_threads)."""
    return _threads


@contextlib.contextmanager
def threads(n: int):
    """``with tblock.threads(n):`` the count is ``n`` for the body, in every Python thread.
    Blocks may overlap across threads: the newest open one's count is in force, and once
    all have exited the count is set_num_threads' again, whatever the order of exits."""
    block = [_check("n", n), threading.get_ident()]
    with _lock:
        _open.append(block)
        _update()
    outer = _innermost.set(block)
    try:
        yield block[0]
    finally:
        with _lock:
            for i in range(len(_open) - 1, -1, -1):
                if _open[i] is block:       # identity: another block may hold the same count
                    del _open[i]
                    break
            _update()
        try:
            _innermost.reset(outer)
        except ValueError:                  # exited in another context (an async task's)
            pass


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
