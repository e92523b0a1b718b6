"""The vocabulary head of a language model: logits = LN_f(H) @ E^T, E the tied token embedding.

E is (vocab, d): row v is token v's embedding, so the head's weight is E^T, (d, vocab),
in the lesson's row convention.  It is packed once (``pack_head``) into gemm's column
panels, panel p holding E[p*NR:(p+1)*NR, :]^T as a (d, NR) block, and the logits are
the GEMM of gemm.py's micro-kernel over those panels.

One compiled call (``head_parallel``, or ``head_serial`` with the same sums) runs:

  1. LN_f over the rows, a slice of rows per thread, into a (rows, d) scratch;
  2. the GEMM, in tasks of (a row block of at most HEAD_ROWS rows) x (a group of
     HEAD_PANELS column panels: tiles.py).  At GPT-2's size E^T is far past every cache:
     each row block streams all of it once, so the row blocks are large, and the panels
     are grouped so that gemm_panels prefetches the next panel's slice while one is in
     use.  With one row (a decode step, the last row's logits: a GEMV) a thread's share
     of the panels is one task: Numba's prange hands each thread a contiguous share
     anyway, and a call per group rounded a stored head's input again and restarted the
     stream; with more rows the groups stay, which keep a group's panels in L2 while the
     row tiles pass (docs/perf-log.md).

Each logit is written by exactly one task, with a fixed summation order (k blocks of KC),
so the result does not depend on the schedule.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .gemm import pack_b, packed_size, panel_width
from .layout import ceil_div, panels
from .options import build
from .records import Panels, Rows, Tile
from .simd import panel_lanes
from .stages import layernorm_piece
from .tiles import HEAD_PANELS, HEAD_ROWS
from .wgemm import as_head, floats, wgemm_block


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
    """The body of head_serial and head_parallel: out[0:rows, 0:vocab] = LN_f(X) @ E^T.  X: the flat (rows, d) stream; P = [gamma | beta]
    of LN_f (2d), or gamma alone (d) for an RMSNorm LN_f; Ep: pack_head's panels, or E's stored rows (qgemv.stored_view); out: the flat (rows, vocab) logits.  in_place:
    LN_f(X) is written over X (scratch of the caller's: a decode step then allocates
    nothing), else into a new buffer.  nthr: the threads the tasks are sized for (an
    argument: get_num_threads in here is uncacheable)."""
    xn = X if in_place else np.empty(rows * d, dtype=X.dtype)
    for t in prange(nthr):
        layernorm_piece(X, xn, t, nthr, rows, d, P, 0, d if P.size > d else -1, eps)   # -1: RMSNorm
    W = as_head(Ep, xn)                 # float panels, or stored rows (wgemm)
    NR = panel_lanes(floats(W))
    npn = panels(vocab, NR)
    nrb = ceil_div(rows, HEAD_ROWS)
    mc = ceil_div(rows, nrb)            # equal row blocks: 600 rows are 2 x 300, not 512 + 88
    per = HEAD_PANELS if rows > 1 else ceil_div(npn, nthr)      # one row: a task a thread
    groups = ceil_div(npn, per)
    for t in prange(nrb * groups):
        r0 = (t // groups) * mc
        p0 = (t % groups) * per
        wgemm_block(xn, Rows(0, d), W, Panels(0, d * NR, d, vocab), out, Rows(0, vocab),
                   Tile(r0, min(rows, r0 + mc), p0, min(npn, p0 + per)), False, -1)


# _head's builds, its prange loops run in turn (sized for nthr = 1) or on Numba's threads;
# standalone: kernels.decode calls them by address (their prange loops compile once)
head_serial = build(_head, "head_serial", standalone=True, readonly=("P", "Ep"))
head_parallel = build(_head, "head_parallel", parallel=True, standalone=True, readonly=("P", "Ep"))
