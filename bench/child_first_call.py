"""One first call in a fresh process (bench/first_call.py's child), its Numba cache folder
set by NUMBA_CACHE_DIR: python child_first_call.py JOB D_MODEL T.

JOB forward: `import tblock`, then the first tblock.forward on a (T, D_MODEL) float32 input
of random weights; JOB warmup: tblock.warmup().  Prints one JSON line: the import's time,
the job's wall and CPU time, the signatures Numba compiled and loaded, the peak RSS."""

import time

t0 = time.perf_counter()            # before every import: the import's time is measured

import gc  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import tblock  # noqa: E402  # isort: skip  (before Numba: it sets Numba's target first)
from numba.core.registry import CPUDispatcher  # noqa: E402  # isort: skip

t1 = time.perf_counter()
job, d, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c0, w0 = time.process_time(), time.perf_counter()
if job == "warmup":
    tblock.warmup()
else:
    cfg = tblock.BlockConfig(d_model=d, n_heads=d // 64, d_ff=4 * d)
    w = tblock.init_weights(cfg, seed=0, dtype=np.float32)
    H = np.random.default_rng(0).standard_normal((T, d)).astype(np.float32)
    c0, w0 = time.process_time(), time.perf_counter()
    tblock.forward(H, w, cfg)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
stats = [o.stats for o in gc.get_objects() if isinstance(o, CPUDispatcher)]
print(json.dumps({"import_s": t1 - t0, "wall_s": wall, "cpu_s": cpu,
                  "compiled": sum(sum(s.cache_misses.values()) for s in stats),
                  "loaded": sum(sum(s.cache_hits.values()) for s in stats),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
