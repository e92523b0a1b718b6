"""Each backend's components as separately callable pieces, for timing them one by one.

``prepare(backend, cfg, weights, dtype)`` returns a ``ComponentSet``: one callable per
component the backend exposes, with the weights cast, fused and transposed once, up
front, so a timed call does only the component's own work. A component a backend does
not expose is listed in ``missing`` with the reason ("n/a" in the reports), never an error.

The components, and the input each callable takes (``make_inputs`` builds them):

    layernorm       one LayerNorm of a (T, d_model) array            X
    softmax         masked row softmax of (n_heads, T, T) scores     S
    attention_core  scores -> mask -> softmax -> A V, all heads      Q, K, V  (T, d_model) each
    attention       the MHA sublayer: QKV projection, the core,      X
                    output projection (no LayerNorm, no residual)
    ffn             the FFN sublayer: up, activation, down           X
    block           the whole block: tblock.forward (for torch,      X
                    the nanoGPT-style Block module)

``attention_core`` is not a sublayer of its own but it is what ``tblock.crossover_T``
models (scores + AV against the FFN's two matmuls), so timing it separately lets the
measured crossover be compared with the FLOP model like for like.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import api, oracle
from .config import BlockConfig
from .counting import flops
from .weights import BlockWeights

COMPONENTS = ("layernorm", "softmax", "attention_core", "attention", "ffn", "block")
# numba first: it is the default backend, and the ratios in the reports are taken against it
BACKENDS = ("numba", "numpy", "c", "torch")


@dataclass
class ComponentSet:
    backend: str
    cfg: BlockConfig
    dtype: np.dtype                 # dtype of the inputs handed to every callable
    compute_dtype: np.dtype         # dtype the backend computes in (the oracle: always float64)
    fns: dict = field(default_factory=dict)       # component -> callable(*inputs)
    missing: dict = field(default_factory=dict)   # component -> why it is n/a for this backend
    notes: list = field(default_factory=list)     # anything a reader of the timings should know
    prepare_s: float = 0.0                        # wall time prepare() took (casts, fusing, copies)
    # which T x T work the attention really does when causal: "full" (the whole square is
    # computed, then masked) or "causal" (tiles above the diagonal are skipped)
    square: str = "full"
    _keep: list = field(default_factory=list, repr=False)   # foreign memory the callables point into

    def available(self, component: str) -> bool:
        return component in self.fns


# ---------------------------------------------------------------------------------------
# FLOPs per component, taken from tblock.flops so the reports can never disagree with it

def component_flops(cfg: BlockConfig, T: int) -> dict[str, dict[str, int]]:
    """{"full": {component: FLOPs}, "causal": {...}} for one sequence of T tokens."""
    fc = flops(cfg, T)

    def pick(c):
        return {
            "layernorm": c["layernorm"] // 2,   # tblock.flops counts LN1 and LN2; a component is one
            "softmax": c["softmax"],
            "attention_core": c["scores"] + c["softmax"] + c["av"],
            "attention": c["qkv"] + c["scores"] + c["softmax"] + c["av"] + c["out_proj"],
            "ffn": c["ffn_up"] + c["activation"] + c["ffn_down"],
            "block": sum(c.values()),
        }

    return {"full": pick(fc.full), "causal": pick(fc.causal)}


def sublayer_crossover_T(cfg: BlockConfig, causal: bool) -> float:
    """T at which the whole attention sublayer's FLOPs (QKV, scores, softmax, AV, W_O)
    equal the whole FFN's; interpolated between the two integers that bracket it.

    About 2 d_model for the full square and 4 d_model causal: half of ``crossover_T``,
    because the sublayer also carries the 8 T d^2 of its four projections."""
    kind = "causal" if causal else "full"

    def gap(T):
        c = component_flops(cfg, T)[kind]
        return c["attention"] - c["ffn"]

    if gap(1) >= 0:
        return 1.0
    hi = 2
    while gap(hi) < 0:       # attention grows as T^2, the FFN as T: this ends
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    g_lo, g_hi = gap(lo), gap(hi)
    return lo + (-g_lo) / (g_hi - g_lo)


# ---------------------------------------------------------------------------------------
# inputs

def make_inputs(cfg: BlockConfig, T: int, dtype=np.float32, seed: int = 0,
                components=COMPONENTS) -> dict[str, tuple]:
    """The arguments of each named component's callable: standard normal, C-contiguous,
    writable. Only the named ones are drawn (the (n_heads, T, T) scores get large)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    d = cfg.d_model

    def normal(*shape):
        return rng.standard_normal(shape, dtype=np.float64).astype(dtype)

    out = {}
    X = normal(T, d)     # the sublayers see LayerNorm output: unit-variance rows
    for name in components:
        if name == "softmax":
            # scores after the 1/sqrt(d_k) scale are about N(0, 1) for unit-variance Q and K
            out[name] = (normal(cfg.n_heads, T, T),)
        elif name == "attention_core":
            out[name] = (normal(T, d), normal(T, d), normal(T, d))
        elif name in COMPONENTS:
            out[name] = (X,)
        else:
            raise ValueError(f"component must be one of {COMPONENTS}, got {name!r}")
    return out


def input_bytes(cfg: BlockConfig, T: int, component: str, dtype=np.float32) -> int:
    """Memory of one component's inputs, so callers can skip sizes that would not fit."""
    item = np.dtype(dtype).itemsize
    if component == "softmax":
        return cfg.n_heads * T * T * item
    if component == "attention_core":
        return 3 * T * cfg.d_model * item
    return T * cfg.d_model * item


# ---------------------------------------------------------------------------------------
# availability

def backend_status(backend: str) -> tuple[bool, str]:
    """(can run here, why not) for one of BACKENDS; never raises for a known name."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        if importlib.util.find_spec("torch") is None:
            return False, "torch is not installed (it is an optional peer: pip install torch)"
        try:
            importlib.import_module("torch")
        except Exception as e:          # a broken torch install must not break the report
            return False, f"torch failed to import: {e}"
        return True, ""
    try:
        api.get_backend(backend)
    except api.BackendUnavailable as e:
        return False, str(e)
    return True, ""


def available_backends() -> list[str]:
    return [b for b in BACKENDS if backend_status(b)[0]]


def prepare(backend: str, cfg: BlockConfig, weights: BlockWeights, dtype=np.float32) -> ComponentSet:
    """Every component ``backend`` exposes, ready to call on ``make_inputs``'s arrays."""
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    weights.check(cfg)
    ok, why = backend_status(backend)
    if not ok:
        raise api.BackendUnavailable(f"backend {backend!r} cannot run here: {why}")
    dtype = np.dtype(dtype)
    # the block's weights in the timed dtype, so a backend never converts them per call
    weights = weights if weights.dtype == dtype else BlockWeights(
        **{k: a.astype(dtype) for k, a in weights.arrays().items()})
    cs = _PREPARE[backend](cfg, weights, dtype)
    for name in COMPONENTS:
        if name not in cs.fns and name not in cs.missing:
            cs.missing[name] = f"the {backend} backend does not expose it"
    return cs


def _block_fn(backend, cfg, weights):
    def block(X):
        return api.forward(X, weights, cfg, backend=backend)
    return block


# ---------------------------------------------------------------------------------------
# numpy: the oracle's own functions, in float64 as tblock.oracle.forward_batch runs them

def _numpy_components(cfg, weights, dtype):
    cs = ComponentSet("numpy", cfg, dtype, np.dtype(np.float64))
    cs.notes.append("the numpy oracle computes in float64 whatever the input dtype, "
                    "and always fills the full T x T score square")
    w = {k: a.astype(np.float64) for k, a in weights.arrays().items()}
    ln1 = (w.get("ln1_gamma"), w.get("ln1_beta"))
    scale = 1.0 / np.sqrt(cfg.d_k)

    def allowed(T):
        return oracle.causal_mask(T) if cfg.causal else np.ones((T, T), dtype=bool)

    def layernorm(X):
        return oracle.layernorm(X.astype(np.float64), *ln1, eps=cfg.eps)

    def softmax(S):
        # the oracle's per-head step: mask, then its max-subtracted row softmax
        S = S.astype(np.float64)
        keep = allowed(S.shape[-1])
        return np.stack([oracle.softmax_rows(np.where(keep, S[h], -np.inf)) for h in range(S.shape[0])])

    def attention_core(Q, K, V):
        # oracle.attention's head loop without its projections
        Q, K, V = Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64)
        keep = allowed(Q.shape[0])
        out = np.zeros_like(Q)
        for h in range(cfg.n_heads):
            cols = slice(h * cfg.d_k, (h + 1) * cfg.d_k)
            S = np.where(keep, Q[:, cols] @ K[:, cols].T * scale, -np.inf)
            out[:, cols] = oracle.softmax_rows(S) @ V[:, cols]
        return out

    def attention(X):
        return oracle.attention(X.astype(np.float64), w, cfg, {})

    def ffn(X):
        return oracle.ffn(X.astype(np.float64), w, cfg, {})

    cs.fns.update(layernorm=layernorm, softmax=softmax, attention_core=attention_core,
                  attention=attention, ffn=ffn, block=_block_fn("numpy", cfg, weights))
    return cs


# ---------------------------------------------------------------------------------------
# numba: the fused block (tblock.kernels.block) runs LN, QKV, attention, W_O, FFN and the
# residuals in one compiled call. Its attention core is exposed on its own
# (kernels.block.attention_core); the projections and the FFN are driven here with the
# block's own kernels, tiles and task split

try:
    from numba import njit, prange

    from .kernels.activations import ACTIVATION_CODES
    from .kernels.block import (KC, MC, MF, attention_core as nb_attention_core, ffn_tile, packed_len,
                                 rows_per_task, task_tile, weight_layout)
    from .kernels.gemm import gemm_block, panel_width
    from .kernels.layernorm import layernorm_rows
    from .kernels.options import JIT
    from .kernels.simd import panel_lanes
    from .kernels.softmax import CAUSAL, NO_MASK, masked_softmax_rows
except Exception as e:      # not there, or broken: these components become n/a, not an error
    _NUMBA_KERNELS_MISSING = f"tblock.kernels cannot be used ({type(e).__name__}: {e})"
else:
    _NUMBA_KERNELS_MISSING = None

    # Numba's on-disk cache is keyed on this file alone: after a change to the kernels
    # these drivers would keep the old kernels compiled in, so they are not cached
    # (their compile time shows in the report as first-call overhead).
    DRIVER_JIT = {**JIT, "cache": False}

    @njit(parallel=True, **DRIVER_JIT)
    def _nb_projection(A, lda, rows, K, Wf, b_off, N, C, ldc):
        """C[0:rows, 0:N] = A[0:rows, 0:K] @ (the packed matrix at Wf[b_off]), tiled like
        the block's QKV and W_O stages: MC-row blocks, split by columns when few."""
        NR = panel_lanes(Wf)
        nrb = (rows + MC - 1) // MC
        npn = (N + NR - 1) // NR
        groups = min(npn, max(1, 8 // nrb))
        for t in prange(nrb * groups):
            r0, r1, p0, p1 = task_tile(t, groups, MC, rows, npn)
            gemm_block(A, 0, lda, r0, r1, Wf, b_off, K, N, p0, p1, C, 0, ldc, False, KC)

    @njit(parallel=True, **DRIVER_JIT)
    def _nb_ffn(X, Wf, rows, d, dff, act, out, nthr):
        """The block's stage 5 without its LayerNorm and residual: the same row tiles
        and the same ffn_tile (up-projection, bias + activation, down-projection + b_ff2)."""
        mf = rows_per_task(rows, MF, nthr)
        for t in prange((rows + mf - 1) // mf):
            r0 = t * mf
            ffn_tile(X, r0 * d, min(rows, r0 + mf) - r0, d, dff, Wf, act, out, r0 * d, False)


def _numba_components(cfg, weights, dtype):
    cs = ComponentSet("numba", cfg, dtype, dtype)
    cs.fns["block"] = _block_fn("numba", cfg, weights)
    try:
        if _NUMBA_KERNELS_MISSING:
            raise ImportError(_NUMBA_KERNELS_MISSING)
        from ._numba_backend import _KEY, _pack_weights, parallel_call
    except ImportError as e:
        for name in ("layernorm", "softmax", "attention_core", "attention", "ffn"):
            cs.missing[name] = f"not wired: {e}"
        return cs
    # the backend's own packed weights, under its own cache key: one copy, one layout
    Wf = weights.prepared((_KEY, dtype.char), lambda w: _pack_weights(w, dtype))
    d, dff, n_heads = cfg.d_model, cfg.d_ff, cfg.n_heads
    NR = panel_width(dtype)             # the panel width the packing used
    o_qkv, o_o, _, _, _, _, o_g1, o_be1, _, _, _ = weight_layout(d, dff, NR)
    act = ACTIVATION_CODES[cfg.activation]
    no_add, no_keep = np.zeros((1, 1)), np.zeros((1, 1), dtype=np.bool_)

    def layernorm(X):
        T = X.shape[0]
        Y = np.empty_like(X)
        layernorm_rows(X.reshape(-1), 0, d, Y.reshape(-1), 0, d, T, d, Wf, o_g1, o_be1, cfg.eps)
        return Y

    def softmax(S):
        out = np.empty_like(S)
        kind = CAUSAL if cfg.causal else NO_MASK
        for h in range(S.shape[0]):
            masked_softmax_rows(S[h], 1.0, kind, no_add, no_keep, out[h])
        return out

    def attention_core(Q, K, V):
        # the block keeps Q, K, V as rows [Q | K | V] of one buffer: the copy in is O(T d)
        T = Q.shape[0]
        rows = np.empty((T, 3 * d), dtype=dtype)
        rows[:, :d], rows[:, d:2 * d], rows[:, 2 * d:] = Q, K, V
        parallel_call(nb_attention_core, rows.reshape(-1), T, d, n_heads, cfg.causal)
        return rows[:, :d]

    def attention(X):
        T = X.shape[0]
        qkv = np.empty(T * 3 * d, dtype=dtype)
        step = packed_len(d, d, NR)     # W_q, W_k, W_v are packed one after another
        for j in range(3):              # Q, K, V: columns j*d.. of the (T, 3d) rows
            parallel_call(_nb_projection, X.reshape(-1), d, T, d, Wf, o_qkv + j * step, d, qkv[j * d:], 3 * d)
        parallel_call(nb_attention_core, qkv, T, d, n_heads, cfg.causal)
        out = np.empty((T, d), dtype=dtype)
        parallel_call(_nb_projection, qkv, 3 * d, T, d, Wf, o_o, d, out.reshape(-1), d)
        return out

    def ffn(X):
        T = X.shape[0]
        out = np.empty((T, d), dtype=dtype)
        parallel_call(_nb_ffn, X.reshape(-1), Wf, T, d, dff, act, out.reshape(-1), pass_threads=True)
        return out

    cs.fns.update(layernorm=layernorm, softmax=softmax, attention_core=attention_core,
                  attention=attention, ffn=ffn)
    cs.square = "causal"        # flash_rows never visits key tiles above the diagonal
    cs.notes.append("numba: the block is one fused compiled call (tblock.forward); the attention core is "
                    "the block's own kernels.block.attention_core; the projections and the FFN are driven "
                    "here with the block's kernels and tiles (not cached: compiled on the first call); "
                    "layernorm and softmax are the serial row kernels (the fused attention never "
                    "materialises the scores: its online softmax runs on tiles)")
    return cs


def _c_components(cfg, weights, dtype):
    """The C reference's own entry points (c_ref/tblock_ref.h) through its cffi module:
    outputs and scratch are allocated once per T, so a timed call is the cast to float64
    (the C reference computes in double only, as forward_batch does) plus the C work."""
    cs = ComponentSet("c", cfg, dtype, np.dtype(np.float64))
    cs.fns["block"] = _block_fn("c", cfg, weights)
    cs.missing["attention"] = ("the C reference exposes no projection (matmul) entry point, only "
                               "tb_attention_head (the core) and the whole block")
    try:
        ext = importlib.import_module("tblock._cref")
        from ._c_backend import config_fields
        ffi, lib = ext.ffi, ext.lib
        fields = config_fields(cfg)
        for name in ("tb_layernorm_rows", "tb_masked_softmax_rows", "tb_attention_head", "tb_ffn"):
            getattr(lib, name)
    except (ImportError, AttributeError) as e:
        for name in ("layernorm", "softmax", "attention_core", "ffn"):
            cs.missing[name] = f"the C reference's entry points are not reachable ({e})"
        return cs
    c_cfg = ffi.new("tb_config *", fields)
    w64 = {k: np.ascontiguousarray(a, dtype=np.float64) for k, a in weights.arrays().items()}
    c_w = ffi.new("tb_weights *")
    keep = [c_cfg, c_w]                    # cffi frees what nothing references: hold it all
    for name, a in w64.items():
        p = ffi.from_buffer("double[]", a)
        keep.append(p)
        setattr(c_w, name, p)
        setattr(c_w, name + "_len", a.size)
    d, f, n_heads = cfg.d_model, cfg.d_ff, cfg.n_heads
    gamma = w64.get("ln1_gamma")
    g_p = ffi.NULL if gamma is None else ffi.from_buffer("double[]", gamma)
    b_p = ffi.NULL if gamma is None else ffi.from_buffer("double[]", w64["ln1_beta"])
    keep += [g_p, b_p]
    buffers = {}

    def bufs(key, *shapes):
        # per-shape output buffers with their C pointers, made on the warm-up call
        if key not in buffers:
            arrays = [np.empty(s) for s in shapes]
            buffers[key] = [(a, ffi.from_buffer("double[]", a, require_writable=True)) for a in arrays]
        return buffers[key]

    def check(name, code):
        if code != 0:
            raise RuntimeError(f"{name} failed: {ffi.string(lib.tb_status_name(code)).decode()}")

    def ptr(a):
        return ffi.from_buffer("double[]", a)

    def layernorm(X):
        X = np.ascontiguousarray(X, dtype=np.float64)
        T = X.shape[0]
        [(out, out_p)] = bufs(("ln", T), (T, d))
        check("tb_layernorm_rows", lib.tb_layernorm_rows(out_p, out.size, ptr(X), X.size, T, d, g_p, b_p,
                                                         0 if gamma is None else d, cfg.eps))
        return out

    def softmax(S):
        S = np.ascontiguousarray(S, dtype=np.float64)
        H, T = S.shape[0], S.shape[1]
        [(out, out_p)] = bufs(("sm", H, T), S.shape)
        s_p = ptr(S)
        for h in range(H):          # the C function masks by row index: one head per call
            check("tb_masked_softmax_rows", lib.tb_masked_softmax_rows(
                out_p + h * T * T, T * T, s_p + h * T * T, T * T, T, T, int(cfg.causal)))
        return out

    def attention_core(Q, K, V):
        Q, K, V = (np.ascontiguousarray(a, dtype=np.float64) for a in (Q, K, V))
        T = Q.shape[0]
        (out, out_p), (A, A_p), (S, S_p) = bufs(("core", T), (T, d), (T, T), (T, T))
        q, k, v = ptr(Q), ptr(K), ptr(V)
        for h in range(n_heads):
            check("tb_attention_head", lib.tb_attention_head(out_p, out.size, A_p, A.size, S_p, S.size,
                                                             q, Q.size, k, K.size, v, V.size, T, h, c_cfg))
        return out

    def ffn(X):
        X = np.ascontiguousarray(X, dtype=np.float64)
        T = X.shape[0]
        (out, out_p), (pre, pre_p), (post, post_p) = bufs(("ffn", T), (T, d), (T, f), (T, f))
        check("tb_ffn", lib.tb_ffn(out_p, out.size, pre_p, pre.size, post_p, post.size, ptr(X), X.size,
                                   T, c_cfg, c_w))
        return out

    cs.fns.update(layernorm=layernorm, softmax=softmax, attention_core=attention_core, ffn=ffn)
    cs._keep = keep
    cs.notes.append("the C reference computes in float64 (inputs are cast inside each timed call) and "
                    "fills the full T x T score square, masked entries included")
    return cs


# ---------------------------------------------------------------------------------------
# torch: nanoGPT's model.py modules, the one module the peers benchmark runs too (tblock.peers)

def _torch_components(cfg, weights, dtype):
    import torch

    from .peers import torch_module

    block = torch_module(weights, cfg, dtype)

    masks = {}

    def keep(T):
        if T not in masks:      # built on the warm-up call, never inside a timed one
            masks[T] = torch.ones(T, T, dtype=torch.bool).tril()
        return masks[T]

    # from_numpy shares memory, so handing numpy inputs over costs nothing; a batch of one
    @torch.inference_mode()
    def layernorm(X):
        return block.ln_1(torch.from_numpy(X))

    @torch.inference_mode()
    def softmax(S):
        S = torch.from_numpy(S)
        if cfg.causal:
            S = S.masked_fill(~keep(S.shape[-1]), float("-inf"))
        return torch.softmax(S, dim=-1)

    @torch.inference_mode()
    def attention_core(Q, K, V):
        return block.attn.core(torch.from_numpy(Q)[None], torch.from_numpy(K)[None], torch.from_numpy(V)[None])[0]

    @torch.inference_mode()
    def attention(X):
        return block.attn(torch.from_numpy(X)[None])[0]

    @torch.inference_mode()
    def ffn(X):
        return block.mlp(torch.from_numpy(X)[None])[0]

    @torch.inference_mode()
    def whole(X):
        return block(torch.from_numpy(X)[None])[0].numpy()

    cs = ComponentSet("torch", cfg, dtype, dtype, square="causal")   # SDPA's CPU flash kernel skips masked tiles
    cs.fns.update(layernorm=layernorm, softmax=softmax, attention_core=attention_core,
                  attention=attention, ffn=ffn, block=whole)
    cs.notes.append("torch: nanoGPT-style modules under torch.inference_mode, "
                    "F.scaled_dot_product_attention(is_causal=cfg.causal); "
                    "its block is the module, not tblock.forward")
    return cs


_PREPARE: dict[str, Callable] = {
    "numpy": _numpy_components,
    "numba": _numba_components,
    "c": _c_components,
    "torch": _torch_components,
}
