"""Masked, max-subtracted softmax over the rows of a materialised score matrix.

The fused attention kernel does its own online softmax on tiles; this one is for the
trace path, which must return the full attention matrix."""

from __future__ import annotations

import math

import numpy as np

from .options import kernel

@kernel
def masked_softmax_rows(S, scale, causal, out):
    """out[i, :] = softmax_j(S[i, j] * scale) over the allowed j: every j, or j <= i when
    ``causal``.  A row with no allowed entry (or only -inf ones) gives zeros, never NaN.
    ``out`` may be ``S``."""
    R, N = S.shape
    buf = np.empty(N, dtype=np.float64)
    for i in range(R):
        m = -math.inf
        n = min(i + 1, N) if causal else N
        for j in range(N):
            v = S[i, j] * scale if j < n else -math.inf
            buf[j] = v
            if v > m:
                m = v
        if m == -math.inf:
            for j in range(N):
                out[i, j] = 0.0
            continue
        total = 0.0
        for j in range(N):
            e = math.exp(buf[j] - m)      # exp(-inf) = 0 for the masked entries
            buf[j] = e
            total += e
        for j in range(N):
            out[i, j] = buf[j] / total
