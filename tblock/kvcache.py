"""KVCache: the keys and values a causal block has computed, for incremental decoding.

A causal block's row t depends on rows 0..t only, and its keys and values for a row never
change once computed, so a generator that appends tokens one at a time can keep them and
compute only the new rows: ``forward(H_new, weights, cfg, cache=cache)`` projects the new
rows, appends their K and V here, and attends over everything cached. It returns the same
rows a forward over the whole sequence would.

Layout: K and V are (batch, n_heads, max_T, d_k), each head's keys contiguous rows, the
layout the decode kernel streams (one head's cache is one contiguous block). The memory is
allocated once: 2 * max_T * d_model values per sequence, and nothing grows per token.
"""

from __future__ import annotations

import numbers

import numpy as np

from .config import BlockConfig
from .weights import FLOAT_DTYPES


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
        self.cfg, self.max_T, self.batch, self.dtype = cfg, int(max_T), int(batch), dtype
        shape = (self.batch, cfg.n_heads, self.max_T, cfg.d_k)
        self.K = np.zeros(shape, dtype)     # K[b, h, t] = key of token t, head h
        self.V = np.zeros(shape, dtype)
        self.length = 0                     # tokens cached so far (the same for every sequence)

    def __repr__(self):
        return (f"KVCache(d_model={self.cfg.d_model}, n_heads={self.cfg.n_heads}, length={self.length}, "
                f"max_T={self.max_T}, batch={self.batch}, dtype={self.dtype})")

    @property
    def nbytes(self) -> int:
        return self.K.nbytes + self.V.nbytes

    def reset(self) -> None:
        """Forget every token (the memory is kept)."""
        self.length = 0

    def keys(self) -> np.ndarray:
        """The cached keys as (batch, length, d_model): head h is columns h*d_k:(h+1)*d_k."""
        return _rows(self.K[:, :, :self.length])

    def values(self) -> np.ndarray:
        """The cached values as (batch, length, d_model)."""
        return _rows(self.V[:, :, :self.length])

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
    B, h, T, dk = X.shape
    return X.transpose(0, 2, 1, 3).reshape(B, T, h * dk)     # (B, h, T, d_k) -> (B, T, d_model)


def make_caches(cfg: BlockConfig, n: int, max_T: int, batch: int = 1, dtype=np.float32) -> list[KVCache]:
    """One KVCache per block of a stack of n blocks."""
    return [KVCache(cfg, max_T, batch, dtype) for _ in range(n)]
