"""Row LayerNorm with the affine fused in."""

from __future__ import annotations

import math

from numba import njit

from .options import FASTMATH


@njit(fastmath=FASTMATH, cache=True, nogil=True)
def layernorm_rows(X, x_off, ldx, Y, y_off, ldy, rows, d, P, g_off, b_off, eps):
    """Y[r, :] = (X[r, :] - mean) / sqrt(var + eps) * gamma + beta for r < rows.

    As the oracle: population variance (divide by d), eps inside the square root.
    X[r, j] = X.flat[x_off + r*ldx + j], likewise Y; gamma = P[g_off : g_off + d],
    beta = P[b_off : b_off + d] (the identity 1 / 0 when the block has no LN affine,
    which changes no bit of the result).  Y may be X itself (in place).

    The mean and variance are accumulated in float64 whatever the dtype: a float32 sum
    over d = 768 terms would otherwise cost ~1e-6 relative; two passes (mean, then the
    squared deviations) so that a constant row gives var = 0 and stays finite."""
    for r in range(rows):
        xo = x_off + r * ldx
        yo = y_off + r * ldy
        s = 0.0
        for j in range(d):
            s += X[xo + j]
        mu = s / d
        v = 0.0
        for j in range(d):
            t = X[xo + j] - mu
            v += t * t
        rstd = 1.0 / math.sqrt(v / d + eps)
        for j in range(d):
            Y[yo + j] = (X[xo + j] - mu) * rstd * P[g_off + j] + P[b_off + j]
