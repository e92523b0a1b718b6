"""Numba's allocation counts over GPT2.next_logits steps (tests/test_generate.py), run with
NUMBA_NRT_STATS=1: python step_allocations.py.

Prints a list, per model shape, of (the first step's count, the most and the fewest of the
steps after it, the last logits' relative error against the whole forward)."""

import numpy as np
from numba.core.runtime import rtsys

import tblock

out = []
for n_layer, d, heads, vocab, B in [(2, 32, 4, 101, 1), (5, 32, 4, 101, 1), (2, 256, 4, 5000, 2), (4, 256, 4, 5000, 2)]:
    model = tblock.GPT2.from_config(n_layer=n_layer, n_embd=d, n_head=heads, vocab_size=vocab, n_positions=64, seed=3)
    ids = np.random.default_rng(0).integers(0, vocab, (B, 20))
    cache = model.make_cache(40, batch=B)
    logits = np.empty((B, vocab), np.float32)
    model.next_logits(ids[:, :10], cache, out=logits)
    counts = []
    for t in range(10, 14):
        before = rtsys.get_allocation_stats().alloc
        model.next_logits(ids[:, t:t + 1], cache, out=logits)
        counts.append(rtsys.get_allocation_stats().alloc - before)
    want = model(ids[:, :14])[:, -1]
    # the first step takes the checked path (two compiled calls), the next the prepared step's one
    out.append((counts[0], max(counts[1:]), min(counts[1:]), float(np.abs(logits - want).max() / np.abs(want).max())))
print(out)
