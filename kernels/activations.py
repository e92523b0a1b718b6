"""FFN hidden layer: bias + activation in one pass over a tile; the gated FFN's act(gate) * up."""

from __future__ import annotations

import math

from .options import kernel
from .records import with_part
from .simd import lanes, panel_lanes, vadd, vdiv, vexp, vload, vload_n, vmax, vmul, vsplat, vstore, vstore_n, vsub

GELU_TANH, GELU_ERF, RELU, SILU = 0, 1, 2, 3
ACTIVATION_CODES = {"gelu_tanh": GELU_TANH, "gelu_erf": GELU_ERF, "relu": RELU, "silu": SILU}

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@kernel
def _gelu_tanh_vec(x, c1, c2, one, neg_two):
    # 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
    # one exp instead of a tanh, and the limits come out exactly (x for u -> +inf,
    # -0 for u -> -inf, where exp gives +inf).
    u = vmul(vmul(x, c1), vadd(one, vmul(c2, vmul(x, x))))
    return vdiv(x, vadd(one, vexp(vmul(neg_two, u))))


@kernel
def _silu_vec(x, one):
    # x / (1 + exp(-x)): -0 for x -> -inf, where exp gives +inf, and x for x -> +inf
    return vdiv(x, vadd(one, vexp(vsub(vsplat(x, 0.0), x))))


@kernel
def act_vec(x, act):
    """act(x) of a vector (GELU_TANH, RELU or SILU; GELU_ERF is scalar: act_scalar)."""
    one = vsplat(x, 1.0)
    if act == GELU_TANH:
        return _gelu_tanh_vec(x, vsplat(x, _SQRT_2_OVER_PI), vsplat(x, 0.044715), one, vsplat(x, -2.0))
    if act == SILU:
        return _silu_vec(x, one)
    return vmax(vsplat(x, 0.0), x)


@kernel(readonly=("G",))
def gated_rows(G, g_off, ldg, rows, n, Y, y_off, ldy, act):
    """Y[r, c] = act(gate) * up for r < rows, c < n, from the [gate | up] panels of G (rows
    ldg apart from g_off): column c's gate at panel pair c // NR, lane c % NR, its up NR
    further (layout.ffn_cols).  Panels hold whole vectors, so no load straddles two."""
    W = lanes(G)
    NR = panel_lanes(G)
    for r in range(rows):
        go = g_off + r * ldg
        yo = y_off + r * ldy
        for c in range(0, n, W):
            m = min(W, n - c)
            src = go + c // NR * 2 * NR + c % NR
            if act == GELU_ERF:
                for j in range(m):
                    g = G[src + j]
                    Y[yo + c + j] = 0.5 * g * (1.0 + math.erf(g * _INV_SQRT2)) * G[src + NR + j]
                continue
            vstore_n(Y, yo + c, vmul(act_vec(vload_n(G, src, m), act), vload_n(G, src + NR, m)), m)


@with_part("gated")
def gated_rows_if_gated(G, g_off, ldg, rows, n, Y, y_off, ldy, dims):
    """gated_rows with the block's activation (dims.act), for a block with the gated FFN."""
    gated_rows(G, g_off, ldg, rows, n, Y, y_off, ldy, dims.act)


@kernel(readonly=("P",))
def bias_act_rows(X, x_off, ldx, rows, n, P, bias_off, act):
    """X[r, j] = act(X[r, j] + bias[j]) in place for r < rows, j < n; bias = P[bias_off:],
    zeros when the block has no FFN bias (x + 0 is exact).  act: GELU_TANH, GELU_ERF, RELU, SILU."""
    W = lanes(X)
    if act == GELU_ERF:
        # scalar erf: no vector erf of float64 accuracy here, and gelu_erf is not on
        # the benchmarked path
        for r in range(rows):
            o = x_off + r * ldx
            for j in range(n):
                x = X[o + j] + P[bias_off + j]
                X[o + j] = 0.5 * x * (1.0 + math.erf(x * _INV_SQRT2))
        return
    c1 = vsplat(X, _SQRT_2_OVER_PI)
    c2 = vsplat(X, 0.044715)
    one = vsplat(X, 1.0)
    neg_two = vsplat(X, -2.0)
    zero = vsplat(X, 0.0)
    for r in range(rows):
        o = x_off + r * ldx
        j = 0
        while j < n:
            m = n - j
            if m >= W:
                x = vadd(vload(X, o + j), vload(P, bias_off + j))
            else:
                x = vadd(vload_n(X, o + j, m), vload_n(P, bias_off + j, m))
            if act == GELU_TANH:
                y = _gelu_tanh_vec(x, c1, c2, one, neg_two)
            elif act == SILU:
                y = _silu_vec(x, one)
            else:
                # max(0, x): "0 > x ? 0 : x", so a NaN passes through as in np.maximum
                y = vmax(zero, x)
            if m >= W:
                vstore(X, o + j, y)
            else:
                vstore_n(X, o + j, y, m)
            j += W
