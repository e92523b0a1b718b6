"""Compiler options shared by every kernel."""

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
