"""Masked, max-subtracted softmax over the rows of a materialised score matrix.

The fused attention kernel does its own online softmax on tiles; this one is for the
trace path (which must return the full attention matrix) and for testing masking."""

from __future__ import annotations

import math

import numpy as np

from .options import kernel

NO_MASK, CAUSAL, ADDITIVE, BOOLEAN = 0, 1, 2, 3


@kernel
def masked_softmax_rows(S, scale, mask_kind, mask_add, mask_keep, out):
    """out[i, :] = softmax_j(S[i, j] * scale (+ mask)) over the allowed j.

    mask_kind: NO_MASK; CAUSAL (j <= i); ADDITIVE (mask_add[i, j] is added, -inf drops
    the entry); BOOLEAN (mask_keep[i, j] True keeps it).  The arrays of the unused kinds
    may be any (1, 1) placeholders.  A row with no allowed entry (or only -inf ones)
    gives zeros, never NaN.  ``out`` may be ``S``."""
    R, N = S.shape
    buf = np.empty(N, dtype=np.float64)
    for i in range(R):
        m = -math.inf
        for j in range(N):
            v = -math.inf
            if mask_kind == NO_MASK:
                v = S[i, j] * scale
            elif mask_kind == CAUSAL:
                if j <= i:
                    v = S[i, j] * scale
            elif mask_kind == ADDITIVE:
                v = S[i, j] * scale + mask_add[i, j]
            elif mask_keep[i, j]:
                v = S[i, j] * scale
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
