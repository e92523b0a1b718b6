"""Greedy steps many to a compiled call (DecodeStep.greedy, kernels.decode.greedy_steps, which
``generate`` takes at temperature 0): the tokens equal those of one step a call (``stream``,
each step its own next_logits), over every weight format, batched, with eos, and across the
switch from the stack's serial build to its parallel one; a call the step was not prepared
for changes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tblock
from tblock import GPT2
from tblock.backends.numba import cached, parallel
from tblock.backends.numba.cached import DecodeStep

pytestmark = pytest.mark.isa

# a GPT-2 trained here (bench/train_tiny_gpt2.py): greedy continuations of real text vary
DATA = Path(__file__).resolve().parent / "data" / "tiny_gpt2"
PROMPT = np.frombuffer(b"def main(args):\n    return ", dtype=np.uint8).astype(np.int64)


@pytest.fixture(scope="module", params=["fp32", "int8", "int4"])
def trained(request):
    return tblock.load(str(DATA), weights=request.param, **({} if request.param == "fp32" else {"dot": "int8"}))


@pytest.fixture
def taken(monkeypatch):
    """The steps each DecodeStep.greedy call took, in order."""
    counts, greedy = [], DecodeStep.greedy

    def spy(self, *args, **kwargs):
        counts.append(greedy(self, *args, **kwargs))
        return counts[-1]
    monkeypatch.setattr(DecodeStep, "greedy", spy)
    return counts


def one_step_a_call(model, ids, n, eos=None) -> np.ndarray:
    """The prompt and n greedy tokens, one next_logits call a token (stream)."""
    steps = list(model.stream(ids, n, temperature=0, eos_token_id=eos))
    if np.ndim(ids) == 2:
        return np.concatenate([ids, np.stack(steps, axis=1)], axis=1)
    return np.concatenate([ids, steps])


def test_one_call_equals_one_step_a_call(trained, taken):
    want = one_step_a_call(trained, PROMPT, 40)
    assert taken == [] and len(set(want[PROMPT.size:].tolist())) > 5     # stream never bulks; text varies
    got = trained.generate(PROMPT, 40, temperature=0)
    np.testing.assert_array_equal(got, want)
    # the prompt's step and the first one-token step (which prepares the step for these
    # caches: a call before it, with stream's step, takes none) come one at a time, the
    # other 38 in one call
    assert [k for k in taken if k] == [38]


def test_batched_with_eos(trained, taken):
    ids = np.stack([PROMPT, PROMPT[::-1]])
    free = one_step_a_call(trained, ids, 30)
    eos = int(free[0, PROMPT.size + 6])         # sequence 0's 7th new token
    want = one_step_a_call(trained, ids, 30, eos)
    got = trained.generate(ids, 30, temperature=0, eos_token_id=eos)
    np.testing.assert_array_equal(got, want)
    assert (got[0, PROMPT.size + 6:] == eos).all() and sum(taken) == got.shape[1] - PROMPT.size - 2


def test_across_the_serial_parallel_switch(monkeypatch):
    """A run whose first steps are below the parallel threshold and later ones above it: a
    call each build, the same tokens as one step a call (which switches at the same step)."""
    model = tblock.load(str(DATA))
    switch = PROMPT.size + 9
    monkeypatch.setattr(cached, "cached_flops", lambda n, T, past, per_row, per_key: past)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_FLOPS", switch)
    builds = []

    def greedy_steps(*args):
        builds.append((args[7][0], args[6][2]))       # (the stack's build, the run's length)
        return cached_greedy(*args)
    cached_greedy = cached.greedy_steps
    monkeypatch.setattr(cached, "greedy_steps", greedy_steps)
    want = one_step_a_call(model, PROMPT, 24)
    got = model.generate(PROMPT, 24, temperature=0)
    np.testing.assert_array_equal(got, want)
    # past = T + 1 (after the prompt and one step) to switch - 1 serial, then parallel
    assert builds == [(False, switch - PROMPT.size - 1), (True, 24 - (switch - PROMPT.size + 1))]


@pytest.fixture
def prepared():
    """A trained model whose step is prepared for its caches at 5 tokens, and an out buffer."""
    model = GPT2.from_pretrained(DATA)
    cache = model.make_cache(16)
    model.next_logits(PROMPT[:4], cache)
    model.next_logits(PROMPT[4:5], cache)       # a one-token checked step prepares the step
    out = np.zeros((1, 24), dtype=np.int64)
    out[0, 0] = PROMPT[5]
    return model, model.prepared_step, cache, out


def test_greedy_takes_what_it_is_given(prepared):
    model, step, cache, out = prepared
    assert step.greedy(cache, out, 1, 11) == 11 and all(c.length == 16 for c in cache)
    # the same steps one call each, over caches filled the same way
    again = model.make_cache(16)
    model.next_logits(PROMPT[:4], again)
    model.next_logits(PROMPT[4:5], again)
    want = [PROMPT[5]]
    for _ in range(11):
        want.append(int(model.next_logits(np.array(want[-1:]), again).argmax()))
    np.testing.assert_array_equal(out[0, :12], want)
    assert not out[0, 12:].any()


@pytest.mark.parametrize("case", ["other caches", "lengths apart", "no room in the cache", "n past out",
                                  "col 0", "out int32", "out not contiguous", "out read-only", "done of 2",
                                  "done int", "eos past the vocabulary", "a bad token"])
def test_a_call_it_was_not_prepared_for_changes_nothing(prepared, case):
    model, step, cache, out = prepared
    args = dict(caches=cache, out=out, col=1, n=4, eos=-1, done=None)
    if case == "other caches":
        args["caches"] = model.make_cache(16)
    elif case == "lengths apart":
        cache[1].length = 4
    elif case == "no room in the cache":
        args["n"] = 12
    elif case == "n past out":
        args.update(col=21, n=4)
    elif case == "col 0":
        args["col"] = 0
    elif case == "out int32":
        args["out"] = out.astype(np.int32)
    elif case == "out not contiguous":
        args["out"] = np.zeros((1, 24), dtype=np.int64)[:, ::2]
    elif case == "out read-only":
        out.flags.writeable = False
    elif case == "done of 2":
        args.update(eos=3, done=np.zeros(2, dtype=bool))
    elif case == "done int":
        args.update(eos=3, done=np.zeros(1, dtype=np.int64))
    elif case == "eos past the vocabulary":
        args["eos"] = model.vocab_size
    elif case == "a bad token":
        out[0, 0] = model.vocab_size
    lengths, before, K = [c.length for c in cache], args["out"].copy(), cache[0].K.copy()
    assert step.greedy(**args) == 0
    assert [c.length for c in cache] == lengths
    np.testing.assert_array_equal(args["out"], before)
    np.testing.assert_array_equal(cache[0].K, K)
