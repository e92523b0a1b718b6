"""A language model's vocabulary head on this backend: LN_f, then the tied embedding's GEMM.

The model hands its embedding once (prepare_head packs it in the GEMM's panels) and then
calls lm_head for any rows; the kernel is kernels.lm_head, serial below a size where the
pool's start costs more than it saves.
"""

from __future__ import annotations

import numpy as np

from ... import _runtime
from ...formats import QuantizedMatrix
from ...kernels.lm_head import head_parallel, head_serial, pack_head
from .packing import held_matrix
from .parallel import PARALLEL_MIN_FLOPS, parallel_call


def prepare_head(E, dtype) -> np.ndarray:
    """E (vocab, d) packed for the head kernel in ``dtype``: what lm_head and DecodeStep
    take; a stored E (a QuantizedMatrix of E^T, shape (d, vocab): one row a token) is read
    in place, its rows as they are stored (float32 logits), or with dot "int8" on a CPU
    with VNNI a copy of them in groups of 16 (kernels.qgroups), as a block's matrices."""
    if isinstance(E, QuantizedMatrix):
        return held_matrix(E)
    return pack_head(E, np.dtype(dtype))


def head_norm(ln_f: np.ndarray, d: int, rms: bool) -> np.ndarray:
    """LN_f's affine as kernels.lm_head takes it: [gamma | beta] (2d) for LayerNorm, gamma
    alone (d: a view) for RMSNorm."""
    return ln_f[:d] if rms else ln_f


def head_is_large(rows: int, shape: tuple[int, int]) -> bool:
    """Whether the head over ``rows`` rows of an embedding of ``shape`` (vocab, d) has the
    FLOPs to run in parallel (as a block does below its own threshold)."""
    vocab, d = shape
    return 2 * rows * d * vocab >= PARALLEL_MIN_FLOPS


def lm_head(H: np.ndarray, ln_f: np.ndarray, eps: float, head, out: np.ndarray, scratch: bool = False,
            rms: bool = False):
    """out (B, T, vocab) = LN_f(H) @ E^T for H (B, T, d); ln_f = [gamma | beta] (2d,); head:
    prepare_head(E).  scratch: H is the caller's to overwrite (LN_f goes over it).  rms:
    LN_f is RMSNorm, X / sqrt(mean(X^2) + eps) * gamma (ln_f's beta half unused)."""
    B, T, d = H.shape
    ln_f = head_norm(ln_f, d, rms)
    vocab = out.shape[-1]
    rows = B * T
    X = np.ascontiguousarray(H, dtype=out.dtype).reshape(rows * d)     # (B*T*d,) flat rows
    flat = out.reshape(rows * vocab)        # a view: the kernel writes the logits in place
    if not head_is_large(rows, (vocab, d)) or not _runtime.parallel_allowed():
        head_serial(X, rows, d, ln_f, eps, head, vocab, flat, scratch, 1)
    else:
        parallel_call(head_parallel, X, rows, d, ln_f, eps, head, vocab, flat, scratch, pass_threads=True)
    return out
