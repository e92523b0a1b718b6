"""Compile every kernel ahead of the first call (tblock.warmup).

The backend compiles its block kernels itself; a model's prepared decode step is warmed
here, above both, through a tiny model's steps made as a user's are.
"""

from __future__ import annotations

import numpy as np


def warm_all() -> None:
    """The numba backend's kernels, then a tiny GPT-2's and a tiny Llama's decode steps,
    one sequence and several (generate_many's ragged step), and a greedy run's steps in
    one call (kernels.decode.greedy_steps), in float32 and float64."""
    from .backends.numba import warmup
    from .models.gpt2 import GPT2
    from .models.llama import Llama, LlamaConfig
    warmup()
    llama = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, max_position_embeddings=4, tie_word_embeddings=True)
    for dtype in (np.float32, np.float64):
        _warm_steps(GPT2.from_config(vocab_size=8, n_positions=4, n_embd=8, n_layer=2, n_head=2, seed=0, dtype=dtype))
        _warm_steps(Llama.from_config(llama, seed=0, dtype=dtype))


def _warm_steps(model) -> None:
    """A model's decode steps as a user's calls make them (4 positions at least)."""
    cache = model.make_cache(4)
    for t in range(3):                  # the prompt, a checked step, a prepared one
        model.next_logits(np.arange(t, t + 1 + (t == 0)), cache)
    model.generate_many([np.arange(2), np.arange(1)], 2, temperature=0)     # a ragged step
    model.generate(np.arange(1), 3, temperature=0)      # greedy steps, once a step is prepared
