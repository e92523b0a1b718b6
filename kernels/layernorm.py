"""Row LayerNorm (or RMSNorm) with the affine fused in."""

from __future__ import annotations

import math


from .options import kernel
from .simd import lanes, vadd, vfma, vhsum, vkeep, vload_n, vmul, vsplat, vstore_n, vsub


@kernel(readonly=("X", "P"))
def layernorm_rows(X, x, Y, y, rows, d, P, g_off, b_off, eps):
    """Y[r, :] = (X[r, :] - mean) / sqrt(var + eps) * gamma + beta for r < rows, the rows
    of X and Y at their Rows x and y (records.Rows).

    As the oracle: population variance (divide by d), eps inside the square root, two
    passes (mean, then squared deviations), so a constant row gives var = 0 and stays
    finite.  gamma = P[g_off:g_off+d], beta = P[b_off:b_off+d] (the identity 1 / 0 when
    the block has no LN affine, which changes no bit of the result).  Y may be X itself
    (in place).  Sums run in lanes (a vector of partial sums, then a pairwise tree), not
    one long chain.  b_off < 0: RMSNorm instead (rms_rows), gamma only."""
    if b_off < 0:
        rms_rows(X, x, Y, y, rows, d, P, g_off, eps)
        return
    x_off, ldx = x
    y_off, ldy = y
    W = lanes(X)
    zero = vsplat(X, 0.0)
    for r in range(rows):
        xo = x_off + r * ldx
        yo = y_off + r * ldy
        acc = zero
        for j in range(0, d, W):
            acc = vadd(acc, vload_n(X, xo + j, d - j))      # lanes past d load as 0
        mu = vhsum(acc) / d
        vmu = vsplat(X, mu)
        acc = zero
        for j in range(0, d, W):
            t = vkeep(vsub(vload_n(X, xo + j, d - j), vmu), d - j, 0.0)
            acc = vfma(t, t, acc)
        rstd = 1.0 / math.sqrt(vhsum(acc) / d + eps)
        vr = vsplat(X, rstd)
        for j in range(0, d, W):
            n = d - j
            t = vmul(vsub(vload_n(X, xo + j, n), vmu), vr)
            vstore_n(Y, yo + j, vfma(t, vload_n(P, g_off + j, n), vload_n(P, b_off + j, n)), n)


@kernel(readonly=("X", "P"))
def rms_rows(X, x, Y, y, rows, d, P, g_off, eps):
    """Y[r, :] = X[r, :] / sqrt(mean(X[r, :]^2) + eps) * gamma for r < rows (RMSNorm: no
    mean taken out, no beta), as layernorm_rows lays out its arguments; Y may be X."""
    x_off, ldx = x
    y_off, ldy = y
    W = lanes(X)
    zero = vsplat(X, 0.0)
    for r in range(rows):
        xo = x_off + r * ldx
        yo = y_off + r * ldy
        acc = zero
        for j in range(0, d, W):
            t = vload_n(X, xo + j, d - j)                   # lanes past d load as 0
            acc = vfma(t, t, acc)
        vr = vsplat(X, 1.0 / math.sqrt(vhsum(acc) / d + eps))
        for j in range(0, d, W):
            n = d - j
            vstore_n(Y, yo + j, vmul(vmul(vload_n(X, xo + j, n), vr), vload_n(P, g_off + j, n)), n)
