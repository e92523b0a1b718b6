"""The peak memory of one forward after warmup (tests/test_numba_runtime.py), Linux only:
python forward_memory.py.

Prints the peak RSS above the RSS before the call in MiB and whether the output is finite,
or "no-reset" where the kernel does not let a process reset its peak."""

import numpy as np

import tblock


def rss(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024


tblock.warmup()
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
