"""Compiler options shared by every kernel."""

# Fast-math flags that keep IEEE NaN/Inf semantics: no "nnan", no "ninf", so a NaN or
# an infinity in the data still propagates and masked (-inf) scores still behave.
# "reassoc"/"contract" let LLVM vectorise reductions and fuse multiply-adds; "afn"
# allows approximate library calls, "arcp" x/y -> x*(1/y), "nsz" ignores the sign of 0.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

# Options of every kernel: cache=True (compiled code is written next to the sources in
# __pycache__, or, where that is read-only, in Numba's per-user cache directory, or in
# NUMBA_CACHE_DIR when set); nogil so that serial calls from several Python threads
# run at once; error_model="numpy" so x/0 gives inf/nan instead of Python's branch
# and exception on every division.
JIT = dict(fastmath=FASTMATH, cache=True, nogil=True, error_model="numpy")
