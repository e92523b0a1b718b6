"""Which of the block's path- and part-specific kernels a process compiled: argv[1] "long"
(one forward of 800 rows, T 800: many rows over a long sequence, no KV cache), "short" (T
5 on 2 threads: few rows, a tiny sequence), "cached" (T 800 into a KV cache), each with
the lesson's block, or "llama" (as "long", the block with rotary positions and the gated
FFN); prints one JSON line, kernel -> builds.  Run with NUMBA_CACHE_DIR set to an empty folder and
NUMBA_NUM_THREADS=2 (tests/test_numba_block.py)."""

import json
import sys

import numpy as np

import tblock
from tblock.kernels import activations, block, ffn, rotary, stages, tasks

tblock.set_num_threads(2)
if sys.argv[1] == "llama":
    cfg = tblock.BlockConfig(d_model=32, n_heads=2, d_ff=64, positions="rotary", ffn="gated", activation="silu")
else:
    cfg = tblock.BlockConfig(d_model=32, n_heads=2, d_ff=64)
w = tblock.init_weights(cfg, 0)
T = 5 if sys.argv[1] == "short" else 800
H = np.random.default_rng(0).standard_normal((T, 32)).astype(np.float32)
cache = tblock.KVCache(cfg, T, 1, np.float32) if sys.argv[1] == "cached" else None
tblock.forward(H, w, cfg, cache=cache)
kernels = {"ffn_input_task": ffn.ffn_input_task, "ffn_up_task": ffn.ffn_up_task, "ffn_down_task": ffn.ffn_down_task,
           "attention_direct_task": stages.attention_direct_task, "cache_rows_task": stages.cache_rows_task,
           "cache_packed_task": stages.cache_packed_task, "attention_task": stages.attention_task,
           "cached_attention_task": stages.cached_attention_task,
           "rope_rows": block.rope_rows, "rope_table": rotary.rope_table, "rope_packed": tasks.rope_packed,
           "turn_new_rows": tasks.turn_new_rows, "rotate_rows": rotary.rotate_rows, "rotate_kt": rotary.rotate_kt,
           "gated_rows": activations.gated_rows}
print(json.dumps({name: len(k.overloads) for name, k in kernels.items()}))
