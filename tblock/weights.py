"""BlockWeights and the lesson's initialisation.

Row convention throughout, as in the lesson: a layer acts by right-multiplication,
``X @ W``, so ``w_ff1`` is (d_model, d_ff) and ``w_ff2`` is (d_ff, d_model).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields

import numpy as np

from .config import BlockConfig
from .formats import QuantizedMatrix, check_dot, check_format, quantize_matrix

# (name, shape as a function of the config); the optional ones follow the flags
MATRICES = ("w_q", "w_k", "w_v", "w_o", "w_ff1", "w_ff2")   # every block has these six
GATED = ("w_gate",)                                         # and the gated FFN this one
FFN_BIASES = ("b_ff1", "b_ff2")
ATTN_BIASES = ("b_q", "b_k", "b_v", "b_o")
QKV_BIASES = ("b_q", "b_k", "b_v")
LN_AFFINES = ("ln1_gamma", "ln1_beta", "ln2_gamma", "ln2_beta")
LN_GAINS, LN_SHIFTS = ("ln1_gamma", "ln2_gamma"), ("ln1_beta", "ln2_beta")
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def expected_shape(name: str, cfg: BlockConfig) -> tuple[int, ...]:
    d, f, kv = cfg.d_model, cfg.d_ff, cfg.d_kv
    return {
        "w_q": (d, d), "w_k": (d, kv), "w_v": (d, kv), "w_o": (d, d),
        "w_ff1": (d, f), "w_ff2": (f, d), "w_gate": (d, f),
        "b_ff1": (f,), "b_ff2": (d,), "b_gate": (f,),
        "b_q": (d,), "b_k": (kv,), "b_v": (kv,), "b_o": (d,),
        "ln1_gamma": (d,), "ln1_beta": (d,), "ln2_gamma": (d,), "ln2_beta": (d,),
    }[name]


def weight_names(cfg: BlockConfig) -> list[str]:
    """The arrays a BlockWeights for ``cfg`` holds, in a fixed order: the matrices (w_gate with
    the gated FFN), the FFN biases, the norms' gains (and LayerNorm's shifts), b_q/b_k/b_v, b_o."""
    gated = cfg.ffn == "gated"
    names = list(MATRICES) + (["w_gate"] if gated else [])
    if cfg.ffn_bias:
        names += list(FFN_BIASES) + (["b_gate"] if gated else [])
    if cfg.ln_affine:
        names += list(LN_GAINS) + (list(LN_SHIFTS) if cfg.norm_type == "layernorm" else [])
    if cfg.qkv_bias:
        names += list(QKV_BIASES)
    if cfg.out_bias:
        names += ["b_o"]
    return names


def as_float_array(name: str, value, ndim: int | None = None) -> np.ndarray:
    """Check that ``value`` is a real float32/float64 array (never converting ints,
    complex or objects silently) and return it as an ndarray (no copy)."""
    if not isinstance(value, np.ndarray):
        if isinstance(value, (list, tuple, numbers.Number)):
            value = np.asarray(value)
        else:
            raise TypeError(f"{name} must be a numpy array, got {type(value).__name__}")
    if value.dtype.char not in "fd":    # float32, float64; cheaper than comparing dtypes
        raise TypeError(f"{name} must have dtype float32 or float64, got {value.dtype}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {value.shape}")
    return value


def frozen_copy(a: np.ndarray, dtype) -> np.ndarray:
    """A C-contiguous copy of ``a`` in ``dtype`` that nobody can make writeable again: its
    memory is an immutable bytes object, so ``flags.writeable = True`` raises ValueError (on
    a copy owning its memory it would succeed, and an edit would leave what the backends
    packed from it stale)."""
    data = np.ascontiguousarray(a, dtype=dtype).tobytes()
    return np.frombuffer(data, dtype=dtype).reshape(a.shape)


def check_finite(name: str, a: np.ndarray) -> None:
    # the compiled loop takes native byte order only; big-endian data goes through numpy
    if not (_all_finite(a) if a.dtype.isnative else np.isfinite(a).all()):
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"{name} must be finite, found {a[tuple(bad)]} at index {tuple(int(i) for i in bad)}")


def _all_finite(a: np.ndarray) -> bool:
    # the compiled check (tblock.kernels.validate) is imported on first use: importing
    # it at the top would make tblock.weights fail to import where Numba is missing; where
    # the kernels cannot load (no Numba, a bad TBLOCK_ISA, a broken install) numpy does the check
    global _all_finite
    try:
        from .kernels.validate import all_finite
    except Exception:
        all_finite = lambda x: bool(np.isfinite(x).all())   # noqa: E731
    _all_finite = all_finite
    return all_finite(a)


@dataclass(frozen=True, eq=False)
class BlockWeights:
    # the six matrices: float arrays, or all six QuantizedMatrix of one format (tblock.formats)
    w_q: np.ndarray              # (d_model, d_model) query projection, heads are column slices
    w_k: np.ndarray              # (d_model, d_model) key projection
    w_v: np.ndarray              # (d_model, d_model) value projection
    w_o: np.ndarray              # (d_model, d_model) output projection after the head concat
    w_ff1: np.ndarray            # (d_model, d_ff) FFN up-projection
    w_ff2: np.ndarray            # (d_ff, d_model) FFN down-projection
    w_gate: np.ndarray | None = None     # (d_model, d_ff) the gated FFN's gate, with cfg.ffn "gated"
    b_gate: np.ndarray | None = None     # (d_ff,) its bias, with cfg.ffn_bias
    b_ff1: np.ndarray | None = None      # (d_ff,) FFN hidden bias, with cfg.ffn_bias
    b_ff2: np.ndarray | None = None      # (d_model,) FFN output bias, with cfg.ffn_bias
    ln1_gamma: np.ndarray | None = None  # (d_model,) LN1 gain, with cfg.ln_affine
    ln1_beta: np.ndarray | None = None   # (d_model,) LN1 shift
    ln2_gamma: np.ndarray | None = None  # (d_model,) LN2 gain
    ln2_beta: np.ndarray | None = None   # (d_model,) LN2 shift
    b_q: np.ndarray | None = None        # (d_model,) query bias, with cfg.attn_bias
    b_k: np.ndarray | None = None        # (d_kv,) key bias
    b_v: np.ndarray | None = None        # (d_kv,) value bias
    b_o: np.ndarray | None = None        # (d_model,) output-projection bias, with cfg.out_bias
    # per-config validation results and backend-prepared arrays (fused QKV, casts):
    # safe to cache because every array above is a private copy nobody can make writeable
    # (frozen_copy); init=False, so dataclasses.replace builds a fresh one instead of
    # inheriting the old weights' packing
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # backend name (None: the default) -> (cfg, that backend's prepared plain call), kept by
    # tblock.api's checked path for repeat calls under the same cfg object
    _calls: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        arrays = {}
        names = self.matrix_names
        stored = {n: getattr(self, n) for n in names if isinstance(getattr(self, n), QuantizedMatrix)}
        if stored and (len(stored) < len(names) or len({(m.format, m.dot) for m in stored.values()}) > 1):
            kinds = ", ".join(f"{n}: " + (f"{getattr(self, n).format} (dot {getattr(self, n).dot})" if n in stored
                                          else "float") for n in names)
            raise ValueError(f"the matrices must share one format and dot, got {kinds}")
        for name in MATRICES + GATED + FFN_BIASES + ("b_gate",) + LN_AFFINES + ATTN_BIASES:
            value = getattr(self, name)
            if value is None:
                if name in MATRICES:
                    raise TypeError(f"{name} is required, got None")
                continue
            if name in stored:
                continue                    # checked and frozen by QuantizedMatrix itself
            ndim = 2 if name in MATRICES + GATED else 1
            a = as_float_array(name, value, ndim)
            check_finite(name, a)
            arrays[name] = a
        if any(arrays.get(n) is None for n in FFN_BIASES) and any(arrays.get(n) is not None for n in FFN_BIASES):
            raise ValueError("b_ff1 and b_ff2 must be given together, got only one of them")
        if arrays.get("b_gate") is not None and (self.w_gate is None or arrays.get("b_ff1") is None):
            raise ValueError("b_gate comes with w_gate and b_ff1, b_ff2")
        for group in (LN_GAINS, LN_SHIFTS, QKV_BIASES):
            given = [n for n in group if arrays.get(n) is not None]
            if given and len(given) < len(group):
                raise ValueError(f"{', '.join(group)} must be given together, got only {', '.join(given)}")
        # one dtype for the whole set: float64 if any array is float64; float32 beside
        # stored matrices (their values are float32s)
        dtype = np.dtype(np.float32) if stored else np.result_type(*arrays.values()).newbyteorder("=")
        for name, a in arrays.items():
            # a private, C-contiguous, read-only copy: later edits to the caller's
            # arrays cannot change (or invalidate the cached checks of) these weights
            object.__setattr__(self, name, frozen_copy(a, dtype))

    def __reduce__(self):
        # copy, deepcopy and pickle rebuild through __init__: private read-only arrays again
        # (pickle and deepcopy would hand back writeable ones) and an empty cache of their own
        return type(self), tuple(getattr(self, f.name) for f in fields(self) if f.init)

    @property
    def dtype(self) -> np.dtype:
        """The float type the block computes in (float32 beside stored matrices)."""
        w = self.w_q
        return np.dtype(np.float32) if isinstance(w, QuantizedMatrix) else w.dtype

    @property
    def format(self) -> str:
        """How the matrices are stored: "fp32", "fp64", or a stored format (tblock.formats)."""
        w = self.w_q
        return w.format if isinstance(w, QuantizedMatrix) else ("fp64" if w.dtype == np.float64 else "fp32")

    @property
    def dot(self) -> str:
        """How products with the matrices are computed (tblock.formats): "fp32", or "int8"
        (inputs rounded to int8 blocks first)."""
        w = self.w_q
        return w.dot if isinstance(w, QuantizedMatrix) else "fp32"

    @property
    def quantized(self) -> bool:
        return isinstance(self.w_q, QuantizedMatrix)

    def matrix(self, name: str, dtype=None) -> np.ndarray:
        """Matrix ``name`` as a float array: the array itself, or a stored one dequantized
        (exactly) into ``dtype`` (default: self.dtype)."""
        w = getattr(self, name)
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        if isinstance(w, QuantizedMatrix):
            return w.dequantize(dtype)
        return w if w.dtype == dtype else w.astype(dtype)

    def float_arrays(self, dtype=None) -> dict[str, np.ndarray]:
        """arrays() as float arrays of ``dtype`` (default: self.dtype), stored matrices
        dequantized exactly: what a backend computing in floats multiplies by."""
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        return {n: self.matrix(n, dtype) if n in MATRICES + GATED else a.astype(dtype, copy=False)
                for n, a in self.arrays().items()}

    @property
    def nbytes(self) -> int:
        """Bytes of everything the block stores: what one token's pass reads."""
        return sum(a.nbytes for a in self.arrays().values())

    @property
    def has_ffn_bias(self) -> bool:
        return self.b_ff1 is not None

    @property
    def has_ln_affine(self) -> bool:
        return self.ln1_gamma is not None

    @property
    def has_attn_bias(self) -> bool:
        return self.b_q is not None

    @property
    def has_out_bias(self) -> bool:
        return self.b_o is not None

    @property
    def matrix_names(self) -> tuple[str, ...]:
        """The matrices present: the six, and w_gate for the gated FFN."""
        return MATRICES + GATED if self.w_gate is not None else MATRICES

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays that are present, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.init and getattr(self, f.name) is not None}

    def check(self, cfg: BlockConfig, name: str = "weights") -> "BlockWeights":
        """Raise ValueError unless these weights fit ``cfg``; cheap after the first call."""
        if self._cache.get("last_checked") is cfg:   # identity: cheaper than hashing cfg
            return self
        key = ("checked", cfg)
        if key in self._cache:
            return self
        if not isinstance(cfg, BlockConfig):
            raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
        if cfg.ffn_bias != self.has_ffn_bias:
            raise ValueError(f"{name}: cfg.ffn_bias={cfg.ffn_bias} but the weights "
                             f"{'have' if self.has_ffn_bias else 'lack'} b_ff1/b_ff2")
        if cfg.ln_affine != self.has_ln_affine:
            raise ValueError(f"{name}: cfg.ln_affine={cfg.ln_affine} but the weights "
                             f"{'have' if self.has_ln_affine else 'lack'} LayerNorm gamma/beta")
        if (cfg.qkv_bias, cfg.out_bias) != (self.has_attn_bias, self.has_out_bias):
            have = [n for n in ATTN_BIASES if getattr(self, n) is not None]
            raise ValueError(f"{name}: cfg.attn_bias={cfg.attn_bias!r} asks for "
                             f"{'b_q/b_k/b_v/b_o' if cfg.out_bias else 'b_q/b_k/b_v' if cfg.qkv_bias else 'no biases'} "
                             f"but the weights have {'/'.join(have) if have else 'none'}")
        if (cfg.ffn == "gated") != (self.w_gate is not None):
            raise ValueError(f"{name}: cfg.ffn={cfg.ffn!r} but the weights "
                             f"{'have' if self.w_gate is not None else 'lack'} w_gate")
        if cfg.ffn == "gated" and cfg.ffn_bias != (self.b_gate is not None):
            raise ValueError(f"{name}: cfg.ffn_bias={cfg.ffn_bias} with the gated FFN but the weights "
                             f"{'have' if self.b_gate is not None else 'lack'} b_gate")
        shifts = self.ln1_beta is not None
        if self.has_ln_affine and shifts != (cfg.norm_type == "layernorm"):
            raise ValueError(f"{name}: cfg.norm_type={cfg.norm_type!r} but the weights "
                             f"{'have' if shifts else 'lack'} the norms' beta (RMSNorm has gamma only)")
        for field_name, a in self.arrays().items():
            want = expected_shape(field_name, cfg)
            if tuple(a.shape) != want:
                kv = f", n_kv_heads={cfg.kv_heads}" if cfg.kv_heads != cfg.n_heads else ""
                raise ValueError(f"{name}.{field_name} must have shape {want} for d_model={cfg.d_model}, "
                                 f"d_ff={cfg.d_ff}{kv}, got {a.shape}")
        self._cache[key] = True
        self._cache["last_checked"] = cfg
        return self

    @property
    def prepared_state(self) -> dict:
        """What backends prepared from these weights (packed copies, call plans), by key:
        the backend's to read and fill; the weights never change, so entries stay valid."""
        return self._cache

    @property
    def prepared_calls(self) -> dict:
        """backend name -> (cfg, prepared plain call): tblock.api's, for repeat calls."""
        return self._calls

    def prepared(self, key, build):
        """Backend helper: ``build(self)`` once, then reuse it (the weights never change)."""
        try:
            return self._cache[key]
        except KeyError:
            value = self._cache[key] = build(self)
            return value

    def scaled(self, branch_scale: float) -> "BlockWeights":
        """A copy with the two residual-branch output matrices (w_o, w_ff2) times ``branch_scale``."""
        if self.quantized:
            raise TypeError(f"scaled() takes float weights, these are {self.format}: scale, then quantize")
        a = self.arrays()
        a["w_o"] = a["w_o"] * a["w_o"].dtype.type(branch_scale)
        a["w_ff2"] = a["w_ff2"] * a["w_ff2"].dtype.type(branch_scale)
        return BlockWeights(**a)


def init_weights(cfg: BlockConfig, seed: int, dtype=np.float32, branch_scale: float = 1.0) -> BlockWeights:
    """The lesson's initialisation: N(0,1)/sqrt(d_model) for W_Q, W_K, W_V, W_O; He init
    N(0,1)*sqrt(2/fan_in) for W_ff1 and W_ff2; ``w_o`` and ``w_ff2`` times ``branch_scale``
    (nanoGPT's 1/sqrt(2N) for a stack of N). Biases (FFN, attention) start at 0, LayerNorm at
    gamma=1, beta=0.

    Draws in the lesson's order from one ``numpy.random.default_rng(seed)`` stream, in float64,
    then casts, so float32 and float64 weights of one seed agree to float32 rounding."""
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    branch_scale = float(branch_scale)
    if not np.isfinite(branch_scale):
        raise ValueError(f"branch_scale must be finite, got {branch_scale}")
    rng = np.random.default_rng(seed)
    d, f, kv = cfg.d_model, cfg.d_ff, cfg.d_kv

    def normal(shape, *scales):
        # drawn in float64 a block of rows at a time and cast block by block: the stream
        # is consumed in the same order as one draw of the whole matrix, so the values are
        # the same, but the float64 scratch is at most ~1 MiB (at d_model=768 all six
        # matrices in float64 were 57 MiB of peak memory for 28 MiB of float32 weights).
        # The scales are applied one after another, as they always were.
        out = np.empty(shape, dtype)
        rows = max(1, (1 << 17) // shape[1])
        for r in range(0, shape[0], rows):
            x = rng.standard_normal((min(rows, shape[0] - r), shape[1]))
            for s in scales:
                x *= s
            out[r:r + rows] = x
        return out

    attn = 1.0 / np.sqrt(d)
    w = dict(
        w_q=normal((d, d), attn),
        w_k=normal((d, kv), attn),
        w_v=normal((d, kv), attn),
        w_o=normal((d, d), attn, branch_scale),
        w_ff1=normal((d, f), np.sqrt(2.0 / d)),
        w_ff2=normal((f, d), np.sqrt(2.0 / f), branch_scale),
    )
    if cfg.ffn == "gated":                  # drawn last: the lesson's block draws what it always drew
        w.update(w_gate=normal((d, f), np.sqrt(2.0 / d)))
    if cfg.ffn_bias:
        w.update(b_ff1=np.zeros(f, dtype), b_ff2=np.zeros(d, dtype))
        if cfg.ffn == "gated":
            w.update(b_gate=np.zeros(f, dtype))
    if cfg.qkv_bias:
        w.update(b_q=np.zeros(d, dtype), b_k=np.zeros(kv, dtype), b_v=np.zeros(kv, dtype))
    if cfg.out_bias:
        w.update(b_o=np.zeros(d, dtype))
    if cfg.ln_affine:
        w.update(ln1_gamma=np.ones(d, dtype), ln2_gamma=np.ones(d, dtype))
        if cfg.norm_type == "layernorm":
            w.update(ln1_beta=np.zeros(d, dtype), ln2_beta=np.zeros(d, dtype))
    return BlockWeights(**w)


def quantize(weights: BlockWeights, format: str, dot: str = "fp32") -> BlockWeights:
    """The same block with its six matrices stored in ``format`` (tblock.formats: "bf16",
    "int8", "int4", or "fp32" for a float32 copy); biases and LayerNorm stay float32.
    ``dot``: how products with them are computed, "fp32" or, for int8 and int4, "int8"
    (inputs rounded to int8 blocks, llama.cpp's arithmetic).  Every backend takes the
    result; each reads the stored bytes itself."""
    if not isinstance(weights, BlockWeights):
        raise TypeError(f"weights must be a BlockWeights, got {type(weights).__name__}")
    check_format(format)
    check_dot(dot, format)
    if weights.quantized:
        raise ValueError(f"weights are stored as {weights.format} already: quantize the float weights")
    a = {n: np.asarray(v, np.float32) for n, v in weights.arrays().items()}
    if format != "fp32":
        for n in weights.matrix_names:
            a[n] = quantize_matrix(a[n], format, name=n, dot=dot)
    return BlockWeights(**a)
