"""How much a weight or KV cache format changes a language model: perplexity, KL divergence,
top-1.

    ref = GPT2.from_pretrained(path)                        # float32: the reference
    q = GPT2.from_pretrained(path, weights="int8")
    acc = compare(q, ref, tokens, positions=10_240)         # an Accuracy
    acc.perplexity, acc.kl, acc.top1                        # and acc.reference_perplexity
    compare(ref, ref, tokens, cache_format="int8")          # the model through an int8 KV cache

The protocol: the token stream is cut into non-overlapping windows of ``context`` tokens
(default the model's n_positions), window w holding tokens[w*context : (w+1)*context] as
the input and the same span shifted by one as the targets; a trailing part shorter than a
window is left out.  Every position of a window is scored: position j predicts its target
from the window's first j + 1 tokens only (so early positions see little context, as in any
stride = context evaluation).  ``positions`` (a multiple of ``context``) takes the first
windows only; the number scored is reported.

At every position, with p the reference model's next-token distribution and q the
model's (softmax of the logits in float64):

    perplexity   exp(mean over positions of -log q(target))
    kl           mean over positions of KL(p || q) = sum_v p_v (log p_v - log q_v), nats
    top1         the fraction of positions where argmax q equals argmax p

Windows run through ``model(ids, backend=backend)`` in batches of ``batch`` windows; with
``cache_format`` ("fp32", "bf16", "int8": tblock.kvcache), through
``model(ids, backend=backend, cache=model.make_cache(context, batch, format=cache_format))``
instead, a prefill whose every key and value is read from the cache as stored, as a
generation's would be (the reference always runs without a cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import check_int


@dataclass(frozen=True)
class Accuracy:
    """A model against a reference on one token stream (module docstring)."""
    positions: int                  # positions scored
    perplexity: float               # the model's, on the targets
    reference_perplexity: float     # the reference's, on the same targets
    kl: float                       # mean KL(p_reference || p_model), nats
    top1: float                     # fraction of positions whose argmax agrees


def windows(tokens, context: int, positions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (n_windows, context) int64: the stream's non-overlapping
    windows and the tokens that follow each position (module docstring)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise TypeError(f"tokens must be a 1-D integer array, got {tokens.dtype} of shape {tokens.shape}")
    context = check_int("context", context, 1)
    n = (len(tokens) - 1) // context
    if positions is not None:
        positions = check_int("positions", positions, context)
        if positions % context:
            raise ValueError(f"positions must be a multiple of context={context}, got {positions}")
        if positions > n * context:
            raise ValueError(f"positions={positions} needs {positions + 1} tokens, the stream has {len(tokens)}")
        n = positions // context
    if n == 0:
        raise ValueError(f"tokens must hold at least context + 1 = {context + 1} tokens, got {len(tokens)}")
    span = tokens[:n * context + 1].astype(np.int64)
    return span[:-1].reshape(n, context), span[1:].reshape(n, context)


def log_probs(model, inputs: np.ndarray, backend: str | None = None, batch: int = 8,
              cache_format: str | None = None):
    """log softmax of the model's logits, float64 (w, context, vocab), ``batch`` windows
    of ``inputs`` (n_windows, context) at a time: an iterator.  ``cache_format``: each
    batch through new KV caches of that format (module docstring); None: no cache."""
    batch = check_int("batch", batch, 1)
    if cache_format is not None:
        model.make_cache(1, 1, format=cache_format)        # a bad format fails before any work
    for start in range(0, len(inputs), batch):
        ids = inputs[start:start + batch]
        if cache_format is None:
            logits = model(ids, backend=backend)
        else:
            logits = model(ids, backend=backend, cache=model.make_cache(ids.shape[1], len(ids), format=cache_format))
        logits = logits.astype(np.float64)
        logits -= logits.max(axis=-1, keepdims=True)
        yield logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))


def _context(model, context: int | None) -> int:
    if context is None:
        return model.n_positions
    context = check_int("context", context, 1)
    if context > model.n_positions:
        raise ValueError(f"context must be <= the model's n_positions={model.n_positions}, got {context}")
    return context


def _nll(logp: np.ndarray, targets: np.ndarray) -> float:
    """Sum over positions of -log p(target)."""
    return -float(np.take_along_axis(logp, targets[..., None], axis=-1).sum())


def perplexity(model, tokens, context: int | None = None, positions: int | None = None,
               backend: str | None = None, batch: int = 8, cache_format: str | None = None) -> float:
    """exp(mean -log p(target)) of ``model`` on the stream's windows (module docstring)."""
    inputs, targets = windows(tokens, _context(model, context), positions)
    nll = 0.0
    for w, logp in enumerate(log_probs(model, inputs, backend, batch, cache_format)):
        nll += _nll(logp, targets[w * batch:w * batch + len(logp)])
    return float(np.exp(nll / targets.size))


def compare(model, reference, tokens, context: int | None = None, positions: int | None = None,
            backend: str | None = None, reference_backend: str | None = None, batch: int = 8,
            cache_format: str | None = None) -> Accuracy:
    """``model`` against ``reference`` (same vocabulary) on the stream's windows: perplexity
    of both, mean KL(p_reference || p_model) and top-1 agreement (module docstring).
    ``reference_backend`` defaults to ``backend``; ``cache_format``: the model's logits
    through KV caches of that format (the reference's without a cache)."""
    if model.vocab_size != reference.vocab_size:
        raise ValueError(f"the models' vocabularies differ: {model.vocab_size} and {reference.vocab_size}")
    context = _context(model, context)
    _context(reference, context)
    inputs, targets = windows(tokens, context, positions)
    ref_backend = backend if reference_backend is None else reference_backend
    nll = ref_nll = kl = agree = 0.0
    pairs = zip(log_probs(model, inputs, backend, batch, cache_format), log_probs(reference, inputs, ref_backend, batch))
    for w, (logq, logp) in enumerate(pairs):
        tgt = targets[w * batch:w * batch + len(logq)]
        nll += _nll(logq, tgt)
        ref_nll += _nll(logp, tgt)
        kl += float((np.exp(logp) * (logp - logq)).sum())
        agree += int((logq.argmax(axis=-1) == logp.argmax(axis=-1)).sum())
    n = targets.size
    return Accuracy(positions=n, perplexity=float(np.exp(nll / n)), reference_perplexity=float(np.exp(ref_nll / n)),
                    kl=kl / n, top1=agree / n)
