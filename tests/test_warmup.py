"""tblock.warmup(): after it no call compiles, and what it compiled is in Numba's cache.

Not among the tests make test-isa runs again on every vector path: what warmup covers does
not depend on the path, and each run is a cold compile of every build (minutes).
"""

from __future__ import annotations

import os

import numpy as np

import tblock


def _compiled_signatures():
    """Every signature of every kernel dispatcher: a call that compiles adds one."""
    import importlib
    import pkgutil

    from numba.core.dispatcher import Dispatcher

    import tblock.kernels
    names = [m.name for m in pkgutil.iter_modules(tblock.kernels.__path__)]
    return sum(len(f.signatures) for n in names
               for f in vars(importlib.import_module(f"tblock.kernels.{n}")).values()
               if isinstance(f, Dispatcher))


def _layouts(H):
    """The same values as writeable, read-only, strided, Fortran-ordered and unaligned
    arrays: the API hands the block one array type for all of them."""
    ro = H.copy()
    ro.flags.writeable = False
    strided = np.repeat(H, 2, axis=0)[::2]
    raw = np.empty(H.nbytes + 1, dtype=np.uint8)[1:].view(H.dtype).reshape(H.shape)
    raw[...] = H
    assert not raw.flags.aligned
    return [H, ro, strided, np.asfortranarray(H), raw, H[None]]


def test_warmup_compiles_everything_used_by_forward():
    """After warmup(), no call compiles: both dtypes, the serial and the parallel block,
    the trace path, a GPT-2's and a Llama-family model's decode steps for one prompt and
    several, greedy and sampled, and inputs of any flags and layout (issue #13: a
    writeable or a non-contiguous input compiled again, 6-17 s)."""
    tblock.warmup()
    before = _compiled_signatures()
    for dtype in (np.float32, np.float64):
        cfg = tblock.BlockConfig(d_model=24, n_heads=3, norm="post", activation="relu")
        w = tblock.init_weights(cfg, 1, dtype=dtype)
        for T in (3, 2000):                       # the serial and the parallel variant
            H = np.random.default_rng(0).standard_normal((T, 24)).astype(dtype)
            want = tblock.forward(H, w, cfg, backend="numba")
            for X in _layouts(H):
                np.testing.assert_array_equal(tblock.forward(X, w, cfg, backend="numba"), want.reshape(X.shape))
            tblock.forward(H[:5], w, cfg, backend="numba", trace=True)
        # a GPT-2's prompt, checked decode steps and prepared ones, serial and parallel
        for d, vocab in ((16, 50), (256, 3000)):
            model = tblock.GPT2.from_config(vocab_size=vocab, n_positions=64, n_embd=d, n_layer=2, n_head=4,
                                            seed=0, dtype=dtype)
            model.generate(np.arange(5), 20, temperature=0)
            model.generate_many([np.arange(5), np.arange(2), np.arange(7)], 6, temperature=0)
        # rotary positions, RMSNorm, a gated FFN: other builds of the block; K/V heads
        # grouped, one a query head, and one for all (a grouped decode step either way)
        for kv in (1, 2, 4):
            cfg = tblock.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=512,
                                     model_type="qwen2" if kv == 2 else "llama", tie_word_embeddings=kv != 4)
            model = tblock.Llama.from_config(cfg, seed=0, dtype=dtype)
            model(np.arange(7))
            model(np.arange(400) % 300)
            model.generate(np.arange(5), 8, temperature=0)
            model.generate(np.arange(5), 4, temperature=0.8, seed=1)
            model.generate_many([np.arange(5), np.arange(2)], 4, temperature=0)
    assert _compiled_signatures() == before


def test_the_compiled_block_is_cacheable():
    """Numba refuses to cache a function that touches ctypes globals (get_num_threads()
    inside the block did): after warmup() every top-level kernel has its cache index."""
    tblock.warmup()
    from tblock.kernels.block import attention_core, block_parallel, block_serial, cached_parallel, cached_serial
    from tblock.kernels.decode import decode_step
    from tblock.kernels.lm_head import head_parallel, head_serial
    for disp in (block_serial, block_parallel, cached_serial, cached_parallel, head_serial, head_parallel,
                 decode_step):
        index = disp._cache._cache_file._index_path
        assert os.path.exists(index), f"{disp.py_func.__qualname__} was not cached ({index})"
    assert attention_core._cache is not None
