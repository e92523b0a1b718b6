"""A first forward with or without the compile-ahead helper (tblock.backends.numba.ahead):
argv[1] "waited" (start the helper for the call's signature, wait for it, then call) or
"alone" (TBLOCK_COMPILE_AHEAD=0 in the environment: the call compiles everything).  Prints
one JSON line: what start returned each time it was asked, whether the cache held the
signatures before and after, the cache hits and misses in this process of output_stages_task
and of layernorm_piece (the LN1 stage's, the helper's second kernel),
and the output's bytes as hex.  Run with NUMBA_CACHE_DIR set to an empty folder."""

import json
import sys

import numpy as np

import tblock
from tblock.backends.numba import ahead, forward, packing
from tblock.kernels.cache import holds
from tblock.kernels.stages import layernorm_piece
from tblock.kernels.tasks import output_stages_task

tblock.set_num_threads(2)
cfg = tblock.BlockConfig(d_model=32, n_heads=2, d_ff=64, norm="post", activation="relu")
w = tblock.init_weights(cfg, 0)
H = np.random.default_rng(0).standard_normal((1, 600, 32)).astype(np.float32)
scalars = packing.scalars_of(cfg)
few = forward.few_paths(H.shape, scalars)
signature = ahead.output_signature(np.float32, scalars, few)
norm = ahead.norm_signature(np.float32)
report = {"cached_before": holds(output_stages_task, signature) or holds(layernorm_piece, norm)}
if sys.argv[1] == "waited":
    helper = ahead.start(np.float32, scalars, few)
    report["started"] = helper is not None
    report["helper_rc"] = helper.wait(timeout=600) if helper else None
    report["cached_after_helper"] = holds(output_stages_task, signature) and holds(layernorm_piece, norm)
    report["started_again"] = ahead.start(np.float32, scalars, few) is not None
out = tblock.forward(H, w, cfg)
for name, kernel in (("", output_stages_task), ("norm_", layernorm_piece)):
    stats = kernel.stats
    report.update({name + "hits": sum(stats.cache_hits.values()), name + "misses": sum(stats.cache_misses.values())})
report["out"] = out.tobytes().hex()
print(json.dumps(report))
