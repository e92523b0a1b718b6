"""KVCache: the keys and values a causal block has computed, for incremental decoding.

A causal block's row t depends on rows 0..t only, and its keys and values for a row never
change once computed, so a generator that appends tokens one at a time can keep them and
compute only the new rows: ``forward(H_new, weights, cfg, cache=cache)`` projects the new
rows, appends their K and V here, and attends over everything cached. It returns the same
rows a forward over the whole sequence would.

Layout: the one the numba backend's attention reads (kernels.stages.attention_buffers),
so a decode step streams each head's keys and values as they lie, through the GEMM's
micro-kernel: per (sequence, head), K^T in panels of NR keys (panel p holds keys p*NR ..
p*NR+NR-1 as a (d_k, NR) row-major block) and V as rows of d_k rounded up to NR columns
(zero past d_k); NR is the micro-kernel's panel width for the dtype on this vector path.
``keys()``/``values()`` give them as (batch, length, d_model) rows, and the reference
backends read and write them through ``head_rows`` and ``store``. The memory is allocated
once: 2 * max_T * d_model values per sequence (max_T rounded up to NR keys, d_k to NR
columns), and nothing grows per token.  Beside them, ``work`` holds the numba kernels'
scratch for a decode step, so that a step allocates no memory at all.
"""

from __future__ import annotations

import numbers

import numpy as np

from .config import BlockConfig
from .weights import FLOAT_DTYPES


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
    """Keys and values of the first ``length`` tokens of ``batch`` sequences of one block."""

    def __init__(self, cfg: BlockConfig, max_T: int, batch: int = 1, dtype=np.float32):
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
        # fixed for the cache's life (read-only properties): compiled callers hold the
        # arrays' addresses (tblock.backends.numba.DecodeStep)
        self._cfg, self._max_T, self._batch, self._dtype = cfg, int(max_T), int(batch), dtype
        self.nr = NR = _panel_width(dtype)
        self.panels = -(-self.max_T // NR)          # K^T panels of NR keys per head
        self.ldv = -(-cfg.d_k // NR) * NR           # V's row length: d_k rounded up to NR
        # zeros: the kernels read whole panels and rows, the parts past length and d_k too
        self._K = np.zeros((self.batch, cfg.n_heads, self.panels * cfg.d_k * NR), dtype)
        self._V = np.zeros((self.batch, cfg.n_heads, self.max_T, self.ldv), dtype)
        self._length = 0                    # tokens cached so far (the same for every sequence)
        self._addresses = (self._K.ctypes.data, self._V.ctypes.data)
        # the numba kernels' scratch for a decode step (a few dozen KiB): with it a step
        # allocates nothing.  Not part of the cache: its contents mean nothing between calls
        self._work = np.empty(_work_len(cfg, self.batch, self.max_T, dtype), dtype)

    cfg = property(lambda self: self._cfg, doc="the BlockConfig of the block whose keys and values these are")
    max_T = property(lambda self: self._max_T, doc="the most tokens the cache holds")
    batch = property(lambda self: self._batch, doc="the number of sequences")
    dtype = property(lambda self: self._dtype, doc="float32 or float64")
    K = property(lambda self: self._K, doc="the keys: K^T panels per (sequence, head), see the module's docstring")
    V = property(lambda self: self._V, doc="the values: rows per (sequence, head), d_k rounded up to NR")
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
                f"max_T={self.max_T}, batch={self.batch}, dtype={self.dtype})")

    @property
    def nbytes(self) -> int:
        return self.K.nbytes + self.V.nbytes

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

    def _kt(self, b: int) -> np.ndarray:
        """Sequence b's K^T panels as (n_heads, panels, d_k, NR), a view."""
        return self.K[b].reshape(self.cfg.n_heads, self.panels, self.cfg.d_k, self.nr)

    def head_rows(self, b: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of sequence b's keys and values of tokens 0..end-1, (n_heads, end, d_k) each."""
        h, dk = self.cfg.n_heads, self.cfg.d_k
        K = self._kt(b).transpose(0, 1, 3, 2).reshape(h, self.panels * self.nr, dk)[:, :end]  # (h, keys, d_k)
        return K.copy(), self.V[b, :, :end, :dk].copy()

    def store(self, b: int, pos: int, K: np.ndarray, V: np.ndarray) -> None:
        """Write sequence b's keys and values of tokens pos..pos+n-1, K and V (n_heads, n, d_k)."""
        t = np.arange(pos, pos + K.shape[1])
        # key t of head h lies at panel t // NR, column t % NR, one row per channel
        self._kt(b)[:, t // self.nr, :, t % self.nr] = K.transpose(1, 0, 2)   # (n, h, d_k)
        self.V[b, :, pos:pos + V.shape[1], :self.cfg.d_k] = V

    def keys(self) -> np.ndarray:
        """The cached keys as (batch, length, d_model): head h is columns h*d_k:(h+1)*d_k."""
        return np.stack([_rows(self.head_rows(b, self.length)[0]) for b in range(self.batch)])

    def values(self) -> np.ndarray:
        """The cached values as (batch, length, d_model)."""
        return np.stack([_rows(self.head_rows(b, self.length)[1]) for b in range(self.batch)])

    def check(self, H3: np.ndarray, cfg: BlockConfig) -> None:
        """ValueError/TypeError unless a (B, T_new, d_model) input fits: the same config,
        dtype and batch, and room for T_new more tokens. Nothing is changed."""
        if cfg != self.cfg:
            raise ValueError(f"cache was made for {self.cfg}, got a block with {cfg}")
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
    return X.transpose(1, 0, 2).reshape(T, h * dk)     # (h, T, d_k) -> (T, d_model)


def make_caches(cfg: BlockConfig, n: int, max_T: int, batch: int = 1, dtype=np.float32) -> list[KVCache]:
    """One KVCache per block of a stack of n blocks."""
    return [KVCache(cfg, max_T, batch, dtype) for _ in range(n)]
