"""One block on the numpy and the numba backends where Numba's cache may not be writable
(tests/test_cache_fallback.py): python read_only_cache.py [TEMPDIR].

TEMPDIR, when given, becomes the temporary directory (tempfile.tempdir) before tblock is
imported: a read-only one, where the test cannot make /tmp read-only.  Prints tblock's
file, the cache folder Numba chose (None when it caches nothing) and the largest
difference between the two backends."""

import sys
import tempfile

if len(sys.argv) > 1:
    tempfile.tempdir = sys.argv[1]

import numpy as np  # noqa: E402  (after the temporary directory is set)

import tblock  # noqa: E402
from tblock.kernels.validate import all_finite  # noqa: E402

cfg = tblock.BlockConfig(d_model=8, n_heads=2)
w = tblock.init_weights(cfg, seed=0)
H = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
diff = np.abs(tblock.forward(H, w, cfg, backend="numpy") - tblock.forward(H, w, cfg)).max()
print(tblock.__file__)
print(getattr(all_finite._cache, "_cache_path", None))      # Numba's NullCache has none
print(diff)
