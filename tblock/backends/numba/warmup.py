"""Compile (or load from Numba's cache) every kernel a user's calls reach, ahead of them."""

from __future__ import annotations

import numpy as np

from ... import _runtime
from ...config import BlockConfig
from ...kernels.block import block_parallel, block_serial, cached_parallel, cached_serial
from ...kernels.lm_head import head_parallel, head_serial
from ...kvcache import make_caches
from ...weights import init_weights
from .cached import ONE_BLOCK, cache_args
from .forward import forward_batch
from .lm import prepare_head
from .packing import make_plan, packed
from .parallel import parallel_call


# a block of each build a model runs (kernels.records.with_part): the lesson's and GPT-2's,
# and the Llama family's (RMSNorm, rotary positions, a gated FFN, grouped K/V heads)
WARM_CONFIGS = (BlockConfig(d_model=8, n_heads=2),
                BlockConfig(d_model=8, n_heads=2, n_kv_heads=1, norm_type="rmsnorm", ffn="gated", activation="silu",
                            positions="rotary", attn_bias=False, ffn_bias=False, ln_affine=True))


def warmup() -> None:
    """Every block kernel for float32 and float64 and each of WARM_CONFIGS: the serial and
    the parallel block, without and with a KV cache, the trace path and the vocabulary
    head.  A model's prepared decode step is warmed by tblock.warmup, through a tiny
    model's steps."""
    for cfg in WARM_CONFIGS:
        _warm_blocks(cfg)
    for dtype in (np.float32, np.float64):
        _warm_head(dtype)


def _warm_blocks(cfg):
    """The block kernels for one config, in float32 and float64."""
    parallel = not _runtime.serial_only()
    for dtype in (np.float32, np.float64):
        w = init_weights(cfg, seed=0, dtype=dtype)
        H = np.zeros((1, 4, 8), dtype=dtype)
        H.flags.writeable = False          # the API hands backends read-only, aligned C arrays
        args = (H, packed(w, dtype), make_plan(w, cfg, dtype)[2])
        for X in (H, H[0], H.copy(), H[0].copy()):  # the lane's: 2-D or 3-D, read-only or not
            block_serial(X, args[1], np.empty(X.shape, dtype), args[2], 1)
        if parallel:
            for few in (True, None):        # the builds for calls of few rows and of many (forward.few_paths)
                parallel_call(block_parallel, *args, few, pass_threads=True)
        cache = make_caches(cfg, 1, 5, 1, dtype)[0]
        cached = args + (cache_args(cache, ONE_BLOCK),)
        cached_serial(*cached, 1)
        if parallel:
            parallel_call(cached_parallel, *cached, pass_threads=True)
        forward_batch(H, w, cfg, True)      # the trace path, its finiteness check included


def _warm_head(dtype):
    """The vocabulary head with the array kinds a model passes: the rows writeable, LN_f's
    affine and the packed embedding read-only."""
    d, vocab, rows = 8, 8, 4
    P = np.concatenate([np.ones(d, dtype), np.zeros(d, dtype)])
    P.flags.writeable = False
    args = (np.zeros(rows * d, dtype), rows, d, P, 1e-5, prepare_head(np.zeros((vocab, d)), dtype), vocab,
            np.empty(rows * vocab, dtype), False)
    head_serial(*args, 1)
    if not _runtime.serial_only():
        parallel_call(head_parallel, *args, pass_threads=True)

