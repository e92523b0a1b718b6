"""The peak memory of one forward after a warm-up call (tests/test_numba_runtime.py), Linux
only: python forward_memory.py.

Prints the peak RSS above the RSS before the call in MiB and whether the output is finite,
or "no-reset" where the kernel does not let a process reset its peak."""

import numpy as np

import tblock


def rss(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024


# the build the measured call takes (as many rows, for any thread count:
# kernels.block.takes_few_paths), compiled or loaded by a narrow call whose freed buffers
# are too small to serve the measured one's (not warmup(), which compiles every build)
small = tblock.BlockConfig(d_model=64, n_heads=4)
tblock.forward(np.zeros((4096, 64), np.float32), tblock.init_weights(small, seed=1, dtype=np.float32), small)
cfg = tblock.BlockConfig(d_model=768, n_heads=12)
w = tblock.init_weights(cfg, seed=0, dtype=np.float32)
H = np.random.default_rng(0).standard_normal((4096, 768)).astype(np.float32)
try:
    with open("/proc/self/clear_refs", "w") as f:   # "5" resets the peak (VmHWM) to now
        f.write("5")
except OSError:
    print("no-reset")
    raise SystemExit
before = rss("VmRSS")
out = tblock.forward(H, w, cfg)
print(rss("VmHWM") - before, bool(np.isfinite(out).all()))
