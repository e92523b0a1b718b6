"""The numba backend's ragged decode step (DecodeStep.ragged): one token for each of several
of a batch cache's slots, each slot at its own length, in one weight pass.

Expected values come from elsewhere than the ragged kernels: the same tokens decoded alone
in a batch-1 cache by the uniform step (model.next_logits; bit for bit, as both run the
serial build for these small models), and the numpy oracle's full forward pass over each
whole sequence (float64 to 1e-12; float32 to the bound F32_BOUND, measured below it).
Slots are prefilled through KVCache.slot views, as the continuous batcher does.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gpt2 import hf_config, random_tensors, write_checkpoint
from test_llama import random_tensors as llama_tensors
from test_llama import write as write_llama

from tblock import GPT2, Llama

pytestmark = pytest.mark.isa

VOCAB, N_POS, D, LAYERS, HEADS = 101, 48, 32, 2, 4
LLAMA = dict(model_type="qwen2", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40, rms_norm_eps=1e-6,
             rope_theta=1000.0, tie_word_embeddings=False)
# float32 logits against the float64 oracle, max |error| / max |logit|: measured up to 5.9e-7
# (this file's GPT-2 and Llama checkpoints, 21 sequences of 2 to 48 tokens, avx512; float64's
# up to 8.5e-16); the bound leaves room for other ISAs
F32_BOUND = 1e-5
# stored weights: a ragged row against the same sequence decoded alone (other row counts,
# other rounding of the stored products): measured up to 4.3e-7 (int8, int4, bf16; 9 sequences)
QUANT_BOUND = 1e-5


@pytest.fixture(scope="module")
def gpt2_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("ragged") / "gpt2"
    write_checkpoint(root, random_tensors(np.random.default_rng(5), VOCAB, N_POS, D, LAYERS),
                     hf_config(vocab_size=VOCAB, n_positions=N_POS, n_embd=D, n_layer=LAYERS, n_head=HEADS))
    return root


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("ragged") / "qwen2", LLAMA, llama_tensors(LLAMA, seed=3))


@pytest.fixture(scope="module")
def gpt2(gpt2_path):
    return GPT2.from_pretrained(gpt2_path)


def batch_step(model, batch, fmt="fp32", max_T=None):
    """(caches, the model's prepared DecodeStep for them): caches of ``batch`` slots, the step
    made as the model makes it, by one checked one-token step (which writes token 0 of every
    slot; the prefills below overwrite it)."""
    caches = model.make_cache(max_T, batch=batch, format=fmt)
    model.next_logits(np.zeros((batch, 1), np.int64), caches, backend="numba")
    return caches, model.prepared_step


def prefill(model, caches, slot, prompt):
    """The prompt's keys and values into one slot of the batch caches, through slot views."""
    model(np.asarray(prompt), cache=[c.slot(slot) for c in caches], backend="numba")


def alone(model, seq, fmt="fp32", max_T=None, decoded=1):
    """The logits after seq's last token, decoded alone as the ragged steps decoded it:
    seq but its last ``decoded`` tokens prefilled into a batch-1 cache, then the uniform
    one-token step for each of those (a token prefilled and one decoded round apart)."""
    cache = model.make_cache(max_T, batch=1, format=fmt)
    model(np.asarray(seq[:-decoded]), cache=cache, backend="numba")
    for t in seq[-decoded:]:
        logits = model.next_logits(np.asarray([t]), cache, backend="numba")
    return logits


def snapshot(caches):
    return [(c.K.copy(), c.V.copy()) for c in caches]


def run_ragged(model, batch, prompts, slots, fmt="fp32", rng=None, max_T=None):
    """Prefill prompts[i] into slots[i] (every prompt at least 1 token), run one ragged step
    of a new token each; returns (logits (n, vocab), the sequences with their new tokens,
    caches, the caches' bytes before the step)."""
    rng = np.random.default_rng(0) if rng is None else rng
    caches, step = batch_step(model, batch, fmt, max_T)
    for s, p in zip(slots, prompts):
        prefill(model, caches, s, p)
    before = snapshot(caches)
    lengths = [c.length for c in caches]
    ids = rng.integers(0, model.vocab_size, len(slots))
    out = step.ragged(ids, np.array(slots), np.array([len(p) for p in prompts]))
    assert [c.length for c in caches] == lengths            # the batcher keeps the slots' lengths
    return out, [np.append(p, t) for p, t in zip(prompts, ids)], caches, before


def assert_others_untouched(caches, before, slots):
    """Slots not in the call keep every byte of every block's cache."""
    others = [s for s in range(caches[0].batch) if s not in set(slots)]
    for c, (K, V) in zip(caches, before):
        assert np.array_equal(c.K[others], K[others]) and np.array_equal(c.V[others], V[others])


def rel(a, b):
    return np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max()


# ----------------------------------------------------------------------------- bit for bit


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_rows_equal_each_sequence_decoded_alone(gpt2, data):
    """Any subset of the slots in any order, lengths at panel edges (NR = 16 keys) and T = 1
    prompts included: each row is bit for bit the uniform step's alone; other slots keep
    their bytes."""
    batch = data.draw(st.integers(1, 4))
    slots = data.draw(st.permutations(range(batch)).flatmap(lambda p: st.integers(1, batch).map(lambda n: p[:n])))
    lengths = data.draw(st.lists(st.sampled_from([1, 2, 7, 15, 16, 17, 31, 32, 33, N_POS - 1]),
                                 min_size=len(slots), max_size=len(slots)))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    prompts = [rng.integers(0, VOCAB, L) for L in lengths]
    out, seqs, caches, before = run_ragged(gpt2, batch, prompts, slots, rng=rng)
    for i, seq in enumerate(seqs):
        assert np.array_equal(out[i], alone(gpt2, seq)), (slots, lengths, i)
    assert_others_untouched(caches, before, slots)


def test_steps_continue_each_slot_and_new_keys_land_at_their_position(gpt2):
    """Three ragged steps over slots of different lengths (one joining late): every row
    equals the sequence decoded alone, and each step wrote only token pasts[i] of its slots."""
    rng = np.random.default_rng(4)
    caches, step = batch_step(gpt2, 3)
    seqs = {0: rng.integers(0, VOCAB, 15), 2: rng.integers(0, VOCAB, 1)}
    decoded = {0: 0, 2: 0}
    for s, p in seqs.items():
        prefill(gpt2, caches, s, p)
    for k in range(3):
        if k == 1:
            seqs[1], decoded[1] = rng.integers(0, VOCAB, 31), 0
            prefill(gpt2, caches, 1, seqs[1])
        slots = list(seqs)[::-1]
        ids = rng.integers(0, VOCAB, len(slots))
        pasts = np.array([len(seqs[s]) for s in slots])
        kept = [[c.head_rows(s, len(seqs[s])) for c in caches] for s in slots]
        out = step.ragged(ids, slots, pasts)
        for i, s in enumerate(slots):
            for c, (Kb, Vb) in zip(caches, kept[i]):
                Ka, Va = c.head_rows(s, len(seqs[s]))
                assert np.array_equal(Ka, Kb) and np.array_equal(Va, Vb)
            seqs[s] = np.append(seqs[s], ids[i])
            decoded[s] += 1
            assert np.array_equal(out[i], alone(gpt2, seqs[s], decoded=decoded[s])), (k, s)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_stored_caches(gpt2, fmt):
    out, seqs, caches, before = run_ragged(gpt2, 3, [np.arange(16) % VOCAB, [5], np.arange(33) % VOCAB],
                                           [1, 2, 0], fmt)
    for i, seq in enumerate(seqs):
        assert np.array_equal(out[i], alone(gpt2, seq, fmt))
    assert_others_untouched(caches, before, [1, 2, 0])


@pytest.mark.parametrize("weights", ["int8", "int4", "bf16"])
def test_quantized_weights(gpt2_path, weights):
    """Stored weights' products depend on the number of rows (a uniform batch-2 step's row
    differs from batch 1's in the last bits), so bit for bit against the uniform step at
    the same rows: one slot alone, and every slot at one length against the uniform batch
    step; ragged lengths against the alone decoding to QUANT_BOUND."""
    model = GPT2.from_pretrained(gpt2_path, weights=weights)
    rng = np.random.default_rng(11)
    out, seqs, caches, before = run_ragged(model, 3, [np.arange(17) % VOCAB], [2], rng=rng)
    assert np.array_equal(out[0], alone(model, seqs[0]))
    assert_others_untouched(caches, before, [2])
    prompts = rng.integers(0, VOCAB, (2, 16))
    out, seqs, _, _ = run_ragged(model, 2, list(prompts), [1, 0], rng=rng)
    uniform = model.make_cache(None, batch=2)
    model(prompts[::-1], cache=uniform, backend="numba")
    expected = model.next_logits(np.array([[seqs[1][-1]], [seqs[0][-1]]]), uniform, backend="numba")
    assert np.array_equal(out, expected[::-1])
    out, seqs, _, _ = run_ragged(model, 3, [np.arange(17) % VOCAB, [9], np.arange(40) % VOCAB], [2, 0, 1], rng=rng)
    for i, seq in enumerate(seqs):
        assert rel(out[i], alone(model, seq)) < QUANT_BOUND


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_llama_gqa_rotary_rmsnorm_gated(llama_path, fmt):
    """Rotary positions turn each row by its own position; GQA, RMSNorm, the gated FFN."""
    model = Llama.from_pretrained(llama_path)
    prompts = [np.arange(1, 17), [3], np.arange(5, 30) % 97]
    out, seqs, caches, before = run_ragged(model, 4, prompts, [3, 0, 1], fmt)
    for i, seq in enumerate(seqs):
        assert np.array_equal(out[i], alone(model, seq, fmt))
        if fmt == "fp32":
            assert rel(out[i], model(seq, backend="numpy")[-1]) < F32_BOUND
    assert_others_untouched(caches, before, [3, 0, 1])


# ----------------------------------------------------------------------------- the oracle


@pytest.mark.parametrize("dtype, bound", [(np.float64, 1e-12), (np.float32, F32_BOUND)])
def test_rows_match_the_oracle(gpt2_path, dtype, bound):
    """Each row against the numpy oracle's full forward over its whole sequence (n = batch;
    lengths at float64's panel edge NR = 8 and float32's 16, and the last position)."""
    model = GPT2.from_pretrained(gpt2_path, dtype=dtype)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, VOCAB, L) for L in (8, 1, 16, N_POS - 1)]
    out, seqs, _, _ = run_ragged(model, 4, prompts, [1, 3, 0, 2], rng=rng)
    assert out.dtype == dtype
    for i, seq in enumerate(seqs):
        assert rel(out[i], model(seq, backend="numpy")[-1]) < bound, i


# ----------------------------------------------------------------------------- arguments


def test_bad_arguments_raise_and_change_nothing(gpt2):
    caches, step = batch_step(gpt2, 3, max_T=20)
    prefill(gpt2, caches, 0, [1, 2, 3])
    prefill(gpt2, caches, 1, [4])
    before = snapshot(caches)
    out = np.full((2, VOCAB), 7.0, np.float32)
    good = dict(ids=np.array([5, 6]), slots=np.array([0, 1]), pasts=np.array([3, 1]), out=out)
    bad = [("slots", dict(slots=np.array([1, 1]))), ("slots", dict(slots=np.array([0, 3]))),
           ("slots", dict(slots=np.array([-1, 0]))), ("slots", dict(slots=np.array([0]))),
           ("slots", dict(slots=np.array([0.0, 1.0]))),
           ("pasts", dict(pasts=np.array([0, 1]))), ("pasts", dict(pasts=np.array([3, 20]))),
           ("pasts", dict(pasts=np.array([3, 1, 2]))),
           ("ids", dict(ids=np.array([[5, 6]]))), ("ids", dict(ids=np.array([5.0, 6.0]))),
           ("ids", dict(ids=np.arange(4), slots=np.arange(4), pasts=np.ones(4, int))),
           ("out", dict(out=np.zeros((2, VOCAB), np.float64))), ("out", dict(out=np.zeros((3, VOCAB), np.float32))),
           ("out", dict(out=np.zeros((VOCAB, 2), np.float32).T))]
    for name, change in bad:
        with pytest.raises(ValueError, match=name):
            step.ragged(**{**good, **change})
        for c, (K, V) in zip(caches, before):
            assert np.array_equal(c.K, K) and np.array_equal(c.V, V)
        assert (out == 7.0).all()
    # a token id out of range: None, nothing written
    for ids in ([5, VOCAB], [-1, 6], np.array([5, 2 ** 64 - 1], np.uint64)):
        assert step.ragged(**{**good, "ids": np.asarray(ids)}) is None
        assert (out == 7.0).all()
        for c, (K, V) in zip(caches, before):
            assert np.array_equal(c.K, K) and np.array_equal(c.V, V)
    assert step.ragged(**good) is out and np.isfinite(out).all()


def test_learned_positions_bound_the_pasts(gpt2):
    """With learned positions, pasts must be < n_positions: a cache of n_positions tokens
    takes a last token at N_POS - 1, not past it."""
    caches, step = batch_step(gpt2, 2, max_T=N_POS)
    prefill(gpt2, caches, 1, np.arange(N_POS - 1) % VOCAB)
    out = step.ragged([4], [1], [N_POS - 1])
    assert np.array_equal(out[0], alone(gpt2, np.append(np.arange(N_POS - 1) % VOCAB, 4), max_T=N_POS))
    with pytest.raises(ValueError, match="pasts"):
        step.ragged([4], [1], [N_POS])


def test_llama_float64_matches_the_oracle(llama_path):
    """Rotary positions per row in float64, against the oracle to 1e-12."""
    model = Llama.from_pretrained(llama_path, dtype=np.float64)
    out, seqs, _, _ = run_ragged(model, 3, [np.arange(1, 9), [3], np.arange(5, 22) % 97], [2, 0, 1])
    for i, seq in enumerate(seqs):
        assert rel(out[i], model(seq, backend="numpy")[-1]) < 1e-12, i


def test_the_parallel_build(gpt2, monkeypatch):
    """Every call on the threads (no size runs serially): rows still equal each sequence
    decoded alone by the uniform step, which runs the parallel build too."""
    from tblock.backends.numba import cached, parallel
    monkeypatch.setattr(parallel, "PARALLEL_MIN_FLOPS", 0)
    calls = []

    def counted(fn, *args, **kw):
        calls.append(fn.__name__ if hasattr(fn, "__name__") else fn.py_func.__name__)
        return parallel.parallel_call(fn, *args, **kw)
    monkeypatch.setattr(cached, "parallel_call", counted)
    prompts = [np.arange(16) % VOCAB, [7], np.arange(3, 36) % VOCAB]
    out, seqs, caches, before = run_ragged(gpt2, 4, prompts, [3, 1, 0])
    assert "decode_step" in calls
    for i, seq in enumerate(seqs):
        assert np.array_equal(out[i], alone(gpt2, seq)), i
        assert rel(out[i], gpt2(seq, backend="numpy")[-1]) < F32_BOUND
    assert_others_untouched(caches, before, [3, 1, 0])
