"""Which reading of the demo seed reproduces the state its page shows?

    predicts: ran 0.39 · residual norm: 2.00 · attention entropy: 2.12 bits · stage: predict
    tour: "the inspected token predicts ran at 39 percent, and the attention rows average 2.11 bits"

The seed fixes the block (transformer-block.ts) but leaves open: the vocabulary beyond the
sentence's words, how its SelfAttention draws and applies W_q, W_k, W_v, the position code's
first index, the norm's epsilon, and which token the inspector shows. This script runs every
combination of those readings, written here independently of tblock.lesson.demo (only the
Mulberry32 stream, tested bit for bit against JavaScript, is shared), and prints the ones whose
figures round to the seed's. docs/demo.md records the result.

    .venv/bin/python tests/data/demo_seed_search.py            # seed 1, the class's default
    .venv/bin/python tests/data/demo_seed_search.py --seeds 50 # seeds 1..50: the chance rate
"""

import argparse
import itertools
import math

import numpy as np

from tblock.lesson.demo import Mulberry32

SENTENCE = (0, 1, 2, 3, 0, 4)        # the cat sat on the mat: five distinct words, "the" twice
DIM, HIDDEN, HEADS = 4, 8, 2
SEED_FIGURES = dict(p="0.39", entropy="2.12", mean_entropy="2.11")


def draw(random, rows, cols, by_column=False):
    """(rows, cols) uniform(-1, 1): filled row by row (the class's matrix()) or column by column."""
    if by_column:
        return np.array([[random.between(-1, 1) for _ in range(rows)] for _ in range(cols)]).T
    return np.array([[random.between(-1, 1) for _ in range(cols)] for _ in range(rows)])


def code(i, one_based):
    k2 = np.arange(0, DIM, 2)
    angle = (i + one_based) / 10000.0 ** (k2 / DIM)
    return np.ravel(np.column_stack([np.sin(angle), np.cos(angle)]))


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, eps):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)


def head_weights(seed, head, order, extra_first, scale_draws, hd):
    """A seeded SelfAttention's three matrices: its own stream, in the order given."""
    own = Mulberry32(seed * 101 + head + 1)
    if extra_first:                                     # an output projection drawn before them
        draw(own, hd, hd)
    drawn = dict(zip(order, (draw(own, hd, hd) for _ in range(3))))
    gain = 1 / math.sqrt(hd) if scale_draws else 1.0
    return [gain * drawn[name] for name in "qkv"]


def attention(x, seed, reading):
    """Per head (T, T) weights and the concatenated outputs, (heads, T, T) and (T, DIM)."""
    order, extra_first, scale_draws, row_vectors, scaled_scores = reading
    hd = DIM // HEADS
    weights, outputs = [], []
    for head in range(HEADS):
        rows = x[:, head * hd:(head + 1) * hd]
        wq, wk, wv = head_weights(seed, head, order, extra_first, scale_draws, hd)
        q, k, v = ((rows @ m) if row_vectors else (rows @ m.T) for m in (wq, wk, wv))
        a = softmax(q @ k.T / (math.sqrt(hd) if scaled_scores else 1.0))
        weights.append(a)
        outputs.append(a @ v)
    return np.array(weights), np.concatenate(outputs, axis=1)


def run(seed, vocab_size, reading, by_column, one_based, eps):
    """The block's probabilities (T, vocab) and attention (heads, T, T) under one reading."""
    random = Mulberry32(seed)
    embeddings = draw(random, vocab_size, DIM, by_column)
    wo, w1, w2 = draw(random, DIM, DIM, by_column), draw(random, HIDDEN, DIM, by_column), \
        draw(random, DIM, HIDDEN, by_column)
    wout = draw(random, vocab_size, DIM, by_column)
    x = embeddings[list(SENTENCE)] + np.array([code(i, one_based) for i in range(len(SENTENCE))])
    a, heads_out = attention(x, seed, reading)
    h = layer_norm(x + heads_out @ wo.T, eps)
    y = layer_norm(h + np.maximum(0, h @ w1.T) @ w2.T, eps)
    return softmax(y @ wout.T), a


def entropy_bits(p):
    return -(p * np.log2(p)).sum(axis=-1)


def shown(x):
    """How the page prints a figure: two decimals (JavaScript's toFixed(2) on these values)."""
    return f"{x:.2f}"


def readings():
    attention_readings = itertools.product(itertools.permutations("qkv"), (False, True), (False, True),
                                           (False, True), (True, False))
    return itertools.product(attention_readings, range(6, 17), (False, True), (False, True), (1e-5, 1e-12))


def search(seeds):
    hits, tried = [], 0
    for seed in seeds:
        for reading, vocab_size, by_column, one_based, eps in readings():
            p, a = run(seed, vocab_size, reading, by_column, one_based, eps)
            mean_entropy = shown(entropy_bits(a).mean())
            for token in range(len(SENTENCE)):
                tried += 1
                top = int(p[token].argmax())
                figures = dict(p=shown(p[token, top]), entropy=shown(entropy_bits(a[:, token]).mean()),
                               mean_entropy=mean_entropy)
                if figures == SEED_FIGURES and top not in SENTENCE:     # "ran" is not a sentence word
                    hits.append(dict(seed=seed, vocab_size=vocab_size, ran_index=top, token=token,
                                     qkv_order="".join(reading[0]), head_output_drawn_first=reading[1],
                                     draws_scaled=reading[2], row_vectors=reading[3], scores_scaled=reading[4],
                                     by_column=by_column, one_based=one_based, eps=eps,
                                     p=round(float(p[token, top]), 4)))
    return hits, tried


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=1, help="search seeds 1..N (default 1)")
    args = parser.parse_args()
    hits, tried = search(range(1, args.seeds + 1))
    print(f"{tried} (reading, inspected token) pairs tried, {len(hits)} reproduce "
          f"ran {SEED_FIGURES['p']} · {SEED_FIGURES['entropy']} bits · rows {SEED_FIGURES['mean_entropy']} bits")
    for hit in hits:
        print("  ", hit)


if __name__ == "__main__":
    main()
