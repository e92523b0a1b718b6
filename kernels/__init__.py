"""Numba kernels, installed as ``tblock.kernels`` (never as a bare ``kernels``).

Each module holds small ``@njit`` functions with one job, for float32 and float64,
writing into caller-allocated outputs; ``tblock._numba_backend`` validates nothing (the
API did) and only prepares weights and dispatches.

    options     compiler flags shared by all kernels (fast-math without nnan/ninf, cache)
    isa         the vector path (avx512 / avx2 / generic): vector width, micro-tile, KC
    cache       Numba's cache, one directory per path
    simd        a vector type of the path's width and LLVM intrinsics (load/store, fma, exp, exp2)
    gemm        6 x NV-vector register-blocked micro-kernel over pre-packed weight panels
    layout      panel, stride and task arithmetic: weight layout, packed K/V sizes, task grids
    layernorm   row LayerNorm with the affine fused in
    activations bias + activation (gelu_tanh, gelu_erf, relu) over a tile
    softmax     masked (causal / additive / boolean) row softmax, for the trace path
    attention   flash-style attention for one head (online softmax over key tiles), and
                the untiled per-query kernel for tiny sequences
    block       the whole block as one compiled call (serial and parallel builds), and
                its stages as functions (qkv_task, attention_task, attention_core)

Numba's cache is one directory per vector path, and any edit to a module of this package
invalidates all of it (``cache``): the block inlines code from every sibling.
"""

from . import isa           # first: it may set Numba's target CPU before anything compiles
from . import cache

cache.install()
