"""A vector path chosen in a fresh interpreter (tests/test_isa.py): python isa_paths.py CHECK.

The path is a process-wide choice made when tblock.kernels is imported, so the test sets
TBLOCK_ISA / NUMBA_CPU_NAME in this process's environment and reads what it prints.

    worked     the worked example through the numba backend in float64 and float32: a JSON
               line of the path, its lanes, whether it was forced, the LLVM cpu, the outputs
    bad_isa    the backends available, tblock.isa()'s error, a numpy forward's shape, the
               numba forward's error (under an unknown TBLOCK_ISA)
    isa        prints tblock.isa() (exits with its error when the path is refused)
    narrow     Numba compiles something before tblock is imported, then tblock.isa()
    cached     one cached kernel's call: a JSON line of its cache hits, misses, folder and
               the path's key
"""

import json
import sys

import numpy as np


def worked():
    from numba import njit

    import tblock
    from tblock.kernels import isa
    from tblock.kernels.simd import lanes
    ex = tblock.load_worked_example()
    out = tblock.forward(ex.H_in, ex.weights, ex.cfg)
    out32 = tblock.forward(ex.H_in.astype(np.float32), ex.weights, ex.cfg)
    w = njit(lambda x: lanes(x))(np.zeros(1, np.float32))
    print(json.dumps(dict(isa=tblock.isa(), lanes=int(w), forced=isa.PATH.forced, cpu=isa.PATH.cpu,
                          out=out.tolist(), out32=out32.astype(float).tolist())))


def bad_isa():
    import tblock
    print(tblock.available_backends())
    try:
        tblock.isa()
    except ValueError as e:
        print("isa:", e)
    cfg = tblock.BlockConfig(d_model=8, n_heads=2)
    w = tblock.init_weights(cfg, seed=0)
    H = np.ones((3, 8), np.float32)
    print(tblock.forward(H, w, cfg, backend="numpy").shape)
    try:
        tblock.forward(H, w, cfg)
    except ValueError as e:
        print("forward:", type(e).__name__, e)


def isa():
    import tblock
    print(tblock.isa())


def narrow():
    from numba import njit
    njit(lambda x: x + 1)(1)          # Numba's target is fixed from here on
    import tblock
    tblock.isa()


def cached():
    from tblock.kernels import isa
    from tblock.kernels.layernorm import layernorm_rows
    from tblock.kernels.records import Rows
    X = np.arange(24, dtype=np.float32)
    Y = np.empty_like(X)
    P = np.concatenate([np.ones(12, np.float32), np.zeros(12, np.float32)])
    layernorm_rows(X, Rows(0, 12), Y, Rows(0, 12), 2, 12, P, 0, 12, 1e-5)
    s = layernorm_rows.stats
    print(json.dumps(dict(hits=sum(s.cache_hits.values()), misses=sum(s.cache_misses.values()),
                          path=str(s.cache_path), key=isa.PATH.key)))


if __name__ == "__main__":
    {"worked": worked, "bad_isa": bad_isa, "isa": isa, "narrow": narrow, "cached": cached}[sys.argv[1]]()
