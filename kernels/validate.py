"""Input checks that must cost almost nothing at the lesson's toy size."""

import math

from numba import njit

from .options import JIT, kernel
from .simd import panel_lanes, pload, psplat, vadd, vhsum, vmul
from .tiles import FINITE_BLOCK


@njit(cache=JIT["cache"], nogil=True)     # no fast-math: the check is about NaN and Inf
def all_finite(a):
    """True when no entry of ``a`` (any shape, any strides) is NaN or +-Inf.

    The API checks every input with this: a compiled loop with an early exit, cheaper at
    the toy size than numpy's isfinite(a).all() (two ufunc calls)."""
    for x in a.flat:
        if not math.isfinite(x):
            return False
    return True


@kernel(readonly=("a",))
def all_finite_flat(a):
    """all_finite for a C-contiguous 1-D ``a`` (the block's flat rows), a panel vector at a
    time: x * 0 is NaN exactly when x is NaN or +-Inf (else +-0), and a sum that meets a
    NaN stays NaN, so one comparison per FINITE_BLOCK elements decides: all_finite's early
    exit on every element keeps LLVM from vectorising it (docs/perf-log.md)."""
    P = panel_lanes(a)
    n = a.size
    body = n - n % P
    zero = psplat(a, 0.0)
    for b0 in range(0, body, FINITE_BLOCK):
        acc = zero
        for i in range(b0, min(body, b0 + FINITE_BLOCK), P):
            acc = vadd(acc, vmul(pload(a, i), zero))
        s = vhsum(acc)
        if s != s:
            return False
    for i in range(body, n):
        if not math.isfinite(a[i]):
            return False
    return True
