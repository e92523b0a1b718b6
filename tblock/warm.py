"""Compile every kernel ahead of the first call (tblock.warmup).

The backend compiles its block kernels itself; a model's prepared decode step is warmed
here, above both, through a tiny model's steps made as a user's are.
"""

from __future__ import annotations

import numpy as np


def warm_all() -> None:
    """The numba backend's kernels, then a tiny GPT-2's decode steps, one sequence and
    several (generate_many's ragged step), and a greedy run's steps in one call
    (kernels.decode.greedy_steps), in float32 and float64."""
    from .backends.numba import warmup
    from .models.gpt2 import GPT2
    warmup()
    for dtype in (np.float32, np.float64):
        model = GPT2.from_config(vocab_size=8, n_positions=4, n_embd=8, n_layer=2, n_head=2, seed=0, dtype=dtype)
        cache = model.make_cache(4)
        for t in range(3):                  # the prompt, a checked step, a prepared one
            model.next_logits(np.arange(t, t + 1 + (t == 0)), cache)
        model.generate_many([np.arange(2), np.arange(1)], 2, temperature=0)     # a ragged step
        model.generate(np.arange(1), 3, temperature=0)      # greedy steps, once a step is prepared
