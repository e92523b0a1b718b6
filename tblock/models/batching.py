"""Continuous batching: many prompts of any lengths through one model, one weight pass a step.

    results = model.generate_many(prompts, 64, temperature=0, max_batch=16)   # input order
    for i, tokens in model.stream_many(prompts, 64, seed=[1, 2, 3]):          # as each ends
        ...

A decode step reads every weight once whatever the number of sequences it carries, so
the batcher keeps up to ``max_batch`` of them in flight.  Its KV caches are made once, a
slot a sequence (``KVCache.slot``: a one-sequence view of one batch of caches); each step

  1. admits waiting prompts, in input order, into free slots: the prompt goes through the
     blocks as one chunk into its slot (as ``generate`` runs it alone), and its logits
     give its first new token;
  2. decodes one token for every sequence in flight: the backend's compiled step over the
     slots, each at its own length (``ragged``), or, for a backend without one, each slot's
     checked step in turn;
  3. retires the sequences that made their ``max_new_tokens`` or their ``eos_token_id``,
     freeing their slots for step 1.

Every prompt has its own parameters and its own random stream (``np.random.default_rng``
of its seed), drawn from only by its own tokens, so its result is ``generate``'s for it
alone: the same tokens greedily and, given its seed, when sampling (the kernels' rows do
not depend on the rows beside them).
"""

from __future__ import annotations

import numbers
from collections import deque

import numpy as np

from ..config import check_int
from ..kvcache import check_kv_format
from .sampling import check_filters, check_temperature, check_token_id, draw, next_token_probs, rng_of


class Request:
    """One prompt and its own parameters, checked: ids (T,) int64, max_new, the token
    picker (greedy or seeded draws) and eos (or None)."""

    def __init__(self, model, index: int, ids, max_new, temperature, top_k, top_p, seed, eos):
        where = f"prompts[{index}]"
        ids = np.asarray(ids) if isinstance(ids, (list, tuple)) else ids
        if not isinstance(ids, np.ndarray) or ids.ndim != 1:
            raise ValueError(f"{where} must be a 1-D sequence of token ids, got "
                             f"{getattr(ids, 'shape', type(ids).__name__)}")
        try:
            self.ids = model.check_ids(ids)[0].astype(np.int64)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        self.index = index
        self.max_new = check_int(f"max_new_tokens (of {where})", max_new, 0)
        T, room = self.ids.size, model.n_positions
        if T + self.max_new > room:
            raise ValueError(f"{where}: max_new_tokens={self.max_new} after its {T} tokens passes n_positions={room} "
                             f"(the model's context): at most {room - T}")
        self.temperature = check_temperature(temperature)
        self.top_k, self.top_p = check_filters(top_k, top_p)
        self.eos = None if eos is None else check_token_id(f"eos_token_id (of {where})", eos, model.vocab_size)
        self.rng = rng_of(seed)
        self.tokens = list(self.ids)            # the prompt, then each new token

    def pick(self, logits: np.ndarray) -> int:
        """The next token from its logits (vocab,), as generate picks for one sequence."""
        if self.temperature == 0.0:
            return int(logits.argmax())
        p = next_token_probs(logits[None], self.temperature, self.top_k, self.top_p)
        return int(draw(p, self.rng)[0])

    def add(self, token: int) -> bool:
        """Append a new token; whether the sequence is finished."""
        self.tokens.append(token)
        return len(self.tokens) - self.ids.size >= self.max_new or token == self.eos

    def result(self) -> np.ndarray:
        return np.array(self.tokens, dtype=np.int64)


def per_prompt(name: str, value, n: int, scalar) -> list:
    """value for each of n prompts: one value for all, or a sequence of n."""
    if value is None or isinstance(value, scalar) or isinstance(value, np.random.Generator):
        if isinstance(value, np.random.Generator):
            raise TypeError(f"{name} must be an integer or one per prompt: a shared Generator would make each "
                            f"prompt's draws depend on the schedule")
        return [value] * n
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n:
            raise ValueError(f"{name} must be one value or one per prompt ({n}), got {len(value)} values")
        return list(value)
    raise TypeError(f"{name} must be one value or a sequence of one per prompt, got {type(value).__name__}")


def requests_of(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None,
                eos_token_id=None) -> list[Request]:
    """Every prompt and parameter checked, before any work."""
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        prompts = list(prompts)
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of token-id sequences, got {type(prompts).__name__}")
    n = len(prompts)
    columns = [per_prompt("max_new_tokens", max_new_tokens, n, numbers.Integral),
               per_prompt("temperature", temperature, n, numbers.Real),
               per_prompt("top_k", top_k, n, numbers.Integral), per_prompt("top_p", top_p, n, numbers.Real),
               per_prompt("seed", seed, n, numbers.Integral), per_prompt("eos_token_id", eos_token_id, n, numbers.Integral)]
    return [Request(model, i, p, *values) for i, (p, *values) in enumerate(zip(prompts, *columns))]


class Batcher:
    """The slots of up to ``max_batch`` sequences in flight over one list of KV caches,
    and the step that runs them (module docstring)."""

    def __init__(self, model, requests: list[Request], max_batch: int, backend, cache_format: str):
        self.model, self.backend = model, backend
        live = [r for r in requests if r.max_new > 0]
        self.batch = min(max_batch, max(1, len(live)))
        # each slot holds a prompt and all its new tokens but the last (never fed back)
        max_T = max([r.ids.size + r.max_new - 1 for r in live] + [1])
        self.caches = model.make_cache(max_T, self.batch, cache_format)
        self.slots = [[c.slot(s) for c in self.caches] for s in range(self.batch)]    # one list a slot
        self.step = model.make_step(self.caches, backend)
        if not hasattr(self.step, "ragged"):
            self.step = None                # each slot's own checked step instead
        self.logits = np.empty((self.batch, model.vocab_size), dtype=model.dtype)

    def prefill(self, s: int, r: Request) -> np.ndarray:
        """Slot s emptied and given prompt r: the logits after its last token (vocab,)."""
        for c in self.slots[s]:
            c.length = 0                    # the old tokens are past the length: masked, then overwritten
        return self.model.next_logits(r.ids[None], self.slots[s], self.backend, out=self.logits[s:s + 1])[0]

    def decode(self, active: list[int], tokens: list[int]) -> np.ndarray:
        """One new token in each of the slots ``active``: their logits (len(active), vocab)."""
        n = len(active)
        out = self.logits[:n]
        if self.step is not None:
            pasts = np.array([self.slots[s][0].length for s in active], dtype=np.intp)
            if self.step.ragged(np.array(tokens, np.int64), np.array(active, np.intp), pasts, out) is not None:
                for s in active:
                    for c in self.slots[s]:
                        c.advance()
                return out
        for i, (s, tok) in enumerate(zip(active, tokens)):     # the checked path raises what went wrong
            self.model.next_logits(np.array([[tok]]), self.slots[s], self.backend, out=out[i:i + 1])
        return out


def stream_many(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None,
                eos_token_id=None, backend=None, cache_format="fp32", max_batch: int = 16):
    """(index, tokens) for each prompt as it finishes: tokens (T_i + n_i,) int64, its prompt
    and new tokens, equal to ``model.generate(prompts[i], ...)`` with its own parameters.
    max_new_tokens, temperature, top_k, top_p, seed and eos_token_id are one value for every
    prompt or a sequence of one per prompt (a seed: an integer, or None for fresh entropy).
    Every argument is checked here, before the first result is asked for."""
    requests = requests_of(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id)
    max_batch = check_int("max_batch", max_batch, 1)
    check_kv_format(cache_format, model.dtype, "cache_format")
    model.cached_backend(backend)
    return _schedule(model, requests, max_batch, backend, cache_format)


def _schedule(model, requests, max_batch, backend, cache_format):
    """The continuous batching loop (module docstring)."""
    for r in requests:
        if r.max_new == 0:
            yield r.index, r.result()
    waiting = deque(r for r in requests if r.max_new > 0)
    if not waiting:
        return
    batcher = Batcher(model, requests, max_batch, backend, cache_format)
    free, running = list(range(batcher.batch - 1, -1, -1)), {}     # running: slot -> Request
    while waiting or running:
        while waiting and free:
            s, r = free.pop(), waiting.popleft()
            if r.add(r.pick(batcher.prefill(s, r))):
                free.append(s)
                yield r.index, r.result()
            else:
                running[s] = r
        if not running:
            continue
        active = list(running)
        logits = batcher.decode(active, [running[s].tokens[-1] for s in active])
        for i, s in enumerate(active):
            r = running[s]
            if r.add(r.pick(logits[i])):
                del running[s]
                free.append(s)
                yield r.index, r.result()


def generate_many(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None,
                  eos_token_id=None, backend=None, cache_format="fp32", max_batch: int = 16) -> list[np.ndarray]:
    """stream_many's results in input order: a list of (T_i + n_i,) int64 arrays."""
    out = [None] * len(prompts)
    for i, tokens in stream_many(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id,
                                 backend, cache_format, max_batch):
        out[i] = tokens
    return out
