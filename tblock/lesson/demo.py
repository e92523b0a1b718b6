"""The interactive demo's model: a tiny language model around the lesson's block, with a tracer.

The demo's ``TransformerBlock`` (transformer-block.ts) in Python:

    x_i = E[t_i] + PE(i)                          embed   (PE switchable; a zero vector when off)
    h   = LN(x + MultiHead(x) W_o)                attend, add, norm   (Post-LN, unmasked)
    y   = LN(h + relu(h W_1) W_2)                 ffn, add, norm
    p_i = softmax(y_i W_out^T / temperature)      predict

with d_model = ``dim`` (4 in the demo), one or two heads, hidden width 8, no biases and no
LayerNorm gain or shift. The block part runs through ``tblock.forward`` (cfg norm="post",
causal=False, activation="relu", d_ff=hidden) on any backend; the tracer's events are read
off the returned Trace.

Conventions taken from the demo's source, and the choices its source leaves open:

- The demo multiplies matrix times column vector, ``apply(m, v) = m @ v``. The lesson's row
  convention is ``x @ W``, so every demo matrix enters BlockWeights transposed: W_row = m.T.
- Every matrix is drawn from one Mulberry32 stream, uniform(-1, 1), row by row, in the
  order embeddings (vocab x dim), then W_o (dim x dim), W_1 (hidden x dim), W_2 (dim x hidden),
  W_out (vocab x dim). ``Mulberry32.between(lo, hi)`` is taken to be lo + (hi - lo) * next().
- Each head is its own SelfAttention seeded with seed * 101 + head + 1 (its own stream, so it
  does not advance the main one). The SelfAttention class is not shown; we choose: three
  (head_dim x head_dim) matrices W_q, W_k, W_v drawn from Mulberry32(that seed),
  uniform(-1, 1), row by row, in that order; scores q_i . k_j / sqrt(head_dim); a row
  softmax with no mask. Head h reads only columns h*head_dim:(h+1)*head_dim of the stream,
  so the full W_Q is block diagonal, which is exactly the lesson's MHA with d_k = head_dim.
  Of the readings tests/data/demo_seed_search.py tries (draw order, products, scaling, fill,
  positions, vocabulary size, inspected token), this one, with an eight-word vocabulary, is
  the one that reproduces the figures the seed's page shows (docs/demo.md).
- LayerNorm uses the population variance and eps = 1e-5 (the demo's Kernels.layerNorm is not
  shown); the norm event reports the mean and variance of the row it normalises.
- Position i is 0-based: PE(i)_{2k} = sin(i / 10000^(2k/d)), PE(i)_{2k+1} = cos(i / 10000^(2k/d)).
- ``n_blocks > 1`` (not in the demo) continues the same stream: W_o, W_1, W_2 per block,
  then W_out; block l's heads are seeded seed * 101 + l * heads + head + 1, so block 0 is
  the demo's. Events from inside block l then carry ``block: l``.

Event count. For 6 tokens and 2 heads the class emits 6 embed + 12 attend + 6 add + 6 norm +
6 ffn + 6 add + 6 norm + 6 predict = 54 events (``event_count``). The demo's notes say "the
trace stays at 56 events"; the published class we read emits the 54 above (one attend per
head and token, as the note says), so the other two must come from outside this class, most
likely the demo driver's own start/finish frames, which we cannot see. We emit the class's 54.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ..api import forward
from ..config import BlockConfig
from ..weights import BlockWeights

EVENTS = ("embed", "attend", "add", "norm", "ffn", "predict")
LN_EPS = 1e-5
_U32 = 0xFFFFFFFF


def _imul(a: int, b: int) -> int:
    """JavaScript's Math.imul on uint32 bit patterns: the low 32 bits of the product."""
    return (a * b) & _U32


class Mulberry32:
    """Tommy Ettinger's Mulberry32, bit for bit as the usual JavaScript rendering:

        a = a + 0x6D2B79F5 | 0; t = Math.imul(a ^ a >>> 15, 1 | a);
        t = t + Math.imul(t ^ t >>> 7, 61 | t) ^ t; return ((t ^ t >>> 14) >>> 0) / 4294967296
    """

    def __init__(self, seed: int):
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an integer, got {type(seed).__name__} {seed!r}")
        self.state = int(seed) & _U32                       # JavaScript's seed >>> 0

    def next_uint32(self) -> int:
        self.state = (self.state + 0x6D2B79F5) & _U32
        t = self.state
        t = _imul(t ^ (t >> 15), t | 1)
        t = ((t + _imul(t ^ (t >> 7), t | 61)) & _U32) ^ t
        return (t ^ (t >> 14)) & _U32

    def next(self) -> float:
        """Uniform in [0, 1), a multiple of 2^-32."""
        return self.next_uint32() / 4294967296.0

    def between(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self.next()

    def matrix(self, rows: int, cols: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
        """(rows, cols) uniform(lo, hi), filled row by row as the demo's matrix() does."""
        values = [[self.between(lo, hi) for _ in range(cols)] for _ in range(rows)]
        return np.array(values).reshape(rows, cols)         # (rows, cols), also when rows or cols is 0


def positional_encoding(index: int, dim: int) -> np.ndarray:
    """The sinusoidal code of position ``index`` (0-based): sin on even, cos on odd channels."""
    k2 = np.arange(0, dim, 2)                               # the 2k of each sin/cos pair
    angle = index / 10000.0 ** (k2 / dim)                   # (ceil(dim / 2),)
    pe = np.zeros(dim)
    pe[0::2] = np.sin(angle)
    pe[1::2] = np.cos(angle[: dim // 2])
    return pe


def softmax(logits, temperature: float = 1.0) -> np.ndarray:
    """softmax(logits / temperature) along the last axis, max-subtracted."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass(frozen=True, eq=False)
class DemoBlockWeights:
    """One block in the demo's orientation (matrix times column vector)."""
    heads: tuple                # per head (W_q, W_k, W_v), each (head_dim, head_dim)
    wo: np.ndarray              # (dim, dim) mixes the concatenated head outputs
    w1: np.ndarray              # (hidden, dim) FFN up
    w2: np.ndarray              # (dim, hidden) FFN down

    def to_block_weights(self) -> BlockWeights:
        """The lesson's row-convention BlockWeights: block-diagonal W_Q, W_K, W_V, and m.T."""
        hd = self.heads[0][0].shape[0]
        dim = hd * len(self.heads)
        w_q, w_k, w_v = (np.zeros((dim, dim)) for _ in range(3))
        for h, head in enumerate(self.heads):
            cols = slice(h * hd, (h + 1) * hd)              # head h's slice of the stream
            for W, m in zip((w_q, w_k, w_v), head):
                W[cols, cols] = m.T
        return BlockWeights(w_q=w_q, w_k=w_k, w_v=w_v, w_o=self.wo.T, w_ff1=self.w1.T, w_ff2=self.w2.T)


@dataclass(frozen=True, eq=False)
class DemoWeights:
    embeddings: np.ndarray      # (vocab, dim) one row per word
    blocks: tuple               # DemoBlockWeights per block
    wout: np.ndarray            # (vocab, dim) vocabulary head: logits = W_out @ y


def seeded_weights(vocab_size: int, dim: int, heads: int, hidden: int, seed: int = 1,
                   n_blocks: int = 1) -> DemoWeights:
    """Every matrix from the demo's seeded streams, in the demo's order (module docstring)."""
    hd = dim // heads
    random = Mulberry32(seed)
    embeddings = random.matrix(vocab_size, dim)
    blocks = []
    for l in range(n_blocks):
        head_weights = []
        for head in range(heads):
            own = Mulberry32(seed * 101 + l * heads + head + 1)   # the head's SelfAttention stream
            head_weights.append((own.matrix(hd, hd), own.matrix(hd, hd), own.matrix(hd, hd)))
        wo, w1, w2 = random.matrix(dim, dim), random.matrix(hidden, dim), random.matrix(dim, hidden)
        blocks.append(DemoBlockWeights(heads=tuple(head_weights), wo=wo, w1=w1, w2=w2))
    return DemoWeights(embeddings=embeddings, blocks=tuple(blocks), wout=random.matrix(vocab_size, dim))


@dataclass(frozen=True)
class DemoResult:
    stream: np.ndarray          # (T, dim) the residual stream after the last block
    attentions: tuple           # per block, (heads, T, T): attention[head][query][key]
    logits: np.ndarray          # (T, vocab) y W_out^T
    probabilities: np.ndarray   # (T, vocab) softmax(logits / temperature), one row per token
    top: tuple                  # the top word of every row

    @property
    def attention(self) -> np.ndarray:
        """The last block's attention, (heads, T, T); the demo's only block."""
        return self.attentions[-1]


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def _check_vocab(vocab) -> tuple[str, ...]:
    if isinstance(vocab, str) or not hasattr(vocab, "__len__"):
        raise TypeError(f"vocab must be a sequence of words (str), got {type(vocab).__name__} {vocab!r}")
    vocab = tuple(vocab)
    for i, word in enumerate(vocab):
        if not isinstance(word, str):
            raise TypeError(f"vocab[{i}] must be a word (str), got {type(word).__name__} {word!r}")
    if len(vocab) < 2:
        raise ValueError(f"vocab must hold at least two words, got {len(vocab)}: {vocab!r}")
    if len(set(vocab)) != len(vocab):
        dup = next(w for w in vocab if vocab.count(w) > 1)
        raise ValueError(f"vocab must hold distinct words, got {dup!r} more than once")
    return vocab


def check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a finite number > 0, got {type(temperature).__name__} "
                        f"{temperature!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return float(temperature)


def _emitter(tracer):
    """A tracer is a callable ``tracer(kind, payload)`` or an object with ``.emit(kind, payload)``."""
    if tracer is None:
        return None
    if hasattr(tracer, "emit"):
        return tracer.emit
    if callable(tracer):
        return tracer
    raise TypeError(f"tracer must be callable as tracer(kind, payload) or have .emit, got {type(tracer).__name__}")


class TinyLM:
    """The demo's seeded, untrained tiny language model: embed + position, block(s), head.

    ``TinyLM(["the", "cat", "sat"], dim=4, heads=2, hidden=8, seed=1)(["the", "cat"])``
    """

    def __init__(self, vocab, dim: int = 4, heads: int = 2, hidden: int = 8, seed: int = 1,
                 n_blocks: int = 1, tracer=None, backend: str | None = None, weights: DemoWeights | None = None):
        self.vocab = _check_vocab(vocab)
        self.dim = _check_int("dim", dim, 1)
        self.heads = _check_int("heads", heads, 1)
        if self.dim % self.heads:
            raise ValueError(f"dim must split evenly across the heads, got dim={dim}, heads={heads}")
        self.hidden = _check_int("hidden", hidden, 1)
        self.n_blocks = _check_int("n_blocks", n_blocks, 1)
        self.head_dim = self.dim // self.heads
        self.tracer, self.backend = tracer, backend
        _emitter(tracer)
        if weights is None:
            weights = seeded_weights(len(self.vocab), self.dim, self.heads, self.hidden, seed, self.n_blocks)
        self._check_weights(weights)
        self.weights = weights
        # cfg of every block: Post-LN, unmasked, relu, no biases, no LN affine
        self.cfg = BlockConfig(d_model=self.dim, n_heads=self.heads, d_ff=self.hidden, causal=False,
                               norm="post", activation="relu", eps=LN_EPS)
        self.block_weights = [b.to_block_weights() for b in weights.blocks]

    def _check_weights(self, w):
        V, d, hd = len(self.vocab), self.dim, self.head_dim
        want = {"embeddings": (V, d), "wout": (V, d)}
        for name, shape in want.items():
            if np.shape(getattr(w, name)) != shape:
                raise ValueError(f"weights.{name} must have shape {shape}, got {np.shape(getattr(w, name))}")
        if len(w.blocks) != self.n_blocks:
            raise ValueError(f"weights must hold n_blocks={self.n_blocks} blocks, got {len(w.blocks)}")
        for l, b in enumerate(w.blocks):
            shapes = {"wo": (d, d), "w1": (self.hidden, d), "w2": (d, self.hidden)}
            for name, shape in shapes.items():
                if np.shape(getattr(b, name)) != shape:
                    raise ValueError(f"weights.blocks[{l}].{name} must have shape {shape}, "
                                     f"got {np.shape(getattr(b, name))}")
            if len(b.heads) != self.heads or any(np.shape(m) != (hd, hd) for head in b.heads for m in head):
                raise ValueError(f"weights.blocks[{l}].heads must hold {self.heads} (W_q, W_k, W_v) "
                                 f"triples of shape {(hd, hd)}")

    def token_ids(self, tokens) -> np.ndarray:
        """Token ids from ids or words; clear errors for anything else."""
        if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
            raise TypeError(f"tokens must be a sequence of token ids or words, got {type(tokens).__name__} "
                            f"{tokens!r}")
        if len(tokens) == 0:
            raise ValueError("tokens must hold at least one token, got an empty sequence")
        ids = []
        V = len(self.vocab)
        for i, t in enumerate(tokens):
            if isinstance(t, str):
                if t not in self.vocab:
                    raise ValueError(f"tokens[{i}] must be a word of the vocabulary {self.vocab!r}, got {t!r}")
                ids.append(self.vocab.index(t))
            elif isinstance(t, numbers.Integral) and not isinstance(t, bool):
                if not 0 <= t < V:
                    raise ValueError(f"tokens[{i}] must index the vocabulary, an id in [0, {V}), got {t}")
                ids.append(int(t))
            else:
                raise TypeError(f"tokens[{i}] must be a token id (int) or a word (str), got "
                                f"{type(t).__name__} {t!r}")
        return np.array(ids)

    def embed(self, ids, positional: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(E[t_i] for every i, PE(i) or zeros), each (T, dim)."""
        E = self.weights.embeddings[ids]                    # (T, dim)
        P = np.array([positional_encoding(i, self.dim) if positional else np.zeros(self.dim)
                      for i in range(len(ids))]).reshape(len(ids), self.dim)   # (T, dim)
        return E, P

    def forward(self, tokens, positional: bool = True, temperature: float = 1.0, tracer=None) -> DemoResult:
        """Run the tokens through the model; emit the demo's events to ``tracer`` (or the one
        given to the constructor), in the demo's order."""
        if not isinstance(positional, bool):
            raise TypeError(f"positional must be a bool, got {type(positional).__name__} {positional!r}")
        temperature = check_temperature(temperature)
        emit = _emitter(tracer if tracer is not None else self.tracer)
        ids = self.token_ids(tokens)
        E, P = self.embed(ids, positional)
        x = E + P                                           # (T, dim): the residual stream
        if emit:
            for i, t in enumerate(ids):
                emit("embed", dict(index=i, token=self.vocab[t], embedding=E[i].copy(), position=P[i].copy(),
                                   sum=x[i].copy()))
        attentions = []
        for l, w in enumerate(self.block_weights):
            x_in = x
            x, tr = forward(x_in, w, self.cfg, backend=self.backend, trace=True)
            attentions.append(np.asarray(tr.A, dtype=np.float64))
            if emit:
                self._emit_block(emit, l, x_in, tr)
        logits = x @ self.weights.wout.T                    # (T, vocab)
        p = softmax(logits, temperature)
        top = p.argmax(axis=1)
        if emit:
            for i in range(len(ids)):
                emit("predict", dict(index=i, logits=logits[i].copy(), probabilities=p[i].copy(),
                                     top=self.vocab[top[i]], probability=float(p[i, top[i]])))
        return DemoResult(stream=x, attentions=tuple(attentions), logits=logits, probabilities=p,
                          top=tuple(self.vocab[k] for k in top))

    __call__ = forward

    def _emit_block(self, emit, l, x_in, tr):
        """The block's events, read off its Trace, in the demo's order."""
        T, hd = x_in.shape[0], self.head_dim
        tag = {"block": l} if self.n_blocks > 1 else {}

        def residual_and_norm(stage, before, delta, normed):
            after = before + delta                          # (T, dim)
            for i in range(T):
                emit("add", dict(stage=stage, index=i, before=before[i].copy(), delta=delta[i].copy(),
                                 after=after[i].copy(), **tag))
            mean = after.mean(axis=1)                       # (T,) the statistics the norm removes
            variance = ((after - mean[:, None]) ** 2).mean(axis=1)
            for i in range(T):
                emit("norm", dict(stage=stage, index=i, mean=float(mean[i]), variance=float(variance[i]),
                                  after=normed[i].copy(), **tag))

        for head in range(self.heads):
            cols = slice(head * hd, (head + 1) * hd)        # the head's slice of the concat
            for i in range(T):
                emit("attend", dict(head=head, index=i, weights=tr.A[head, i].copy(),
                                    output=tr.out_concat[i, cols].copy(), **tag))
        residual_and_norm("attention", x_in, tr.A_out, tr.H_mid)
        for i in range(T):
            emit("ffn", dict(index=i, hidden=tr.F_post[i].copy(), output=tr.F_out[i].copy(), **tag))
        residual_and_norm("ffn", tr.H_mid, tr.F_out, tr.H_out)


def event_count(n_tokens: int, heads: int, n_blocks: int = 1) -> int:
    """Events of one forward: T embed, per block (heads*T attend + 5T add/norm/ffn/add/norm),
    T predict. 54 for the demo's 6 tokens and 2 heads."""
    return n_tokens + n_blocks * (heads * n_tokens + 5 * n_tokens) + n_tokens
