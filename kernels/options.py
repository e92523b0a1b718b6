"""Compiler options shared by every kernel."""

import types as pytypes

from numba.core import types
from numba.core.registry import CPUDispatcher

from .cache import CACHE_PATH

# Fast-math flags that keep IEEE NaN/Inf semantics: no "nnan", no "ninf", so a NaN or
# an infinity in the data still propagates and masked (-inf) scores still behave.
# "reassoc"/"contract" let LLVM vectorise reductions and fuse multiply-adds; "afn"
# allows approximate library calls, "arcp" x/y -> x*(1/y), "nsz" ignores the sign of 0.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

# Options of every kernel: cache (compiled code is written where tblock.kernels.cache found
# a writable folder; where there is none, Numba would refuse cache=True at import); nogil so
# that serial calls from several Python threads run at once; error_model="numpy" so x/0
# gives inf/nan instead of Python's branch and exception on every division.
JIT = dict(fastmath=FASTMATH, cache=CACHE_PATH is not None, nogil=True, error_model="numpy")


class KernelDispatcher(CPUDispatcher):
    """Numba's CPU dispatcher, except that a call from compiled code is typed without its
    literal constants: Numba would compile one copy of a kernel per combination of
    constant arguments at its call sites (the parallel block built gemm_panels nine
    times, for offsets of 0 and flags of True or False), each a full LLVM compile."""

    def get_call_template(self, args, kws):
        return super().get_call_template(tuple(types.unliteral(a) for a in args),
                                         {k: types.unliteral(v) for k, v in kws.items()})


def kernel(fn=None, **options):
    """``@njit(**JIT, **options)`` with a KernelDispatcher: the decorator of every kernel."""
    opts = {**JIT, **options, "nopython": True, "boundscheck": None}
    cache = opts.pop("cache")

    def wrap(f):
        disp = KernelDispatcher(py_func=f, locals={}, targetoptions=opts)
        if cache:
            disp.enable_caching()
        return disp
    return wrap(fn) if fn is not None else wrap


def serial_and_parallel(fn, name):
    """Two kernels of one body, ``{name}_serial`` and ``{name}_parallel`` (prange a plain
    loop in the first).  Numba names its cache files after the function's qualified name,
    so each copy gets its own; otherwise the two builds would overwrite each other's
    cache entries."""
    def copy(suffix, parallel):
        f = pytypes.FunctionType(fn.__code__, fn.__globals__, f"{name}_{suffix}", fn.__defaults__,
                                 fn.__closure__)
        f.__qualname__ = f.__name__
        f.__doc__ = fn.__doc__
        return kernel(f, parallel=parallel)
    return copy("serial", False), copy("parallel", True)
