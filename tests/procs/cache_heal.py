"""One block through the numba backend beside the numpy oracle, and where its kernels came
from (tests/test_cache_fallback.py): python cache_heal.py [fsize BYTES | remount-ro | chmod-ro].

``fsize BYTES``: no file this process writes may grow past BYTES (RLIMIT_FSIZE, the
signal it raises ignored, so a write fails with EFBIG as on a full volume).  After tblock
is imported, ``remount-ro`` remounts the volume mounted at NUMBA_CACHE_DIR read-only (the
process must be root in a mount namespace of its own), and ``chmod-ro`` takes the write
permission off every folder in the cache (for a process that file modes bind).  Prints the cache folder, the largest
difference between the two backends, then how many of the kernels' signatures were loaded
from the cache and how many compiled."""

import os
import resource
import signal
import subprocess
import sys

import numpy as np

if sys.argv[1:2] == ["fsize"]:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

import tblock  # noqa: E402
from numba.core.dispatcher import Dispatcher  # noqa: E402
from tblock.kernels import cache  # noqa: E402

if sys.argv[1:2] == ["remount-ro"]:
    subprocess.run(["mount", "-o", "remount,ro", os.environ["NUMBA_CACHE_DIR"]], check=True)
if sys.argv[1:2] == ["chmod-ro"]:
    for folder, _, _ in os.walk(os.environ["NUMBA_CACHE_DIR"]):
        os.chmod(folder, 0o555)

cfg = tblock.BlockConfig(d_model=8, n_heads=2)
w = tblock.init_weights(cfg, seed=0)
H = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
diff = np.abs(tblock.forward(H, w, cfg, backend="numpy") - tblock.forward(H, w, cfg)).max()
kernels = {id(d): d for name, m in list(sys.modules.items()) if name.startswith("tblock.kernels.")
           for d in vars(m).values() if isinstance(d, Dispatcher)}.values()
print(cache.CACHE_PATH)
print(diff)
print(sum(sum(d.stats.cache_hits.values()) for d in kernels), sum(sum(d.stats.cache_misses.values()) for d in kernels))
