"""Each backend's components as separately callable pieces, for timing them one by one.

``prepare(backend, cfg, weights, dtype)`` returns a ``ComponentSet``: one callable per
component the backend exposes, with the weights cast, fused and transposed once, up
front, so a timed call does only the component's own work; each backend module builds its
own set (its ``components`` function). A component a backend does not expose is listed in
``missing`` with the reason ("n/a" in the reports), never an error.

The components, and the input each callable takes (``make_inputs`` builds them):

    layernorm       the block's first norm (LayerNorm or RMSNorm)    X
                    of a (T, d_model) array
    softmax         masked row softmax of (n_heads, T, T) scores     S
    attention_core  scores -> mask -> softmax -> A V, all heads      Q (T, d_model); K, V (T, d_kv)
                    (grouped-query: query head h reads K/V head       (d_kv = d_model without GQA)
                    h // group; Q and K already rotated)
    attention       the MHA sublayer: QKV projection, the core,      X
                    output projection (no LayerNorm, no residual)
    ffn             the FFN sublayer: up, activation, down           X
    block           the whole block: tblock.forward (for torch,      X
                    the nanoGPT-style Block module)

``attention_core`` is not a sublayer of its own but it is what ``tblock.crossover_T``
models (scores + AV against the FFN's matmuls), so timing it separately lets the
measured crossover be compared with the FLOP model like for like.

For a block beyond the lesson's (``not cfg.lesson_block``: RMSNorm, the gated FFN, rotary,
grouped K/V), ``prepare`` times only what a backend computes for it: a backend whose
``components`` refuses the config, or that builds the lesson's block only (LESSON_ONLY), has
every component n/a with the reason, and each component it does expose is first checked
against the numpy oracle's on a short input (``check_against_oracle``); one that raises or
disagrees is n/a, with the reason, instead of timing work the block does not do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import api
from ..config import BlockConfig
from ..counting import flops
from ..weights import BlockWeights
from . import BACKEND_MODULES, DEFAULT_BACKEND

COMPONENTS = ("layernorm", "softmax", "attention_core", "attention", "ffn", "block")
# the default backend first: the ratios in the reports are taken against it
BACKENDS = (DEFAULT_BACKEND,) + tuple(b for b in BACKEND_MODULES if b != DEFAULT_BACKEND)
# backends whose components are built for the lesson's block only -> why
LESSON_ONLY = {"torch": "nanoGPT's modules compute the lesson's block only (LayerNorm, the two-matrix GELU/ReLU "
                        "FFN, no rotary, n_kv_heads = n_heads)"}
# the oracle's components on this many tokens check another backend's for a variant block
CHECK_T = 8
# relative error (max |difference| over max |oracle|) a checked component may show, by the
# dtype it computes in
CHECK_TOLERANCE = {"float64": 1e-9, "float32": 1e-3}


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
            out[name] = (normal(T, d), normal(T, cfg.d_kv), normal(T, cfg.d_kv))    # Q; K, V of the K/V heads
        elif name in COMPONENTS:
            out[name] = (X,)
        else:
            raise ValueError(f"component must be one of {COMPONENTS}, got {name!r}")
    return out


def point_memory(cfg, T, component, backend, dtype) -> int:
    """Rough peak bytes of one component call of ``backend``, its inputs included: the
    (n_heads, T, T) arrays dominate (the report and the benchmarks skip what would not fit)."""
    if component not in ("softmax", "attention_core", "attention", "block"):
        return 0
    # the numpy oracle keeps every head's float64 A plus masks and temporaries
    item = 8 if backend in ("numpy", "c") else np.dtype(dtype).itemsize
    square = cfg.n_heads * T * T * item
    if component == "softmax":
        return 3 * square                     # input (drawn in float64 first), output
    if backend == "numpy":
        return 3 * square
    return 2 * T * T * 8 if backend == "c" else 0     # C: one head's scores and A; numba tiles


# ---------------------------------------------------------------------------------------
# availability

def backend_status(backend: str) -> tuple[bool, str]:
    """(can run here, why not) for one of BACKENDS; never raises for a known name."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
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
        **weights.float_arrays(dtype))
    if cfg.lesson_block:
        cs = api.get_backend(backend).components(cfg, weights, dtype)
    else:
        cs = _variant_components(backend, cfg, weights, dtype)
    for name in COMPONENTS:
        if name not in cs.fns and name not in cs.missing:
            cs.missing[name] = f"the {backend} backend does not expose it"
    return cs


def _variant_components(backend, cfg, weights, dtype) -> ComponentSet:
    """``backend``'s components for a block beyond the lesson's: only those that compute it."""
    why = LESSON_ONLY.get(backend)
    if why is None:
        try:
            cs = api.get_backend(backend).components(cfg, weights, dtype)
        except Exception as e:          # a backend that refuses the config (by name, or failing to build)
            why = f"{type(e).__name__}: {e}"[:300]
        else:
            if backend != "numpy":      # the oracle is what the others are checked against
                check_against_oracle(cs, cfg, weights, dtype)
            return cs
    cs = ComponentSet(backend, cfg, dtype, dtype)
    cs.missing.update({name: f"not computed for this block: {why}" for name in COMPONENTS})
    return cs


def check_against_oracle(cs: ComponentSet, cfg: BlockConfig, weights: BlockWeights, dtype) -> None:
    """Run each of ``cs``'s components once on CHECK_T tokens next to the numpy oracle's;
    one that raises or differs by more than CHECK_TOLERANCE (relative to the oracle's
    largest value) moves to ``cs.missing`` with the reason."""
    ref = api.get_backend("numpy").components(cfg, weights, dtype)
    inputs = make_inputs(cfg, CHECK_T, dtype, seed=CHECK_T, components=list(cs.fns))
    tol = CHECK_TOLERANCE["float64" if np.dtype(cs.compute_dtype) == np.float64 else "float32"]
    for name in list(cs.fns):
        want = np.asarray(ref.fns[name](*inputs[name]), dtype=np.float64)
        try:
            got = np.asarray(cs.fns[name](*inputs[name]), dtype=np.float64)
        except Exception as e:
            why = f"raised {type(e).__name__}: {e}"[:300]
        else:
            err = (np.max(np.abs(got - want)) / max(np.max(np.abs(want)), np.finfo(np.float64).tiny)
                   if got.shape == want.shape else None)
            if err is not None and err <= tol:
                continue
            why = (f"gave shape {got.shape}, the oracle {want.shape}" if err is None else
                   f"differs from the numpy oracle by {err:.1e} relative (> {tol:g})")
        del cs.fns[name]
        cs.missing[name] = f"not timed for this block: at T={CHECK_T} it {why}"
    cs.notes.append(f"each component timed for this block was first checked against the numpy oracle at "
                    f"T={CHECK_T} (compilation, if any, happened there)")


def block_fn(backend, cfg, weights):
    """The whole block through tblock.forward, as a component."""
    def block(X):
        return api.forward(X, weights, cfg, backend=backend)
    return block
