"""Rotary positions (Hugging Face's rotate-half): Q's and K's heads turned by their token's position.

In each head of d_k columns, the pair (x_j, x_{j + d_k/2}), j < d_k/2, of the token at
absolute position t turns by the angle

    a(t, j) = (t / rope_scale) * inv_freq_j,   inv_freq_j = 1 / rope_theta^(2j / d_k)

    x_j <- x_j cos a - x_{j+d_k/2} sin a,   x_{j+d_k/2} <- x_{j+d_k/2} cos a + x_j sin a

A call makes the table of its rows' cos and sin once (``rope_table``: angles, cos and sin
in float64, without fast-math, then stored in the compute dtype) and every block of the
call reads it: row i of a sequence is token first + i (first: the tokens cached before
the call).  Q and K are turned after their biases; the KV cache holds the keys turned.
The block turns them where the projection stage left them: rows of Q and K side by side
(``rotate_rows``, the untiled and the cached paths) or K packed as K^T panels
(``rotate_kt``, attention's layout for long sequences).
"""

from __future__ import annotations

import math

from .layout import panels
from .options import kernel
from .simd import lanes, panel_lanes, vfma, vload_n, vmul, vstore_n, vsub


@kernel(fastmath=False)
def rope_table(out, T, dk, first, theta, scale):
    """out[i*dk + j] = cos a(first + i, j), out[i*dk + dk/2 + j] = sin a(first + i, j) for
    i < T, j < dk/2 (module docstring), computed in float64 and stored in out's dtype."""
    half = dk // 2
    for j in range(half):
        inv = 1.0 / theta ** (j * 2.0 / dk)
        for i in range(T):
            a = ((first + i) / scale) * inv
            out[i * dk + j] = math.cos(a)
            out[i * dk + half + j] = math.sin(a)


@kernel(readonly=("R",))
def rotate_rows(X, off, ld, rows, heads, dk, R, r0):
    """Turn ``heads`` consecutive heads of rows X.flat[off + i*ld ...], i < rows, in place,
    row i at table row r0 + i of R (rope_table)."""
    W = lanes(X)
    half = dk // 2
    for i in range(rows):
        rc = (r0 + i) * dk
        for h in range(heads):
            o = off + i * ld + h * dk
            for j in range(0, half, W):
                n = half - j
                x1 = vload_n(X, o + j, n)
                x2 = vload_n(X, o + half + j, n)
                c = vload_n(R, rc + j, n)
                s = vload_n(R, rc + half + j, n)
                vstore_n(X, o + j, vsub(vmul(x1, c), vmul(x2, s)), n)
                vstore_n(X, o + half + j, vfma(x1, s, vmul(x2, c)), n)


@kernel(readonly=("R",))
def rotate_kt(Kt, base, T, dk, R):
    """Turn the T keys of one head packed as K^T panels at Kt[base:] (attention.pack_kt:
    key t's column c at panel t // NR, row c, lane t % NR) in place, key t at table row t."""
    NR = panel_lanes(Kt)
    half = dk // 2
    for p in range(panels(T, NR)):
        pb = base + p * dk * NR
        for lane in range(min(NR, T - p * NR)):
            rc = (p * NR + lane) * dk
            for j in range(half):
                i1 = pb + j * NR + lane
                i2 = pb + (half + j) * NR + lane
                x1 = Kt[i1]
                x2 = Kt[i2]
                c = R[rc + j]
                s = R[rc + half + j]
                Kt[i1] = x1 * c - x2 * s
                Kt[i2] = x2 * c + x1 * s
