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


def _canonical(t):
    """The type a kernel is compiled for when compiled code passes a ``t``: no literal
    constants, and every integer an intp."""
    t = types.unliteral(t)
    return types.intp if isinstance(t, types.Integer) else t


class KernelDispatcher(CPUDispatcher):
    """Numba's CPU dispatcher, except that a call from compiled code is typed canonically
    (_canonical), so that a kernel is compiled once per dtype, not once per combination of
    argument types at its call sites, each a full LLVM compile:

    * without literal constants: the parallel block built gemm_panels nine times, for
      offsets of 0 and flags of True or False;
    * every integer an intp: a parallel loop's index is an int64 while Numba types the
      function and a uint64 in the loop body it compiles, so every task called with its
      index was built twice;
    * the arrays a kernel only reads (its ``readonly`` parameters) read-only: a writeable
      array converts to a read-only one, so a scratch buffer and the caller's input share
      one build (micro_kernel was built three times)."""

    def get_call_template(self, args, kws):
        readonly = getattr(self, "readonly_positions", ())
        args = tuple(_canonical(a) for a in args)
        args = tuple(a.copy(readonly=True) if i in readonly and isinstance(a, types.Array) else a
                     for i, a in enumerate(args))
        return super().get_call_template(args, {k: _canonical(v) for k, v in kws.items()})


def kernel(fn=None, readonly=(), **options):
    """``@njit(**JIT, **options)`` with a KernelDispatcher: the decorator of every kernel.
    ``readonly``: names of array parameters the kernel never writes (typed read-only)."""
    opts = {**JIT, **options, "nopython": True, "boundscheck": None}
    cache = opts.pop("cache")

    def wrap(f):
        names = f.__code__.co_varnames[:f.__code__.co_argcount]
        unknown = set(readonly) - set(names)
        if unknown:
            raise TypeError(f"{f.__name__} has no parameters {sorted(unknown)}")
        disp = KernelDispatcher(py_func=f, locals={}, targetoptions=opts)
        disp.readonly_positions = tuple(names.index(n) for n in readonly)
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
