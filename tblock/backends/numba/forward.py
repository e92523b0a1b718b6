"""A forward pass of one block: one call into compiled code (kernels.block).

Validation happens in tblock.api; here the call is sized (serial or parallel build, by
its FLOPs) and made.  ``prepare_call`` gives the checked path the plain call it keeps
for repeat calls: anything unusual returns None and takes the checked path again.
"""

from __future__ import annotations

import numpy as np

from ... import _runtime
from ...kernels.block import block_parallel, block_serial, takes_few_paths
from ...kernels.validate import all_finite_flat
from . import ahead
from .packing import PLAN, forward_flops, plan_of
from .parallel import is_serial, parallel_call
from .trace import forward_trace


def prepare_call(weights, cfg):
    """The plain call (no trace, no cache) of these weights under this cfg, after the
    checked path has checked them against it (tblock.api keeps it on the weights): a
    function of H that gives H_out for an ndarray the checked path would take as it is
    (float32/float64 in native byte order, C-contiguous, aligned, (T, d_model) or (B, T,
    d_model), T and B >= 1); None for anything else, and for an H holding a NaN or an
    Inf: the checked path then gives the same result or raises.  A block small enough to
    run serially gets H as it came, 2-D or 3-D, writeable or not (four array types a
    dtype, all compiled by warmup): a view of it would cost the toy block's call more than
    the rest of this function; a larger one, the parallel build's (parallel_lane)."""
    d_model = cfg.d_model
    state = weights.prepared_state

    def call(H):
        plan = state.get((PLAN, H.dtype.char))     # made by the checked path, not here
        if plan is None or plan[0] is not cfg:
            return None
        shape = H.shape
        if len(shape) == 2:
            T, d = shape
            B = 1
        elif len(shape) == 3:
            B, T, d = shape
        else:
            return None
        _, flat, scalars, per_row, per_key = plan
        flags = H.flags
        if d != d_model or T == 0 or B == 0 or not (flags.c_contiguous and flags.aligned) or not H.dtype.isnative:
            return None
        if not is_serial(forward_flops(B, T, per_row, per_key, scalars[2])):
            return parallel_lane(H, flat, scalars)
        out = np.empty(shape, H.dtype)
        if block_serial(H, flat, out, scalars, 1) >= 0:
            return None
        return out
    return call


def parallel_lane(H, flat, scalars):
    """prepare_call's call for a block the parallel build runs: H as the checked path hands
    it over, a read-only (B, T, d_model) view (the array type warmup compiled), so a repeat
    call skips the checks that cost a few microseconds; None for an H holding a NaN or an Inf."""
    H3 = H.reshape((1,) + H.shape) if H.ndim == 2 else H[...]
    H3.flags.writeable = False
    out, bad = parallel_call(block_parallel, H3, flat, scalars, few_paths(H3.shape, scalars), pass_threads=True)
    if bad >= 0:
        return None
    return out[0] if H.ndim == 2 else out


def few_paths(shape, scalars):
    """block_parallel's ``few`` for an input of this (B, T, d) shape (kernels.block.takes_few_paths)."""
    B, T, d = shape
    return takes_few_paths(B * T, T, d // scalars[0], _runtime.get_num_threads())


def forward_batch(H, weights, cfg, trace):
    """The backend contract of tblock.api: H is a read-only C-contiguous (B, T, d_model)
    float32/float64 array; compute in H's dtype; return (H_out, trace dict or None), or
    (None, None) when H holds a NaN or an Inf (CHECKS_FINITE: the API then says where).
    Repeat plain calls usually come through prepare_call's function instead."""
    if trace:
        if not all_finite_flat(H.reshape(-1)):      # H: C-contiguous (the contract)
            return None, None
        return forward_trace(H, weights, cfg)
    if weights.quantized and H.dtype != np.float32:
        H = H.astype(np.float32)        # stored weights run in float32; the API casts H_out back
    _, flat, scalars, per_row, per_key = plan_of(weights, cfg, H.dtype)
    B, T, d = H.shape
    if is_serial(forward_flops(B, T, per_row, per_key, scalars[2])):
        # numpy's output array (a large block on one thread then holds it through the call)
        out = np.empty(H.shape, H.dtype)
        bad = block_serial(H, flat, out, scalars, 1)
    else:
        few = few_paths(H.shape, scalars)
        if not weights.quantized:
            ahead.start(H.dtype, scalars, few)      # a cold first call: its output half compiled beside it
        out, bad = parallel_call(block_parallel, H, flat, scalars, few, pass_threads=True)
    return (out, None) if bad < 0 else (None, None)
