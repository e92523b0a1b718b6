"""Every block path under Numba's bounds checking (tests/test_numba_runtime.py), run with
NUMBA_BOUNDSCHECK=1 and a cache folder of its own: python bounds_checked.py.

Prints the largest relative error against the oracle over both dtypes, Pre-LN and Post-LN,
serial, tiled and parallel sizes, a KV cache's prefill and step, and a stack of three."""

import numpy as np

import tblock

worst = 0.0
for dtype in (np.float32, np.float64):
    for norm in ("pre", "post"):
        # serial sizes; a tiled causal one; a parallel one with few rows (the FFN's split path)
        for d, h, T, B in [(24, 3, 3, 1), (16, 1, 1, 3), (24, 3, 50, 2), (48, 4, 700, 1), (256, 4, 200, 1)]:
            cfg = tblock.BlockConfig(d_model=d, n_heads=h, norm=norm)
            w = tblock.init_weights(cfg, 1, dtype=dtype)
            H = np.random.default_rng(T).standard_normal((B, T, d)).astype(dtype)
            ref = tblock.forward(H.astype(np.float64), w, cfg, backend="numpy")
            worst = max(worst, np.abs(tblock.forward(H, w, cfg) - ref).max() / np.abs(ref).max())
            if norm == "pre" and T > 1:     # a prefill, then one token, through a KV cache
                cache = tblock.KVCache(cfg, T + 4, batch=B, dtype=dtype)
                tblock.forward(H[:, :T - 1], w, cfg, cache=cache)
                last = tblock.forward(H[:, T - 1:], w, cfg, cache=cache)
                worst = max(worst, np.abs(last - ref[:, T - 1:]).max() / np.abs(ref).max())
                # the same through a stack of three (one compiled call: blocks reached by address)
                stack = tblock.Stack.init(cfg, 3, seed=2, dtype=dtype)
                caches = stack.make_cache(T + 4, batch=B, dtype=dtype)
                sref = stack(H.astype(np.float64), backend="numpy")
                stack(H[:, :T - 1], cache=caches)
                last = stack(H[:, T - 1:], cache=caches)
                worst = max(worst, np.abs(last - sref[:, T - 1:]).max() / np.abs(sref).max())
print(worst)
