"""The vocabulary head of a language model: logits = LN_f(H) @ E^T, E the tied token embedding.

E is (vocab, d): row v is token v's embedding, so the head's weight is E^T, (d, vocab),
in the lesson's row convention.  It is packed once (``pack_head``) into gemm's column
panels, panel p holding E[p*NR:(p+1)*NR, :]^T as a (d, NR) block, and the logits are
the GEMM of gemm.py's micro-kernel over those panels.

One compiled call (``head_parallel``, or ``head_serial`` with the same sums) runs:

  1. LN_f over the rows, a slice of rows per thread, into a (rows, d) scratch;
  2. the GEMM, in tasks of (a row block of at most HEAD_ROWS rows) x (a group of
     HEAD_PANELS column panels).  At GPT-2's size E^T is 147 MiB of float32, far past
     every cache: each row block streams all of it once, so the row blocks are large
     (a 512-row block does ~200 FLOPs per byte of E read), and the panels are grouped
     so that gemm_panels prefetches the next panel's slice while one is in use.  With
     ~100 groups per row block the two threads stay balanced under dynamic scheduling.

Each logit is written by exactly one task, with a fixed summation order (k blocks of KC),
so the result does not depend on the schedule.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .gemm import KC, gemm_block, pack_b, packed_size, panel_width
from .layout import ceil_div, panels
from .options import serial_and_parallel
from .simd import panel_lanes
from .stages import layernorm_piece

HEAD_ROWS = 512     # rows per task at most: the A slice (512 x KC, 256 KiB) and the C panel
                    # (512 x NR, 128 KiB) stay in L2 while a panel's slices pass
HEAD_PANELS = 8     # column panels per task: 512 columns (avx512, float32), 98 groups for GPT-2


def pack_head(E: np.ndarray, dtype) -> np.ndarray:
    """E (vocab, d) packed as the panels of E^T, (d, vocab), in a read-only flat array of
    ``dtype`` whose data starts on a 64-byte boundary (the micro-kernel reads whole panel rows)."""
    dtype = np.dtype(dtype)
    vocab, d = E.shape
    n = packed_size(d, vocab, panel_width(dtype))
    raw = np.empty(n + 64 // dtype.itemsize, dtype=dtype)
    start = (-raw.ctypes.data % 64) // dtype.itemsize
    flat = raw[start:start + n]
    pack_b(np.asarray(E, dtype=dtype).T, flat)      # E^T: a (d, vocab) view, copied panel by panel
    flat.flags.writeable = False
    return flat


def _head(X, rows, d, P, eps, Ep, vocab, out, in_place, nthr):
    """out[0:rows, 0:vocab] = LN_f(X) @ E^T.  X: the flat (rows, d) stream; P = [gamma | beta]
    of LN_f (2d); Ep: pack_head's panels; out: the flat (rows, vocab) logits.  in_place:
    LN_f(X) is written over X (scratch of the caller's: a decode step then allocates
    nothing), else into a new buffer.  nthr: the threads the tasks are sized for (an
    argument: get_num_threads in here is uncacheable)."""
    xn = X if in_place else np.empty(rows * d, dtype=X.dtype)
    for t in prange(nthr):
        layernorm_piece(X, xn, t, nthr, rows, d, P, 0, d, eps)
    npn = panels(vocab, panel_lanes(Ep))
    groups = ceil_div(npn, HEAD_PANELS)
    nrb = ceil_div(rows, HEAD_ROWS)
    mc = ceil_div(rows, nrb)            # equal row blocks: 600 rows are 2 x 300, not 512 + 88
    for t in prange(nrb * groups):
        r0 = (t // groups) * mc
        p0 = (t % groups) * HEAD_PANELS
        gemm_block(xn, 0, d, r0, min(rows, r0 + mc), Ep, 0, d, vocab, p0, min(npn, p0 + HEAD_PANELS),
                   out, 0, vocab, False, KC, -1)


# standalone: kernels.decode calls them by address (their prange loops compile once)
head_serial, head_parallel = serial_and_parallel(_head, "head", standalone=True, readonly=("P", "Ep"))
