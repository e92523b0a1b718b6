"""Compile ahead: a second process compiles the block's output half while a first call
compiles the rest.

Numba compiles one function at a time in a process.  A cold first call of the parallel
block spends about a third of its compile on the output half (kernels.tasks'
output_stages_task: W_O, the FFN and their GEMMs); a helper process started with the
call compiles that kernel for the signature the call will use and writes it to Numba's
cache, and the call, when its typing reaches the kernel, loads it from there
(docs/perf-log.md).  Should the call get there first, it compiles the kernel itself, as
without a helper.  The helper then compiles the LN1 stage's layernorm_piece, the last
kernel the call's attention half reaches, while the call is still on the ones before it.

A helper starts only where it can help: float weights, a writable kernel cache
(kernels.cache.CACHE_PATH) not yet holding that signature, two or more usable CPUs, once
a signature a process; TBLOCK_COMPILE_AHEAD=0 turns it off.  It is a child process of
its own (``python -m tblock.backends.numba.ahead``), its output discarded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
from numba import typeof, types

from ..._runtime import usable_cores
from ...kernels.cache import CACHE_PATH, holds
from ...kernels.records import Dims, Grid, Output
from ...kernels.stages import layernorm_piece
from ...kernels.tasks import output_stages_task

_started: set = set()
_lock = threading.Lock()


def output_signature(dtype, scalars: tuple, few) -> tuple:
    """output_stages_task's argument types in block_parallel's call on float weights of
    ``dtype`` with the block's scalar arguments (packing.scalars_of), as _one_block types
    them: stage and task, H and the weights (read-only), the records, few (True or None)."""
    a = np.empty(0, dtype)
    frozen = typeof(a).copy(readonly=True)
    p = np.empty(0, np.uint32)          # no bf16 pairs: float weights
    output = typeof(Output(a, 0, a, a, a, 0, 0, a, p, p))
    return (types.int64, types.int64, frozen, frozen, typeof(Dims(0, 0, *scalars)), typeof(Grid(0, 0, 0)),
            output, typeof(few))


def norm_signature(dtype) -> tuple:
    """layernorm_piece's argument types in attention_stages_task's LN1 stage on float
    weights of ``dtype``: every array read-only as _one_block types them (the LN1 rows
    unify with H, a read-only input), the piece's integers and eps."""
    frozen = typeof(np.empty(0, dtype)).copy(readonly=True)
    return (frozen, frozen) + (types.int64,) * 4 + (frozen, types.int64, types.int64, types.float64)


def start(dtype, scalars: tuple, few) -> subprocess.Popen | None:
    """Start the helper for a call of block_parallel on float weights of ``dtype`` (see the
    module's text for when it starts); the helper's process, or None."""
    key = (np.dtype(dtype).char, scalars, few)
    if key in _started:             # every later call of the signature: no more than this
        return None
    with _lock:
        if key in _started:
            return None
        _started.add(key)
    if os.environ.get("TBLOCK_COMPILE_AHEAD", "1") == "0" or CACHE_PATH is None or usable_cores() < 2:
        return None
    try:
        if holds(output_stages_task, output_signature(dtype, scalars, few)):
            return None
    except Exception:           # an index Numba cannot read: the call compiles as without a helper
        return None
    args = [sys.executable, "-m", __name__, np.dtype(dtype).str, repr(scalars), repr(few)]
    try:
        helper = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    except OSError:             # no interpreter to start (a frozen application): compile as without
        return None
    threading.Thread(target=helper.wait, daemon=True).start()       # reaps it
    return helper


def main(argv: list[str]) -> None:
    """The helper: compile output_stages_task for (dtype, scalars, few) as given by start,
    then the LN1 stage's layernorm_piece, which the call reaches last of its attention half."""
    import ast
    dtype, scalars, few = np.dtype(argv[0]), ast.literal_eval(argv[1]), ast.literal_eval(argv[2])
    output_stages_task.compile(output_signature(dtype, scalars, few))
    layernorm_piece.compile(norm_signature(dtype))


if __name__ == "__main__":
    main(sys.argv[1:])
