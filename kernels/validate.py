"""Input checks that must cost almost nothing at the lesson's toy size."""

import math

from numba import njit

from .options import JIT


@njit(cache=JIT["cache"], nogil=True)     # no fast-math: the check is about NaN and Inf
def all_finite(a):
    """True when no entry of ``a`` (any shape, any strides) is NaN or +-Inf.

    The API checks every input with this: a compiled loop with an early exit, cheaper at
    the toy size than numpy's isfinite(a).all() (two ufunc calls)."""
    for x in a.flat:
        if not math.isfinite(x):
            return False
    return True
