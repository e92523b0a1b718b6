"""The serial and the parallel block in a process that may load them from Numba's cache
(tests/test_numba_runtime.py), run with NUMBA_CACHE_DIR set: python cached_block.py.

Prints the cache hits of the two blocks; when they were compiled here (no hits), whether
the parallel block and its body call their kernels by address and whether a stage task
was linked into them ("-" otherwise); the largest relative error against the oracle."""

import re

import numpy as np

import tblock
from tblock.kernels.block import block_parallel, block_serial, one_block_parallel

cfg = tblock.BlockConfig(d_model=24, n_heads=3)
w = tblock.init_weights(cfg, 1)
errs = []
for T in (3, 2000):                             # the serial and the parallel block
    H = np.random.default_rng(T).standard_normal((T, 24)).astype(np.float32)
    y = tblock.forward(H, w, cfg, backend="numba")
    ref = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy")
    errs.append(float(np.abs(y - ref).max() / np.abs(ref).max()))
hits = sum(block_parallel.stats.cache_hits.values()) + sum(block_serial.stats.cache_hits.values())
by_address = linked = "-"
if hits == 0:                                   # inspection works on freshly compiled code only
    outer = next(iter(block_parallel.overloads.values())).library.get_llvm_str()
    ir = next(iter(one_block_parallel.overloads.values())).library.get_llvm_str()
    by_address = (re.search(r'declare [^@]*@"?tblock\.kernel\.one_block_parallel\.', outer) is not None
                  and re.search(r'declare [^@]*@"?tblock\.kernel\.attention_stages_task\.', ir) is not None)
    linked = any("qkv_task" in f for f in re.findall(r'^define [^@]*@"?([^"(]+)', outer + ir, re.M))
print(hits, by_address, linked, max(errs))
