"""One implementation in a fresh process (bench/compare_peers.py's child):

    python child_peer.py probe NAME D HEADS T B THREADS
        build peer NAME and call it once: a peer that kills its process (OpenVINO 2026.4
        at d_model 8 under ONEDNN_MAX_CPU_ISA=AVX2: a segmentation fault) ends this child,
        not the run
    python child_peer.py memory NAME D HEADS T THREADS
        the peak RSS of one forward (NAME tblock or a peer, weights and input included)
        above the RSS after the imports, and for tblock after warmup() too: one JSON line
"""

import json
import sys
import time

import numpy as np

import tblock
from tblock import peers


def hwm():
    """The peak resident set size so far (VmHWM), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024


def probe(name, d, h, T, B, threads):
    cfg = tblock.BlockConfig(d_model=d, n_heads=h)
    H = np.zeros((B, T, d), np.float32)
    peers.build(name, tblock.init_weights(cfg, seed=0, dtype=np.float32), cfg, threads=threads, shape=H.shape)(H)


def memory(name, d, h, T, threads):
    if name != "tblock":
        ok, why = peers.peer_status(name)       # imports its libraries: part of the baseline
        if not ok:
            sys.exit(why)
    base_import = hwm()
    if name == "tblock":
        tblock.set_num_threads(threads)
        tblock.warmup()          # loads the compiled kernels (Numba and LLVM take memory too)
    base_warm = hwm()
    cfg = tblock.BlockConfig(d_model=d, n_heads=h)
    w = tblock.init_weights(cfg, seed=0, dtype=np.float32)
    H = np.random.default_rng(0).standard_normal((1, T, d)).astype(np.float32)
    t = time.perf_counter()
    if name == "tblock":
        out = tblock.forward(H, w, cfg, backend="numba")
    else:
        out = peers.build(name, w, cfg, threads=threads, shape=H.shape)(H)
    print(json.dumps({"base_import_mib": base_import, "base_warm_mib": base_warm, "peak_mib": hwm(),
                      "seconds": time.perf_counter() - t, "finite": bool(np.isfinite(out).all())}))


if __name__ == "__main__":
    job, name, numbers = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]]
    {"probe": probe, "memory": memory}[job](name, *numbers)
