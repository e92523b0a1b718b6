"""Backend "numba": the fast path.

Validation happens in tblock.api; this module only prepares the weights once per
dtype (packed and fused into one flat buffer, cached on the BlockWeights) and makes a
single call into compiled code per forward pass.

Threading: all parallel work runs in Numba's thread pool, inside the compiled block, on
tblock's thread count (tblock.set_num_threads; Numba's own count is per Python thread, so
parallel_call sets it in the calling thread); no BLAS is called on that path, so BLAS
threads never compete with it.  Numba's "workqueue" layer aborts if two Python threads
enter parallel code at once, and the OpenMP/TBB layers would run both regions on the
same cores, oversubscribed.  A lock
around the parallel call therefore makes concurrent callers take turns: each call
still uses every core, and the results are exactly the serial ones.  The serial
variant (small blocks, one thread, and a child forked after an OpenMP region: see
tblock._runtime) holds no lock and releases the GIL; it gives the same bits.
"""

from __future__ import annotations

import threading

import numba
import numpy as np

from . import _runtime
from .kernels.activations import ACTIVATION_CODES, bias_act_rows
from .kernels.block import block_parallel, block_serial, packed_len, weight_layout
from .kernels.gemm import pack_b, packed_size, panel_width
from .kernels.layernorm import layernorm_rows
from .kernels.softmax import CAUSAL, NO_MASK, masked_softmax_rows
from .kernels.validate import all_finite

_PARALLEL_LOCK = threading.Lock()

# Below this many FLOPs a forward pass runs serially.  Measured on 2 cores (serial /
# parallel, float32): 0.9 MFLOP (d=32, T=32) 48 / 59 us; 3.3 MFLOP (d=64, T=32) 64 / 56 us;
# 6.8 MFLOP (d=64, T=64) 106 / 109 us; the lesson's block (6 kFLOP) 4.5 / 17 us: waking
# the pool for the block's five parallel stages costs tens of microseconds per call.
PARALLEL_MIN_FLOPS = 2_000_000

_KEY = "numba-packed"
_ACT = ACTIVATION_CODES


def _aligned_empty(n: int, dtype) -> np.ndarray:
    """A 1-D array of n elements whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    raw = np.empty(n + 64 // dtype.itemsize, dtype=dtype)
    start = (-raw.ctypes.data % 64) // dtype.itemsize
    return raw[start:start + n]


def _pack_weights(weights, dtype) -> np.ndarray:
    """All weights of the block in one flat array of ``dtype`` (see weight_layout)."""
    dtype = np.dtype(dtype)
    d, dff = weights.w_ff1.shape
    NR = panel_width(dtype)
    o_qkv, o_o, o_1, o_2, o_b1, o_b2, o_g1, o_be1, o_g2, o_be2, total = weight_layout(d, dff, NR)
    flat = _aligned_empty(total, dtype)
    flat[:] = 0
    cast = lambda a: np.asarray(a, dtype=dtype)
    # the cast happens once here, so float64 weights with float32 inputs run in float32
    step = packed_len(d, d, NR)         # W_q, W_k, W_v packed one after another
    for j, w in enumerate((weights.w_q, weights.w_k, weights.w_v)):
        pack_b(cast(w), flat[o_qkv + j * step:o_qkv + j * step + packed_size(d, d, NR)])
    pack_b(cast(weights.w_o), flat[o_o:o_1])
    pack_b(cast(weights.w_ff1), flat[o_1:o_2])
    pack_b(cast(weights.w_ff2), flat[o_2:o_b1])
    # absent biases / LN affines are stored as their identity (0, and gamma=1, beta=0):
    # x + 0 and y * 1 + 0 are exact, so the kernels never need to branch on them
    flat[o_b1:o_b1 + dff] = 0 if weights.b_ff1 is None else cast(weights.b_ff1)
    flat[o_b2:o_b2 + d] = 0 if weights.b_ff2 is None else cast(weights.b_ff2)
    flat[o_g1:o_g1 + d] = 1 if weights.ln1_gamma is None else cast(weights.ln1_gamma)
    flat[o_be1:o_be1 + d] = 0 if weights.ln1_beta is None else cast(weights.ln1_beta)
    flat[o_g2:o_g2 + d] = 1 if weights.ln2_gamma is None else cast(weights.ln2_gamma)
    flat[o_be2:o_be2 + d] = 0 if weights.ln2_beta is None else cast(weights.ln2_beta)
    flat.flags.writeable = False
    return flat


def _flop_terms(d: int, dff: int) -> tuple[int, int]:
    """A forward pass costs B*T*(per_row + per_key * (T + 1 if causal else 2T)) FLOPs:
    the projections and the FFN per row, scores and A V per visible key."""
    return 8 * d * d + 4 * d * dff, 2 * d


def _block_flops(B: int, T: int, d: int, dff: int, causal: bool) -> int:
    per_row, per_key = _flop_terms(d, dff)
    return B * T * (per_row + per_key * (T + 1 if causal else 2 * T))


# tblock.api leaves the check that H is finite to this backend: the compiled block does it
# in the same call (see forward_batch)
CHECKS_FINITE = True


def _plan(weights, cfg, dtype):
    """What every call with these weights, this config and this dtype passes besides H:
    (cfg, packed weights, the block's scalar arguments, then _flop_terms)."""
    key = (_KEY, dtype.char)
    flat = weights.prepared(key, lambda w: _pack_weights(w, dtype))
    scalars = (cfg.n_heads, cfg.d_ff, cfg.causal, cfg.norm == "pre", _ACT[cfg.activation], cfg.eps)
    return (cfg, flat, scalars) + _flop_terms(cfg.d_model, cfg.d_ff)


def forward_batch(H, weights, cfg, trace):
    """The backend contract of tblock.api: H is a read-only C-contiguous (B, T, d_model)
    float32/float64 array; compute in H's dtype; return (H_out, trace dict or None), or
    (None, None) when H holds a NaN or an Inf (CHECKS_FINITE: the API then says where).

    Kept lean: at the lesson's size (T=4, d_model=8) the compiled block takes ~2 us and
    every Python step here is a visible fraction of a call."""
    if trace:
        if not all_finite(H):
            return None, None
        return _forward_trace(H, weights, cfg)
    plan = weights._cache.get(("numba-plan", H.dtype.char))
    if plan is None or plan[0] is not cfg:      # identity: cheaper than comparing configs
        plan = weights._cache[("numba-plan", H.dtype.char)] = _plan(weights, cfg, H.dtype)
    _, flat, scalars, per_row, per_key = plan
    B, T, d = H.shape
    # _block_flops, inlined with the per-config parts precomputed (a call costs ~0.1 us)
    if (B * T * (per_row + per_key * (T + 1 if scalars[2] else 2 * T)) < PARALLEL_MIN_FLOPS
            or _runtime._threads == 1 or _runtime._serial_only):
        out = block_serial(H, flat, T, d, *scalars, 1)
    else:
        out = parallel_call(block_parallel, H, flat, T, d, *scalars, pass_threads=True)
    return (out, None) if out.size else (None, None)


def parallel_call(fn, *args, pass_threads=False):
    """``fn(*args)`` (``fn(*args, nthr)`` with pass_threads) on tblock's thread count, one
    caller at a time.  Numba's thread count and chunk size are thread-local, so they are
    set here, in the calling thread, and put back afterwards."""
    if _runtime._serial_only:
        raise RuntimeError("parallel code cannot run in a child forked after this process used "
                           "Numba's OpenMP pool; start children with spawn or forkserver")
    n = _runtime._threads
    with _PARALLEL_LOCK:
        old_n = numba.get_num_threads()
        if old_n != n:
            numba.set_num_threads(n)
        old_chunk = numba.set_parallel_chunksize(1)    # dynamic scheduling of the coarse tasks
        try:
            return fn(*args, n) if pass_threads else fn(*args)
        finally:
            numba.set_parallel_chunksize(old_chunk)
            if old_n != n:
                numba.set_num_threads(old_n)


# ----------------------------------------------------------------------------- trace


def _trace_weights(weights, dtype):
    """The weights as plain arrays of ``dtype`` for the materialising trace path."""
    def build(w):
        a = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in w.arrays().items() if k != "_cache"}
        d, dff = w.w_ff1.shape
        a.setdefault("b_ff1", np.zeros(dff, dtype))
        a.setdefault("b_ff2", np.zeros(d, dtype))
        a["ln1"] = np.concatenate([a.get("ln1_gamma", np.ones(d, dtype)), a.get("ln1_beta", np.zeros(d, dtype))])
        a["ln2"] = np.concatenate([a.get("ln2_gamma", np.ones(d, dtype)), a.get("ln2_beta", np.zeros(d, dtype))])
        a["zeros_ff"] = np.zeros(dff, dtype)
        return a
    return weights.prepared(("numba-trace", np.dtype(dtype).char), build)


def _layernorm(X, P, eps):
    """Row LayerNorm of a (..., d) array; P = [gamma, beta]."""
    d = X.shape[-1]
    Y = np.empty_like(X)
    layernorm_rows(X.reshape(-1), 0, d, Y.reshape(-1), 0, d, X.size // d, d, P, 0, d, eps)
    return Y


def _forward_trace(H, weights, cfg):
    """Every intermediate materialised, in H's dtype, with the same kernels for the
    non-matmul parts (LayerNorm, masked softmax, bias + activation)."""
    dt = H.dtype
    w = _trace_weights(weights, dt)
    B, T, d = H.shape
    nh, dk = cfg.n_heads, cfg.d_k
    scale = 1.0 / np.sqrt(dk)
    tr = {}
    dummy_add = np.zeros((1, 1))
    dummy_keep = np.zeros((1, 1), dtype=np.bool_)

    def attention(X):
        Q, K, V = X @ w["w_q"], X @ w["w_k"], X @ w["w_v"]
        A = np.empty((B, nh, T, T), dtype=dt)
        oc = np.empty((B, T, d), dtype=dt)
        for b in range(B):
            for h in range(nh):
                cols = slice(h * dk, (h + 1) * dk)
                S = Q[b, :, cols] @ K[b, :, cols].T
                masked_softmax_rows(np.ascontiguousarray(S), scale, CAUSAL if cfg.causal else NO_MASK,
                                    dummy_add, dummy_keep, A[b, h])
                oc[b, :, cols] = A[b, h] @ V[b, :, cols]
        A_out = oc @ w["w_o"]
        tr.update(Q=Q, K=K, V=V, A=A, out_concat=oc, A_out=A_out)
        return A_out

    def ffn(X):
        F_pre = X @ w["w_ff1"] + w["b_ff1"]
        F_post = F_pre.copy()
        dff = F_post.shape[-1]
        bias_act_rows(F_post.reshape(-1), 0, dff, F_post.size // dff, dff, w["zeros_ff"], 0,
                      ACTIVATION_CODES[cfg.activation])
        F_out = F_post @ w["w_ff2"] + w["b_ff2"]
        tr.update(F_pre=F_pre, F_post=F_post, F_out=F_out)
        return F_out

    if cfg.norm == "pre":
        tr["H_norm1"] = _layernorm(H, w["ln1"], cfg.eps)
        tr["H_mid"] = H + attention(tr["H_norm1"])
        tr["H_norm2"] = _layernorm(tr["H_mid"], w["ln2"], cfg.eps)
        tr["H_out"] = tr["H_mid"] + ffn(tr["H_norm2"])
    else:
        tr["H_norm1"] = tr["H_mid"] = _layernorm(H + attention(H), w["ln1"], cfg.eps)
        tr["H_norm2"] = tr["H_out"] = _layernorm(tr["H_mid"] + ffn(tr["H_mid"]), w["ln2"], cfg.eps)
    return tr["H_out"], tr


# ----------------------------------------------------------------------------- warm-up


def warmup() -> None:
    """Compile (or load from Numba's cache) every kernel for float32 and float64: the
    serial and the parallel block and the trace path, so no later call compiles."""
    from .config import BlockConfig
    from .weights import init_weights
    cfg = BlockConfig(d_model=8, n_heads=2)
    for dtype in (np.float32, np.float64):
        w = init_weights(cfg, seed=0, dtype=dtype)
        H = np.zeros((1, 4, 8), dtype=dtype)
        H.flags.writeable = False          # the API hands backends read-only, aligned C arrays
        flat = w.prepared((_KEY, np.dtype(dtype).char), lambda ww: _pack_weights(ww, dtype))
        args = (H, flat, 4, 8, 2, cfg.d_ff, True, True, 0, cfg.eps)
        block_serial(*args, 1)
        if not _runtime._serial_only:
            parallel_call(block_parallel, *args, pass_threads=True)
        forward_batch(H, w, cfg, True)      # the trace path, its finiteness check included
