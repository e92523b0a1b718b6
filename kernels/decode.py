"""A language model's decode step in one call: embedding, the stack over its caches, LN_f, head.

One new token per sequence goes through

    h_0    = E[id] (+ P[past])                    its embedding [at the next position]
    h_l    = Block_l(h_{l-1}; cache_l), l = 1..n  the stack, each block over its KV cache
    logits = LN_f(h_n) @ E^T                      the tied vocabulary head, one row a sequence
                                                  (LN_f LayerNorm or RMSNorm: lm_head)

in one crossing from Python into compiled code.  A step streams every weight once and
leaves the host's caches cold for the Python around it, so each Python step a decode loop
takes costs far more than it would warm; a model's prepared step
(tblock.backends.numba.DecodeStep) checks a cache list once and then calls only this.

The stack is kernels.block's cached build and the head kernels.lm_head's, reached through
their addresses (both are standalone kernels), so this body compiles in moments and the
step's sums are exactly those of the two calls made one after the other.

``greedy_steps`` takes many such steps in one call, each feeding the token the last one
chose (the argmax): a greedy generation's loop, where the Python between two steps,
run with the caches cold, costs a visible part of a step (docs/perf-log.md).

A ragged step (the cache argument's seqs not empty: kernels.block._cached) runs one token
for each of B of the caches' sequences, each at its own position: sequence b is the
caches' sequence seqs[2b] after seqs[2b + 1] tokens, and P's row is its own.
"""

from __future__ import annotations

import numpy as np

from .block import cached_parallel, cached_serial, ragged_pairs
from .lm_head import head_parallel, head_serial
from .options import kernel
from .wgemm import embed_row


@kernel
def decode_step(embed, Wf, cfg, cache, head, logits, parallel, nthr):
    """logits (B * vocab, flat) of the tokens ids (B,) at position ``past`` after the
    tokens the caches hold; -1, or what went wrong (nothing written to ``logits`` then):

        b >= 0         ids[b] is not a token id in [0, vocab)
        -2 - i         block i's input holds a NaN or an Inf (the caches' lengths are the
                       caller's: the keys and values written past them are unused)

    embed = (ids, E, P, H): the tokens, the token and position embeddings E (vocab, d),
    or E's stored rows (the head's Ep), and P (positions, d; (0, d): no learned positions,
    the blocks' rotary ones), and H (B, 1, d), room for h_0.  Wf, cfg, cache: the stack's, as
    kernels.block's cached builds take them for T = 1 (cache[2] is past; its table holds
    every block's weights and caches; an eighth field, seqs: a ragged step's pairs).
    head = (ln_f, eps_f, Ep, vocab): ln_f = [gamma | beta] (2d), or gamma (d) for
    RMSNorm, Ep: E packed for the head (lm_head.pack_head).  parallel = (stack, head):
    which build of each runs (the caller decides as it would for the two calls; a serial
    one is sized for one thread, as there); nthr: the threads of the parallel ones."""
    ids, E, P, H = embed
    ln_f, eps_f, Ep, vocab = head
    past, seqs = cache[2], ragged_pairs(cache)
    B = ids.size
    d = H.shape[2]
    for b in range(B):
        if ids[b] < 0 or ids[b] >= vocab:
            return b
    h = H.reshape(H.size)
    for b in range(B):
        embed_row(E, ids[b], d, h, b * d)
        if P.shape[0] > 0:
            pos = seqs[2 * b + 1] if seqs.size > 0 else past      # each ragged sequence its own
            for j in range(d):
                h[b * d + j] += P[pos, j]
    if parallel[0]:
        out3, bad = cached_parallel(H, Wf, cfg, cache, nthr)
    else:
        out3, bad = cached_serial(H, Wf, cfg, cache, 1)
    if bad >= 0:
        return -2 - bad
    X = out3.reshape(out3.size)         # h_n, (B * d,): scratch of work, LN_f goes over it
    if parallel[1]:
        head_parallel(X, B, d, ln_f, eps_f, Ep, vocab, logits, True, nthr)
    else:
        head_serial(X, B, d, ln_f, eps_f, Ep, vocab, logits, True, 1)
    return -1


@kernel
def greedy_steps(embed, Wf, cfg, cache, head, logits, run, parallel, nthr):
    """run = (out, col, n, eos, done): n decode_step calls, each on the tokens the last one
    chose.  out (B, W) int64: column col - 1 holds the tokens fed first, and the tokens
    chosen go to columns col, col + 1, ...: each row's first largest logit (numpy's
    argmax).  eos >= 0: a sequence that has chosen eos (done[b]) emits it from then on,
    and the run ends once every one has; -1: none.  The other arguments are
    decode_step's, cache[2] the position of the first step (a uniform step's cache
    argument).  Returns (steps taken, -1), or (i, decode_step's code) when step i wrote
    nothing (a bad token or block input)."""
    out, col, n, eos, done = run
    ids, vocab = embed[0], head[3]
    K, V, past, max_T, layers, plan, work = cache
    for i in range(n):
        for b in range(ids.size):
            ids[b] = out[b, col + i - 1]
        code = decode_step(embed, Wf, cfg, (K, V, past + i, max_T, layers, plan, work), head, logits,
                           parallel, nthr)
        if code != -1:
            return i, code
        finished = eos >= 0
        for b in range(ids.size):
            tok = np.argmax(logits[b * vocab:(b + 1) * vocab])
            if eos >= 0:
                tok = eos if done[b] else tok
                done[b] = tok == eos
                finished = finished and done[b]
            out[b, col + i] = tok
        if finished:
            return i + 1, -1
    return n, -1
