"""KVCache: the keys and values a causal block has computed, for incremental decoding.

A causal block's row t depends on rows 0..t only, and its keys and values for a row never
change once computed, so a generator that appends tokens one at a time can keep them and
compute only the new rows: ``forward(H_new, weights, cfg, cache=cache)`` projects the new
rows, appends their K and V here, and attends over everything cached. It returns the same
rows a forward over the whole sequence would.

Formats (``format``, chosen when the cache is made; tblock.formats' names):

    fp32   the keys and values as computed, in the cache's dtype (float32 or float64; the
           default, and a float64 cache reports "fp64" as float64 weights do)
    bf16   each value rounded to the nearest bfloat16 (ties to even): uint16, 2 bytes
    int8   per (sequence, head, token), for K and for V, one float32 scale over that row's
           d_k values: amax = max|x|; amax == 0 gives d = 0, q = 0; else d = amax / 127
           and q = rint(x * (127 / amax)) in float32 (half to even); the value is d * q.
           1 byte a value and 4 bytes a row.  (A row whose amax is below 127 / FLT_MAX,
           about 3.7e-37, where 127 / amax overflows, is stored as zeros too.)

A stored format (bf16, int8) computes in float32 only: its dtype must be float32.  Every
key and value attention reads comes from the cache as stored, the new tokens' own
included: a cached call writes the new rows (rounded) first, then attends over the cache
(as llama.cpp does).  Without a cache nothing is rounded.

Layout: the one the numba backend's attention reads (kernels.stages.attention_buffers),
so a decode step streams each head's keys and values as they lie, through the GEMM's
micro-kernel: per (sequence, head), K^T in panels of NR keys (panel p holds keys p*NR ..
p*NR+NR-1 as a (d_k, NR) row-major block) and V as rows of d_k rounded up to NR columns
(zero past d_k); NR is the micro-kernel's panel width for the dtype on this vector path.
A stored format keeps the same K^T panels (NR of float32) in its own type and V in rows
of d_k rounded up to 16; int8 keeps each scale beside its values, in the same int8 array
(kernels.kvstore reads it there): a K^T panel's d_k rows of NR bytes are followed by its
NR keys' float32 scales, and a V row by its float32 scale.  ``K_scales``/``V_scales``
give them as (batch, n_kv_heads, max_T) float32.
``keys()``/``values()`` give them as (batch, length, d_kv) rows, and the reference
backends read and write them through ``head_rows`` (the exact values) and ``store`` (which
rounds).  The memory is allocated once, and nothing grows per token.  Beside them,
``work`` holds the numba kernels' scratch for a decode step, so that a step allocates no
memory at all.
"""

from __future__ import annotations

import numbers

import numpy as np

from .config import BlockConfig
from .formats import quantize_matrix
from .weights import FLOAT_DTYPES

KV_FORMATS = ("fp32", "bf16", "int8")      # what KVCache's format takes ("fp64" too, with float64)
STORED_KV = ("bf16", "int8")
_STORED_TYPE = {"bf16": np.uint16, "int8": np.int8}
V_ROUND = 16                # a stored V row's values: d_k rounded up to this (any path's lanes divide it)
SCALE_BYTES = 4             # an int8 key's or value row's float32 scale


def check_kv_format(fmt, dtype, name: str = "format") -> str:
    """The cache format ``fmt`` for a cache of ``dtype`` ("fp32" of float64 is "fp64"), or
    TypeError/ValueError naming ``name``."""
    dtype = np.dtype(dtype)
    if not isinstance(fmt, str):
        raise TypeError(f"{name} must be a str, one of {KV_FORMATS}, got {type(fmt).__name__}")
    if fmt not in KV_FORMATS + ("fp64",):
        raise ValueError(f"{name} must be one of {KV_FORMATS}, got {fmt!r}")
    if fmt == "fp64" and dtype != np.float64:
        raise ValueError(f"{name}='fp64' is a float64 cache: dtype must be float64, got {dtype}")
    if fmt in STORED_KV and dtype != np.float32:
        raise ValueError(f"a KV cache in {fmt} computes in float32: dtype must be float32, got {dtype} "
                         f"(a float64 cache holds its keys and values unrounded: {name}='fp32')")
    if fmt == "fp32" and dtype == np.float64:
        return "fp64"
    return fmt


def kv_bytes_per_token(cfg: BlockConfig, fmt: str = "fp32", dtype=np.float32) -> int:
    """The bytes one token's keys and values take in one block's cache, one sequence, in
    format ``fmt`` (padding left out): 2 * d_kv values (d_model without grouped-query
    attention), plus int8's 2 * n_kv_heads scales."""
    fmt = check_kv_format(fmt, dtype)
    d = cfg.d_kv
    if fmt == "bf16":
        return 2 * d * 2
    if fmt == "int8":
        return 2 * (d + 4 * cfg.kv_heads)
    return 2 * d * np.dtype(dtype).itemsize



def _work_len(cfg: BlockConfig, batch: int, max_T: int, dtype) -> int:
    """Elements of the numba kernels' scratch for a decode step (one token a sequence)
    over up to max_T keys (kernels.block.work_len); 0 where they cannot load."""
    try:
        from .kernels.block import work_len
        from .kernels.gemm import panel_width
    except Exception:
        return 0
    return int(work_len(batch, 1, cfg.d_model, cfg.d_ff, cfg.n_heads, max_T, panel_width(dtype),
                        np.dtype(dtype).itemsize))


def _panel_width(dtype) -> int:
    # the numba kernels' panel width; where they cannot load, the layout is tblock's own
    # affair (the reference backends go through head_rows and store) and any width serves
    try:
        from .kernels.gemm import panel_width
    except Exception:
        return 16
    return panel_width(dtype)


class KVCache:
    """Keys and values of the first ``length`` tokens of ``batch`` sequences of one block,
    for up to ``max_T`` tokens, computed in ``dtype`` and stored in ``format`` ("fp32",
    "bf16" or "int8": the module docstring).  ``nbytes``: the memory it holds;
    ``bytes_per_token``: what each cached token adds to a decode step's reads."""

    def __init__(self, cfg: BlockConfig, max_T: int, batch: int = 1, dtype=np.float32, format: str = "fp32"):
        if not isinstance(cfg, BlockConfig):
            raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
        if not cfg.causal:
            raise ValueError("a KV cache needs a causal block (cfg.causal=True): with every key "
                             "visible, a new token would change the earlier rows")
        for name, value in (("max_T", max_T), ("batch", batch)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        dtype = np.dtype(dtype)
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype must be float32 or float64, got {dtype}")
        fmt = check_kv_format(format, dtype)
        # fixed for the cache's life (read-only properties): compiled callers hold the
        # arrays' addresses (tblock.backends.numba.DecodeStep)
        self._cfg, self._max_T, self._batch, self._dtype = cfg, int(max_T), int(batch), dtype
        self._format = fmt
        stored = fmt in STORED_KV
        self.nr = NR = _panel_width(dtype)
        self.panels = -(-self.max_T // NR)          # K^T panels of NR keys per head
        dk, h = cfg.d_k, cfg.kv_heads           # the K/V heads only: grouped-query attention's saving
        self._extra = SCALE_BYTES if fmt == "int8" else 0
        # V's row: d_k rounded up to NR (a stored format's: to V_ROUND, then int8's scale)
        self._vrow = -(-dk // (V_ROUND if stored else NR)) * (V_ROUND if stored else NR)
        self.ldv = self._vrow + self._extra
        kind = _STORED_TYPE[fmt] if stored else dtype
        # zeros: the kernels read whole panels and rows, the parts past length and d_k too
        self._K = np.zeros((self.batch, h, self.panels * (dk + self._extra) * NR), kind)
        self._V = np.zeros((self.batch, h, self.max_T, self.ldv), kind)
        self._length = 0                    # tokens cached so far (the same for every sequence)
        self._addresses = (self._K.ctypes.data, self._V.ctypes.data)
        # the numba kernels' scratch for a decode step (a few dozen KiB): with it a step
        # allocates nothing.  Not part of the cache: its contents mean nothing between calls
        self._work = np.empty(_work_len(cfg, self.batch, self.max_T, dtype), dtype)

    cfg = property(lambda self: self._cfg, doc="the BlockConfig of the block whose keys and values these are")
    max_T = property(lambda self: self._max_T, doc="the most tokens the cache holds")
    batch = property(lambda self: self._batch, doc="the number of sequences")
    dtype = property(lambda self: self._dtype, doc="float32 or float64: the dtype attention computes in")
    format = property(lambda self: self._format, doc='how the keys and values are stored: "fp32", "fp64", '
                                                     '"bf16" or "int8" (module docstring)')
    K = property(lambda self: self._K, doc="the keys: K^T panels per (sequence, head), see the module's docstring")
    V = property(lambda self: self._V, doc="the values: rows per (sequence, head), d_k rounded up to NR (16 stored)")

    @property
    def K_scales(self) -> np.ndarray:
        """int8: a copy of the keys' scales, (batch, n_kv_heads, max_T) float32; empty otherwise."""
        if not self._extra:
            return np.empty(0, np.float32)
        return np.stack([self._k_parts(b)[1].reshape(self.cfg.kv_heads, -1)[:, :self.max_T] for b in range(self.batch)])

    @property
    def V_scales(self) -> np.ndarray:
        """int8: a copy of the values' scales, (batch, n_kv_heads, max_T) float32; empty otherwise."""
        if not self._extra:
            return np.empty(0, np.float32)
        return np.stack([self._v_parts(b)[1] for b in range(self.batch)])
    work = property(lambda self: self._work, doc="the numba kernels' scratch for a decode step")

    @property
    def length(self) -> int:
        """Tokens cached so far, the same for every sequence.  Settable, to any count in
        0..max_T: back to an earlier token (the keys and values past it are then unused
        and overwritten by the next tokens), or on to tokens written by other means."""
        return self._length

    @length.setter
    def length(self, n) -> None:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"length must be an integer, got {type(n).__name__} {n!r}")
        if not 0 <= n <= self._max_T:
            raise ValueError(f"length must be between 0 and max_T={self._max_T}, got {n}")
        self._length = int(n)

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more tokens as cached, after a compiled step has written their keys
        and values past ``length`` (a backend's decode step, tblock.api's stack)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"n must be an integer, got {type(n).__name__} {n!r}")
        if not 0 <= n <= self._max_T - self._length:
            raise ValueError(f"the cache holds {self._length} of max_T={self._max_T} tokens: it cannot "
                             f"advance by {n}")
        self._length += int(n)

    def __repr__(self):
        return (f"KVCache(d_model={self.cfg.d_model}, n_heads={self.cfg.n_heads}, length={self.length}, "
                f"max_T={self.max_T}, batch={self.batch}, dtype={self.dtype}, format={self.format!r})")

    @property
    def nbytes(self) -> int:
        """The bytes the keys and values take, as allocated (padding and int8's scales
        included; the scratch ``work`` left out)."""
        return self.K.nbytes + self.V.nbytes

    @property
    def bytes_per_token(self) -> int:
        """The bytes one more token adds to what a decode step reads from this cache: its
        keys and values in this format, for every sequence (kv_bytes_per_token; padding
        left out)."""
        return self.batch * kv_bytes_per_token(self.cfg, self.format, self.dtype)

    def addresses(self) -> tuple[int, int]:
        """The data addresses of K and V, for a compiled call that reaches several caches
        through a table of addresses (the numba backend's stack)."""
        return self._addresses          # computed once: ctypes.data is slow

    def reset(self) -> None:
        """Forget every token. The memory is kept, and zeroed: the kernels read whole
        panels, the keys past length among them (masked), and nothing of an old sequence
        should reach a new one even so."""
        self._K.fill(0)
        self._V.fill(0)
        self._length = 0

    def slot(self, b: int) -> "KVCache":
        """Sequence b of this cache as a one-sequence KVCache over the same memory (its own
        length, from 0, and its own scratch): what a batch of sequences of different lengths
        runs its prompts and the reference backends' steps through, one slot at a time."""
        if isinstance(b, bool) or not isinstance(b, numbers.Integral) or not 0 <= b < self.batch:
            raise ValueError(f"b must be a sequence of the cache in [0, batch={self.batch}), got {b!r}")
        view = object.__new__(KVCache)
        view.__dict__.update(self.__dict__)
        view._batch, view._length = 1, 0
        view._K, view._V = self._K[b:b + 1], self._V[b:b + 1]      # views: writes land in this cache
        view._addresses = (view._K.ctypes.data, view._V.ctypes.data)
        view._work = np.empty(_work_len(self.cfg, 1, self.max_T, self.dtype), self.dtype)
        return view

    def _k_parts(self, b: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Sequence b's K^T panels as (n_kv_heads, panels, d_k, NR) and int8's scales as
        (n_kv_heads, panels, NR) float32 (None in another format): views."""
        h, dk, NR = self.cfg.kv_heads, self.cfg.d_k, self.nr
        K = self.K[b].reshape(h, self.panels, (dk + self._extra) * NR)
        data = K[:, :, :dk * NR].reshape(h, self.panels, dk, NR) if self._extra else K.reshape(h, self.panels, dk, NR)
        return data, (K[:, :, dk * NR:].view(np.float32) if self._extra else None)

    def _v_parts(self, b: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Sequence b's V rows as (n_kv_heads, max_T, d_k) and int8's scales as (n_kv_heads, max_T)
        float32 (None in another format): views."""
        V = self.V[b]
        return V[:, :, :self.cfg.d_k], (V[:, :, self._vrow:].view(np.float32)[:, :, 0] if self._extra else None)

    def head_rows(self, b: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Sequence b's keys and values of tokens 0..end-1, (n_kv_heads, end, d_k) each: their
        exact values, new arrays, in the cache's dtype (bf16's are float32s), float64 for
        int8 (d * q need not be a float32)."""
        h, dk = self.cfg.kv_heads, self.cfg.d_k
        Kt, ks = self._k_parts(b)
        K = Kt.transpose(0, 1, 3, 2).reshape(h, self.panels * self.nr, dk)[:, :end]     # (h, keys, d_k)
        V, vs = self._v_parts(b)
        V = V[:, :end]
        if self.format == "bf16":
            return _from_bf16(K), _from_bf16(V)
        if self.format == "int8":
            ks = ks.reshape(h, -1)[:, :end, None].astype(np.float64)
            return K * ks, V * vs[:, :end, None].astype(np.float64)
        return K.copy(), V.copy()

    def store(self, b: int, pos: int, K: np.ndarray, V: np.ndarray) -> None:
        """Write sequence b's keys and values of tokens pos..pos+n-1, K and V (n_kv_heads, n, d_k),
        in this cache's format: rounded to the dtype, and a stored format's rounding after
        it (the module docstring)."""
        t = np.arange(pos, pos + K.shape[1])
        Kq, Ks = self._rounded(K, "K")
        Vq, Vs = self._rounded(V, "V")
        Kt, ks = self._k_parts(b)
        Vr, vs = self._v_parts(b)
        # key t of head h lies at panel t // NR, column t % NR, one row per channel
        Kt[:, t // self.nr, :, t % self.nr] = Kq.transpose(1, 0, 2)   # (n, h, d_k)
        Vr[:, pos:pos + V.shape[1]] = Vq
        if Ks is not None:
            ks[:, t // self.nr, t % self.nr] = Ks                       # (h, n)
            vs[:, pos:pos + V.shape[1]] = Vs

    def _rounded(self, X: np.ndarray, name: str):
        """(X as this cache stores it, its int8 scales or None) for X (n_kv_heads, n, d_k)."""
        if self.format not in STORED_KV:
            return X.astype(self.dtype, copy=False), None
        x = np.asarray(X, dtype=np.float32)             # the value the kernels round: a float32
        if self.format == "bf16":
            # tblock.formats' rounding of a (d_in, 1) matrix: every value one row
            return quantize_matrix(x.reshape(-1, 1), "bf16", name=name).data.reshape(x.shape), None
        return quantize_rows_int8(x)

    def keys(self) -> np.ndarray:
        """The cached keys as (batch, length, d_kv): K/V head h is columns h*d_k:(h+1)*d_k."""
        return np.stack([_rows(self.head_rows(b, self.length)[0]) for b in range(self.batch)])

    def values(self) -> np.ndarray:
        """The cached values as (batch, length, d_kv)."""
        return np.stack([_rows(self.head_rows(b, self.length)[1]) for b in range(self.batch)])

    def check(self, H3: np.ndarray, cfg: BlockConfig) -> None:
        """ValueError/TypeError unless a (B, T_new, d_model) input fits: the same config,
        dtype and batch, and room for T_new more tokens. Nothing is changed."""
        if cfg != self.cfg:
            raise ValueError(f"cache was made for {self.cfg}, got a block with {cfg}")
        if H3.dtype.newbyteorder("=") != self.dtype and self.format in STORED_KV:
            raise TypeError(f"a KV cache in {self.format} computes in float32: H must be float32, got {H3.dtype}")
        if H3.dtype.newbyteorder("=") != self.dtype:     # forward converts the byte order itself
            raise TypeError(f"cache holds {self.dtype}, got H of dtype {H3.dtype}: "
                            f"make the cache with dtype=np.{H3.dtype}")
        B, T_new = H3.shape[0], H3.shape[1]
        if B != self.batch:
            raise ValueError(f"cache holds {self.batch} sequence(s), got H with batch {B}: "
                             f"a cache belongs to one batch of sequences")
        if self.length + T_new > self.max_T:
            raise ValueError(f"cache holds {self.length} of max_T={self.max_T} tokens, got {T_new} more")


def _rows(X: np.ndarray) -> np.ndarray:
    h, T, dk = X.shape
    return X.transpose(1, 0, 2).reshape(T, h * dk)     # (h, T, d_k) -> (T, d_kv)


def _from_bf16(X: np.ndarray) -> np.ndarray:
    return (X.astype(np.uint32) << 16).view(np.float32)


def quantize_rows_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8, d float32) of float32 rows x (..., d_k): one scale a row (module docstring)."""
    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore", over="ignore"):
        inv = (np.float32(127) / amax).astype(np.float32)
    # amax == 0, or so small (< 127 / FLT_MAX) that 127 / amax overflows: the row is zeros
    zero = ~np.isfinite(inv)
    d = np.where(zero, np.float32(0), amax / np.float32(127)).astype(np.float32)
    inv = np.where(zero, np.float32(0), inv).astype(np.float32)
    q = np.rint(x * inv[..., None]).astype(np.int8)         # float32 product, half to even
    return q, d


def make_caches(cfg: BlockConfig, n: int, max_T: int, batch: int = 1, dtype=np.float32,
                format: str = "fp32") -> list[KVCache]:
    """One KVCache per block of a stack of n blocks, each in ``format``."""
    return [KVCache(cfg, max_T, batch, dtype, format) for _ in range(n)]
