"""Blocks with KV caches: a cached forward, a stack in one call, a prepared decode step.

A cached call writes the new tokens' keys and values into the cache's arrays and attends
over everything cached (kernels.block, past >= 0).  A stack's blocks run in one compiled
call through a table of their arrays' addresses.  ``DecodeStep`` goes further: the whole
language-model step (embedding, stack, LN_f, head: kernels.decode) in one crossing, for
a list of caches checked once.
"""

from __future__ import annotations

import weakref

import numpy as np

from ... import _runtime
from ...config import BlockConfig
from ...formats import QuantizedMatrix
from ...kernels.block import PLAN_COLS, PLAN_ROWS, cached_parallel, cached_serial
from ...kernels.decode import decode_step, greedy_steps
from .lm import head_is_large, head_norm
from .packing import cached_flops, make_plan, packed_addresses, plan_of
from .parallel import is_serial, parallel_call

# the table of blocks a call runs (kernels.block's ``layers``): none but the one it is given
ONE_BLOCK = np.empty((0, 4), dtype=np.intp)


def forward_cached(H, weights, cfg, cache):
    """The KV-cache entry point of tblock.api: H (B, T_new, d_model) holds the tokens after
    the cache's first cache.length; returns H_out, or None when H holds a NaN or an Inf
    (nothing is written then)."""
    out, bad = run_cached(H, weights, cfg, cache, ONE_BLOCK, True)
    return out if bad < 0 else None


def forward_stack_cached(H, weights, cfg, caches, fresh=True):
    """tblock.Stack's blocks with their caches in one compiled call: H as forward_cached's,
    weights and caches one per block (checked by the caller).  Returns (H_out, -1), or
    (None, i) when block i's input holds a NaN or an Inf (the caches' lengths unchanged).
    fresh=False: H_out may be scratch of caches[0].work, which the next call overwrites."""
    # the lists hold the arrays alive through the call, and every one has block 0's size
    # (one config, dtype, batch and max_T: tblock.Stack checks)
    out, bad = run_cached(H, weights[0], cfg, caches[0], layers_table(weights, caches, H.dtype), fresh)
    return (out, -1) if bad < 0 else (None, bad)


def layers_table(weights, caches, dtype) -> np.ndarray:
    """(n, 4) intp: the data addresses of block i's packed weights, K, V and its stored
    matrices (0 for float weights), through which the compiled block reaches a stack's
    arrays (kernels.block's ``layers``)."""
    rows = []
    for w, c in zip(weights, caches):
        f, q = packed_addresses(w, dtype)
        rows.append((f,) + c.addresses() + (q,))
    return np.array(rows, dtype=np.intp)


def cache_args(cache, layers):
    """The cached block's cache argument (kernels.block._cached's): K, V, past, max_T, the
    table of blocks, room for the stage plan, the work buffer."""
    return (cache.K.reshape(-1), cache.V.reshape(-1), cache.length, cache.max_T, layers,
            np.empty((PLAN_ROWS, PLAN_COLS), np.intp), cache.work)


def run_cached(H, weights, cfg, cache, layers, fresh):
    """kernels.block with a cache: weights and cache those of block 0 of ``layers``.  A
    decode step takes its scratch from cache.work; fresh: an output there is copied out."""
    if weights.quantized and cache.dtype != np.float32:
        raise ValueError(f"the numba backend runs {weights.format} weights in float32: make the KV cache "
                         f"with dtype=np.float32, got {cache.dtype}")
    _, flat, scalars, per_row, per_key = plan_of(weights, cfg, H.dtype)
    B, T, d = H.shape
    args = (H, flat, scalars, cache_args(cache, layers))
    if is_serial(cached_flops(B, T, cache.length, per_row, per_key)):
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
    caches, the head's packed embedding, the step's scratch.  The caller has run a step of
    the checked path with these caches, so their config, dtype, batch and size are known
    good and stay so (a KVCache's arrays are fixed); a step then checks only what can
    change, the tokens, the caches' lengths and that the list holds these caches, and
    crosses into compiled code once.  The step holds the caches weakly: a dropped list's
    memory is freed, and the step no longer matches any list.

    blocks: the stack's BlockWeights; caches: one KVCache each, one max_T; E (vocab, d),
    P (positions, d): the embeddings (P None: none, the blocks' rotary positions); ln_f =
    [gamma | beta]; rms: LN_f is RMSNorm (gamma only); head: lm.prepare_head(E)."""

    def __init__(self, blocks, cfg: BlockConfig, caches, E, P, ln_f, eps_f: float, head, rms: bool = False):
        c0 = caches[0]
        dtype, B, d = c0.dtype, c0.batch, cfg.d_model
        _, flat, scalars, self.per_row, self.per_key = make_plan(blocks[0], cfg, dtype)
        layers = layers_table(blocks, caches, dtype)
        self.blocks, self.batch, self.dtype = tuple(blocks), B, dtype
        if P is None:
            P = np.zeros((0, d), dtype=dtype)           # kernels.decode adds no position row
            self.max_T = c0.max_T
        else:
            self.max_T = min(c0.max_T, P.shape[0])      # no position past P's rows
        self.caches = tuple(weakref.ref(c) for c in caches)
        self.ids = np.empty(B, dtype=np.int64)          # the step's tokens, copied in
        self.seqs = np.empty(2 * B, dtype=np.intp)      # a ragged step's [slot, past] pairs
        self.H = np.empty((B, 1, d), dtype=dtype)       # (B, 1, d): room for their embeddings
        stored = isinstance(E, QuantizedMatrix)            # E^T stored: (d, vocab), rows = tokens
        self.vocab = E.shape[1] if stored else E.shape[0]
        self.head_parallel = head_is_large(B, (self.vocab, d))
        # decode_step's arguments but the cache's arrays and length, the logits and the builds
        self._embed = (self.ids, head if stored else E, P, self.H)
        self._stack = (flat, scalars)
        self._cache = (c0.max_T, layers, np.empty((PLAN_ROWS, PLAN_COLS), np.intp))
        self._head = (head_norm(ln_f, d, rms), eps_f, head, self.vocab)

    def __reduce__(self):
        raise TypeError("a DecodeStep holds addresses of this process's arrays: prepare a new one "
                        "after unpickling")

    def __call__(self, ids, caches, out=None):
        """The logits (B, vocab) (or (vocab,) for ids of shape (1,)) of one token a sequence
        after the caches' tokens, the caches advanced by one; None, with nothing changed,
        when anything differs from what the step was prepared for (other caches, lengths
        apart, no room, ids or out of another kind) or a token or a block's input is bad:
        the caller's checked path then computes the step or raises the error."""
        B = self.batch
        if (not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu"
                or ids.shape != ((B, 1) if ids.ndim == 2 else (1,) if B == 1 else None)):
            return None
        if not self._matches(caches, 1):
            return None
        c0 = caches[0]
        past = c0.length
        if out is None:
            out = np.empty((B, self.vocab), dtype=self.dtype)
        elif (not isinstance(out, np.ndarray) or out.shape != (B, self.vocab) or out.dtype != self.dtype
              or not out.flags.c_contiguous or not out.flags.writeable):
            return None
        self.ids[:] = ids.reshape(B)        # a token id past int64 wraps negative: refused in the step
        if self._run(c0, past, out.reshape(B * self.vocab), B, None) != -1:
            return None
        for c in caches:
            c.length = past + 1
        return out if ids.ndim == 2 else out[0]

    def _matches(self, caches, n: int) -> bool:
        """Whether caches is the list this step was prepared for, every cache at one
        length with room for n more tokens."""
        if not isinstance(caches, (list, tuple)) or len(caches) != len(self.caches):
            return False
        if any(mine() is not theirs for mine, theirs in zip(self.caches, caches)):
            return False
        past = caches[0].length
        return past + n <= self.max_T and all(c.length == past for c in caches)

    def _run(self, c0, past: int, logits: np.ndarray, n: int, seqs: np.ndarray) -> int:
        """kernels.decode.decode_step of self.ids[:n] at position ``past`` (seqs: a ragged
        step's [slot, past] pairs, past their largest; None: uniform, a cache argument of
        the fields it had before ragged steps) into logits (n * vocab, flat): its code (-1:
        done)."""
        cache = self._cache_arg(c0, past)
        if seqs is not None:
            cache += (seqs,)
        embed = self._embed
        if n != self.batch:
            embed = (self.ids[:n], embed[1], embed[2], self.H[:n])
        return self._call(decode_step, (embed,) + self._stack + (cache, self._head, logits), n, past)

    def _cache_arg(self, c0, past: int) -> tuple:
        """decode_step's cache argument of a uniform step at position past (c0: the first cache)."""
        return (c0.K.reshape(-1), c0.V.reshape(-1), past) + self._cache + (c0.work,)

    def _call(self, kernel, args: tuple, n: int, past: int):
        """kernel(*args, builds, nthr), the builds of the stack and the head sized
        as run_cached and lm_head size their calls (the same builds, the same sums) for n
        rows at position past."""
        stack = self._stack_parallel(n, past)
        head = self.head_parallel and _runtime.parallel_allowed()
        if stack or head:
            return parallel_call(kernel, *args, (stack, head), pass_threads=True)
        return kernel(*args, (stack, head), 1)

    def _stack_parallel(self, n: int, past: int) -> bool:
        """Whether a step of n rows at position past runs the stack's parallel build."""
        return not is_serial(cached_flops(n, 1, past, self.per_row, self.per_key))

    def greedy(self, caches, out: np.ndarray, col: int, n: int, eos: int = -1, done=None) -> int:
        """Up to n greedy steps after the caches' tokens in one compiled call
        (kernels.decode.greedy_steps): step i feeds out[:, col + i - 1] and writes the
        argmax of its logits to out[:, col + i].  out: (batch, W) C-contiguous int64;
        eos >= 0: a sequence whose done[b] is set, or that chooses eos, emits eos from then
        on (done (batch,) bool, updated), and the run stops once all have.  Returns the
        steps taken, each cache advanced by as many; fewer than n when all are done, or
        when a step's token or a block's input is bad (the caller's checked step then
        says which); 0, nothing changed, when the call is not one this step was prepared
        for (other caches, lengths apart, no room, out or done of another kind)."""
        B = self.batch
        if done is None:
            done = np.zeros(B, dtype=bool)
        if (not isinstance(out, np.ndarray) or out.dtype != np.int64 or out.ndim != 2 or out.shape[0] != B
                or not out.flags.c_contiguous or not out.flags.writeable or not 1 <= col <= col + n <= out.shape[1]
                or not isinstance(done, np.ndarray) or done.dtype != bool or done.shape != (B,)
                or not -1 <= eos < self.vocab or not self._matches(caches, n)):
            return 0
        c0 = caches[0]
        past, taken = c0.length, 0
        logits = np.empty(B * self.vocab, dtype=self.dtype)
        while taken < n:
            # a run of steps on one build of the stack (the serial one for short caches)
            stack, k = self._stack_parallel(B, past + taken), 1
            while taken + k < n and self._stack_parallel(B, past + taken + k) == stack:
                k += 1
            run = (out, col + taken, k, eos, done)
            steps, code = self._call(greedy_steps, (self._embed,) + self._stack
                                     + (self._cache_arg(c0, past + taken), self._head, logits, run), B, past + taken)
            taken += steps
            for c in caches:
                c.length = past + taken
            if code != -1 or steps < k:
                break
        return taken

    def ragged(self, ids, slots, pasts, out=None):
        """One token for each of n <= batch of the caches' sequences, each at its own length:
        row i is token ids[i] of sequence slots[i], which holds pasts[i] tokens; its key and
        value are written at position pasts[i] of that slot in every block's cache and it
        attends over keys 0..pasts[i].  Returns out (n, vocab) (None: a new array), its row
        i those logits; None, with nothing written, when a token id is not in [0, vocab) or
        a block's input is not finite.  No cache's length changes (the caller keeps each
        slot's); slots not in the call are untouched.

        ids, slots, pasts: (n,) integer arrays (or sequences), slots distinct in [0, batch),
        1 <= pasts[i] < max_T (and < the learned positions' rows); out: a C-contiguous
        writable (n, vocab) array of the step's dtype.  ValueError, nothing changed, else."""
        caches = [ref() for ref in self.caches]
        if any(c is None for c in caches):
            raise ValueError("the caches this step was prepared for are gone: prepare a new step")
        ids, slots, pasts = (_int_vector(name, v, self.batch) for name, v in
                             (("ids", ids), ("slots", slots), ("pasts", pasts)))
        n = ids.size
        for name, v in (("slots", slots), ("pasts", pasts)):
            if v.size != n:
                raise ValueError(f"{name} must have one entry per token of ids ({n}), got {v.size}")
        if slots.min() < 0 or slots.max() >= self.batch or np.unique(slots).size != n:
            raise ValueError(f"slots must be distinct sequences of the caches in [0, {self.batch}), "
                             f"got {slots.tolist()}")
        if pasts.min() < 1 or pasts.max() >= self.max_T:
            raise ValueError(f"pasts must be token counts in [1, {self.max_T}) (a slot's cached tokens, one "
                             f"more to come), got {pasts.tolist()}")
        if out is None:
            out = np.empty((n, self.vocab), dtype=self.dtype)
        elif (not isinstance(out, np.ndarray) or out.shape != (n, self.vocab) or out.dtype != self.dtype
              or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"out must be a writable C-contiguous {np.dtype(self.dtype)} array of shape "
                             f"{(n, self.vocab)}, got {_describe(out)}")
        self.ids[:n] = ids
        seqs = self.seqs[:2 * n]
        seqs[0::2], seqs[1::2] = slots, pasts
        if self._run(caches[0], int(pasts.max()), out.reshape(n * self.vocab), n, seqs) != -1:
            return None
        return out


def _int_vector(name: str, v, most: int) -> np.ndarray:
    """v as a (n,) int64 array, 1 <= n <= most; ValueError naming ``name`` otherwise."""
    a = np.asarray(v)
    if a.dtype.kind not in "iu" or a.ndim != 1 or not 1 <= a.size <= most:
        raise ValueError(f"{name} must be a 1-D integer array of 1 to {most} entries (the caches' batch), "
                         f"got {_describe(a)}")
    return a.astype(np.int64)       # past int64 wraps negative: refused as out of range


def _describe(a) -> str:
    """An argument's kind for an error message: an array's shape and dtype, else its type."""
    return f"shape {a.shape} {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__
