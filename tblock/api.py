"""The block API: validate the arguments once, then dispatch to a backend.

Backends live in tblock.backends, one module each, and share one entry point,
``forward_batch(H, weights, cfg, trace) -> (H_out, trace_dict | None)``, where
``H`` is a read-only C-contiguous (B, T, d_model) float32/float64 array and
``weights`` has already been checked against ``cfg``. Everything a user can get
wrong is caught here, before any backend runs, so no backend ever sees bad input.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from .backends import BACKEND_MODULES, DEFAULT_BACKEND, REFERENCES
from .config import BlockConfig
from .kvcache import KVCache, make_caches
from .weights import BlockWeights, as_float_array, check_finite, init_weights

# lesson names of the intermediates, in the order the block computes them (Pre-LN)
TRACE_NAMES = ("H_norm1", "Q", "K", "V", "A", "out_concat", "A_out", "H_mid",
               "H_norm2", "F_pre", "F_post", "F_out", "H_out")


TRACE_WITH_CACHE = "trace=True cannot be combined with a cache (trace the whole sequence instead)"


class BackendUnavailable(ValueError):
    """The backend exists but cannot run here (e.g. the C reference was not compiled)."""


@dataclass(frozen=True)
class Trace:
    """The block's intermediates by their lesson names.

    Shapes for a (T, d_model) input; a batched (B, T, d_model) input adds a leading B.
    For Post-LN, H_norm1 is LN1(H_in + A_out) (= H_mid) and H_norm2 is LN2(H_mid + F_out)
    (= H_out): the LayerNorms sit on the stream, and Q, K, V and F_pre read H_in and H_mid.
    """
    H_norm1: np.ndarray     # (T, d_model) LN1 output
    Q: np.ndarray           # (T, d_model) all heads' queries; head h is columns h*d_k:(h+1)*d_k
    K: np.ndarray           # (T, d_kv) (d_model but for grouped-query attention); after rotary, if any
    V: np.ndarray           # (T, d_kv)
    A: np.ndarray           # (n_heads, T, T) attention probabilities; A[h][t, i] weight of key i for query t
    out_concat: np.ndarray  # (T, d_model) head outputs side by side
    A_out: np.ndarray       # (T, d_model) MHA output = out_concat @ W_O
    H_mid: np.ndarray       # (T, d_model) stream after the first sublayer
    H_norm2: np.ndarray     # (T, d_model) LN2 output
    F_pre: np.ndarray       # (T, d_ff) hidden pre-activation (the gated FFN's up projection X W1)
    F_post: np.ndarray      # (T, d_ff) hidden after the activation (gated: act(F_gate) * F_pre)
    F_out: np.ndarray       # (T, d_model) FFN output
    H_out: np.ndarray       # (T, d_model) block output
    F_gate: np.ndarray | None = None    # (T, d_ff) the gated FFN's gate X W_gate; None for the mlp


def available_backends() -> list[str]:
    """tblock's own backends that can run in this installation (outside references such as
    "torch" are left out; forward still takes them by name)."""
    out = []
    for name in BACKEND_MODULES:
        if name in REFERENCES:
            continue
        try:
            get_backend(name)
        except BackendUnavailable:
            continue
        out.append(name)
    return out


_LOADED = {}   # backend name -> module, once it has imported and said it can run


def get_backend(name):
    # the hot path: one dict lookup per forward (a name that is not a str, maybe not
    # hashable, is refused below)
    module = _LOADED.get(name) if type(name) is str else None
    if module is not None:
        return module
    if not isinstance(name, str) or name not in BACKEND_MODULES:
        own = tuple(b for b in BACKEND_MODULES if b not in REFERENCES)
        refs = ", ".join(repr(b) for b in REFERENCES)
        if not isinstance(name, str):
            raise TypeError(f"backend must be a str, one of {own} (or a reference: {refs}), "
                            f"got {type(name).__name__}")
        raise ValueError(f"backend must be one of {own}, got {name!r} (or a reference: {refs})")
    try:
        module = importlib.import_module(BACKEND_MODULES[name])
    except ModuleNotFoundError as e:
        if e.name != BACKEND_MODULES[name]:
            raise  # a real import error inside the backend: do not hide it
        raise BackendUnavailable(f"backend {name!r} is not part of this installation") from None
    except ValueError as e:             # its configuration (TBLOCK_ISA) cannot be honoured
        raise BackendUnavailable(f"backend {name!r} cannot run: {e}") from None
    check = getattr(module, "ensure_available", None)
    if check is not None:
        check()  # raises BackendUnavailable with instructions
    _LOADED[name] = module
    return module


def check_input(H, cfg: BlockConfig, name: str = "H", finite: bool = True) -> np.ndarray:
    """Validate a (T, d_model) or (B, T, d_model) float array; return it unchanged.
    ``finite=False`` leaves out the NaN/Inf check (for a backend that does it itself)."""
    H = as_float_array(name, H)
    # issue #31: np.matrix changes what * and reductions mean and a masked array's mask
    # would be ignored, so the numpy backend computed something else: both refused
    if type(H) is not np.ndarray and isinstance(H, (np.matrix, np.ma.MaskedArray)):
        fix = f"np.asarray({name})" if isinstance(H, np.matrix) else f"{name}.filled(value): the mask would be ignored"
        raise TypeError(f"{name} must be a plain numpy array, got {type(H).__module__}.{type(H).__name__}; pass {fix}")
    shape = H.shape                     # fetched once: each .shape builds a new tuple
    if len(shape) not in (2, 3):
        raise ValueError(f"{name} must be (T, d_model) or (B, T, d_model), got shape {shape}")
    if shape[-1] != cfg.d_model:
        raise ValueError(f"{name} must have d_model={cfg.d_model} columns, got shape {shape}")
    if shape[-2] == 0:
        raise ValueError(f"{name} must have at least one token (T >= 1), got shape {shape}")
    if shape[0] == 0:
        raise ValueError(f"{name} must have at least one sequence (B >= 1), got shape {shape}")
    if finite:
        check_finite(name, H)
    return H


def _backend_input(H, cfg: BlockConfig, module):
    """(H checked, H3): H3 the (B, T, d_model) array a backend gets (B=1 for 2-D H):
    read-only, aligned, C-contiguous, native byte order."""
    # a backend with CHECKS_FINITE looks for NaN/Inf in the same call as its work and
    # returns None when it finds one; the caller then raises, the same as ever
    H = check_input(H, cfg, finite=not module.CHECKS_FINITE)
    if not H.dtype.isnative:
        H = H.astype(H.dtype.newbyteorder("="))    # e.g. big-endian data read from a file
    H3 = H[None] if H.ndim == 2 else H.view()      # (B, T, d_model), B=1 for 2-D; a new view
    if not (H3.flags.c_contiguous and H3.flags.aligned):
        H3 = H3.copy(order="C")         # any strides in, aligned C order to the backend
    # read-only: a backend cannot write into the caller's array; and the compiled block
    # sees one array type, whatever the input's flags, so warmup() covers every call
    H3.setflags(write=False)
    return H, H3


def _as_input(H_out: np.ndarray, H: np.ndarray) -> np.ndarray:
    """A backend's (B, T, d_model) output in the shape and dtype of the input H."""
    if H_out.dtype is not H.dtype and H_out.dtype != H.dtype:
        H_out = H_out.astype(H.dtype)   # float64 backends (numpy, c) on float32 input
    if H.ndim == 2:
        H_out = H_out[0]                # (T, d_model) for a 2-D input (cheaper than a reshape)
    return H_out


def forward(H, weights: BlockWeights, cfg: BlockConfig, backend: str | None = None, trace: bool = False,
            cache: KVCache | None = None):
    """Run one transformer block on ``H`` ((T, d_model) or (B, T, d_model), float32 or
    float64, any strides). Returns ``H_out`` with the input's shape and dtype, or
    ``(H_out, Trace)`` with ``trace=True``. Never modifies its arguments.

    With ``cache`` (a KVCache of this config, dtype and batch), ``H`` holds the next rows
    of the sequences whose first ``cache.length`` rows the cache has seen: their keys and
    values are appended to it, and the rows returned are those a forward over the whole
    sequence would give. On any error the cache is left as it was."""
    if (cache is None and trace is False and type(H) is np.ndarray and type(weights) is BlockWeights
            and (backend is None or type(backend) is str)):
        # a repeat plain call: the call the checked path prepared for these weights, this
        # cfg and this backend takes H if it is of the kind that needs no further check
        prepared = weights.prepared_calls.get(DEFAULT_BACKEND if backend is None else backend)
        if prepared is not None and prepared[0] is cfg:
            H_out = prepared[1](H)
            if H_out is not None:
                return H_out
    return _checked_forward(H, weights, cfg, backend, trace, cache)


def _checked_forward(H, weights, cfg, backend, trace, cache):
    """forward with every argument checked; a plain call's success prepares the next."""
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    if not isinstance(weights, BlockWeights):
        raise TypeError(f"weights must be a BlockWeights, got {type(weights).__name__}")
    if not isinstance(trace, bool):
        raise TypeError(f"trace must be a bool, got {type(trace).__name__}")
    if cache is not None:
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a tblock.KVCache, got {type(cache).__name__}")
        if trace:
            raise ValueError(TRACE_WITH_CACHE)
    name = DEFAULT_BACKEND if backend is None else backend
    module = get_backend(name)
    if cache is not None and not hasattr(module, "forward_cached"):
        raise ValueError(f"backend {name!r} has no KV-cache path")
    weights.check(cfg)
    H, H3 = _backend_input(H, cfg, module)
    flat = H.ndim == 2
    if cache is not None:
        cache.check(H3, cfg)
        # the backend writes the new keys and values past cache.length; only a finished
        # call moves cache.length, so a failed one leaves the cache's contents unused
        H_out, tr = module.forward_cached(H3, weights, cfg, cache), None
    else:
        H_out, tr = module.forward_batch(H3, weights, cfg, trace)
    if H_out is None:
        check_finite("H", H)                # raises, naming where the NaN or Inf is
        raise AssertionError("the backend found a NaN or an Inf that check_finite does not")
    if cache is not None:
        cache.length += H3.shape[1]
    H_out = _as_input(H_out, H)
    if cache is None and not trace:
        _prepare_call(weights, cfg, name, module)
    if not trace:
        return H_out
    if flat:
        tr = {k: v[0] for k, v in tr.items()}                    # drop the batch axis of 1
    names = TRACE_NAMES + (("F_gate",) if cfg.ffn == "gated" else ())
    return H_out, Trace(**{k: np.asarray(tr[k], dtype=H.dtype) for k in names})


def _prepare_call(weights, cfg, name: str, module) -> None:
    """Keep backend ``name``'s prepared plain call for these weights and this cfg (checked),
    if it offers one (prepare_call) and it is not kept already."""
    prepared = weights.prepared_calls.get(name)
    if (prepared is None or prepared[0] is not cfg) and hasattr(module, "prepare_call"):
        weights.prepared_calls[name] = (cfg, module.prepare_call(weights, cfg))


class Block:
    """One block with its weights: ``Block(cfg, weights)(H)``."""

    def __init__(self, cfg: BlockConfig, weights: BlockWeights, backend: str | None = None):
        if not isinstance(cfg, BlockConfig):
            raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
        if not isinstance(weights, BlockWeights):
            raise TypeError(f"weights must be a BlockWeights, got {type(weights).__name__}")
        weights.check(cfg)
        if backend is not None:
            get_backend(backend)
        self.cfg, self.weights, self.backend = cfg, weights, backend

    def __call__(self, H, backend: str | None = None, trace: bool = False, cache: KVCache | None = None):
        return forward(H, self.weights, self.cfg, backend=backend or self.backend, trace=trace, cache=cache)

    def make_cache(self, max_T: int, batch: int = 1, dtype=np.float32, format: str = "fp32") -> KVCache:
        """An empty KVCache for this block, its keys and values in ``format`` ("fp32",
        "bf16" or "int8": tblock.kvcache)."""
        return KVCache(self.cfg, max_T, batch, dtype, format)


def _overflow(i: int, dtype) -> ValueError:
    return ValueError(f"the output of block {i} holds a NaN or an Inf (an overflow in {np.dtype(dtype)}): "
                      f"no block's cache has moved")


def _check_distinct(caches) -> None:
    """Every block needs a cache of its own: one object twice would take both blocks' keys."""
    first = {}
    for i, c in enumerate(caches):
        j = first.setdefault(id(c), i)
        if j != i:
            raise ValueError(f"cache[{j}] and cache[{i}] are the same KVCache: each block needs its own "
                             f"(make_cache makes one a block)")


class Stack:
    """N blocks of one architecture, each with its own weights; block l's output
    feeds block l+1."""

    def __init__(self, cfg: BlockConfig, weights, backend: str | None = None):
        if isinstance(weights, BlockWeights) or not hasattr(weights, "__len__"):
            raise TypeError(f"weights must be a list of BlockWeights, got {type(weights).__name__}")
        if len(weights) == 0:
            raise ValueError("weights must hold at least one block's BlockWeights, got an empty list")
        for i, w in enumerate(weights):
            if not isinstance(w, BlockWeights):
                raise TypeError(f"weights[{i}] must be a BlockWeights, got {type(w).__name__}")
            w.check(cfg, name=f"weights[{i}]")
        self.blocks = [Block(cfg, w, backend) for w in weights]
        self.cfg = cfg

    @classmethod
    def init(cfg_cls, cfg: BlockConfig, n_layers: int, seed, scale_branches: bool = True,
             dtype=np.float32, backend: str | None = None) -> "Stack":
        """N freshly initialised blocks; with ``scale_branches`` each block's w_o and w_ff2
        are scaled by the lesson's 1/sqrt(2N). Block l's weights come from the l-th child
        of ``SeedSequence(seed)``, so the scaled and unscaled stacks share their draws."""
        if isinstance(n_layers, bool) or not isinstance(n_layers, (int, np.integer)) or n_layers < 1:
            raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")
        scale = 1.0 / np.sqrt(2 * n_layers) if scale_branches else 1.0
        seeds = np.random.SeedSequence(seed).spawn(n_layers)
        return cfg_cls(cfg, [init_weights(cfg, s, dtype=dtype, branch_scale=scale) for s in seeds], backend)

    def __len__(self):
        return len(self.blocks)

    def make_cache(self, max_T: int, batch: int = 1, dtype=np.float32, format: str = "fp32") -> list[KVCache]:
        """Empty KVCaches, one per block, for ``stack(H, cache=...)``, in ``format``."""
        return make_caches(self.cfg, len(self.blocks), max_T, batch, dtype, format)

    def __call__(self, H, backend: str | None = None, trace: bool = False, cache=None):
        """H_N, or with ``trace=True`` (H_N, [Trace of block 1, ..., block N]).
        ``cache``: a list of one KVCache per block (make_cache); H then holds the next rows."""
        if cache is not None:
            if trace:
                raise ValueError(TRACE_WITH_CACHE)
            return self.run_cached(H, backend, cache)
        traces = []
        for block in self.blocks:
            if trace:
                H, tr = block(H, backend=backend, trace=True)
                traces.append(tr)
            else:
                H = block(H, backend=backend)
        return (H, traces) if trace else H

    def run_cached(self, H, backend, caches, fresh: bool = True):
        """``self(H, backend, cache=caches)``.  fresh=False: the result may be scratch of
        caches[0] that the next call overwrites (GPT2's decode step reads it at once, and
        so allocates nothing)."""
        self._check_caches(caches, H)
        module = get_backend(backend or self.blocks[0].backend or DEFAULT_BACKEND)
        # one call for the whole stack needs one cache layout (max_T) for every block
        if hasattr(module, "forward_stack_cached") and len({c.max_T for c in caches}) == 1:
            return self._forward_cached(H, module, caches, fresh)
        return self._forward_cached_by_block(H, backend, caches)

    def _forward_cached_by_block(self, H, backend, caches):
        """Block after block, each with its cache; on an error no cache has moved."""
        lengths = [c.length for c in caches]
        try:
            for i, (block, c) in enumerate(zip(self.blocks, caches)):
                if i > 0 and not np.isfinite(H).all():
                    raise _overflow(i - 1, H.dtype)
                H = block(H, backend=backend, cache=c)
        except BaseException:
            for c, n in zip(caches, lengths):
                c.length = n        # the keys and values written past a cache's length are unused
            raise
        return H

    def _forward_cached(self, H, module, caches, fresh):
        """Every block with its cache in one backend call (a decode step crosses into
        compiled code once, not once a block); the caches are checked (_check_caches)."""
        for i, block in enumerate(self.blocks):
            block.weights.check(self.cfg, name=f"weights[{i}]")
        H, H3 = _backend_input(H, self.cfg, module)
        H_out, bad = module.forward_stack_cached(H3, [b.weights for b in self.blocks], self.cfg, caches, fresh)
        if H_out is None:
            # no cache has moved: the keys and values written past their length are unused
            if bad == 0:
                check_finite("H", H)            # raises, naming where the NaN or Inf is
            raise _overflow(bad - 1, H.dtype)
        for c in caches:
            c.length += H3.shape[1]
        return _as_input(H_out, H)

    def _check_caches(self, caches, H) -> None:
        # every block's cache is checked before the first one is written, so that a bad
        # one at block l does not leave blocks 0..l-1 a token ahead
        if isinstance(caches, KVCache) or not isinstance(caches, (list, tuple)):
            raise TypeError(f"cache must be a list of one KVCache per block, got {type(caches).__name__}")
        if len(caches) != len(self.blocks):
            raise ValueError(f"cache must hold one KVCache per block ({len(self.blocks)}), got {len(caches)}")
        H3 = check_input(H, self.cfg, finite=False)
        H3 = H3[None] if H3.ndim == 2 else H3
        for i, c in enumerate(caches):
            if not isinstance(c, KVCache):
                raise TypeError(f"cache[{i}] must be a KVCache, got {type(c).__name__}")
            c.check(H3, self.cfg)
        _check_distinct(caches)
        if len({c.format for c in caches}) != 1:
            raise ValueError(f"the blocks' caches hold different formats {[c.format for c in caches]}: "
                             f"make them with one format (make_cache)")
        if len({c.length for c in caches}) != 1:
            raise ValueError(f"the blocks' caches hold different lengths {[c.length for c in caches]}")

    def residual_norms(self, H, backend: str | None = None) -> np.ndarray:
        """Frobenius norms |H_0|, |H_1|, ..., |H_N| of the residual stream along depth."""
        norms = [np.linalg.norm(check_input(H, self.cfg))]
        for block in self.blocks:
            H = block(H, backend=backend)
            norms.append(np.linalg.norm(H))
        return np.array(norms)
