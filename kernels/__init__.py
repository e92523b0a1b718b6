"""Numba kernels, installed as ``tblock.kernels`` (never as a bare ``kernels``).

Each module holds small compiled functions (``options.kernel``) with one job, for float32
and float64, writing into caller-allocated outputs; ``tblock.backends.numba`` validates
nothing (the API did) and only prepares weights and dispatches.

    options     compiler flags and the ``kernel`` decorator shared by all kernels; standalone
                kernels, which compiled callers call through their address, not a copy;
                ``build``, a second build of one body under a name of its own
    isa         the vector path (avx512 / avx2 / generic) and its vector width
    tiles       every tile and block size, per path: the micro-tile, KC, MC, BQ, BK, ...
    records     the named tuples a call passes (operands, dimensions, caches, buffers)
    cache       Numba's cache, one directory per path
    simd        a vector type of the path's width and LLVM intrinsics (load/store, fma, exp, exp2)
    gemm        6 x NV-vector register-blocked micro-kernel over pre-packed weight panels
    layout      panel, stride and task arithmetic: weight layout, packed K/V sizes, task grids
    layernorm   row LayerNorm (or RMSNorm) with the affine fused in
    activations bias + activation (gelu_tanh, gelu_erf, relu, silu) over a tile; the gated
                FFN's act(gate) * up
    rotary      rotary positions: the cos/sin table of a call (float64 angles), Q and K turned
    softmax     causal or unmasked row softmax of a whole score matrix, for the trace path
    attention   flash-style attention for one head (online softmax over key tiles), and
                the untiled per-query kernel for tiny sequences
    stages      the tasks of the block's attention half (projection, attention, W_O)
    ffn         the tasks of its FFN (row tiles, or split by columns; the gated FFN)
    tasks       the stages' plan and the task each worker runs (rotary, the cache's new rows)
    block       the whole block as one compiled call (serial and parallel builds), with or
                without a KV cache, and the attention on its own (attention_core) for the
                component timings
    lm_head     LN_f and a language model's vocabulary head over the packed tied embedding
    decode      a language model's decode step in one call: embedding, the cached stack, head

Numba's cache is one directory per vector path, and any edit to a module of this package
invalidates all of it (``cache``): the kernels inline code from their siblings.
"""

from . import isa           # first: it may set Numba's target CPU before anything compiles
from . import cache

cache.install()
