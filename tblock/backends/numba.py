"""Backend "numba": the fast path.

Validation happens in tblock.api; this module only prepares the weights once per
dtype (packed and fused into one flat buffer, cached on the BlockWeights) and makes a
single call into compiled code per forward pass.  The trace path materialises every
intermediate with the oracle's per-head loop around the kernels' softmax, and
``components`` drives the block's own kernels one stage at a time for the report.

Threading: all parallel work runs in Numba's thread pool, inside the compiled block, on
tblock's thread count (tblock.set_num_threads; Numba's own count is per Python thread, so
parallel_call sets it in the calling thread); no BLAS is called on that path, so BLAS
threads never compete with it.  Numba's "workqueue" layer aborts if two Python threads
enter parallel code at once, and the OpenMP/TBB layers would run both regions on the
same cores, oversubscribed.  A lock around the parallel call therefore makes
concurrent callers take turns: each call still uses every core, and the results are
exactly the serial ones.  The serial variant (small blocks, one thread, and a child
forked after an OpenMP region: see tblock._runtime) holds no lock and releases the GIL;
it computes the same sums in the same order.
"""

from __future__ import annotations

import threading
import weakref

import numba
import numpy as np
from numba import njit, prange

from .. import _runtime
from ..config import BlockConfig
from ..counting import flops
from ..kernels.activations import ACTIVATION_CODES, bias_act_rows
from ..kernels.block import (PLAN_COLS, PLAN_ROWS, attention_core, block_parallel, block_serial, cached_parallel,
                             cached_serial)
from ..kernels.decode import decode_step
from ..kernels.gemm import KC, gemm_block, pack_b, packed_size, panel_width
from ..kernels.layernorm import layernorm_rows
from ..kernels.layout import (bias_len, ceil_div, packed_len, panels, rows_per_task, stage_grid, task_tile,
                             weight_layout)
from ..kernels.options import JIT
from ..kernels.simd import panel_lanes
from ..kernels.softmax import masked_softmax_rows
from ..kernels.stages import MC, MF, ffn_tile
from ..kernels.validate import all_finite_flat
from ..kvcache import KVCache
from .numpy import head_mix, head_probs

_PARALLEL_LOCK = threading.Lock()

# Below this many FLOPs a forward pass runs serially: waking the pool for the block's
# parallel stages costs more than it saves.
PARALLEL_MIN_FLOPS = 2_000_000

_KEY = "numba-packed"

# the table of blocks a call runs (kernels.block's ``layers``): none but the one it is given
ONE_BLOCK = np.empty((0, 3), dtype=np.intp)


def _aligned_empty(n: int, dtype) -> np.ndarray:
    """A 1-D array of n elements whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    raw = np.empty(n + 64 // dtype.itemsize, dtype=dtype)
    start = (-raw.ctypes.data % 64) // dtype.itemsize
    return raw[start:start + n]


def _packed(weights, dtype) -> np.ndarray:
    """The packed weights of ``dtype``, built once per BlockWeights."""
    dtype = np.dtype(dtype)
    return weights.prepared((_KEY, dtype.char), lambda w: _pack_weights(w, dtype))


def _packed_address(weights, dtype) -> int:
    """The data address of _packed(weights, dtype) (which the weights hold as long as they live)."""
    dtype = np.dtype(dtype)
    return weights.prepared((_KEY + "-address", dtype.char), lambda w: _packed(w, dtype).ctypes.data)


def _pack_weights(weights, dtype) -> np.ndarray:
    """All weights of the block in one flat array of ``dtype`` (see weight_layout)."""
    dtype = np.dtype(dtype)
    d, dff = weights.w_ff1.shape
    NR = panel_width(dtype)
    (o_qkv, o_o, o_1, o_2, o_b1, o_b2, o_g1, o_be1, o_g2, o_be2, o_bqkv, o_bo,
     total) = weight_layout(d, dff, NR)
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
    if weights.b_q is not None:         # otherwise zeros, the padding past d_model too
        bstep = bias_len(d, NR)
        for j, b in enumerate((weights.b_q, weights.b_k, weights.b_v)):
            flat[o_bqkv + j * bstep:o_bqkv + j * bstep + d] = cast(b)
        flat[o_bo:o_bo + d] = cast(weights.b_o)
    flat.flags.writeable = False
    return flat


def _flop_terms(cfg) -> tuple[int, int]:
    """tblock.flops' matmuls as (per_row, per_key): a forward pass costs
    B*T*(per_row + per_key * (T + 1 if causal else 2T)) FLOPs, the projections and the FFN
    per row, scores and A V per visible key (at T=1 the full square is one key, counted 2T)."""
    one = flops(cfg, 1)
    return one.full["qkv"] + one.full["out_proj"] + one.ffn_matmul_flops, one.attention_core() // 2


def _block_flops(B: int, T: int, d: int, dff: int, causal: bool) -> int:
    per_row, per_key = _flop_terms(BlockConfig(d_model=d, n_heads=1, d_ff=dff))
    return _forward_flops(B, T, per_row, per_key, causal)


def _forward_flops(B: int, T: int, per_row: int, per_key: int, causal: bool) -> int:
    """_block_flops from _flop_terms' parts (a plan holds them: _plan)."""
    return B * T * (per_row + per_key * (T + 1 if causal else 2 * T))


# tblock.api leaves the check that H is finite to this backend: the compiled block does it
# in the same call (see forward_batch)
CHECKS_FINITE = True


def _plan(weights, cfg, dtype):
    """What every call with these weights, this config and this dtype passes besides H:
    (cfg, packed weights, the block's scalar arguments, then _flop_terms)."""
    scalars = (cfg.n_heads, cfg.d_ff, cfg.causal, cfg.norm == "pre", ACTIVATION_CODES[cfg.activation], cfg.eps)
    return (cfg, _packed(weights, dtype), scalars) + _flop_terms(cfg)


def _plan_of(weights, cfg, dtype):
    """_plan for these weights, cfg and dtype, made once (the weights keep it)."""
    plan = weights._cache.get(("numba-plan", dtype.char))
    if plan is None or plan[0] is not cfg:      # identity: cheaper than comparing configs
        plan = weights._cache[("numba-plan", dtype.char)] = _plan(weights, cfg, dtype)
    return plan


def forward_small(H, weights, cfg):
    """A plain call's lane (tblock.api.forward): H_out for an ndarray H that the API
    would take as it is (float32/float64 in native byte order, C-contiguous, aligned,
    (T, d_model) or (B, T, d_model), T and B >= 1) on a block small enough to run
    serially, with these weights already checked against ``cfg``; None for anything else,
    and for an H holding a NaN or an Inf: the caller then takes the checked path, which
    gives the same result or raises.  At the lesson's size the steps the checked path
    adds to these are a fifth of a call.  H goes to the compiled block as it came, 2-D
    or 3-D, writeable or not (four array types a dtype, all compiled by warmup): a
    read-only 3-D view of it, and a 3-D view of the output, cost the toy block's call a
    tenth more (docs/perf-log.md)."""
    # _plan_of's lookup, without making one: the checked path makes it
    plan = weights._cache.get(("numba-plan", H.dtype.char))
    if plan is None or plan[0] is not cfg:
        return None
    shape = H.shape
    if len(shape) == 2:
        T, d = shape
        B = 1
    elif len(shape) == 3:
        B, T, d = shape
    else:
        return None
    _, flat, scalars, per_row, per_key = plan
    flags = H.flags
    if (d != cfg.d_model or T == 0 or B == 0 or not (flags.c_contiguous and flags.aligned)
            or not H.dtype.isnative or not _serial(_forward_flops(B, T, per_row, per_key, scalars[2]))):
        return None
    out = np.empty(shape, H.dtype)
    if block_serial(H, flat, out, T, d, *scalars, 1) >= 0:
        return None
    return out


def _serial(flops: int) -> bool:
    """Whether a block call of ``flops`` FLOPs runs a serial build: below
    PARALLEL_MIN_FLOPS, or where no parallel call may run (tblock._runtime)."""
    return flops < PARALLEL_MIN_FLOPS or not _runtime.parallel_allowed()


def forward_batch(H, weights, cfg, trace):
    """The backend contract of tblock.api: H is a read-only C-contiguous (B, T, d_model)
    float32/float64 array; compute in H's dtype; return (H_out, trace dict or None), or
    (None, None) when H holds a NaN or an Inf (CHECKS_FINITE: the API then says where).
    A small block's plain call usually comes through forward_small instead."""
    if trace:
        if not all_finite_flat(H.reshape(-1)):      # H: C-contiguous (the contract)
            return None, None
        return _forward_trace(H, weights, cfg)
    _, flat, scalars, per_row, per_key = _plan_of(weights, cfg, H.dtype)
    B, T, d = H.shape
    if _serial(_forward_flops(B, T, per_row, per_key, scalars[2])):
        # numpy's output array (a large block on one thread then holds it through the call)
        out = np.empty(H.shape, H.dtype)
        bad = block_serial(H, flat, out, T, d, *scalars, 1)
    else:
        out, bad = parallel_call(block_parallel, H, flat, T, d, *scalars, pass_threads=True)
    return (out, None) if bad < 0 else (None, None)


def forward_cached(H, weights, cfg, cache):
    """The KV-cache entry point of tblock.api: H (B, T_new, d_model) holds the tokens after
    the cache's first cache.length; the compiled block writes their keys and values into
    the cache's arrays and attends over the cache (kernels.block, past >= 0).  Returns
    H_out, or None when H holds a NaN or an Inf (nothing is written then)."""
    out, bad = _run_cached(H, weights, cfg, cache, ONE_BLOCK, True)
    return out if bad < 0 else None


def forward_stack_cached(H, weights, cfg, caches, fresh=True):
    """tblock.Stack's blocks with their caches in one compiled call: H as forward_cached's,
    weights and caches one per block (checked by the caller).  Returns (H_out, -1), or
    (None, i) when block i's input holds a NaN or an Inf (the caches' lengths unchanged).
    fresh=False: H_out may be scratch of caches[0].work, which the next call overwrites."""
    # the lists hold the arrays alive through the call, and every one has block 0's size
    # (one config, dtype, batch and max_T: tblock.Stack checks)
    out, bad = _run_cached(H, weights[0], cfg, caches[0], _layers_table(weights, caches, H.dtype), fresh)
    return (out, -1) if bad < 0 else (None, bad)


def _layers_table(weights, caches, dtype) -> np.ndarray:
    """(n, 3) intp: the data addresses of block i's packed weights, K and V, through which
    the compiled block reaches a stack's arrays (kernels.block's ``layers``)."""
    return np.array([(_packed_address(w, dtype),) + c.addresses() for w, c in zip(weights, caches)], dtype=np.intp)


def _cached_flops(B: int, T: int, past: int, per_row: int, per_key: int) -> int:
    """FLOPs of a cached block call: B sequences of T new rows after ``past`` cached tokens
    (_flop_terms' parts; each new token t sees past + t + 1 keys)."""
    return B * T * (per_row + per_key * (2 * past + T + 1))


def _cache_args(cache, layers):
    """The cached block's arguments after the config's: K, V, past, max_T, the table of
    blocks, room for the stage plan, the work buffer."""
    return (cache.K.reshape(-1), cache.V.reshape(-1), cache.length, cache.max_T, layers,
            np.empty((PLAN_ROWS, PLAN_COLS), np.intp), cache.work)


def _run_cached(H, weights, cfg, cache, layers, fresh):
    """kernels.block with a cache: weights and cache those of block 0 of ``layers``.  A
    decode step takes its scratch from cache.work; fresh: an output there is copied out."""
    _, flat, scalars, per_row, per_key = _plan_of(weights, cfg, H.dtype)
    B, T, d = H.shape
    past = cache.length
    args = (H, flat, T, d) + scalars + _cache_args(cache, layers)
    if _serial(_cached_flops(B, T, past, per_row, per_key)):
        out, bad = cached_serial(*args, 1)
    else:
        out, bad = parallel_call(cached_parallel, *args, pass_threads=True)
    if fresh and np.may_share_memory(out, cache.work):
        out = out.copy()
    return out, bad


class DecodeStep:
    """A language model's decode step (kernels.decode) prepared for one list of caches.

    Everything a step passes but the tokens, the position, the logits' buffer and the
    first cache's arrays is made here once: the table of every block's packed weights and
    caches, the head's packed embedding, the step's scratch.  The caller
    (tblock.GPT2.next_logits) has run a step of the checked path with these caches, so
    their config, dtype, batch and size are known good and stay so (a KVCache's arrays
    are fixed); a step then checks only what can change, the tokens and the caches'
    lengths (and that the list holds these caches), and crosses into compiled code once.

    blocks: the stack's BlockWeights; caches: one KVCache each, one max_T; E (vocab, d),
    P (positions, d): the embeddings; ln_f = [gamma | beta]; Ep: E packed (lm_head);
    head_parallel: whether the head runs in parallel when threads allow (its size's say)."""

    def __init__(self, blocks, cfg: BlockConfig, caches, E, P, ln_f, eps_f: float, Ep, head_parallel: bool):
        c0 = caches[0]
        dtype, B, d = c0.dtype, c0.batch, cfg.d_model
        _, flat, scalars, self.per_row, self.per_key = _plan(blocks[0], cfg, dtype)
        # self.blocks holds the weights alive, the caller's list the caches during a call;
        # the step holds the caches weakly (a dropped list's memory is freed, and its step
        # no longer matches any list)
        layers = _layers_table(blocks, caches, dtype)
        self.blocks, self.max_T, self.batch = tuple(blocks), c0.max_T, B
        self.caches = tuple(weakref.ref(c) for c in caches)
        self.ids = np.empty(B, dtype=np.int64)          # the step's tokens, copied in
        self.H = np.empty((B, 1, d), dtype=dtype)       # (B, 1, d): room for their embeddings
        self.vocab = E.shape[0]
        self.head_parallel = head_parallel
        # block 0's cache arrays (its K, V and work buffer) come from the caller's list at
        # each call: the step keeps no strong reference to a cache
        self._before = (self.ids, E, P, self.H, flat, d) + scalars
        self._after = (c0.max_T, layers, np.empty((PLAN_ROWS, PLAN_COLS), np.intp))
        self._head = (ln_f, eps_f, Ep, self.vocab)

    def __call__(self, c0, past: int, logits: np.ndarray) -> int:
        """kernels.decode.decode_step of self.ids at position ``past`` into logits (B * vocab,
        flat), c0 the first block's cache (the caller's, checked to be this step's): its
        code (-1: done)."""
        # as _run_cached and GPT2._logits size their calls: the same builds, the same sums
        stack = not _serial(_cached_flops(self.batch, 1, past, self.per_row, self.per_key))
        head = self.head_parallel and _runtime.parallel_allowed()
        args = (self._before + (c0._K.reshape(-1), c0._V.reshape(-1), past) + self._after + (c0._work,)
                + self._head + (logits, stack, head))
        if stack or head:
            return parallel_call(decode_step, *args, pass_threads=True)
        return decode_step(*args, 1)


def parallel_call(fn, *args, pass_threads=False):
    """``fn(*args)`` (``fn(*args, nthr)`` with pass_threads) on tblock's thread count, one
    caller at a time.  Numba's thread count is thread-local, so it is set here, in the
    calling thread, and put back afterwards.  Numba's chunk size is left alone: a block's
    prange runs one iteration per thread, each claiming tasks (kernels.block), so it has
    nothing to split (and the OpenMP layer ignores it), and setting it costs a call time."""
    if _runtime._serial_only:
        raise RuntimeError("parallel code cannot run in a child forked after this process used "
                           "Numba's OpenMP pool; start children with spawn or forkserver")
    n = _runtime._threads
    with _PARALLEL_LOCK:
        old_n = numba.get_num_threads()
        if old_n != n:
            numba.set_num_threads(n)
        try:
            return fn(*args, n) if pass_threads else fn(*args)
        finally:
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
        for name in ("b_q", "b_k", "b_v", "b_o"):
            a.setdefault(name, np.zeros(d, dtype))
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
    B = H.shape[0]
    nh = cfg.n_heads
    scale = 1.0 / np.sqrt(cfg.d_k)
    tr = {}

    def probs(S):
        A = np.empty_like(S)
        masked_softmax_rows(np.ascontiguousarray(S), scale, cfg.causal, A)
        return A

    def attention(X):
        Q, K, V = X @ w["w_q"] + w["b_q"], X @ w["w_k"] + w["b_k"], X @ w["w_v"] + w["b_v"]
        A = np.stack([head_probs(Q[b], K[b], nh, probs, dt) for b in range(B)])
        oc = np.stack([head_mix(A[b], V[b], dt) for b in range(B)])
        A_out = oc @ w["w_o"] + w["b_o"]
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
    serial and the parallel block, without and with a KV cache (a stack's decode step
    among them), the trace path, tblock.GPT2's vocabulary head and its prepared decode
    step, so no later call compiles."""
    from ..weights import init_weights
    cfg = BlockConfig(d_model=8, n_heads=2)
    for dtype in (np.float32, np.float64):
        w = init_weights(cfg, seed=0, dtype=dtype)
        H = np.zeros((1, 4, 8), dtype=dtype)
        H.flags.writeable = False          # the API hands backends read-only, aligned C arrays
        args = (H, _packed(w, dtype), 4, 8) + _plan(w, cfg, dtype)[2]
        for X in (H, H[0], H.copy(), H[0].copy()):  # the lane's: 2-D or 3-D, read-only or not
            block_serial(X, args[1], np.empty(X.shape, dtype), *args[2:], 1)
        if not _runtime._serial_only:
            parallel_call(block_parallel, *args, pass_threads=True)
        cache = KVCache(cfg, 5, dtype=dtype)
        cached = args + _cache_args(cache, ONE_BLOCK)
        cached_serial(*cached, 1)
        if not _runtime._serial_only:
            parallel_call(cached_parallel, *cached, pass_threads=True)
        forward_batch(H, w, cfg, True)      # the trace path, its finiteness check included
        _warm_head(dtype)
        _warm_decode(dtype)


def _warm_head(dtype):
    """The vocabulary head (kernels.lm_head) with the array kinds tblock.GPT2 passes: the
    stream writeable, LN_f's affine and the packed embedding read-only."""
    from ..kernels.lm_head import head_parallel, head_serial, pack_head
    d, vocab, rows = 8, 8, 4
    P = np.concatenate([np.ones(d, dtype), np.zeros(d, dtype)])
    P.flags.writeable = False
    args = (np.zeros(rows * d, dtype), rows, d, P, 1e-5, pack_head(np.zeros((vocab, d)), dtype), vocab,
            np.empty(rows * vocab, dtype), False)
    head_serial(*args, 1)
    if not _runtime._serial_only:
        parallel_call(head_parallel, *args, pass_threads=True)


def _warm_decode(dtype):
    """tblock.GPT2's prepared decode step (kernels.decode), through a tiny model's steps."""
    from ..gpt2 import GPT2
    model = GPT2.from_config(vocab_size=8, n_positions=4, n_embd=8, n_layer=2, n_head=2, seed=0, dtype=dtype)
    cache = model.make_cache(4)
    for t in range(3):                  # the prompt, a checked step, a prepared one
        model.next_logits(np.arange(t, t + 1 + (t == 0)), cache)


# ----------------------------------------------------------------------------- components
# The fused block runs LN, QKV, attention, W_O, FFN and the residuals in one compiled call;
# its attention core is exposed on its own (kernels.block.attention_core), and the
# projections and the FFN are driven here with the block's own kernels, tiles and task split.

# not cached: Numba's on-disk cache is keyed on this file alone, so after a change to the
# kernels these drivers would keep the old kernels compiled in
DRIVER_JIT = {**JIT, "cache": False}


@njit(parallel=True, **DRIVER_JIT)
def _projection(A, lda, rows, K, Wf, b_off, N, C, ldc, bias_off, nthr):
    """C[0:rows, 0:N] = A[0:rows, 0:K] @ (the packed matrix at Wf[b_off]) + (the padded bias
    at Wf[bias_off]), split into tasks as the block's QKV and W_O stages are (stage_grid)."""
    npn = panels(N, panel_lanes(Wf))
    mc, groups, ntasks = stage_grid(rows, npn, MC, nthr)
    for t in prange(ntasks):
        r0, r1, p0, p1 = task_tile(t, groups, mc, rows, npn)
        gemm_block(A, 0, lda, r0, r1, Wf, b_off, K, N, p0, p1, C, 0, ldc, False, KC, bias_off)


@njit(parallel=True, **DRIVER_JIT)
def _ffn(X, Wf, rows, d, dff, act, out, nthr):
    """The block's FFN stage without its LayerNorm and residual: the same row tiles
    and the same ffn_tile (up-projection, bias + activation, down-projection + b_ff2)."""
    mf = rows_per_task(rows, MF, nthr)
    for t in prange(ceil_div(rows, mf)):
        r0 = t * mf
        ffn_tile(X, r0 * d, min(rows, r0 + mf) - r0, d, dff, Wf, act, out, r0 * d, False)


def components(cfg, weights, dtype):
    """The block's own kernels on the backend's own packed weights (one copy, one layout)."""
    from .components import ComponentSet, block_fn

    cs = ComponentSet("numba", cfg, dtype, dtype)
    Wf = _packed(weights, dtype)
    d, dff, n_heads = cfg.d_model, cfg.d_ff, cfg.n_heads
    NR = panel_width(dtype)             # the panel width _pack_weights used
    o_qkv, o_o, _, _, _, _, o_g1, o_be1, _, _, o_bqkv, o_bo, _ = weight_layout(d, dff, NR)
    act = ACTIVATION_CODES[cfg.activation]

    def layernorm(X):
        Y = np.empty_like(X)
        layernorm_rows(X.reshape(-1), 0, d, Y.reshape(-1), 0, d, X.shape[0], d, Wf, o_g1, o_be1, cfg.eps)
        return Y

    def softmax(S):
        out = np.empty_like(S)
        for h in range(S.shape[0]):
            masked_softmax_rows(S[h], 1.0, cfg.causal, out[h])
        return out

    def core(Q, K, V):
        # the block keeps Q, K, V as rows [Q | K | V] of one buffer: the copy in is O(T d)
        rows = np.concatenate([Q, K, V], axis=1)
        parallel_call(attention_core, rows.reshape(-1), Q.shape[0], d, n_heads, cfg.causal)
        return rows[:, :d]

    def attention(X):
        T = X.shape[0]
        qkv = np.empty(T * 3 * d, dtype=dtype)
        step = packed_len(d, d, NR)     # W_q, W_k, W_v are packed one after another
        bstep = bias_len(d, NR)         # and so are their biases
        for j in range(3):              # Q, K, V: columns j*d.. of the (T, 3d) rows
            parallel_call(_projection, X.reshape(-1), d, T, d, Wf, o_qkv + j * step, d, qkv[j * d:], 3 * d,
                          o_bqkv + j * bstep, pass_threads=True)
        parallel_call(attention_core, qkv, T, d, n_heads, cfg.causal)
        out = np.empty((T, d), dtype=dtype)
        parallel_call(_projection, qkv, 3 * d, T, d, Wf, o_o, d, out.reshape(-1), d, o_bo, pass_threads=True)
        return out

    def ffn(X):
        out = np.empty_like(X)
        parallel_call(_ffn, X.reshape(-1), Wf, X.shape[0], d, dff, act, out.reshape(-1), pass_threads=True)
        return out

    cs.fns.update(layernorm=layernorm, softmax=softmax, attention_core=core, attention=attention,
                  ffn=ffn, block=block_fn("numba", cfg, weights))
    cs.square = "causal"        # flash_rows never visits key tiles above the diagonal
    cs.notes.append("numba: the block is one fused compiled call (tblock.forward); the attention core is "
                    "the block's own kernels.block.attention_core; the projections and the FFN are driven "
                    "here with the block's kernels and tiles (not cached: compiled on the first call); "
                    "layernorm and softmax are the serial row kernels (the fused attention never "
                    "materialises the scores: its online softmax runs on tiles)")
    return cs
