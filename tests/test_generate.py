"""GPT2.generate / stream, the sampling distribution and ``tblock generate``.

Expected values come from elsewhere than the decoding loop under test: greedy tokens from
the argmax of the full forward pass (``model(ids)`` on the whole sequence, no cache) at
every step; the sampling distribution from a loop over sorted logits written here; the
CLI's ids from the Python API.  The checkpoints are test_gpt2's (random weights of a
trained model's scale, so the greedy continuation does not just repeat a token).
transformers' own generate is the peer in tests/interop/test_generate_transformers.py.
"""

import ast
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import cli_run, one_line_error, proc
from test_gpt2 import hf_config, random_tensors, rel_err, write_checkpoint

from tblock import GPT2
from tblock.cli import main as cli_main
from tblock.models.sampling import draw, next_token_probs

pytestmark = pytest.mark.isa

VOCAB, N_POS, D, LAYERS, HEADS = 101, 48, 32, 2, 4
SHAPE = dict(vocab_size=VOCAB, n_positions=N_POS, n_embd=D, n_layer=LAYERS, n_head=HEADS)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """test_gpt2's random checkpoint with the position embedding 4x larger: with the tied
    head, a greedy GPT-2 of random weights soon repeats one token; strong positions make
    every step's input differ, so the continuations change (8-15 distinct tokens in 40)."""
    root = tmp_path_factory.mktemp("gen") / "ckpt"
    tensors = random_tensors(np.random.default_rng(18), VOCAB, N_POS, D, LAYERS)
    tensors["transformer.wpe.weight"] *= 4
    write_checkpoint(root, tensors, hf_config(**SHAPE))
    return root


@pytest.fixture(scope="module")
def model(ckpt):
    return GPT2.from_pretrained(ckpt)


def greedy_by_recomputation(model, ids, n, backend):
    """n greedy tokens, each the argmax of the last row of model(whole sequence so far)."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(model(np.array(seq), backend=backend)[-1].argmax()))
    return np.array(seq)


# ----------------------------------------------------------------------------- cached forward


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_cached_logits_equal_the_full_forward(ckpt, backend, dtype, tol):
    """model(chunk, cache=) for chunks of every size gives the rows of model(whole sequence)."""
    model = GPT2.from_pretrained(ckpt, dtype=dtype)
    ids = np.random.default_rng(3).integers(0, VOCAB, (2, 20))
    full = model(ids, backend=backend)                              # (2, 20, vocab)
    for chunks in ([20], [1] * 20, [7, 1, 5, 7], [3, 17]):
        cache = model.make_cache(20, batch=2)
        got, at = [], 0
        for n in chunks:
            got.append(model(ids[:, at:at + n], backend=backend, cache=cache))
            at += n
        assert cache[0].length == 20
        assert rel_err(np.concatenate(got, axis=1), full) <= tol, (backend, chunks)
    cache = model.make_cache(20)
    last = model.next_logits(ids[0, :12], cache, backend=backend)   # (vocab,)
    assert last.shape == (VOCAB,) and last.dtype == dtype
    assert rel_err(last, full[0, 11]) <= tol


def test_cache_errors(model, ckpt):
    cache = model.make_cache(8)
    with pytest.raises(ValueError, match="cache holds 0 of max_T=8 tokens, got 9 more"):
        model(np.arange(9), cache=cache)
    assert cache[0].length == 0                     # a refused call leaves it as it was
    with pytest.raises(ValueError, match="max_T must be <= n_positions=48"):
        model.make_cache(49)
    with pytest.raises(TypeError, match="cache must be the list of KVCaches"):
        model(np.arange(3), cache=cache[0])
    with pytest.raises(ValueError, match="cache holds 1 sequence"):
        model(np.zeros((2, 3), int), cache=cache)
    wide = GPT2.from_pretrained(ckpt, dtype=np.float64).make_cache(8)
    with pytest.raises(TypeError, match="cache holds float64"):
        model(np.arange(3), cache=wide)
    full = model.make_cache()
    model(np.arange(40), cache=full)
    with pytest.raises(ValueError, match="the cache holds 40 tokens; 9 more would pass n_positions=48"):
        model(np.arange(9), cache=full)
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array of shape"):
        model.next_logits([1], full, out=np.empty((1, VOCAB)))


# ----------------------------------------------------------------------------- the prepared step
# After one checked decode step with a list of caches, next_logits runs the next ones as one
# compiled call (the backend's prepared step, kernels.decode): the same sums as the checked
# path's two calls, so its logits are compared bitwise with that path's on a twin list of caches.


def checked_logits(model, ids, cache):
    """next_logits on the checked path: a prepared step is for another list of caches."""
    model.clear_prepared_step()
    return model.next_logits(ids, cache).copy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, B", [(SHAPE, 1), (SHAPE, 2),
                                      (dict(vocab_size=3000, n_positions=40, n_embd=256, n_layer=2, n_head=4), 2)])
def test_prepared_steps_equal_the_checked_path(shape, B, dtype):
    """Bitwise, serial (the small model) and parallel (d_model 256: the blocks once the
    context grows, the head always), one and two sequences: one model runs its prepared
    step, its twin (the same seed) the checked path every time."""
    model, twin = (GPT2.from_config(seed=5, dtype=dtype, **shape) for _ in range(2))
    ids = np.random.default_rng(6).integers(0, shape["vocab_size"], (B, 30))
    fast, slow = model.make_cache(30, batch=B), twin.make_cache(30, batch=B)
    model.next_logits(ids[:, :4], fast)
    twin.next_logits(ids[:, :4], slow)
    model.next_logits(ids[:, 4:5], fast)                    # prepares fast's step
    checked_logits(twin, ids[:, 4:5], slow)
    step = model.prepared_step
    assert step is not None
    for t in range(5, 30):
        got = model.next_logits(ids[:, t:t + 1], fast)
        assert model.prepared_step is step                  # it ran as the prepared step (no new one)
        assert np.array_equal(got, checked_logits(twin, ids[:, t:t + 1], slow)), t
        assert [c.length for c in fast] == [c.length for c in slow] == [t + 1] * shape["n_layer"]


def test_prepared_step_follows_lengths_set_back(model):
    """Setting every cache's length back decodes there again (bench_decode's repetitions)."""
    ids = np.random.default_rng(7).integers(0, VOCAB, 12)
    cache = model.make_cache(12)
    model.next_logits(ids[:8], cache)
    first = [model.next_logits(ids[t:t + 1], cache).copy() for t in range(8, 12)]
    for c in cache:
        c.length = 9
    assert np.array_equal(model.next_logits(ids[9:10], cache), first[1])
    assert np.array_equal(model.next_logits(ids[10:11], cache), first[2])
    want = model(ids)[-1]
    assert rel_err(model.next_logits(ids[11:], cache), want) < 1e-5


def test_prepared_step_refuses_what_the_checked_path_refuses(model):
    """Bad input after a step was prepared: the checked path's errors, nothing changed
    (the caches' lengths, the caller's logits)."""
    cache = model.make_cache(10)
    model.next_logits(np.arange(6), cache)
    out = np.full((1, VOCAB), 7.0, np.float32)
    model.next_logits(np.array([3]), cache, out=out)       # prepared
    before = out.copy()
    for bad, match in [(np.array([VOCAB]), "token ids in"), (np.array([-1]), "token ids in"),
                       (np.array([2**64 - 1], np.uint64), "token ids in"), (np.array([1.0]), "integer dtype"),
                       (np.array([[1]] * 2), "out must be a C-contiguous float32 array of shape \\(2, 101\\)")]:
        with pytest.raises((ValueError, TypeError), match=match):
            model.next_logits(bad, cache, out=out)
        assert [c.length for c in cache] == [7] * LAYERS and np.array_equal(out, before)
    with pytest.raises(ValueError, match="cache holds 1 sequence"):
        model.next_logits(np.array([[1]] * 2), cache)
    with pytest.raises(ValueError, match="out must be"):
        model.next_logits(np.array([1]), cache, out=out[:, ::2])
    cache[0].length = 6                                     # the blocks' lengths now differ
    with pytest.raises(ValueError, match="different lengths"):
        model.next_logits(np.array([1]), cache, out=out)
    assert np.array_equal(out, before)
    for c in cache:
        c.length = 10
    with pytest.raises(ValueError, match="cache holds 10 of max_T=10 tokens"):
        model.next_logits(np.array([1]), cache, out=out)
    assert [c.length for c in cache] == [10] * LAYERS and np.array_equal(out, before)


def test_prepared_step_is_for_its_own_caches(model):
    """A list holding another cache than the prepared step's (same lengths) runs as the
    checked path would on it."""
    twins = []
    for _ in range(2):
        cache, other = model.make_cache(10), model.make_cache(10)
        model.next_logits(np.arange(6), cache)
        model.next_logits(np.arange(2, 9), other)
        twins.append((cache, [other[0]] + cache[1:]))     # the second: block 0's cache swapped
    (cache, swapped), (cache_twin, swapped_twin) = twins
    checked_logits(model, np.array([3]), cache_twin)
    model.next_logits(np.array([3]), cache)                 # prepared for cache
    got = model.next_logits(np.array([1]), swapped)
    assert np.array_equal(got, checked_logits(model, np.array([1]), swapped_twin))


def test_a_prepared_step_does_not_keep_its_caches(model):
    """The model holds its last prepared step, not the caches it was made for: a dropped
    list of caches is freed (generate's, ~2 * n_layer * T * d values)."""
    import gc
    import weakref
    cache = model.make_cache(8)
    model.next_logits(np.arange(3), cache)
    model.next_logits(np.array([3]), cache)                 # prepared
    model.next_logits(np.array([4]), cache)                 # run prepared
    refs = [weakref.ref(c) for c in cache]
    del cache
    gc.collect()
    assert all(r() is None for r in refs)
    fresh = model.make_cache(8)                             # a new list may reuse their addresses
    model.next_logits(np.arange(5), fresh)
    assert rel_err(model.next_logits(np.array([5]), fresh), model(np.arange(6))[-1]) < 1e-5


@pytest.mark.filterwarnings("ignore:overflow encountered in add")     # the checked path's embedding
def test_prepared_step_overflow_is_the_checked_error(ckpt):
    """An embedding whose sum overflows float32: the step's block 0 finds the Inf, and the
    checked path names it; the caches stay where they were."""
    big = GPT2.from_pretrained(ckpt)
    wte, wpe = big.wte.copy(), big.wpe.copy()
    wte[5], wpe[5] = 3e38, 3e38                            # token 5 at position 5: an Inf
    big = GPT2(big.config, wte, wpe, big.blocks, big.ln_f[:D], big.ln_f[D:])
    cache = big.make_cache(10)
    big.next_logits(np.arange(4), cache)
    big.next_logits(np.array([4]), cache)                   # prepared
    with pytest.raises(ValueError, match=r"H must be finite, found inf at index \(0, 0, 0\)"):
        big.next_logits(np.array([5]), cache)
    assert [c.length for c in cache] == [5] * LAYERS


# ----------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("prompt_len", [1, 5])
def test_greedy_equals_the_argmax_of_full_recomputation(model, backend, prompt_len):
    ids = np.random.default_rng(prompt_len).integers(0, VOCAB, prompt_len)
    n = 30
    expected = greedy_by_recomputation(model, ids, n, backend)
    assert len(set(expected[prompt_len:].tolist())) > 3     # a real continuation, not one token repeated
    out = model.generate(ids, n, temperature=0, backend=backend)
    assert out.dtype == np.int64 and out.shape == (prompt_len + n,)
    np.testing.assert_array_equal(out, expected)


def test_greedy_float64_model_to_the_last_position(ckpt):
    """A float64 model; the prompt plus the new tokens fill n_positions exactly."""
    model = GPT2.from_pretrained(ckpt, dtype=np.float64)
    ids = np.array([4, 8, 15, 16, 23, 42])
    out = model.generate(ids, N_POS - len(ids), temperature=0.0)
    np.testing.assert_array_equal(out, greedy_by_recomputation(model, ids, N_POS - len(ids), "numba"))


def test_batched_generate_equals_each_sequence_alone(model, backend):
    ids = np.random.default_rng(5).integers(0, VOCAB, (3, 6))
    out = model.generate(ids, 12, temperature=0, backend=backend)
    assert out.shape == (3, 18)
    for b in range(3):
        np.testing.assert_array_equal(out[b], model.generate(ids[b], 12, temperature=0, backend=backend))


def test_stream_yields_what_generate_returns(model):
    ids = np.array([3, 1, 4, 1, 5])
    toks = list(model.stream(ids, 15, temperature=0))
    assert all(type(t) is int for t in toks)
    np.testing.assert_array_equal(np.concatenate([ids, toks]), model.generate(ids, 15, temperature=0))
    batch = np.stack([ids, ids[::-1]])
    steps = list(model.stream(batch, 9, temperature=0.7, top_k=20, seed=4))
    assert len(steps) == 9 and all(s.shape == (2,) for s in steps)
    np.testing.assert_array_equal(np.concatenate([batch, np.stack(steps, axis=1)], axis=1),
                                  model.generate(batch, 9, temperature=0.7, top_k=20, seed=4))


def test_zero_new_tokens_returns_the_prompt(model):
    np.testing.assert_array_equal(model.generate([7, 8], 0), [7, 8])
    assert list(model.stream([7, 8], 0)) == []


# ----------------------------------------------------------------------------- sampling


def test_sampling_with_a_seed_is_reproducible(model):
    ids = np.array([2, 7, 1, 8])
    a = model.generate(ids, 25, temperature=1.0, seed=123)
    np.testing.assert_array_equal(a, model.generate(ids, 25, seed=123))
    b = model.generate(ids, 25, seed=124)
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, model.generate(ids, 25, temperature=0))
    # a Generator is used as it is: its stream goes on, so two calls differ
    g = np.random.default_rng(123)
    np.testing.assert_array_equal(model.generate(ids, 25, seed=g), a)
    assert not np.array_equal(model.generate(ids, 25, seed=g), a)


def test_top_k_1_and_a_tiny_top_p_are_greedy(model):
    ids = np.array([9, 9, 2])
    greedy = model.generate(ids, 20, temperature=0)
    np.testing.assert_array_equal(model.generate(ids, 20, temperature=1.3, top_k=1, seed=0), greedy)
    np.testing.assert_array_equal(model.generate(ids, 20, temperature=0.5, top_p=1e-9, seed=0), greedy)


def test_samples_come_from_the_filtered_distribution(model):
    """Every sampled token was allowed by top_k at its step: it is among the k largest
    logits of the full forward pass over the sequence before it."""
    ids = np.array([10, 20, 30])
    out = model.generate(ids, 20, temperature=1.5, top_k=3, seed=9)
    for t in range(3, 23):
        logits = model(out[:t])[-1]
        assert out[t] in np.argsort(-logits)[:3], t


def reference_probs(logits, temperature, top_k, top_p):
    """The sampling distribution by a loop over the tokens in order of decreasing logit."""
    z = np.array(logits, np.float64) / temperature
    order = sorted(range(len(z)), key=lambda i: -z[i])
    keep = list(order)
    if top_k is not None and top_k < len(z):
        kth = z[order[top_k - 1]]
        keep = [i for i in order if z[i] >= kth]            # ties with the k-th stay
    p = np.zeros(len(z))
    e = np.exp(z[keep] - z[keep].max())
    p[keep] = e / e.sum()
    if top_p is not None and top_p < 1:
        chosen, mass = [], 0.0
        for i in keep:                                      # most probable first
            chosen.append(i)
            mass += p[i]
            if mass >= top_p:
                break
        q = np.zeros(len(z))
        q[chosen] = p[chosen] / p[chosen].sum()
        p = q
    return p


LOGITS = np.array([2.0, -1.0, 0.5, 3.0, 0.5, 1.0, -3.0, 2.5, 0.0, 0.5], np.float32)


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, None, None), (0.5, None, None), (2.0, None, None), (1.0, 3, None), (1.0, 4, None),
    (0.7, 7, None), (1.0, None, 0.5), (1.0, None, 0.9), (1.3, None, 0.99), (1.0, 5, 0.8),
    (0.8, 2, 0.3), (1.0, 10, 1.0), (1.0, 50, None), (1.0, 1, 0.5)])
def test_next_token_probs_against_a_loop(temperature, top_k, top_p):
    got = next_token_probs(LOGITS, temperature, top_k, top_p)
    assert got.dtype == np.float64 and got.shape == LOGITS.shape
    np.testing.assert_allclose(got, reference_probs(LOGITS, temperature, top_k, top_p), rtol=1e-12, atol=1e-15)


def test_next_token_probs_fixed_values():
    """Hand-checked cases: top_k=4 keeps 3.0, 2.5, 2.0 and 1.0; top_k=6 reaches the three
    tied 0.5s and keeps all of them (7 tokens)."""
    assert np.count_nonzero(next_token_probs(LOGITS, 1.0, 4)) == 4
    assert np.count_nonzero(next_token_probs(LOGITS, 1.0, 6)) == 7
    # top_p: 3.0 alone holds e^3 / sum; with 2.5 and 2.0 the first three hold more than 0.8
    p = np.exp(LOGITS.astype(np.float64)) / np.exp(LOGITS.astype(np.float64)).sum()
    assert p[3] < 0.5 < p[3] + p[7]
    np.testing.assert_array_equal(np.flatnonzero(next_token_probs(LOGITS, 1.0, None, 0.5)), [3, 7])
    batch = np.stack([LOGITS, LOGITS[::-1]])
    got = next_token_probs(batch, 1.0, 3, 0.9)                      # (B, vocab), row by row
    np.testing.assert_allclose(got[1], reference_probs(LOGITS[::-1], 1.0, 3, 0.9), rtol=1e-12)


def test_draw_follows_the_distribution():
    p = next_token_probs(LOGITS, 1.0, 6)
    rng = np.random.default_rng(0)
    n = 200_000
    toks = draw(np.broadcast_to(p, (n, len(p))), rng)
    counts = np.bincount(toks, minlength=len(p))
    assert counts[p == 0].sum() == 0                                # filtered tokens never come
    sigma = np.sqrt(n * p * (1 - p))
    assert np.all(np.abs(counts - n * p) <= 5 * sigma + 1)


# ----------------------------------------------------------------------------- eos


def test_eos_stops_early_and_pads(model):
    ids = np.array([[5, 6, 7], [40, 41, 42]])
    free = model.generate(ids, 20, temperature=0)
    eos = int(free[0, 3 + 4])                   # sequence 0's 5th new token
    first = lambda row: int(np.flatnonzero(row[3:] == eos)[0]) if (row[3:] == eos).any() else None   # noqa: E731
    f0, f1 = first(free[0]), first(free[1])
    out = model.generate(ids, 20, temperature=0, eos_token_id=eos)
    # sequence 0 ends at its first eos and is padded with eos; sequence 1 runs until its own
    np.testing.assert_array_equal(out[0, :3 + f0 + 1], free[0, :3 + f0 + 1])
    assert (out[0, 3 + f0:] == eos).all()
    n_new = 20 if f1 is None else f1 + 1
    assert out.shape == (2, 3 + max(f0 + 1, n_new))
    np.testing.assert_array_equal(out[1], free[1, :out.shape[1]])
    single = model.generate(ids[0], 20, temperature=0, eos_token_id=eos)
    np.testing.assert_array_equal(single, free[0, :3 + f0 + 1])     # stops right after eos
    assert list(model.stream(ids[0], 20, temperature=0, eos_token_id=eos)) == single[3:].tolist()


# ----------------------------------------------------------------------------- arguments


def test_argument_errors(model):
    g = model.generate
    with pytest.raises(TypeError, match="max_new_tokens must be an integer, got float"):
        g([1], 2.0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0, got -1"):
        g([1], -1)
    with pytest.raises(ValueError, match="max_new_tokens=46 after T=3 prompt tokens passes n_positions=48"):
        g([1, 2, 3], 46)
    with pytest.raises(ValueError, match="temperature must be >= 0 and finite"):
        g([1], 2, temperature=-0.1)
    with pytest.raises(ValueError, match="temperature must be >= 0 and finite"):
        g([1], 2, temperature=float("nan"))
    with pytest.raises(ValueError, match="temperature must be >= 0 and finite"):
        g([1], 2, temperature=float("inf"))
    with pytest.raises(TypeError, match="temperature must be a real number, got str"):
        g([1], 2, temperature="hot")
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        g([1], 2, top_k=0)
    with pytest.raises(TypeError, match="top_k must be an integer, got float"):
        g([1], 2, top_k=2.5)
    for bad in (0, 0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
            g([1], 2, top_p=bad)
    with pytest.raises(TypeError, match="top_p must be a real number"):
        g([1], 2, top_p=True)
    with pytest.raises(ValueError, match=r"eos_token_id must be a token id in \[0, vocab_size=101\), got 101"):
        g([1], 2, eos_token_id=101)
    with pytest.raises(ValueError, match="eos_token_id must be >= 0"):
        g([1], 2, eos_token_id=-1)
    with pytest.raises(ValueError, match="seed must be >= 0, got -5"):
        g([1], 2, seed=-5)
    with pytest.raises(TypeError, match="seed must be an integer, got str"):
        g([1], 2, seed="abc")
    with pytest.raises(TypeError, match="seed must be an integer, got bool"):
        g([1], 2, seed=True)
    with pytest.raises(ValueError, match=r"token ids in \[0, vocab_size=101\)"):
        g([1, 101], 2)
    with pytest.raises(ValueError, match="backend must be one of"):
        g([1], 2, backend="gpu")
    # torch, the outside reference, has no cached path; where torch is not installed (the
    # peers extra) the backend cannot run at all: a ValueError (BackendUnavailable) either way
    with pytest.raises(ValueError, match="backend 'torch' (has no KV-cache path|cannot run: torch is not installed)"):
        g([1], 2, backend="torch")
    # stream checks its arguments when called, before the first token is asked for
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        model.stream([1], 2, top_k=0)
    with pytest.raises(ValueError, match="temperature must be > 0 for a distribution"):
        next_token_probs(LOGITS, 0.0)


# ----------------------------------------------------------------------------- the CLI


def run_cli(capsys, *args):
    code = cli_main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_ids(ckpt, model, capsys):
    code, out, err = run_cli(capsys, ckpt, "--ids", 1, 2, 3, "-n", 12, "--temperature", 0)
    assert code == 0
    expected = model.generate([1, 2, 3], 12, temperature=0)
    assert out.split() == [str(i) for i in expected]
    assert "12 tokens" in err and "tokens/s" in err
    code, out, err = run_cli(capsys, ckpt, "--ids", 4, 5, "-n", 10, "--top-k", 5, "--top-p", 0.9,
                             "--temperature", 0.8, "--seed", 7, "--backend", "numpy")
    assert code == 0
    assert out.split() == [str(i) for i in model.generate([4, 5], 10, temperature=0.8, top_k=5, top_p=0.9,
                                                          seed=7, backend="numpy")]
    eos = int(expected[3 + 4])
    code, out, err = run_cli(capsys, ckpt, "--ids", 1, 2, 3, "-n", 12, "--temperature", 0, "--eos", eos)
    assert [int(x) for x in out.split()] == model.generate([1, 2, 3], 12, temperature=0, eos_token_id=eos).tolist()


def test_cli_errors(ckpt, tmp_path, capsys):
    code, out, err = run_cli(capsys, ckpt, "--ids", 1, 200, "-n", 3)
    assert code == 2 and "tblock generate: error:" in err and "vocab_size=101" in err
    code, out, err = run_cli(capsys, tmp_path / "nowhere", "--ids", 1, "-n", 3)
    assert code == 2 and "does not exist" in err
    code, out, err = run_cli(capsys, ckpt, "--prompt", "hello", "-n", 3)
    assert code == 2 and "tokenizer.json" in err
    with pytest.raises(SystemExit):                  # argparse: --ids or --prompt, exactly one
        cli_main(["generate", str(ckpt), "-n", "3"])
    capsys.readouterr()


WORDS = [f"w{i}" for i in range(VOCAB - 1)] + ["[UNK]"]


@pytest.fixture
def text_ckpt(ckpt, tmp_path):
    """The checkpoint with a word-level tokenizer.json of VOCAB words (w0 ... w99, [UNK])."""
    tokenizers = pytest.importorskip("tokenizers", reason="the text extra (tokenizers) is not installed")
    root = tmp_path / "text"
    root.mkdir()
    for f in ckpt.iterdir():
        (root / f.name).write_bytes(f.read_bytes())
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()      # joins the words with spaces
    tok.save(str(root / "tokenizer.json"))
    return root


def test_cli_prompt_with_a_tokenizer(text_ckpt, model, capsys):
    code, out, err = run_cli(capsys, text_ckpt, "--prompt", "w5 w17 w3", "-n", 8, "--temperature", 0)
    assert code == 0, err
    expected = model.generate([5, 17, 3], 8, temperature=0)
    lines = out.strip().splitlines()
    assert lines[0].split() == [str(i) for i in expected]
    assert lines[1] == " ".join(WORDS[i] for i in expected)


def test_cli_prompt_without_tokenizers_says_what_to_install(text_ckpt, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)        # import tokenizers now fails
    code, out, err = run_cli(capsys, text_ckpt, "--prompt", "w5", "-n", 2)
    assert code == 2 and "pip install 'tblock-cpu[text]'" in err



# ----------------------------------------------------------------------------- no allocation

@pytest.mark.subprocess
def test_a_decode_step_allocates_no_memory_in_compiled_code():
    """Numba's allocation counter (NUMBA_NRT_STATS) over GPT2.next_logits steps, serial and
    parallel, one and two sequences: the same count whatever the number of blocks, and no
    more than the array arguments of the compiled calls, each of which Numba wraps in a
    small record at the call: on the checked path's first step two calls (the blocks: 7,
    the head: 4), on the prepared steps after it one (kernels.decode: 13).  Every buffer
    of the step (Q, K and V rows, the attention's tiles, the FFN's hidden layer, the
    blocks' outputs, LN_f's) is the KVCache's work buffer; the logits are the caller's
    ``out``.  Before it a step of 12 blocks made some 800 allocations."""
    env = {**os.environ, "NUMBA_NRT_STATS": "1", "NUMBA_NUM_THREADS": "2"}
    p = subprocess.run(proc("step_allocations"), env=env, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stderr
    runs = ast.literal_eval(p.stdout.strip())
    assert len({first for first, *_ in runs}) == 1 and runs[0][0] <= 11
    assert len({n for _, most, least, _ in runs for n in (most, least)}) == 1 and runs[0][1] <= 13
    assert max(err for *_, err in runs) < 1e-5


# ----------------------------------------------------------------------------- weight formats


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_a_quantized_model_generates_its_own_argmax(ckpt, backend, fmt):
    """weights=fmt: cached chunks give the full forward's rows, and greedy tokens are the
    argmax of the full forward of the same quantized model at every step."""
    model = GPT2.from_pretrained(ckpt, weights=fmt)
    ids = np.random.default_rng(9).integers(0, VOCAB, (2, 16))
    full = model(ids, backend=backend)
    for chunks in ([16], [1] * 16, [5, 1, 10]):
        cache = model.make_cache(16, batch=2)
        got, at = [], 0
        for n in chunks:
            got.append(model(ids[:, at:at + n], backend=backend, cache=cache))
            at += n
        assert rel_err(np.concatenate(got, axis=1), full) <= 1e-5, chunks
    out = model.generate(ids[0, :4], 20, temperature=0, backend=backend)
    np.testing.assert_array_equal(out, greedy_by_recomputation(model, ids[0, :4], 20, backend))


def test_cli_weights(ckpt, tmp_path, capsys):
    """--weights quantizes the blocks on loading: the ids are the Python API's with the same
    weights; a format the blocks cannot take is one line, a bad choice argparse's refusal."""
    for fmt in ("int8", "int4"):
        code, out, err = cli_run(capsys, "generate", ckpt, "--ids", 1, 2, 3, "-n", 12, "--temperature", 0,
                                 "--weights", fmt)
        assert code == 0, err
        expected = GPT2.from_pretrained(ckpt, weights=fmt).generate([1, 2, 3], 12, temperature=0)
        assert out.split() == [str(i) for i in expected]
        assert f"weights {fmt}" in err
    shape = dict(SHAPE, n_embd=48)          # 48 inputs: not a whole number of int8's 32-input blocks
    write_checkpoint(tmp_path / "d48", random_tensors(np.random.default_rng(1), VOCAB, N_POS, 48, LAYERS),
                     hf_config(**shape))
    code, out, err = cli_run(capsys, "generate", tmp_path / "d48", "--ids", 1, "-n", 2, "--weights", "int8")
    one_line_error(code, err, "generate", "block 0 cannot be stored as int8", "multiple of 32, got 48")
    with pytest.raises(SystemExit):         # argparse: one of tblock.FORMATS
        cli_main(["generate", str(ckpt), "--ids", "1", "--weights", "int3"])
    assert "invalid choice: 'int3'" in capsys.readouterr().err
