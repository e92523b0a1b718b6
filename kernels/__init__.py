"""Numba kernels, installed as ``tblock.kernels`` (never as a bare ``kernels``).

Each module holds small ``@njit`` functions with one job, for float32 and float64,
writing into caller-allocated outputs; ``tblock._numba_backend`` validates nothing (the
API did) and only prepares weights and dispatches.

    options     compiler flags shared by all kernels (fast-math without nnan/ninf, cache)
    simd        a 64-byte vector type and LLVM intrinsics (load/store, fma, exp, exp2)
    gemm        6 x 4-vector register-blocked micro-kernel over pre-packed weight panels
    layernorm   row LayerNorm with the affine fused in
    activations bias + activation (gelu_tanh, gelu_erf, relu) over a tile
    softmax     masked (causal / additive / boolean) row softmax, for the trace path
    attention   flash-style attention for one head (online softmax over key tiles), and
                the untiled per-query kernel for tiny sequences
    block       the whole block as one compiled call (serial and parallel builds), and
                its stages as functions (qkv_task, attention_task, attention_core)

Numba's cache does not track dependencies across files: after editing one kernel
module, delete ``kernels/__pycache__`` (or the user cache directory) so that functions
that inlined it are recompiled.  Installed copies are not affected (a reinstall gives
every file a new timestamp).
"""
