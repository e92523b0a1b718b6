"""A causal language model on tblock's blocks: what every model family has in common.

    h_0    = wte[ids] + wpe[past:past + T]    token embedding plus learned positions (none
                                              where the blocks turn Q and K by rotary ones)
    h_l    = Block_l(h_{l-1}), l = 1..N       causal blocks: a tblock.Stack, on any backend
    logits = LN_f(h_N) @ W_head^T             the vocabulary head: wte itself (tied) or its own
                                              matrix; LN_f a LayerNorm or an RMSNorm, as the blocks'

``CausalLM`` owns the embeddings, the stack, the head, the KV caches and the decoding
loop (``generate``, ``stream``); a model family (models.gpt2) adds its config and its
checkpoints' names.  Kernels are reached only through the backend registry: the head is
the backend's ``lm_head`` hook on its ``prepare_head`` of wte, and after a checked
one-token step the backend's ``prepare_decode`` hook may hand back a step that runs the
next ones in one call (its arguments made once for that list of caches); a backend
without them gets the registry's reference versions (a float64 head, no prepared step).

Generation: the prompt goes through the blocks as one chunk, filling a KVCache per block,
then each new token is one cached step: its embedding at the next position, the blocks
over their caches, and the head on that one row.  The next token is the argmax
(temperature 0) or a draw from ``next_token_probs`` (models.sampling).
"""

from __future__ import annotations

import numpy as np

from ..api import Stack, get_backend
from ..backends import DEFAULT_BACKEND, lm_hook
from ..config import BlockConfig, check_int
from ..formats import QuantizedMatrix, dequantize
from ..kvcache import KVCache, check_kv_format, kv_bytes_per_token
from ..weights import FLOAT_DTYPES, BlockWeights, as_float_array, check_finite, frozen_copy
from .batching import generate_many, stream_many
from .sampling import check_filters, check_temperature, check_token_id, draw, next_token_probs, rng_of


def check_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


class CausalLM:
    """Embeddings, a Stack of causal blocks and the tied head.  ``model(ids)`` gives the
    logits, ``hidden_states(ids)`` the residual stream after each block, ``next_logits``
    a decoding step's, ``generate`` and ``stream`` the continuation.  Every array is a
    private copy in the model's dtype that nobody can make writeable: a model is fixed
    once made, so what a backend prepared from it (the packed head, a decode step) stays valid."""

    def __init__(self, cfg: BlockConfig, vocab_size: int, n_positions: int, embeddings, blocks, ln_f,
                 dtype=np.float32, head=None):
        """embeddings = (wte (vocab_size, d), wpe (n_positions, d), or None with cfg.positions
        "rotary"); blocks: one BlockWeights a block, all of one format (float ones are copied
        into ``dtype``; stored ones, tblock.quantize's, need dtype float32); ln_f = (gamma (d,),
        beta (d,), None for RMSNorm); head: the untied head's matrix (vocab_size, d) (stored:
        its transpose, as wte), None to tie it to wte; every array is copied into ``dtype``."""
        dtype = check_dtype(dtype)
        d = cfg.d_model

        def own(name, value, shape):
            a = as_float_array(name, value, len(shape))
            if a.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
            a = frozen_copy(a, dtype)           # nobody can make it writeable: what backends prepared stays valid
            check_finite(name, a)               # after the cast: a float64 value past float32's range is refused
            return a

        self.vocab_size, self.n_positions, self.dtype = vocab_size, n_positions, dtype
        self.wte = self._matrix("wte", embeddings[0], own, d)      # (vocab, d): row v is token v
        self.lm_head = None if head is None else self._matrix("head", head, own, d)   # None: tied to wte
        if (embeddings[1] is None) != (cfg.positions == "rotary"):
            raise ValueError(f"wpe (learned positions) must be {'None' if cfg.positions == 'rotary' else 'given'} "
                             f"with cfg.positions={cfg.positions!r}")
        # (n_positions, d): row t is position t; None: the blocks turn Q and K instead
        self.wpe = None if embeddings[1] is None else own("wpe", embeddings[1], (n_positions, d))
        self.rms = cfg.norm_type == "rmsnorm"   # LN_f is the blocks' kind of norm
        if (ln_f[1] is None) != self.rms:
            raise ValueError(f"ln_f's beta must be {'None' if self.rms else 'given'} with cfg.norm_type="
                             f"{cfg.norm_type!r}")
        gamma = own("ln_f_gamma", ln_f[0], (d,))
        beta = np.zeros(d, dtype) if self.rms else own("ln_f_beta", ln_f[1], (d,))
        self.ln_f = frozen_copy(np.concatenate([gamma, beta]), dtype)     # (2d,): [gamma | beta]
        if isinstance(blocks, BlockWeights) or not isinstance(blocks, (list, tuple)):
            raise TypeError(f"blocks must be a list of BlockWeights, got {type(blocks).__name__}")
        cast = [self._cast(b, i) for i, b in enumerate(blocks)]
        self._one_format(cast)
        self.stack = Stack(cfg, cast)
        self.eps = cfg.eps                      # LN_f's, as the blocks' LayerNorms
        self._heads = {}                        # backend name -> its prepare_head(wte), on first use
        self._step, self._step_backend = None, None     # the prepared decode step and its backend

    def _matrix(self, name: str, value, own, d: int):
        """wte or the untied head: a (vocab, d) array in the model's dtype, or its transpose
        (d, vocab) in a stored format (its rows are the tokens' rows)."""
        if not isinstance(value, QuantizedMatrix):
            return own(name, value, (self.vocab_size, d))
        if value.shape != (d, self.vocab_size):
            raise ValueError(f"a stored {name} holds {name}^T: shape (d_model, vocab_size) = "
                             f"{(d, self.vocab_size)}, got {value.shape}")
        if self.dtype != np.float32:
            raise ValueError(f"a {value.format} {name} computes in float32: the model's dtype must be float32, "
                             f"got {self.dtype}")
        return value

    @property
    def head_matrix(self):
        """The head's matrix: the untied head's, or wte (tied)."""
        return self.wte if self.lm_head is None else self.lm_head

    def _norm_kw(self) -> dict:
        # the hooks' keyword for an RMSNorm LN_f (backends predating it take LayerNorm's call)
        return {"rms": True} if self.rms else {}

    def _cast(self, w, i: int) -> BlockWeights:
        # every block in the model's dtype, so the blocks run in the dtype the logits have
        if not isinstance(w, BlockWeights):
            raise TypeError(f"blocks[{i}] must be a BlockWeights, got {type(w).__name__}")
        if w.quantized and self.dtype != np.float32:
            raise ValueError(f"blocks[{i}] holds {w.format} weights, which compute in float32: the model's "
                             f"dtype must be float32, got {self.dtype}")
        if w.dtype == self.dtype:
            return w
        return BlockWeights(**{k: v.astype(self.dtype) for k, v in w.arrays().items()})

    @staticmethod
    def _one_format(blocks: list[BlockWeights]) -> None:
        # weight_format and bytes_per_token describe the model by one format
        formats = [b.format for b in blocks]
        if len(set(formats)) > 1:
            raise ValueError(f"blocks must share one weight format, got {', '.join(formats)} (block 0, 1, ...)")

    def __getstate__(self):
        # what backends prepared (the packed head, the decode step: addresses of this
        # process's arrays) is left behind; the unpickled model prepares its own on use
        state = self.__dict__.copy()
        state.update(_heads={}, _step=None, _step_backend=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        for name in ("wte", "wpe", "ln_f", "lm_head"):     # pickle hands arrays back writeable
            if isinstance(getattr(self, name), np.ndarray):         # a stored wte rebuilds frozen
                setattr(self, name, frozen_copy(getattr(self, name), self.dtype))

    @property
    def blocks(self) -> list[BlockWeights]:
        return [b.weights for b in self.stack.blocks]

    @property
    def weight_format(self) -> str:
        """How the blocks' six matrices are stored: "fp32", "fp64", "bf16", "int8" or "int4"
        (tblock.formats); head_format says how the tied embedding is."""
        return self.blocks[0].format

    @property
    def head_format(self) -> str:
        """How the head's matrix (the tied wte, or the untied head's) is stored; wpe and LN_f
        are always in the model's dtype."""
        w = self.head_matrix
        return w.format if isinstance(w, QuantizedMatrix) else ("fp64" if w.dtype == np.float64 else "fp32")

    def param_count(self) -> int:
        """Parameters, a tied head counted once (a stored matrix counts its d_in * d_out),
        RMSNorm's LN_f its gamma only."""
        blocks = sum(int(np.prod(a.shape)) for b in self.blocks for a in b.arrays().values())
        d = self.stack.cfg.d_model
        matrices = self.vocab_size * d * (1 if self.lm_head is None else 2)
        positions = 0 if self.wpe is None else self.wpe.size
        return matrices + positions + blocks + (d if self.rms else 2 * d)

    def bytes_per_token(self, context: int = 0, cache_format: str = "fp32") -> int:
        """The bytes one decode step reads, with ``context`` keys and values per block in its
        caches (0 <= context <= n_positions): every block's ``BlockWeights.nbytes`` (its six
        matrices as stored, biases and LayerNorm affines), the head's matrix (wte as stored)
        and the caches' keys and values, n_layer * context * kv_bytes_per_token (2d values
        in the model's dtype for "fp32", 2 bytes each for "bf16", 1 for "int8" plus its
        2 * n_kv_heads float32 scales: tblock.kvcache; 2 * d_kv values with grouped-query
        attention).  Not counted: LN_f's 2d values, the embedding rows the step adds, and
        activations (each O(d) or O(d_ff), not O(d^2))."""
        context = check_int("context", context, 0)
        if context > self.n_positions:
            raise ValueError(f"context must be <= n_positions={self.n_positions}, got {context}")
        per_token = kv_bytes_per_token(self.stack.cfg, check_kv_format(cache_format, self.dtype, "cache_format"),
                                       self.dtype)
        blocks = sum(b.nbytes for b in self.blocks)
        return blocks + self.head_matrix.nbytes + len(self.blocks) * context * per_token

    # --------------------------------------------------------------- forward

    def check_ids(self, ids) -> np.ndarray:
        """ids as an integer (B, T) array, B=1 for 1-D ids, after every check."""
        if isinstance(ids, (list, tuple)):
            ids = np.asarray(ids)
        if not isinstance(ids, np.ndarray):
            raise TypeError(f"ids must be an integer numpy array (T,) or (B, T), got {type(ids).__name__}")
        if ids.ndim not in (1, 2):
            raise ValueError(f"ids must be (T,) or (B, T), got shape {ids.shape}")
        if ids.shape[-1] == 0 or ids.shape[0] == 0:
            raise ValueError(f"ids must hold at least one token (T >= 1) and one sequence, got shape {ids.shape}")
        if ids.dtype.kind not in "iu":
            raise TypeError(f"ids must have an integer dtype, got {ids.dtype}")
        T = ids.shape[-1]
        if T > self.n_positions:
            raise ValueError(f"ids has T={T} tokens, more than n_positions={self.n_positions}: the model has "
                             f"no position embedding past position {self.n_positions - 1}")
        bad = (ids < 0) | (ids >= self.vocab_size)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"ids must be token ids in [0, vocab_size={self.vocab_size}), found {ids[at]} "
                             f"at index {at}")
        return ids if ids.ndim == 2 else ids[None]

    def embed(self, ids2: np.ndarray, past: int = 0) -> np.ndarray:
        """h_0 of tokens ids2 (B, T) at positions past .. past + T - 1: (B, T, d)."""
        if self.wpe is None:                    # rotary: the blocks know the positions
            return self.embedding_rows(ids2)
        return self.embedding_rows(ids2) + self.wpe[past:past + ids2.shape[1]]

    def embedding_rows(self, ids2: np.ndarray) -> np.ndarray:
        """wte's rows of tokens ids2 (B, T): (B, T, d) in the model's dtype (a stored wte's
        rows dequantized exactly, only those)."""
        if not isinstance(self.wte, QuantizedMatrix):
            return self.wte[ids2]
        d = self.stack.cfg.d_model
        rows = dequantize(self.wte.format, self.wte.data[ids2.reshape(-1)], (d, ids2.size))   # (d, n)
        return np.ascontiguousarray(rows.T).reshape(ids2.shape + (d,))

    def hidden_states(self, ids, backend: str | None = None) -> np.ndarray:
        """The residual stream h_0 (the embeddings), h_1, ..., h_N (after each block),
        stacked: (N + 1, T, d) for ids (T,), (N + 1, B, T, d) for ids (B, T).  No LN_f
        is applied (transformers' last hidden state is LN_f(h_N))."""
        ids2 = self.check_ids(ids)
        H = self.embed(ids2)
        states = [H]
        for block in self.stack.blocks:
            H = block(H, backend=backend)
            states.append(H)
        out = np.stack(states)                      # (N + 1, B, T, d)
        return out if np.ndim(ids) == 2 else out[:, 0]

    def __call__(self, ids, backend: str | None = None, cache: list[KVCache] | None = None) -> np.ndarray:
        """Logits: (T, vocab) for ids (T,), (B, T, vocab) for ids (B, T), in the model's dtype.
        ``backend`` runs the blocks as in tblock.forward, and the head (the backend's
        lm_head, or the registry's float64 reference).

        With ``cache`` (``make_cache``), ids are the next tokens of sequences whose first
        ``cache[0].length`` tokens the cache holds: they sit at the positions after those,
        their keys and values are appended, and their logits are those of a call on the
        whole sequence."""
        name = self.cached_backend(backend) if cache is not None else self._backend(backend)
        ids2 = self.check_ids(ids)
        if cache is None:
            H = self.stack(self.embed(ids2), backend=name)
        else:
            H = self._forward_cached(ids2, cache, name)
        logits = self._head(H, name)                # (B, T, vocab)
        return logits if np.ndim(ids) == 2 else logits[0]

    def head(self, H, backend: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """LN_f(H) @ W_head^T: the logits (B, T, vocab) of hidden states H (B, T, d) in the
        model's dtype, into ``out`` when given (a C-contiguous (B, T, vocab) array of it)."""
        name = self._backend(backend)
        H = as_float_array("H", H, 3)
        d = self.stack.cfg.d_model
        if H.shape[-1] != d or H.dtype != self.dtype:
            raise ValueError(f"H must be (B, T, {d}) of {self.dtype}, got {H.shape} of {H.dtype}")
        if out is not None and (not isinstance(out, np.ndarray) or out.dtype != self.dtype
                                or out.shape != H.shape[:2] + (self.vocab_size,) or not out.flags.c_contiguous):
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape "
                             f"{H.shape[:2] + (self.vocab_size,)}, got {getattr(out, 'shape', type(out).__name__)}")
        return self._head(H, name, out)

    def _head(self, H: np.ndarray, backend: str, out: np.ndarray | None = None, scratch: bool = False):
        """The backend's lm_head hook on H (B, T, d) into out (B, T, vocab).  scratch: H is
        the caller's to overwrite (LN_f may go over it)."""
        module = get_backend(backend)
        if out is None:
            out = np.empty(H.shape[:2] + (self.vocab_size,), dtype=self.dtype)
        return lm_hook(module, "lm_head")(H, self.ln_f, self.eps, self._prepared_head(backend, module), out, scratch,
                                          **self._norm_kw())

    def _prepared_head(self, backend: str, module):
        """The backend's prepare_head of the head's matrix, made on first use."""
        head = self._heads.get(backend)
        if head is None:
            head = self._heads[backend] = lm_hook(module, "prepare_head")(self.head_matrix, self.dtype)
        return head

    @staticmethod
    def _backend(backend: str | None) -> str:
        name = DEFAULT_BACKEND if backend is None else backend
        get_backend(name)                       # a bad backend fails before any work
        return name

    @classmethod
    def cached_backend(cls, backend: str | None) -> str:
        """The backend's name (None: the default), or ValueError where it has no KV-cache path."""
        name = cls._backend(backend)
        if getattr(get_backend(name), "forward_cached", None) is None:
            raise ValueError(f"backend {name!r} has no KV-cache path: generation needs one "
                             f"(the default {DEFAULT_BACKEND!r} has it, and the numpy oracle)")
        return name

    # --------------------------------------------------------------- cached forward

    def make_cache(self, max_T: int | None = None, batch: int = 1, format: str = "fp32") -> list[KVCache]:
        """Empty KV caches, one per block, for ``batch`` sequences of up to ``max_T`` tokens
        (default n_positions) in the model's dtype: 2 * N * max_T * d values per sequence,
        allocated here once, stored in ``format``: "fp32" (as computed, in the model's
        dtype), "bf16" or "int8" (rounded: tblock.kvcache; a float32 model's only)."""
        max_T = self.n_positions if max_T is None else check_int("max_T", max_T, 1)
        if max_T > self.n_positions:
            raise ValueError(f"max_T must be <= n_positions={self.n_positions} (the model has no position "
                             f"past that), got {max_T}")
        check_kv_format(format, self.dtype)
        return self.stack.make_cache(max_T, batch, self.dtype, format)

    def _forward_cached(self, ids2: np.ndarray, cache: list[KVCache], backend: str) -> np.ndarray:
        """h_N of the new tokens ids2 (B, T_new) after the cache's ``past`` ones: (B, T_new, d).
        The stack checks every block's cache (config, dtype, batch, room) before writing any."""
        if isinstance(cache, KVCache) or not isinstance(cache, (list, tuple)) or not cache:
            raise TypeError(f"cache must be the list of KVCaches of model.make_cache(), got {type(cache).__name__}")
        past = getattr(cache[0], "length", 0)
        T_new = ids2.shape[1]
        if past + T_new > self.n_positions:
            raise ValueError(f"the cache holds {past} tokens; {T_new} more would pass n_positions="
                             f"{self.n_positions}")
        # the rows may be the cache's scratch: read them before the next call
        return self.stack.run_cached(self.embed(ids2, past), backend, cache, fresh=False)

    def next_logits(self, ids, cache: list[KVCache], backend: str | None = None, out=None) -> np.ndarray:
        """The logits after the last of the new tokens ``ids`` only: (vocab,) for ids (T_new,),
        (B, vocab) for (B, T_new).  As ``model(ids, cache=cache)[..., -1, :]``, with the head
        run on that one row.  ``out``: a (B, vocab) array of the model's dtype to write them
        into, so a decoding loop allocates none per token.  One token a sequence with the
        caches of the previous such call: the backend's prepared step, where it has one;
        otherwise, or when the step declines (anything it was not prepared for), the
        checked path, which raises every error."""
        step = self._step
        if step is not None and (DEFAULT_BACKEND if backend is None else backend) == self._step_backend:
            logits = step(ids, cache, out)
            if logits is not None:
                return logits
        name = self.cached_backend(backend)
        ids2 = self.check_ids(ids)
        B = ids2.shape[0]
        if out is not None and (not isinstance(out, np.ndarray) or out.shape != (B, self.vocab_size)
                                or out.dtype != self.dtype or not out.flags.c_contiguous):
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape "
                             f"{(B, self.vocab_size)}, got {getattr(out, 'shape', type(out).__name__)}")
        H = self._forward_cached(ids2, cache, name)
        logits = self._head(H[:, -1:], name, None if out is None else out[:, None], scratch=True)  # (B, 1, vocab)
        if ids2.shape[1] == 1:
            self._prepare_step(cache, name)
        return logits[:, 0] if np.ndim(ids) == 2 else logits[0, 0]

    def _prepare_step(self, cache: list[KVCache], backend: str) -> None:
        """After a checked decode step with these caches: the backend's prepared step for
        the next ones (None where it has none)."""
        self._step, self._step_backend = self.make_step(cache, backend), backend

    def make_step(self, cache: list[KVCache], backend: str | None = None):
        """The backend's compiled decode step for the caches ``cache`` (model.make_cache's:
        this model's, unchanged since), or None where the backend has none; what
        ``next_logits`` runs once a checked step has vouched for the caches."""
        backend = self._backend(backend)
        module = get_backend(backend)
        return lm_hook(module, "prepare_decode")(self.blocks, self.stack.cfg, cache, self.wte, self.wpe, self.ln_f,
                                                 self.eps, self._prepared_head(backend, module), **self._norm_kw())

    @property
    def prepared_step(self):
        """The backend's decode step prepared for the last list of caches a checked
        one-token step used, or None; ``next_logits`` runs it when it can."""
        return self._step

    def clear_prepared_step(self) -> None:
        """Drop the prepared step: the next one-token step takes the checked path (and
        prepares a step for its caches)."""
        self._step, self._step_backend = None, None

    # --------------------------------------------------------------- generation

    def generate_many(self, prompts, max_new_tokens, **options) -> list[np.ndarray]:
        """Many prompts of any lengths, continuously batched: each one's ``generate`` result,
        in input order (tblock.models.batching.generate_many: the options and the schedule)."""
        return generate_many(self, prompts, max_new_tokens, **options)

    def stream_many(self, prompts, max_new_tokens, **options):
        """``generate_many`` yielding (index, tokens) as each prompt finishes."""
        return stream_many(self, prompts, max_new_tokens, **options)

    def generate(self, ids, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed=None, eos_token_id: int | None = None,
                 backend: str | None = None, cache_format: str = "fp32") -> np.ndarray:
        """The prompt followed by up to ``max_new_tokens`` new tokens, as transformers'
        generate returns them: (T + n,) for ids (T,), (B, T + n) for ids (B, T), int64.

        temperature 0 is greedy (the argmax; top_k and top_p do not apply); otherwise each
        token is drawn from ``next_token_probs(logits, temperature, top_k, top_p)`` with
        ``np.random.default_rng(seed)``, so a seed repeats a run.  A sequence that produces
        ``eos_token_id`` emits it from then on (transformers pads with pad_token_id, GPT-2's
        being its eos), and generation stops once every sequence has (n < max_new_tokens).
        The prompt runs through the blocks as one chunk, then each token is one cached step,
        over KV caches in ``cache_format`` (make_cache's ``format``: "fp32", "bf16", "int8")."""
        out, T, steps = self._start(ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, backend,
                                    cache_format, bulk=True)
        n = 0
        for n in steps:
            pass
        out = out[:, :T + n]
        return out if np.ndim(ids) == 2 else out[0]

    def stream(self, ids, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, seed=None, eos_token_id: int | None = None,
               backend: str | None = None, cache_format: str = "fp32"):
        """``generate`` one token at a time: an iterator yielding each new token as an int
        for ids (T,), or the (B,) array of the step's tokens for ids (B, T).  The arguments
        are checked here, before the first token is asked for."""
        out, T, steps = self._start(ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, backend,
                                    cache_format)
        if np.ndim(ids) == 2:
            return (out[:, T + n - 1].copy() for n in steps)
        return (int(out[0, T + n - 1]) for n in steps)

    def _start(self, ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, backend, cache_format,
               bulk=False):
        """Every argument checked, the output buffer (B, T + max_new_tokens) holding the prompt,
        and the decoding loop (not started): (out, T, steps).  bulk: no caller sees the
        tokens one by one, so greedy steps may run many to a call."""
        ids2 = self.check_ids(ids)
        B, T = ids2.shape
        name = self.cached_backend(backend)
        max_new = check_int("max_new_tokens", max_new_tokens, 0)
        if T + max_new > self.n_positions:
            raise ValueError(f"max_new_tokens={max_new} after T={T} prompt tokens passes n_positions="
                             f"{self.n_positions} (the model's context): at most {self.n_positions - T}")
        temperature = check_temperature(temperature)
        top_k, top_p = check_filters(top_k, top_p)
        check_kv_format(cache_format, self.dtype, "cache_format")
        if eos_token_id is not None:
            eos_token_id = check_token_id("eos_token_id", eos_token_id, self.vocab_size)
        rng = rng_of(seed)
        if temperature == 0.0:
            def pick(logits):               # (B, vocab) -> (B,): the first of equal maxima
                return logits.argmax(axis=-1)
        else:
            def pick(logits):
                return draw(next_token_probs(logits, temperature, top_k, top_p), rng)
        out = np.empty((B, T + max_new), dtype=np.int64)    # prompt + new tokens, allocated once
        out[:, :T] = ids2
        greedy = bulk and temperature == 0.0
        return out, T, self._decode(out, T, max_new, pick, eos_token_id, name, cache_format, greedy)

    def _decode(self, out: np.ndarray, T: int, max_new: int, pick, eos: int | None, backend: str, cache_format: str,
                greedy: bool = False):
        """The decoding loop: fills out[:, T + n] for n = 0, 1, ... and yields the tokens
        filled after each step.  The prompt out[:, :T] is one chunk through the blocks;
        every later step feeds the token just chosen.  Caches and logits are allocated once,
        before the loop.  greedy: the argmax tokens, whose steps the backend's prepared
        step may take many to a call (DecodeStep.greedy)."""
        if max_new == 0:
            return
        B, n = out.shape[0], 0
        cache = self.make_cache(T + max_new - 1, B, cache_format)     # the last new token is never fed back
        logits = np.empty((B, self.vocab_size), dtype=self.dtype)
        done = np.zeros(B, dtype=bool)
        chunk = out[:, :T]                  # (B, T): the prompt, then (B, 1) per step
        while n < max_new:
            self.next_logits(chunk, cache, backend, out=logits)
            tok = pick(logits)              # (B,)
            if eos is not None:
                tok = np.where(done, eos, tok)      # a finished sequence keeps emitting eos
                done |= tok == eos
            out[:, T + n] = tok
            n += 1
            if (greedy and n < max_new and not (eos is not None and done.all()) and self._step is not None
                    and self._step_backend == backend):
                n += self._step.greedy(cache, out, T + n, max_new - n, -1 if eos is None else eos, done)
            yield n
            if eos is not None and done.all():
                return
            chunk = out[:, T + n - 1:T + n]
