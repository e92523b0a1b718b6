"""Which stored-format kernels a process compiled: argv[1] is the format its block and
head run in ("fp32", "bf16", "int8" or "int4"), argv[2] (optional, "fp32" unless given)
their dot ("fp32", "int8" or "bf16"); prints one JSON line, kernel -> builds.  Run with NUMBA_CACHE_DIR set to an
empty folder (tests/test_formats_numba.py)."""

import json
import sys

import numpy as np

import tblock
from tblock.backends.numba import lm_head, prepare_head
from tblock.formats import quantize_matrix
from tblock.kernels import bgemm, igemm, qdot, qgemv, qgroups, wgemm

fmt = sys.argv[1]
dot = sys.argv[2] if len(sys.argv) > 2 else "fp32"
cfg = tblock.BlockConfig(d_model=64, n_heads=2, d_ff=128)
w = tblock.quantize(tblock.init_weights(cfg, 0), fmt, dot=dot)
H = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
tblock.forward(H, w, cfg)
tblock.forward(H, w, cfg, cache=tblock.KVCache(cfg, 8, 1, np.float32))
E = np.random.default_rng(1).standard_normal((100, 64)).astype(np.float32)
head = prepare_head(E if fmt == "fp32" else quantize_matrix(E.T, fmt, dot=dot), np.float32)
lm_head(H[None], np.ones(128, np.float32), 1e-5, head, np.empty((1, 5, 100), np.float32))
kernels = {"stored_gemm": wgemm.stored_gemm, "dot_rows": qgemv.dot_rows, "dot_q8": qgemv.dot_q8,
           "dot_q4": qgemv.dot_q4, "gemv_int8": qdot.gemv_int8, "round_blocks": qdot.round_blocks,
           "rounded_rows": qdot.rounded_rows, "stored_bgemm": wgemm.stored_bgemm, "bgemm_panels": bgemm.bgemm_panels,
           "bgemm_packed": bgemm.bgemm_packed, "bf16_rows": bgemm.bf16_rows, "pack_pairs": bgemm.pack_pairs,
           "paired_bgemm": wgemm.paired_bgemm,
           "stored_igemm": wgemm.stored_igemm, "igemm": igemm.igemm, "gemv_groups": qgroups.gemv_groups,
           "group_columns": qgroups.group_columns}
print(json.dumps({name: len(k.overloads) for name, k in kernels.items()}))
